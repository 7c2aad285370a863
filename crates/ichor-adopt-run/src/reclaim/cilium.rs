//! Phase `cilium`: Cilium handed back as a plain Helm release.

use ichor_adopt::Refusal;
use ichor_adopt::reclaim::{self, CiliumChoice};
use ichor_helm::SecretStorage;
use ichor_helm::storage::StorageError;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::json;

use super::{
    HANDED_BACK_NAMESPACE, HELM_FIELD_MANAGER, ICHOR_FIELD_MANAGER, Reclaim, ReclaimError, failed,
};

/// Phase `cilium`: Cilium handed back as a plain Helm release. Once no
/// ichor-cni Job runs, every revision's record is written to kube-system
/// with Helm's own labels only (an existing copy must be the same), the
/// fields Ichor applied are handed to helm's field manager, and then the
/// records in ichor-system are deleted — in that order, so a kill leaves a
/// state the rerun finishes.
pub(super) async fn cilium(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    if !matches!(r.plan.cilium, CiliumChoice::HandBack { .. }) {
        return Ok(());
    }
    let jobs = Api::<Job>::namespaced(r.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    r.wait("the ichor-cni Job to finish", || async {
        Ok(jobs
            .list(&ListParams::default().labels("ichor.maesh.dev/cni-for"))
            .await
            .map_err(failed("reading the ichor-cni Jobs"))?
            .items
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or_default() > 0)
            .map(|j| {
                format!(
                    "Job {} is running",
                    j.metadata.name.clone().unwrap_or_default()
                )
            })
            .collect())
    })
    .await?;
    let ichors = SecretStorage::new(r.kube.clone(), ichor_cilium::STORAGE_NAMESPACE);
    let plain = SecretStorage::new(r.kube.clone(), HANDED_BACK_NAMESPACE);
    let history = ichors.history(ichor_cilium::RELEASE_NAME).await?;
    if let Some(pending) = history.iter().find(|s| s.release.status().is_pending()) {
        return Err(ReclaimError::Refused(vec![Refusal::new(format!(
            "Cilium's Helm release cilium became {} (revision {}) while reclaim ran: wait for that operation to finish, then run ichor reclaim again",
            pending.release.status(),
            pending.release.version
        ))]));
    }
    for stored in &history {
        let rel = &stored.release;
        match plain.create(rel).await {
            Ok(_) => {}
            Err(StorageError::AlreadyExists { .. }) => {
                let there = plain.get(&rel.name, rel.version).await?;
                if there.as_ref().map(|s| &s.release) != Some(rel) {
                    return Err(ReclaimError::Refused(vec![Refusal::new(format!(
                        "kube-system already holds revision {} of a Helm release cilium that differs from Ichor's record of it, so the two histories cannot be joined. Look at helm -n kube-system history cilium; remove the records that are not Cilium's, or rerun with --keep-cilium-record",
                        rel.version
                    ))]));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(deployed) = history
        .iter()
        .rev()
        .find(|s| s.release.status() == ichor_helm::Status::Deployed)
    {
        hand_fields_to_helm(r.kube, &deployed.release).await?;
    }
    for stored in &history {
        ichors
            .delete(&stored.release.name, stored.release.version)
            .await?;
    }
    r.say(&format!(
        "handed Cilium back: the records of Helm release cilium ({}) now live in kube-system; helm -n kube-system list shows it",
        reclaim::join_revisions(
            &history
                .iter()
                .map(|s| s.release.version)
                .collect::<Vec<_>>()
        )
    ));
    Ok(())
}

/// Every object of the release's manifest: the managedFields entries of
/// Ichor's field manager renamed to helm's, so the next `helm upgrade` (v4
/// applies server-side as `helm`) owns what it applies instead of
/// conflicting with a manager that is gone. An entry helm already has for
/// the same operation keeps helm's, and Ichor's is dropped.
async fn hand_fields_to_helm(
    kube: &kube::Client,
    release: &ichor_helm::Release,
) -> Result<(), ReclaimError> {
    let objects = ichor_helm::manifest::parse_manifest(&release.manifest).map_err(|source| {
        ReclaimError::Manifest {
            revision: release.version,
            source,
        }
    })?;
    for obj in objects {
        let (group, version) = obj.group_version();
        let gvk = GroupVersionKind::gvk(group, version, &obj.kind);
        let what = format!("{} {}", obj.kind, obj.name);
        let Ok((ar, caps)) = kube::discovery::pinned_kind(kube, &gvk).await else {
            // A kind no longer served has no object to hand over.
            continue;
        };
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => Api::namespaced_with(
                kube.clone(),
                obj.namespace.as_deref().unwrap_or(&release.namespace),
                &ar,
            ),
            kube::discovery::Scope::Cluster => Api::all_with(kube.clone(), &ar),
        };
        let Some(live) = api
            .get_opt(&obj.name)
            .await
            .map_err(failed(format!("reading {what}")))?
        else {
            continue;
        };
        let fields = live.metadata.managed_fields.clone().unwrap_or_default();
        let Some(handed) = fields_handed_to_helm(&fields) else {
            continue;
        };
        let patch = json!({"metadata": {
            "managedFields": handed,
            "resourceVersion": live.metadata.resource_version,
        }});
        api.patch(&obj.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(failed(format!("handing the fields of {what} to helm")))?;
    }
    Ok(())
}

/// `fields` with Ichor's entries renamed to helm's; `None` when Ichor has none.
pub(super) fn fields_handed_to_helm(
    fields: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>> {
    if !fields
        .iter()
        .any(|f| f.manager.as_deref() == Some(ICHOR_FIELD_MANAGER))
    {
        return None;
    }
    let key = |f: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
        (f.operation.clone(), f.subresource.clone())
    };
    let helms: Vec<_> = fields
        .iter()
        .filter(|f| f.manager.as_deref() == Some(HELM_FIELD_MANAGER))
        .map(key)
        .collect();
    Some(
        fields
            .iter()
            .filter_map(|f| {
                if f.manager.as_deref() != Some(ICHOR_FIELD_MANAGER) {
                    return Some(f.clone());
                }
                if helms.contains(&key(f)) {
                    return None;
                }
                let mut renamed = f.clone();
                renamed.manager = Some(HELM_FIELD_MANAGER.into());
                Some(renamed)
            })
            .collect(),
    )
}
