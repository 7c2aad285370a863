//! A deleted TalosMachine's removal: planned into status (refused with
//! nothing written to a node when etcd would lose its majority, when it is
//! the last control plane, or when the node does not answer without
//! `force`), then step by step, each step's intent written before it runs
//! (`ichor_reconcile::membership::removal`). The reset is sent once per
//! node whatever happens to the controller meanwhile.

use std::time::Duration;

use ichor_api::{
    MachineRole, MembershipPhase, RemovalMode, TalosCluster, TalosMachine, TalosMachineStatus,
};
use ichor_reconcile::membership::quorum::{Leave, may_leave};
use ichor_reconcile::membership::record::{progress_of, record};
use ichor_reconcile::membership::removal::{self, Next, Options, Progress, Seen, Step, plan, sent};
use ichor_talos_client::{ResetRequest, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::view::{self, EtcdView, STAGE_RESETTING};
use super::{event, membership, node, reasons, set, set_finalizer, write};
use crate::{Context, Result};

/// How long each step may wait for its effect before the removal stops.
const STEP_BOUND: Duration = Duration::from_secs(300);
/// How soon a removal looks again while a step waits.
const POLL: Duration = Duration::from_secs(2);

/// What one look at the machine's node gave.
struct Look {
    seen: Seen,
    /// The node's admin client, when it answers.
    talos: Option<TalosClient>,
    /// The node's etcd member id, and etcd as the control planes see it.
    member_id: Option<u64>,
    etcd: Option<EtcdView>,
}

pub(super) async fn remove(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<Action> {
    let run = Run {
        machine,
        cluster,
        ctx,
        name: machine.name_any(),
    };
    let look = run.look().await?;
    let progress = match status.membership.as_ref().and_then(progress_of) {
        Some(p) => p,
        None => {
            let control = machine.spec.role == MachineRole::Controlplane;
            match planned(machine, &look, control) {
                Ok(p) => {
                    let steps: Vec<&str> = p.plan.iter().map(|s| s.as_str()).collect();
                    let note = format!("removing node {}: {}", run.name, steps.join(", "));
                    event(ctx, machine, EventType::Normal, reasons::LEAVING, note).await;
                    p
                }
                Err(why) => return run.refuse(status, why.text()).await,
            }
        }
    };
    run.drive(status, progress, look).await
}

/// One removal's reads and writes.
struct Run<'a> {
    machine: &'a TalosMachine,
    cluster: &'a TalosCluster,
    ctx: &'a Context,
    name: String,
}

impl Run<'_> {
    async fn look(&self) -> Result<Look> {
        look(self.machine, self.cluster, self.ctx, &self.name).await
    }

    /// Steps through the removal until it waits, stops or ends.
    async fn drive(
        &self,
        status: &mut TalosMachineStatus,
        mut progress: Progress,
        mut look: Look,
    ) -> Result<Action> {
        let (mut dirty, mut acted) = (true, Vec::new());
        for _ in 0..32 {
            let now = (self.ctx.clock)();
            match removal::next(&progress, &look.seen, &now, STEP_BOUND) {
                Next::Record(p) => {
                    progress = p;
                    dirty = true;
                }
                Next::Act(step) if acted.contains(&step) => {
                    // Sent this pass; its effect is looked for on the next one.
                    let why = format!("{step}: waiting for its effect");
                    return self.pause(status, &progress, &why, &now).await;
                }
                Next::Act(Step::Reset) => {
                    progress = self.reset(status, &progress, &look, &now).await?;
                    (dirty, look) = (false, self.look().await?);
                    acted.push(Step::Reset);
                }
                Next::Act(step) => {
                    if dirty {
                        keep(status, &progress, &format!("{step}: running"), &now);
                        write(self.ctx, self.machine, status).await?;
                        dirty = false;
                    }
                    act(
                        step,
                        self.machine,
                        self.cluster,
                        self.ctx,
                        &look,
                        &self.name,
                    )
                    .await?;
                    progress = sent(&progress, step);
                    acted.push(step);
                    look = self.look().await?;
                }
                Next::Wait(why) => return self.pause(status, &progress, &why, &now).await,
                Next::Fail(why) => return self.fail(status, &progress, why, &now).await,
                Next::Done => return self.done(status, &now).await,
            }
        }
        self.pause(status, &progress, "working", &(self.ctx.clock)())
            .await
    }

    /// The Reset, recorded as sent before it is sent: a controller killed
    /// between the two never sends a second one.
    async fn reset(
        &self,
        status: &mut TalosMachineStatus,
        progress: &Progress,
        look: &Look,
        now: &Time,
    ) -> Result<Progress> {
        let progress = sent(progress, Step::Reset);
        let why = "Reset: sent; waiting for the node to come back in maintenance mode";
        keep(status, &progress, why, now);
        write(self.ctx, self.machine, status).await?;
        let (m, c, ctx) = (self.machine, self.cluster, self.ctx);
        if let Err(e) = act(Step::Reset, m, c, ctx, look, &self.name).await {
            if refused(&e) {
                membership(status).reset_sent_boot_id = None;
                write(ctx, m, status).await?;
            }
            return Err(e);
        }
        let boot = look.seen.boot_id.as_deref().unwrap_or("unknown");
        let note = format!("graceful reset sent to node {} (boot id {boot})", self.name);
        event(ctx, m, EventType::Normal, reasons::RESET_SENT, note).await;
        Ok(progress)
    }

    async fn pause(
        &self,
        status: &mut TalosMachineStatus,
        progress: &Progress,
        why: &str,
        now: &Time,
    ) -> Result<Action> {
        keep(status, progress, why, now);
        write(self.ctx, self.machine, status).await?;
        Ok(Action::requeue(POLL))
    }

    /// A step that did not finish within its bound: the node stays as it
    /// is, the status says why, and the step is tried again, bounded anew.
    async fn fail(
        &self,
        status: &mut TalosMachineStatus,
        progress: &Progress,
        why: String,
        now: &Time,
    ) -> Result<Action> {
        let message = format!(
            "stopped: {why}; the node stays as it is; Ichor tries the step again in a minute"
        );
        keep(status, progress, &message, now);
        membership(status).since = Some(now.clone());
        write(self.ctx, self.machine, status).await?;
        let (m, ctx) = (self.machine, self.ctx);
        event(ctx, m, EventType::Warning, reasons::REMOVAL_REFUSED, why).await;
        Ok(Action::requeue(Duration::from_secs(60)))
    }

    async fn refuse(&self, status: &mut TalosMachineStatus, why: String) -> Result<Action> {
        set(
            status,
            MembershipPhase::Refused,
            why.clone(),
            &(self.ctx.clock)(),
        );
        write(self.ctx, self.machine, status).await?;
        let (m, ctx) = (self.machine, self.ctx);
        event(ctx, m, EventType::Warning, reasons::REMOVAL_REFUSED, why).await;
        Ok(Action::requeue(Duration::from_secs(30)))
    }

    async fn done(&self, status: &mut TalosMachineStatus, now: &Time) -> Result<Action> {
        let name = &self.name;
        set(
            status,
            MembershipPhase::Removed,
            format!("node {name} removed"),
            now,
        );
        write(self.ctx, self.machine, status).await?;
        let note = format!("node {name} removed from the cluster");
        event(
            self.ctx,
            self.machine,
            EventType::Normal,
            reasons::REMOVED,
            note,
        )
        .await;
        set_finalizer(self.ctx, self.machine, false).await?;
        Ok(Action::await_change())
    }
}

