//! Talos's bootstrap-manifests inventory (Talos 1.13 and later): the
//! ConfigMap `kube-system/talos-bootstrap-manifests-inventory` in which Talos
//! records every object it applied from its bootstrap manifests (inline
//! manifests included), and the `config.k8s.io/owning-inventory` annotation it
//! stamps on the objects it creates. `talosctl upgrade-k8s` prunes the objects
//! of this inventory that are no longer in the bootstrap manifests, so an
//! object Ichor takes over must leave it (R6.1).
//!
//! The format, exactly as Talos reads and writes it (see
//! docs/adr/0015-a-cilium-hand-over-talos-cannot-prune.md): one `data` key per
//! object, `<namespace>_<name>_<group>_<kind>`, every value the empty string;
//! a `:` in a name is written `__`. A key that does not parse makes Talos's
//! whole inventory unreadable, so this module never writes one it cannot
//! read back.

use std::collections::BTreeMap;
use std::fmt;

/// The inventory ConfigMap's namespace.
pub const INVENTORY_NAMESPACE: &str = "kube-system";
/// The inventory ConfigMap's name (also the inventory's id in the annotation).
pub const INVENTORY_NAME: &str = "talos-bootstrap-manifests-inventory";
/// Where Talos's bootstrap manifests put their workloads (kube-proxy,
/// CoreDNS); objects there made before Talos stamped them carry no
/// owning-inventory annotation.
pub const WORKLOADS_NAMESPACE: &str = "kube-system";
/// The annotation naming the inventory that owns an object.
pub const OWNING_INVENTORY_ANNOTATION: &str = "config.k8s.io/owning-inventory";
/// Talos's field manager for its bootstrap manifests.
pub const FIELD_MANAGER: &str = "talos";

/// One object as the inventory names it: no version, an empty namespace for a
/// cluster-scoped object and an empty group for the core group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InventoryObject {
    pub namespace: String,
    pub name: String,
    pub group: String,
    pub kind: String,
}

impl InventoryObject {
    /// The object of `apiVersion`, `kind`, `namespace` (`""` when
    /// cluster-scoped) and `name`.
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> Self {
        let group = api_version
            .split_once('/')
            .map(|(g, _)| g)
            .unwrap_or_default();
        InventoryObject {
            namespace: namespace.to_string(),
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
        }
    }

    /// The object's `data` key, or why Talos could not read it back.
    pub fn key(&self) -> Result<String, InventoryError> {
        let key = format!(
            "{}_{}_{}_{}",
            self.namespace,
            self.name.replace(':', "__"),
            self.group,
            self.kind
        );
        match parse_key(&key) {
            Ok(back) if back == *self => Ok(key),
            _ => Err(InventoryError::Unwritable {
                object: self.to_string(),
            }),
        }
    }
}

impl fmt::Display for InventoryObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.group.as_str() {
            "" => self.kind.clone(),
            g => format!("{}.{g}", self.kind),
        };
        match self.namespace.as_str() {
            "" => write!(f, "{kind} {}", self.name),
            ns => write!(f, "{kind} {ns}/{}", self.name),
        }
    }
}

/// What is wrong with an inventory key or object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    #[error(
        "inventory key {key:?} in ConfigMap {INVENTORY_NAMESPACE}/{INVENTORY_NAME} is not <namespace>_<name>_<group>_<kind>; Talos cannot read its inventory until the key is fixed or removed"
    )]
    BadKey { key: String },
    #[error(
        "{object} cannot be named in Talos's bootstrap-manifests inventory (a `_` in its namespace, name or group does not read back)"
    )]
    Unwritable { object: String },
}

/// Reads a `data` key as Talos does: the namespace up to the first `_`, the
/// kind after the last, the group between the last two, the name the rest
/// with `__` turned back into `:`; a `_` left in the name is an error.
pub fn parse_key(key: &str) -> Result<InventoryObject, InventoryError> {
    let bad = || InventoryError::BadKey {
        key: key.to_string(),
    };
    let (namespace, rest) = key.split_once('_').ok_or_else(bad)?;
    let (rest, kind) = rest.rsplit_once('_').ok_or_else(bad)?;
    let (name, group) = rest.rsplit_once('_').ok_or_else(bad)?;
    let name = name.replace("__", ":");
    if name.is_empty() || kind.is_empty() || name.contains('_') {
        return Err(bad());
    }
    Ok(InventoryObject {
        namespace: namespace.to_string(),
        name,
        group: group.to_string(),
        kind: kind.to_string(),
    })
}

