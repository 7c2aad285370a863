//! Machines that come and go (ADR 0019): a TalosMachine whose node answers
//! in maintenance mode is joined ([`join`]); a deleted one is removed step
//! by step, each step's intent in its status before the step runs
//! ([`removal`]); a control plane with `spec.replaces` has the old machine
//! removed once it counts in etcd, or first when the old one has failed
//! ([`replace`]). The decisions are
//! `ichor_reconcile::membership`'s; here the reads and the writes.
//!
//! A released machine carries the finalizer [`FINALIZER`], so its deletion
//! runs the removal first. A held machine has none: Ichor writes nothing to
//! its node, so deleting it only forgets it (and `ichor reclaim`, which
//! holds the machines before it deletes them, never waits on a removal).

mod join;
mod node;
mod removal;
mod replace;
mod view;

use ichor_api::{
    MembershipPhase, MembershipStatus, TalosCluster, TalosMachine, TalosMachineStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::{Context, Error, Result};

/// The finalizer on every released TalosMachine.
pub const FINALIZER: &str = ichor_api::machine::MEMBERSHIP_FINALIZER;

/// Event reasons.
pub mod reasons {
    pub const JOINING: &str = "Joining";
    pub const JOINED: &str = "Joined";
    pub const LEAVING: &str = "Leaving";
    pub const REMOVED: &str = "Removed";
    pub const REMOVAL_REFUSED: &str = "RemovalRefused";
    pub const RESET_SENT: &str = "ResetSent";
}

/// What the machine reconcile does after membership looked.
pub(crate) enum Flow {
    /// Membership wrote the status and decided when to look again.
    Done(Action),
    /// The usual reconcile goes on (with the status membership may have changed).
    Continue,
}

/// Membership's part of a machine's reconcile, before the drift: the
/// removal of a deleted machine, the finalizer, a join, a replacement.
pub(crate) async fn reconcile(
    machine: &TalosMachine,
    cluster: Option<&TalosCluster>,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<Flow> {
    let has_finalizer = machine.finalizers().iter().any(|f| f == FINALIZER);
    if machine.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            // Nothing else keeps the machine: its history goes with it.
            crate::machine::history::forget(ctx, machine).await?;
            return Ok(Flow::Done(Action::await_change()));
        }
        let Some(cluster) = cluster.filter(|_| !machine.spec.hold) else {
            // Held (or its cluster is gone): nothing may be written to the
            // node, so the machine is only forgotten.
            set_finalizer(ctx, machine, false).await?;
            return Ok(Flow::Done(Action::await_change()));
        };
        return removal::remove(machine, cluster, ctx, status)
            .await
            .map(Flow::Done);
    }
    if has_finalizer == machine.spec.hold {
        set_finalizer(ctx, machine, !machine.spec.hold).await?;
    }
    let Some(cluster) = cluster else {
        return Ok(Flow::Continue);
    };
    // A failed control plane being replaced goes before its replacement joins.
    if join::wanted(status)
        && let Some(action) = replace::before_join(machine, cluster, ctx, status).await?
    {
        return Ok(Flow::Done(action));
    }
    if join::wanted(status)
        && let Some(action) = join::join(machine, cluster, ctx, status).await?
    {
        return Ok(Flow::Done(action));
    }
    if machine.spec.replaces.is_some() && membership(status).phase == MembershipPhase::Member {
        replace::replace_old(machine, cluster, ctx, status).await?;
    }
    Ok(Flow::Continue)
}

fn membership(status: &mut TalosMachineStatus) -> &mut MembershipStatus {
    status
        .membership
        .get_or_insert_with(MembershipStatus::default)
}

/// Sets the phase and message; `since` moves only with the phase.
fn set(status: &mut TalosMachineStatus, phase: MembershipPhase, message: String, now: &Time) {
    let m = membership(status);
    if m.phase != phase || m.since.is_none() {
        m.since = Some(now.clone());
    }
    m.phase = phase;
    m.message = Some(message);
}

async fn write(ctx: &Context, machine: &TalosMachine, status: &TalosMachineStatus) -> Result<()> {
    crate::pipeline::write_status::<TalosMachine>(
        &ctx.client,
        &machine.namespace().unwrap_or_default(),
        &machine.name_any(),
        status,
    )
    .await
}

async fn event(
    ctx: &Context,
    machine: &TalosMachine,
    type_: EventType,
    reason: &str,
    note: String,
) {
    crate::pipeline::publish_on(ctx, "TalosMachine", &machine.metadata, type_, reason, note).await;
}

/// Adds (`true`) or removes the finalizer (a merge patch of the list,
/// guarded by the resourceVersion read).
async fn set_finalizer(ctx: &Context, machine: &TalosMachine, present: bool) -> Result<()> {
    let mut list: Vec<String> = machine
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_string());
    }
    let patch = serde_json::json!({
        "metadata": { "finalizers": list, "resourceVersion": machine.resource_version() }
    });
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    match Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone already (the finalizer was the last one).
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "updating the finalizers of TalosMachine {namespace}/{name}"
        ))(e)),
    }
}