/// Writes the progress and a message into status (phase Leaving).
fn keep(status: &mut TalosMachineStatus, progress: &Progress, message: &str, now: &Time) {
    let m = membership(status);
    if m.phase != MembershipPhase::Leaving {
        m.since = Some(now.clone());
    }
    record(progress, m);
    m.message = Some(message.to_string());
}

/// Why a removal is refused (nothing written to the node).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("not removed: {0}")]
    Quorum(ichor_reconcile::membership::quorum::QuorumRefusal),
    #[error("not removed: {0}")]
    Plan(ichor_reconcile::membership::removal::PlanRefusal),
    #[error(
        "not removed: no control plane answers with etcd's members, so whether {name} may leave cannot be judged"
    )]
    NoEtcd { name: String },
}

impl Refusal {
    /// The refusal and what to do, for the status.
    fn text(&self) -> String {
        let help = match self {
            Refusal::Quorum(r) => r.help(),
            Refusal::Plan(r) => r.help(),
            Refusal::NoEtcd { .. } => "bring a control plane back",
        };
        format!("{self}; {help}")
    }
}

/// The removal's plan, or why it is refused.
fn planned(machine: &TalosMachine, look: &Look, control: bool) -> Result<Progress, Refusal> {
    let removal = machine.spec.removal.unwrap_or_default();
    let name = machine.name_any();
    // A node back in maintenance mode has nothing left to drain or reset.
    let answers = look.seen.node_answers;
    let options = Options {
        control_plane: control,
        keep_node: removal.mode == RemovalMode::KeepNode,
        force: removal.force || look.seen.maintenance,
    };
    let leave = if control {
        let Some(etcd) = &look.etcd else {
            return Err(Refusal::NoEtcd { name });
        };
        may_leave(&etcd.members, &name, answers).map_err(Refusal::Quorum)?
    } else {
        Leave::NotAMember
    };
    let plan = plan(&name, options, answers, &leave).map_err(Refusal::Plan)?;
    Ok(Progress {
        plan,
        done: 0,
        intent: None,
    })
}