/// The inventory's `data` for `objects` (every value `""`).
pub fn inventory_data<'a>(
    objects: impl IntoIterator<Item = &'a InventoryObject>,
) -> Result<BTreeMap<String, String>, InventoryError> {
    objects
        .into_iter()
        .map(|o| o.key().map(|k| (k, String::new())))
        .collect()
}

/// The objects an inventory's `data` names. One bad key fails the whole
/// inventory, as it does for Talos.
pub fn inventory_objects(
    data: &BTreeMap<String, String>,
) -> Result<Vec<InventoryObject>, InventoryError> {
    data.keys().map(|k| parse_key(k)).collect()
}

/// Whether `annotations` say the object belongs to Talos's inventory.
pub fn owned_by_inventory(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(OWNING_INVENTORY_ANNOTATION)
        .is_some_and(|v| v == INVENTORY_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(api_version: &str, kind: &str, ns: &str, name: &str) -> InventoryObject {
        InventoryObject::new(api_version, kind, ns, name)
    }

    /// Covers: R6.1 (the inventory's key format, four examples of keys Talos writes)
    #[test]
    fn keys_are_written_as_talos_writes_them() {
        let cases = [
            (
                obj("apps/v1", "DaemonSet", "kube-system", "cilium"),
                "kube-system_cilium_apps_DaemonSet",
            ),
            (
                obj("v1", "ConfigMap", "kube-system", "cilium-config"),
                "kube-system_cilium-config__ConfigMap",
            ),
            (
                obj("rbac.authorization.k8s.io/v1", "ClusterRole", "", "cilium"),
                "_cilium_rbac.authorization.k8s.io_ClusterRole",
            ),
            (
                obj(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    "",
                    "ciliumnetworkpolicies.cilium.io",
                ),
                "_ciliumnetworkpolicies.cilium.io_apiextensions.k8s.io_CustomResourceDefinition",
            ),
            (
                obj(
                    "rbac.authorization.k8s.io/v1",
                    "ClusterRole",
                    "",
                    "system:cilium",
                ),
                "_system__cilium_rbac.authorization.k8s.io_ClusterRole",
            ),
        ];
        for (object, key) in cases {
            assert_eq!(object.key().unwrap(), key, "{object}");
            assert_eq!(parse_key(key).unwrap(), object, "{key}");
        }
    }

    /// Covers: R6.1 (a key Talos could not read back is never written)
    #[test]
    fn a_name_with_an_underscore_is_refused_not_written() {
        let e = obj("v1", "ConfigMap", "kube-system", "a_b")
            .key()
            .unwrap_err();
        assert!(matches!(e, InventoryError::Unwritable { .. }), "{e}");
        assert!(parse_key("kube-system_a_b__ConfigMap").is_err());
        assert!(parse_key("nounderscore").is_err());
        assert!(parse_key("ns_name_Kind").is_err());
    }

    /// Covers: R6.1 (one bad key fails the whole inventory, as for Talos)
    #[test]
    fn one_bad_key_fails_the_inventory() {
        let mut data = BTreeMap::new();
        data.insert(
            "kube-system_cilium_apps_DaemonSet".to_string(),
            String::new(),
        );
        assert_eq!(inventory_objects(&data).unwrap().len(), 1);
        data.insert("bad".to_string(), String::new());
        assert!(inventory_objects(&data).is_err());
    }

    #[test]
    fn ownership_is_the_exact_inventory_id() {
        let mut a = BTreeMap::new();
        assert!(!owned_by_inventory(&a));
        a.insert(
            OWNING_INVENTORY_ANNOTATION.to_string(),
            INVENTORY_NAME.to_string(),
        );
        assert!(owned_by_inventory(&a));
        a.insert(OWNING_INVENTORY_ANNOTATION.to_string(), "other".to_string());
        assert!(!owned_by_inventory(&a));
    }
}
