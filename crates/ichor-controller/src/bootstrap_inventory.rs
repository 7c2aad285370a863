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
//! [`decide`] is the decision (pure); [`read`] and [`release`] the I/O.

use std::collections::BTreeMap;

use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, InventoryObject, OWNING_INVENTORY_ANNOTATION,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{Error, Result};

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

/// The objects of a release manifest (Helm's rendered manifest, hooks
/// excluded), an object without a namespace placed in `release_namespace`
/// unless its kind is cluster-scoped.
pub fn release_objects(
    manifest: &str,
    release_namespace: &str,
) -> std::result::Result<Vec<ReleaseObject>, ichor_helm::manifest::ManifestError> {
    Ok(ichor_helm::manifest::parse_manifest(manifest)?
        .into_iter()
        .map(|o| {
            let namespace = match o.namespace.as_deref() {
                Some(ns) if !ns.is_empty() => ns.to_string(),
                _ if CLUSTER_SCOPED.contains(&o.kind.as_str()) => String::new(),
                _ => release_namespace.to_string(),
            };
            ReleaseObject {
                object: InventoryObject::new(&o.api_version, &o.kind, &namespace, &o.name),
                api_version: o.api_version,
            }
        })
        .collect())
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

/// The inventory ConfigMap, `None` when there is none.
pub async fn read(client: &kube::Client) -> Result<Option<ConfigMap>> {
    Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
        .get_opt(INVENTORY_NAME)
        .await
        .map_err(Error::kube(format!(
            "reading ConfigMap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}"
        )))
}

/// Does `step` on the inventory read as `inventory`: strips the annotation of
/// each object (one gone meanwhile is fine), then replaces the inventory's
/// `data` at the resource version read (a concurrent writer makes it fail,
/// and the next reconcile decides again).
pub async fn release(
    client: &kube::Client,
    inventory: &ConfigMap,
    step: &InventoryStep,
) -> Result<()> {
    for o in step.strip.iter().filter(|o| !never_written(&o.object)) {
        strip_annotation(client, o).await?;
    }
    let mut cm = inventory.clone();
    cm.data = Some(step.data.clone());
    Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
        .replace(INVENTORY_NAME, &PostParams::default(), &cm)
        .await
        .map_err(Error::kube(format!(
            "removing {} objects of Helm release {} from ConfigMap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}",
            step.strip.len(),
            ichor_cilium::RELEASE_NAME
        )))?;
    Ok(())
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

/// Removes the owning-inventory annotation of one object (a JSON merge patch
/// of that key alone: nothing else of the object is touched).
async fn strip_annotation(client: &kube::Client, o: &ReleaseObject) -> Result<()> {
    let (group, version) = match o.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", o.api_version.as_str()),
    };
    let what = format!(
        "the {OWNING_INVENTORY_ANNOTATION} annotation of {}",
        o.object
    );
    let gvk = GroupVersionKind::gvk(group, version, &o.object.kind);
    let (resource, _) = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        // The kind is not served any more: nothing of it to strip.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(Error::kube(format!("discovering {}", o.api_version))(e)),
    };
    let api: Api<DynamicObject> = match o.object.namespace.as_str() {
        "" => Api::all_with(client.clone(), &resource),
        ns => Api::namespaced_with(client.clone(), ns, &resource),
    };
    let patch = json!({"metadata": {"annotations": {OWNING_INVENTORY_ANNOTATION: null}}});
    match api
        .patch(
            &o.object.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("removing {what}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "---\n# Source: cilium/templates/a.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: cilium\nrules: []\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: cilium\nspec: {}\n";

    fn inventory(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| (k.to_string(), String::new()))
            .collect()
    }

    /// Covers: R6.1, R10.4 (the release's objects leave the inventory; Talos's stay)
    #[test]
    fn the_release_objects_leave_the_inventory_and_talos_objects_stay() {
        let release = release_objects(MANIFEST, "kube-system").unwrap();
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
        let release = release_objects(MANIFEST, "kube-system").unwrap();
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
        let release = release_objects(MANIFEST, "kube-system").unwrap();
        let inv = inventory(&["kube-system_cilium_apps_DaemonSet", "odd key"]);
        let step = decide(&release, Some(&inv)).unwrap();
        assert_eq!(step.data, inventory(&["odd key"]));
    }
}