async fn look(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    name: &str,
) -> Result<Look> {
    let mut seen = Seen::default();
    let talos = match view::admin(ctx, cluster, machine, &machine.spec.address).await {
        Ok(c) => c.version("").await.ok().map(|_| c),
        Err(_) => None,
    };
    if let Some(c) = &talos {
        seen.node_answers = true;
        seen.boot_id = c.boot_id("").await.ok();
        seen.resetting = c
            .machine_status("")
            .await
            .is_ok_and(|s| s.stage == STAGE_RESETTING);
    } else if let Some(m) = view::maintenance(ctx, &machine.spec.address).await {
        seen.maintenance = true;
        seen.boot_id = m.client.boot_id("").await.ok();
    }
    if let Some(n) = view::node(ctx, name).await? {
        seen.node_exists = true;
        seen.unschedulable = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        seen.pods_left = node::pods_left(ctx, name).await?;
    }
    let (mut member_id, mut etcd) = (None, None);
    if machine.spec.role == MachineRole::Controlplane {
        let others = view::cluster_machines(ctx, machine);
        etcd = view::etcd(ctx, cluster, &others, machine).await;
        if let Some(e) = &etcd {
            let own = e.members.iter().find(|m| m.name == name);
            member_id = own.map(|m| m.id);
            seen.member_present = own.is_some();
            seen.member_is_leader = member_id.is_some() && member_id == e.leader;
        } else {
            // Unknown: assume it is still there, so nothing counts it gone.
            seen.member_present = true;
        }
    }
    Ok(Look {
        seen,
        talos,
        member_id,
        etcd,
    })
}

/// Carries out one step.
async fn act(
    step: Step,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    look: &Look,
    name: &str,
) -> Result<()> {
    let talos_error = |e| crate::machine::talos_error(machine, e);
    let Some(on_node) = look.talos.as_ref().filter(|_| step.on_node()) else {
        if step.on_node() {
            // It stopped answering since the look: the step waits, bounded.
            tracing::info!(machine = %name, step = %step, "the node does not answer; the step waits");
            return Ok(());
        }
        return act_elsewhere(step, machine, cluster, ctx, look, name).await;
    };
    match step {
        Step::ForfeitLeadership => {
            // What counts is the leader seen next, not this answer.
            let _ = on_node.etcd_forfeit_leadership("").await;
            Ok(())
        }
        Step::LeaveEtcd => on_node.etcd_leave_cluster("").await.map_err(talos_error),
        Step::Reset => {
            // A node whose volumes cannot be listed gets STATE and EPHEMERAL wiped.
            let volumes = on_node.volume_labels("").await.unwrap_or_default();
            on_node
                .reset("", &ResetRequest::back_to_maintenance(&volumes))
                .await
                .map(|_| ())
                .map_err(talos_error)
        }
        _ => act_elsewhere(step, machine, cluster, ctx, look, name).await,
    }
}

/// The steps carried out through the Kubernetes API or a peer.
async fn act_elsewhere(
    step: Step,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    look: &Look,
    name: &str,
) -> Result<()> {
    match step {
        Step::Cordon => node::cordon(ctx, name).await,
        Step::Drain => node::evict(ctx, name, &look.seen.pods_left).await,
        Step::RemoveMember => {
            let (Some(id), Some(peer)) = (
                look.member_id,
                look.etcd.as_ref().and_then(|e| e.peer.clone()),
            ) else {
                return Ok(());
            };
            let peer_machine = view::cluster_machines(ctx, machine)
                .into_iter()
                .find(|m| m.spec.address == peer)
                .unwrap_or_else(|| machine.clone());
            view::admin(ctx, cluster, &peer_machine, &peer)
                .await?
                .etcd_remove_member_by_id("", id)
                .await
                .map_err(|e| crate::machine::talos_error(&peer_machine, e))
        }
        Step::DeleteNode => node::delete(ctx, name).await,
        Step::ForfeitLeadership | Step::LeaveEtcd | Step::Reset => Ok(()),
    }
}

/// The node answered and refused the call: it took no reset.
fn refused(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Talos { source, .. } if matches!(**source, ichor_talos_client::Error::Status { .. }))
}

trait OnNode {
    /// The step is a call to the node's own Talos API.
    fn on_node(self) -> bool;
}

impl OnNode for Step {
    fn on_node(self) -> bool {
        matches!(
            self,
            Step::ForfeitLeadership | Step::LeaveEtcd | Step::Reset
        )
    }
}
