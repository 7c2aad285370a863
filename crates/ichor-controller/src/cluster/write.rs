//! What the TalosCluster reconcile writes: the decision's actions (the
//! ichor-cni Job, Talos's inventory), then the status.

use ichor_api::TalosCluster;
use ichor_reconcile::cluster::{ClusterAction, Decision};
use kube::ResourceExt as _;

use super::INVENTORY_RELEASED;
use crate::pipeline;
use crate::{Context, Result};

/// The actions, then the status.
pub(super) async fn write(
    ctx: &Context,
    cluster: &TalosCluster,
    decision: &Decision,
) -> Result<()> {
    for action in &decision.actions {
        match action {
            ClusterAction::StartJob { hash } => {
                let image = ctx.config.cni_job_image.as_deref().unwrap_or_default();
                super::cni_job::start(
                    &ctx.client,
                    &ctx.config.system_namespace,
                    cluster,
                    hash,
                    image,
                )
                .await?;
            }
            ClusterAction::DeleteFailedJob { name } => {
                super::cni_job::delete(&ctx.client, &ctx.config.system_namespace, name).await?;
            }
            ClusterAction::ReleaseInventory { config_map, step } => {
                super::bootstrap_inventory::release(&ctx.client, config_map, step).await?;
                pipeline::publish_on(
                    ctx,
                    "TalosCluster",
                    &cluster.metadata,
                    kube::runtime::events::EventType::Normal,
                    INVENTORY_RELEASED,
                    format!(
                        "removed {} objects of Helm release {} from Talos's bootstrap-manifests inventory {}/{} and their {} annotation, so talosctl upgrade-k8s cannot prune them",
                        step.strip.len(),
                        ichor_cilium::RELEASE_NAME,
                        ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
                        ichor_talos::bootstrap_inventory::INVENTORY_NAME,
                        ichor_talos::bootstrap_inventory::OWNING_INVENTORY_ANNOTATION,
                    ),
                )
                .await;
            }
        }
    }
    let namespace = cluster.namespace().unwrap_or_default();
    pipeline::write_status::<TalosCluster>(
        &ctx.client,
        &namespace,
        &cluster.name_any(),
        &decision.status,
    )
    .await
}
