//! What the TalosCluster reconcile reads before it decides: its machines
//! (from the shared store), the hand-over check, the ichor-cni Job, Talos's
//! inventory, Ichor's Cilium release, the CNI DaemonSets and the
//! cluster's backups (for `BackupHealthy`).

use ichor_api::cni::CniWorkload;
use ichor_api::conditions::{self, types};
use ichor_api::{CniPreset, TalosCluster, TalosMachine};
use ichor_cilium::ClusterSettings;
use ichor_reconcile::cluster::{
    HandoverCheck, InvalidValues, InventoryObserved, Observed, inline_pending,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use crate::{Context, Error, Result};

pub(super) async fn read(ctx: &Context, cluster: &TalosCluster) -> Result<Observed> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let machines = machines_of(ctx, &namespace, &name).await?;
    let mut observed = Observed {
        machines,
        ..Observed::default()
    };
    if cluster.spec.cni.preset == CniPreset::Cilium {
        observed.cilium_release = read_cilium_release(ctx).await;
        observed.handover = Some(read_handover(ctx, cluster, observed.machines.len()).await?);
        if let Some(Ok(check)) = &observed.handover
            && !check.at_desired_hash()
            && ctx.config.cni_job_image.is_some()
        {
            observed.job = super::cni_job::read(
                &ctx.client,
                &ctx.config.system_namespace,
                cluster,
                &check.desired_hash,
            )
            .await?;
        }
        let handed_over = cluster
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER));
        if let Some(Ok(check)) = &observed.handover
            && check.complete()
            && (!handed_over || !inline_pending(cluster, &observed.machines).is_empty())
        {
            observed.inventory = Some(read_inventory(ctx, cluster).await?);
        }
    }
    observed.cni_workloads = read_cni_workloads(ctx).await?;
    observed.backup_health = crate::backup::health::read(ctx, cluster).await?;
    Ok(observed)
}

/// Ichor's Cilium release from its records; `None` without a record. A
/// failed read is logged and leaves the field out: the hand-over check,
/// which reads the same records, reports the failure.
async fn read_cilium_release(ctx: &Context) -> Option<ichor_api::CiliumReleaseStatus> {
    let storage_ns = &ctx.config.cilium_storage_namespace;
    match ichor_helm::SecretStorage::new(ctx.client.clone(), storage_ns)
        .history(ichor_cilium::RELEASE_NAME)
        .await
    {
        Ok(history) => cilium_release_status(&history, storage_ns),
        Err(e) => {
            tracing::debug!(error = %ichor_api::error_text::chain(&e), "reading Ichor's Cilium release records");
            None
        }
    }
}

/// What `status.cni.release` says of a release's history (oldest first):
/// the newest revision, its status, chart version and deploy time, and the
/// newest deployed revision when that is an older one.
pub fn cilium_release_status(
    history: &[ichor_helm::StoredRelease],
    storage_ns: &str,
) -> Option<ichor_api::CiliumReleaseStatus> {
    let newest = history.last()?;
    let deployed = ichor_helm::storage::newest_deployed(history).map(|s| s.release.version);
    let release = &newest.release;
    Some(ichor_api::CiliumReleaseStatus {
        name: release.name.clone(),
        storage_namespace: storage_ns.to_string(),
        revision: i64::from(release.version),
        status: release.status().as_str().to_string(),
        chart_version: release.chart_version().map(str::to_string),
        last_deployed: release
            .info
            .as_ref()
            .and_then(|i| i.last_deployed)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        deployed_revision: deployed.filter(|d| *d != release.version).map(i64::from),
    })
}

/// The deployed release's objects and Talos's inventory.
async fn read_inventory(ctx: &Context, cluster: &TalosCluster) -> Result<InventoryObserved> {
    let release =
        ichor_cilium::deployed_release(ctx.client.clone(), &ctx.config.cilium_storage_namespace)
            .await
            .map_err(|e| Error::Cilium {
                namespace: cluster.namespace().unwrap_or_default(),
                cluster: cluster.name_any(),
                source: Box::new(e),
            })?;
    let release = match release {
        Some(r) => super::bootstrap_inventory::release_objects(
            &r.manifest,
            &ctx.config.cilium_release_namespace,
        )
        .map_err(|e| Error::Cilium {
            namespace: cluster.namespace().unwrap_or_default(),
            cluster: cluster.name_any(),
            source: Box::new(ichor_cilium::Error::Helm(ichor_helm::Error::Manifest {
                release: ichor_cilium::RELEASE_NAME.into(),
                source: e,
            })),
        })?,
        None => Vec::new(),
    };
    Ok(InventoryObserved {
        release,
        config_map: super::bootstrap_inventory::read(&ctx.client).await?,
    })
}

