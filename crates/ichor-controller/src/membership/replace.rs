//! A control plane that replaces another (`spec.replaces`): once it has
//! joined and etcd lists its member as a healthy voter beside the old one,
//! the old TalosMachine gets `spec.removal` (Wipe unless set) and is
//! deleted, so its removal runs. Before that the old node stays as it is.

use ichor_api::{MachineRemoval, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::membership::replace::old_may_go;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;

use super::view;
use super::{event, membership, reasons, write};
use crate::{Context, Error, Result};

pub(super) async fn replace_old(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<()> {
    let Some(old_name) = machine.spec.replaces.as_deref() else {
        return Ok(());
    };
    let namespace = machine.namespace().unwrap_or_default();
    let api = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace);
    let old = api.get_opt(old_name).await.map_err(Error::kube(format!(
        "reading TalosMachine {namespace}/{old_name}"
    )))?;
    let Some(old) = old.filter(|o| o.metadata.deletion_timestamp.is_none()) else {
        return Ok(());
    };
    let others = view::cluster_machines(ctx, machine);
    let verdict = match view::etcd(ctx, cluster, &others, machine).await {
        Some(etcd) => {
            old_may_go(&etcd.members, &machine.name_any(), old_name).map_err(|why| why.to_string())
        }
        None => Err("no control plane answers with etcd's members".to_string()),
    };
    let message = match verdict {
        Err(why) => format!("replaces {old_name} once etcd counts it: {why}"),
        Ok(()) => {
            if old.spec.removal.is_none() {
                let patch = serde_json::json!({ "spec": { "removal": MachineRemoval::default() } });
                api.patch(old_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(Error::kube(format!(
                        "setting spec.removal of TalosMachine {namespace}/{old_name}"
                    )))?;
            }
            api.delete(old_name, &DeleteParams::default())
                .await
                .map_err(Error::kube(format!(
                    "deleting TalosMachine {namespace}/{old_name}"
                )))?;
            event(
                ctx,
                machine,
                EventType::Normal,
                reasons::LEAVING,
                format!(
                    "{} counts in etcd: {old_name}, which it replaces, is removed",
                    machine.name_any()
                ),
            )
            .await;
            format!("joined; {old_name}, which it replaces, is being removed")
        }
    };
    membership(status).message = Some(message);
    write(ctx, machine, status).await
}
