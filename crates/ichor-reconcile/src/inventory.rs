//! The last step of the CNI hand-over (R6.1, R10.4): the objects Ichor's
//! Cilium release took over leave Talos's bootstrap-manifests inventory, so a
//! later `talosctl upgrade-k8s` (whose manifests step prunes what its
//! inventory names and its manifests no longer hold) can never delete them.
//!
//! For each object of the release that the inventory names, the
//! `config.k8s.io/owning-inventory` annotation is stripped first and the
//! inventory entry removed after, so the inventory is the to-do list: a kill
//! between the two leaves the entries, and the rerun strips again (a no-op)
//! and removes them. Objects of the inventory that the release does not hold
//! stay: they are Talos's. Keys Ichor does not remove are left byte for byte.
//! Secrets and RBAC objects leave the inventory but keep the annotation
//! ([`never_written`]).
//!
//! Here the decision ([`decide`]) and which objects are never written
//! ([`never_written`]); the controller's `bootstrap_inventory` reads the
//! inventory and carries the step out.

use std::collections::BTreeMap;

use ichor_talos::bootstrap_inventory::InventoryObject;

/// Kinds that are never namespaced among what a Helm chart renders: an object
/// of another kind without a namespace lives in the release namespace.
const CLUSTER_SCOPED: &[&str] = &[
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "Namespace",
    "PriorityClass",
    "StorageClass",
    "IngressClass",
    "GatewayClass",
    "RuntimeClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "APIService",
    "PersistentVolume",
];

/// One object of the release as the inventory names it, with the
/// `apiVersion` to reach it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseObject {
    pub object: InventoryObject,
    pub api_version: String,
}

/// What the inventory step has left to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryStep {
    /// Release objects the inventory still names: their annotation goes first.
    pub strip: Vec<ReleaseObject>,
    /// The inventory's `data` without them.
    pub data: BTreeMap<String, String>,
}

/// One object of a release manifest as the inventory names it: an object
/// without a namespace is placed in `release_namespace` unless its kind is
/// cluster-scoped.
pub fn release_object(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    release_namespace: &str,
) -> ReleaseObject {
    let namespace = match namespace {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ if CLUSTER_SCOPED.contains(&kind) => String::new(),
        _ => release_namespace.to_string(),
    };
    ReleaseObject {
        object: InventoryObject::new(api_version, kind, &namespace, name),
        api_version: api_version.to_string(),
    }
}

/// The step left to do, `None` when the inventory names none of the
/// release's objects (or there is no inventory: Talos before 1.13, or a
/// cluster that never had one). Pure.
pub fn decide(
    release: &[ReleaseObject],
    inventory: Option<&BTreeMap<String, String>>,
) -> Option<InventoryStep> {
    let inventory = inventory?;
    let mut data = inventory.clone();
    let strip: Vec<ReleaseObject> = release
        .iter()
        .filter(|o| o.object.key().is_ok_and(|key| data.remove(&key).is_some()))
        .cloned()
        .collect();
    (!strip.is_empty()).then_some(InventoryStep { strip, data })
}

/// Objects whose annotation the controller leaves: Secrets (it never writes
/// one; ADR 0007), and RBAC roles and bindings (the API server lets a subject
/// update one only when it holds every right the role grants, which the
/// controller does not). Out of the inventory, such an object keeps an
/// annotation that no prune reads: the prune starts from the inventory.
pub fn never_written(o: &InventoryObject) -> bool {
    match o.group.as_str() {
        "" => o.kind == "Secret",
        "rbac.authorization.k8s.io" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release of three objects as the controller reads them from its
    /// manifest (the DaemonSet names no namespace).
    fn release(release_namespace: &str) -> Vec<ReleaseObject> {
        [
            ("v1", "ServiceAccount", Some("kube-system"), "cilium"),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "cilium",
            ),
            ("apps/v1", "DaemonSet", None, "cilium"),
        ]
        .into_iter()
        .map(|(api, kind, ns, name)| release_object(api, kind, ns, name, release_namespace))
        .collect()
    }

    fn inventory(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| (k.to_string(), String::new()))
            .collect()
    }

    /// Covers: R6.1, R10.4 (the release's objects leave the inventory; Talos's stay)
    #[test]
    fn the_release_objects_leave_the_inventory_and_talos_objects_stay() {
        let release = release("kube-system");
        let inv = inventory(&[
            "kube-system_cilium__ServiceAccount",
            "_cilium_rbac.authorization.k8s.io_ClusterRole",
            "kube-system_cilium_apps_DaemonSet",
            "kube-system_coredns_apps_Deployment",
        ]);
        let step = decide(&release, Some(&inv)).expect("a step");
        assert_eq!(step.strip.len(), 3);
        assert_eq!(
            step.data,
            inventory(&["kube-system_coredns_apps_Deployment"])
        );
        // The DaemonSet had no namespace in the manifest: the release namespace.
        assert_eq!(step.strip[2].object.namespace, "kube-system");
        assert_eq!(step.strip[1].object.namespace, "");
    }

    /// Covers: R6.1 (what the controller may not write keeps its annotation)
    #[test]
    fn secrets_and_rbac_objects_are_never_written() {
        let o = |api: &str, kind: &str| InventoryObject::new(api, kind, "kube-system", "x");
        assert!(never_written(&o("v1", "Secret")));
        assert!(never_written(&o(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole"
        )));
        assert!(never_written(&o(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding"
        )));
        assert!(!never_written(&o("v1", "ConfigMap")));
        assert!(!never_written(&o("apps/v1", "DaemonSet")));
    }

    /// Covers: R6.1 (idempotent: once done, nothing is left to do)
    #[test]
    fn a_clean_inventory_or_none_needs_nothing() {
        let release = release("kube-system");
        let inv = inventory(&["kube-system_coredns_apps_Deployment"]);
        assert_eq!(decide(&release, Some(&inv)), None);
        assert_eq!(decide(&release, None), None);
        let step = decide(
            &release,
            Some(&inventory(&["kube-system_cilium_apps_DaemonSet"])),
        )
        .unwrap();
        assert_eq!(decide(&release, Some(&step.data)), None);
    }

    /// Covers: R6.1 (a key Ichor does not remove is left as it is, even one
    /// Talos could not read)
    #[test]
    fn other_keys_are_left_byte_for_byte() {
        let release = release("kube-system");
        let inv = inventory(&["kube-system_cilium_apps_DaemonSet", "odd key"]);
        let step = decide(&release, Some(&inv)).unwrap();
        assert_eq!(step.data, inventory(&["odd key"]));
    }
}