/// The readable TalosMachines of `namespace/name`, from the store the
/// machine watch fills (a list per reconcile would read every machine of
/// the namespace for every machine that changed).
async fn machines_of(ctx: &Context, namespace: &str, name: &str) -> Result<Vec<TalosMachine>> {
    if !ctx.machines.ready().await {
        // The watch is gone: the controller is stopping.
        return Ok(Vec::new());
    }
    Ok(ctx
        .machines
        .store
        .state()
        .iter()
        .filter_map(|m| m.0.as_ref().ok())
        .filter(|m| m.namespace().as_deref() == Some(namespace) && m.spec.cluster_ref.name == name)
        .cloned()
        .collect())
}

/// The hand-over check for the cluster's effective values, or why they
/// cannot be derived.
async fn read_handover(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: usize,
) -> Result<std::result::Result<HandoverCheck, InvalidValues>> {
    let node_count = node_count(ctx, machines).await?;
    let settings = match ClusterSettings::from_cluster(cluster, node_count) {
        Ok(s) => s,
        Err(e) => return Ok(Err(InvalidValues(ichor_api::error_text::chain(&e)))),
    };
    ichor_cilium::check_handover(
        ctx.client.clone(),
        &ctx.config.cilium_storage_namespace,
        &ctx.config.cilium_release_namespace,
        &settings,
    )
    .await
    .map(Ok)
    .map_err(|e| Error::Cilium {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
        source: Box::new(e),
    })
}

/// The node count the effective values depend on ([`ichor_cilium::node_count_rule`]),
/// from the store the Node watch fills.
async fn node_count(ctx: &Context, machines: usize) -> Result<u32> {
    let nodes = match ctx.nodes.ready().await {
        true => ctx.nodes.store.len(),
        false => Api::<Node>::all(ctx.client.clone())
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::kube("listing the Nodes"))?
            .items
            .len(),
    };
    Ok(ichor_cilium::node_count_rule(nodes, machines))
}

/// The DaemonSets of every namespace that the one detector recognises as
/// a CNI's (`ichor_api::cni`, the reading adopt makes too).
async fn read_cni_workloads(ctx: &Context) -> Result<Vec<CniWorkload>> {
    let daemonsets = Api::<DaemonSet>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the DaemonSets"))?;
    Ok(daemonsets
        .items
        .iter()
        .filter_map(CniWorkload::of_daemonset)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(version: u32, status: &str) -> ichor_helm::StoredRelease {
        let release: ichor_helm::Release = serde_json::from_value(serde_json::json!({
            "name": "cilium", "version": version, "namespace": "kube-system", "manifest": "",
            "info": {"status": status, "last_deployed": "2026-01-02T03:04:05Z"},
            "chart": {"metadata": {"name": "cilium", "version": format!("1.18.{version}")}}
        }))
        .unwrap();
        ichor_helm::StoredRelease {
            release,
            resource_version: None,
            labels: Default::default(),
        }
    }

    /// Covers: the UI's cluster page (docs/ui.md): the Cilium release status read from its record
    #[test]
    fn the_cilium_release_status_is_the_newest_record_and_the_deployed_one_behind_it() {
        assert_eq!(cilium_release_status(&[], "ichor-system"), None);
        let deployed = cilium_release_status(
            &[stored(1, "superseded"), stored(2, "deployed")],
            "ichor-system",
        )
        .unwrap();
        assert_eq!(
            deployed,
            ichor_api::CiliumReleaseStatus {
                name: "cilium".into(),
                storage_namespace: "ichor-system".into(),
                revision: 2,
                status: "deployed".into(),
                chart_version: Some("1.18.2".into()),
                last_deployed: Some("2026-01-02T03:04:05Z".into()),
                deployed_revision: None,
            }
        );
        let failed = cilium_release_status(
            &[stored(1, "deployed"), stored(2, "failed")],
            "ichor-system",
        )
        .unwrap();
        assert_eq!((failed.revision, failed.status.as_str()), (2, "failed"));
        assert_eq!(failed.deployed_revision, Some(1));
    }
}
