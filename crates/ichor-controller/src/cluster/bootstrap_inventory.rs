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
//! The decision ([`decide`]) is `ichor_reconcile::inventory`'s (re-exported
//! here); [`release_objects`], [`read`] and [`release`] the I/O.

use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, OWNING_INVENTORY_ANNOTATION,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

pub use ichor_reconcile::inventory::{InventoryStep, ReleaseObject, decide, never_written};

use crate::{Error, Result};

/// The objects of a release manifest (Helm's rendered manifest, hooks
/// excluded), each placed as [`ichor_reconcile::inventory::release_object`] says.
pub fn release_objects(
    manifest: &str,
    release_namespace: &str,
) -> std::result::Result<Vec<ReleaseObject>, ichor_helm::manifest::ManifestError> {
    Ok(ichor_helm::manifest::parse_manifest(manifest)?
        .into_iter()
        .map(|o| {
            ichor_reconcile::inventory::release_object(
                &o.api_version,
                &o.kind,
                o.namespace.as_deref(),
                &o.name,
                release_namespace,
            )
        })
        .collect())
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
