//! A control plane that replaces another (`spec.replaces`).
//!
//! A healthy old one: once the new one has joined and etcd lists its
//! member as a healthy voter beside the old one, the old TalosMachine gets
//! `spec.removal` (Wipe unless set) and is deleted, so its removal runs.
//! Before that the old node stays as it is.
//!
//! A failed old one (its member listed but not a healthy voter): before
//! the new one joins, the old TalosMachine gets `spec.removal` (forced when
//! its node does not answer) and is deleted, so its removal has a peer
//! remove its member by id and deletes its Node; no Reset is sent to a
//! node that does not answer. The new one waits in maintenance mode until
//! etcd no longer lists the old member, then joins.

use std::time::Duration;

use ichor_api::{MachineRemoval, MembershipPhase, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::membership::replace::{Failed, Order, old_may_go, order};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::view;
use super::{event, membership, reasons, set, write};
use crate::{Context, Error, Result};

/// How soon a join that waits on the old control plane looks again.
const POLL: Duration = Duration::from_secs(2);

pub(super) async fn replace_old(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<()> {
    let Some(old_name) = machine.spec.replaces.as_deref() else {
        return Ok(());
    };
    let old = read_old(ctx, machine, old_name).await?;
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
        Ok(()) if old.spec.hold => held(old_name),
        Ok(()) => {
            let removal = old.spec.removal.unwrap_or_default();
            start_removal(ctx, &old, removal, true).await?;
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

/// Before a replacing control plane joins: a failed old one is removed
/// first. `Some(action)` while the join waits on it (status written);
/// `None` when the join may go on (the old one counts, or is gone from
/// etcd).
pub(super) async fn before_join(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<Option<Action>> {
    let Some(old_name) = machine.spec.replaces.as_deref() else {
        return Ok(None);
    };
    // Nothing is decided for a held machine, nor for one whose node is not
    // waiting in maintenance mode (its join is not this reconcile's).
    if machine.spec.hold
        || view::maintenance(ctx, &machine.spec.address)
            .await
            .is_none()
    {
        return Ok(None);
    }
    let Some(old) = read_old(ctx, machine, old_name).await? else {
        return Ok(None);
    };
    let others = view::cluster_machines(ctx, machine);
    let Some(etcd) = view::etcd(ctx, cluster, &others, machine).await else {
        // The join waits for etcd's members itself, and says so.
        return Ok(None);
    };
    let listed = etcd.members.iter().any(|m| m.name == old_name);
    let deleting = old.metadata.deletion_timestamp.is_some();
    if deleting && !listed {
        return Ok(None);
    }
    let answers = match view::admin(ctx, cluster, &old, &old.spec.address).await {
        Ok(c) => c.version("").await.is_ok(),
        Err(_) => false,
    };
    let (now, name) = ((ctx.clock)(), machine.name_any());
    let why = match order(&etcd.members, old_name, answers) {
        Order::JoinFirst if !deleting => return Ok(None),
        Order::RemoveOldFirst { failed } if old.spec.hold && !deleting => {
            format!("{failed}; {}", held(old_name))
        }
        Order::RemoveOldFirst { failed } if !deleting => {
            start_removal(ctx, &old, removal_of(&old, &failed), true).await?;
            announce(ctx, machine, &failed).await;
            format!(
                "{failed}: it is removed first (a peer removes its member by id, its Node is deleted); {name} joins once etcd no longer lists it"
            )
        }
        order => {
            // Its removal runs; one refused because its node stopped
            // answering since is forced now.
            if let Order::RemoveOldFirst { failed } = order {
                start_removal(ctx, &old, removal_of(&old, &failed), false).await?;
            }
            let old_says = old
                .status
                .as_ref()
                .and_then(|s| s.membership.as_ref())
                .and_then(|m| m.message.clone())
                .unwrap_or_else(|| "its removal has not begun".into());
            format!("waiting for {old_name}, which it replaces, to leave etcd first: {old_says}")
        }
    };
    set(status, MembershipPhase::Joining, why, &now);
    membership(status).step = None;
    write(ctx, machine, status).await?;
    Ok(Some(Action::requeue(POLL)))
}

/// The old TalosMachine, `None` when it is gone.
async fn read_old(
    ctx: &Context,
    machine: &TalosMachine,
    old_name: &str,
) -> Result<Option<TalosMachine>> {
    let namespace = machine.namespace().unwrap_or_default();
    Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(old_name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosMachine {namespace}/{old_name}"
        )))
}

fn held(old_name: &str) -> String {
    format!(
        "{old_name}, which it replaces, is held: release it (spec.hold: false) so that its removal runs; deleting a held machine only forgets it and would leave its etcd member behind"
    )
}

/// The removal of a failed old control plane: forced when its node does
/// not answer (its member removed by id from a peer, its Node deleted,
/// nothing written to it).
fn removal_of(old: &TalosMachine, failed: &Failed) -> MachineRemoval {
    let asked = old.spec.removal.unwrap_or_default();
    MachineRemoval {
        force: asked.force || failed.force(),
        ..asked
    }
}

async fn announce(ctx: &Context, machine: &TalosMachine, failed: &Failed) {
    let note = format!(
        "{failed}: it is removed before {} joins (its member by id from a peer, then its Node){}",
        machine.name_any(),
        if failed.force() {
            "; nothing is written to its node"
        } else {
            ""
        }
    );
    event(ctx, machine, EventType::Warning, reasons::LEAVING, note).await;
}

/// Writes `spec.removal` on the old machine when it differs, then deletes
/// it (`delete`): its finalizer runs the removal.
async fn start_removal(
    ctx: &Context,
    old: &TalosMachine,
    removal: MachineRemoval,
    delete: bool,
) -> Result<()> {
    let namespace = old.namespace().unwrap_or_default();
    let old_name = old.name_any();
    let api = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace);
    if old.spec.removal != Some(removal) {
        let patch = serde_json::json!({ "spec": { "removal": removal } });
        api.patch(&old_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "setting spec.removal of TalosMachine {namespace}/{old_name}"
            )))?;
    }
    if delete {
        api.delete(&old_name, &DeleteParams::default())
            .await
            .map_err(Error::kube(format!(
                "deleting TalosMachine {namespace}/{old_name}"
            )))?;
    }
    Ok(())
}
