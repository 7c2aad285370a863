//! The pure decisions of a TalosOperation (ADR 0011): its plan, which
//! machines act next, the step after a step, and the verdicts on what was
//! observed (etcd health, a node's return, a bound). No I/O here; the
//! controller's `operation` module reads, calls these, and writes.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::conditions::reasons;
use ichor_api::machine::MachineRole;
use ichor_api::operation::{
    MachineProgress, MachineStep, OperationKind, PlanEntry, PlannedAction, TalosOperationSpec,
    TalosOperationStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub mod backup_gate;
pub mod component;
pub mod duration;
pub mod ichor;
mod kubernetes;
pub mod manifests;
pub mod path;
pub mod pre_pull;
pub mod removed;
pub mod step;
pub mod support;
pub mod window;

pub use kubernetes::{
    ComponentArgs, NextComponent, PathRefused, REMOVED_API_RESOURCES, component_plan,
    component_verdict, image_tag, kubernetes_path, kubernetes_tag, lowest_version,
    machines_from_components, next_component, removed_api_refusal, removed_on_path, semver,
    version_path_refusal,
};
pub use step::{OperationBounds, StepOutcome};

/// The plan's words for a machine skipped because it is held.
pub const HELD: &str = "held";

/// The plan's words for the machine that runs Ichor's controller (it goes last).
pub const RUNS_CONTROLLER: &str = "runs Ichor's controller";

/// What the controller knows of a machine when it plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    /// The TalosMachine's name.
    pub name: String,
    pub role: MachineRole,
    /// `spec.hold`.
    pub held: bool,
    /// Its Kubernetes Node, when known.
    pub node_name: Option<String>,
    /// The Talos version it runs, when known.
    pub talos_version: Option<String>,
}

/// A plan, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanOutcome {
    /// The ordered machines (skipped ones included, with their reason).
    Plan(Vec<PlanEntry>),
    /// Nothing may be done; `reason` is a constant of `conditions::reasons`.
    Refused {
        reason: &'static str,
        message: String,
    },
}

fn role_name(role: MachineRole) -> &'static str {
    match role {
        MachineRole::Controlplane => "control plane",
        MachineRole::Worker => "worker",
    }
}

/// The plan of an operation. Order: control planes one at a time, then
/// workers (`spec.concurrency` at a time, default 1), each group by name;
/// the machine whose Node runs Ichor's controller goes last (for
/// kubernetes-upgrade, last of its role, so no kubelet runs ahead of the
/// control plane). Held machines are skipped, and a kubernetes-upgrade is
/// refused while any control plane is held (version skew). A talos-upgrade
/// skips a machine already at the target version.
pub fn plan(
    spec: &TalosOperationSpec,
    machines: &[MachineFacts],
    controller_node: Option<&str>,
) -> PlanOutcome {
    if let Some(refused) = refusal(spec, machines) {
        return refused;
    }
    let targeted: Vec<&MachineFacts> = machines
        .iter()
        .filter(|m| spec.target.machines.is_empty() || spec.target.machines.contains(&m.name))
        .collect();
    if targeted.is_empty() {
        return PlanOutcome::Refused {
            reason: reasons::REFUSED,
            message: format!(
                "cluster {:?} has no TalosMachine to act on",
                spec.target.cluster_ref.name
            ),
        };
    }
    let group =
        |m: &MachineFacts| plan_group(spec.kind, m.role, runs_controller(m, controller_node));
    let mut ordered = targeted;
    ordered.sort_by(|a, b| group(a).cmp(&group(b)).then(a.name.cmp(&b.name)));
    PlanOutcome::Plan(batched_entries(spec, &ordered, controller_node))
}

/// Why an operation gets no plan whatever its machines' order: kind ichor, a
/// target that is not a machine of the cluster, or a kubernetes-upgrade while
/// a control plane is held. `None` when nothing refuses it.
fn refusal(spec: &TalosOperationSpec, machines: &[MachineFacts]) -> Option<PlanOutcome> {
    if spec.kind == OperationKind::Ichor {
        return Some(PlanOutcome::Refused {
            reason: reasons::KIND_NOT_SUPPORTED,
            message:
                "kind ichor acts on Ichor's install, not on machines: there is no machine plan"
                    .to_string(),
        });
    }
    for wanted in &spec.target.machines {
        if !machines.iter().any(|m| &m.name == wanted) {
            return Some(PlanOutcome::Refused {
                reason: reasons::REFUSED,
                message: format!(
                    "spec.target.machines names {wanted:?}, which is not a TalosMachine of cluster {:?}",
                    spec.target.cluster_ref.name
                ),
            });
        }
    }
    if spec.kind == OperationKind::KubernetesUpgrade {
        return held_control_planes_refusal(machines);
    }
    None
}

/// A kubernetes-upgrade's refusal while any control plane is held: upgrading
/// the others would leave the control planes on different versions.
fn held_control_planes_refusal(machines: &[MachineFacts]) -> Option<PlanOutcome> {
    let held: Vec<&str> = machines
        .iter()
        .filter(|m| m.role == MachineRole::Controlplane && m.held)
        .map(|m| m.name.as_str())
        .collect();
    if held.is_empty() {
        return None;
    }
    Some(PlanOutcome::Refused {
        reason: reasons::CONTROL_PLANE_HELD,
        message: format!(
            "kubernetes-upgrade refused: {} held, and upgrading the others would leave the control planes on different Kubernetes versions; release the hold (spec.hold: false) and create the operation again",
            if held.len() == 1 {
                format!("control plane {} is", held[0])
            } else {
                format!("control planes {} are", held.join(", "))
            }
        ),
    })
}

/// Whether machine `m` runs Ichor's controller (its Node, or its name, is
/// `controller_node`).
fn runs_controller(m: &MachineFacts, controller_node: Option<&str>) -> bool {
    controller_node.is_some_and(|n| m.node_name.as_deref() == Some(n) || m.name == n)
}

/// The plan group of plain workers: the only group whose machines share a batch.
const WORKER_GROUP: u8 = 2;

/// A machine's group in the plan's order (the sort key is (group, name)):
/// control planes, workers, then Ichor's node. For a kubernetes-upgrade,
/// Ichor's node goes last of its role instead, so no kubelet runs ahead of
/// the control plane.
fn plan_group(kind: OperationKind, role: MachineRole, runs_controller: bool) -> u8 {
    let base = match role {
        MachineRole::Controlplane => 0,
        MachineRole::Worker => WORKER_GROUP,
    };
    if runs_controller {
        if kind == OperationKind::KubernetesUpgrade {
            base + 1
        } else {
            4
        }
    } else {
        base
    }
}

/// Why machine `m` is skipped, if it is: held, or (talos-upgrade) already at
/// the target version.
fn skip_reason(spec: &TalosOperationSpec, m: &MachineFacts) -> Option<String> {
    if m.held {
        Some(HELD.to_string())
    } else if spec.kind == OperationKind::TalosUpgrade
        && m.talos_version.is_some()
        && m.talos_version == spec.version
    {
        Some(format!(
            "already at {}",
            spec.version.as_deref().unwrap_or_default()
        ))
    } else {
        None
    }
}

/// The plan entries of the `ordered` machines, in batches: each machine acts
/// alone except plain workers, up to `spec.concurrency` (default 1) a batch.
/// A skipped machine takes the current batch number and does not count.
fn batched_entries(
    spec: &TalosOperationSpec,
    ordered: &[&MachineFacts],
    controller_node: Option<&str>,
) -> Vec<PlanEntry> {
    let concurrency = spec.concurrency.unwrap_or(1).max(1);
    let acting = match spec.kind {
        OperationKind::Reboot => PlannedAction::Reboot,
        _ => PlannedAction::Upgrade,
    };
    let mut entries = Vec::with_capacity(ordered.len());
    let mut batch: u32 = 0;
    let mut in_batch: u32 = 0;
    let mut last_group: Option<u8> = None;
    for &m in ordered {
        if let Some(reason) = skip_reason(spec, m) {
            entries.push(PlanEntry {
                machine: m.name.clone(),
                role: m.role,
                batch,
                action: PlannedAction::Skip,
                reason: Some(reason),
            });
            continue;
        }
        let runs_controller = runs_controller(m, controller_node);
        let g = plan_group(spec.kind, m.role, runs_controller);
        if let Some(prev) = last_group {
            // Only plain workers share a batch, up to the concurrency.
            let shares = g == WORKER_GROUP && prev == WORKER_GROUP && in_batch < concurrency;
            if !shares {
                batch += 1;
                in_batch = 0;
            }
        }
        last_group = Some(g);
        in_batch += 1;
        entries.push(PlanEntry {
            machine: m.name.clone(),
            role: m.role,
            batch,
            action: acting,
            reason: runs_controller.then(|| RUNS_CONTROLLER.to_string()),
        });
    }
    entries
}

/// The progress entries a fresh plan starts with: skipped machines are done.
pub fn initial_progress(plan: &[PlanEntry], now: &Time) -> Vec<MachineProgress> {
    plan.iter()
        .map(|e| {
            let skipped = e.action == PlannedAction::Skip;
            MachineProgress {
                machine: e.machine.clone(),
                step: if skipped {
                    MachineStep::Skipped
                } else {
                    MachineStep::Pending
                },
                completion_time: skipped.then(|| now.clone()),
                message: skipped.then(|| skipped_words(e.reason.as_deref())),
                ..Default::default()
            }
        })
        .collect()
}

/// `skipped (held)`, `skipped (already at v1.14.0)`.
pub fn skipped_words(reason: Option<&str>) -> String {
    format!("skipped ({})", reason.unwrap_or("no reason given"))
}

/// The skipped machines and why, in plan order: `w-2 skipped (held)`.
pub fn skipped_summary(plan: &[PlanEntry]) -> Vec<String> {
    plan.iter()
        .filter(|e| e.action == PlannedAction::Skip)
        .map(|e| format!("{} {}", e.machine, skipped_words(e.reason.as_deref())))
        .collect()
}

/// What the controller does next with an operation that has a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Run the current step of each of these machines (one batch), in order.
    Steps(Vec<(String, MachineStep)>),
    /// Stop: the operation was cancelled and no machine is past its reboot.
    Cancel,
    /// Done: every machine succeeded or was skipped.
    Succeed,
    /// Stop: a machine failed (its message says why).
    Fail { machine: String, message: String },
}

/// The next thing to do, from the status alone (so a restarted controller
/// resumes where the status says, and never repeats a finished machine).
/// `cancel`: the operation is being deleted or carries the cancel annotation.
/// A cancel stops before the next step, except for machines already past
/// their reboot: those finish coming back (and are uncordoned) first.
pub fn next(status: &TalosOperationStatus, cancel: bool) -> Next {
    if let Some(failed) = status
        .machines
        .iter()
        .find(|m| m.step == MachineStep::Failed)
    {
        return Next::Fail {
            machine: failed.machine.clone(),
            message: failed.message.clone().unwrap_or_default(),
        };
    }
    let batch_of: BTreeMap<&str, u32> = status
        .plan
        .iter()
        .map(|e| (e.machine.as_str(), e.batch))
        .collect();
    let open: Vec<&MachineProgress> = status
        .machines
        .iter()
        .filter(|m| !m.step.is_terminal())
        .collect();
    let Some(current) = open
        .iter()
        .filter_map(|m| batch_of.get(m.machine.as_str()).copied())
        .min()
    else {
        return if cancel { Next::Cancel } else { Next::Succeed };
    };
    let in_batch: Vec<&MachineProgress> = open
        .into_iter()
        .filter(|m| batch_of.get(m.machine.as_str()) == Some(&current))
        .collect();
    let past_reboot = |m: &MachineProgress| {
        matches!(
            m.step,
            MachineStep::WaitingForReturn | MachineStep::Uncordoning
        )
    };
    if cancel {
        let finishing: Vec<(String, MachineStep)> = in_batch
            .iter()
            .filter(|m| past_reboot(m))
            .map(|m| (m.machine.clone(), m.step))
            .collect();
        return if finishing.is_empty() {
            Next::Cancel
        } else {
            Next::Steps(finishing)
        };
    }
    Next::Steps(
        in_batch
            .iter()
            .map(|m| (m.machine.clone(), m.step))
            .collect(),
    )
}

/// The step after `step` for a machine of `role` in an operation of `kind`.
pub fn step_after(kind: OperationKind, role: MachineRole, step: MachineStep) -> MachineStep {
    let upgrade = kind == OperationKind::TalosUpgrade;
    match step {
        MachineStep::Pending if role == MachineRole::Controlplane => MachineStep::CheckingEtcd,
        MachineStep::Pending | MachineStep::CheckingEtcd if upgrade => MachineStep::Pulling,
        MachineStep::Pending | MachineStep::CheckingEtcd => MachineStep::Draining,
        MachineStep::Pulling => MachineStep::Upgrading,
        MachineStep::Upgrading => MachineStep::Draining,
        MachineStep::Draining => MachineStep::Rebooting,
        MachineStep::Rebooting => MachineStep::WaitingForReturn,
        MachineStep::WaitingForReturn => MachineStep::Uncordoning,
        MachineStep::Uncordoning => MachineStep::Succeeded,
        terminal => terminal,
    }
}

/// One etcd member as seen through the Talos API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMemberView {
    pub id: u64,
    /// Empty when the member has not started.
    pub name: String,
    pub is_learner: bool,
}

/// Whether a control plane may go down now, from the member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdVerdict {
    Healthy,
    /// Why not, naming the member.
    Unhealthy(String),
}

/// etcd is healthy enough to take `member` (the machine's hostname) down:
/// every member started, none a learner, and quorum kept without it. Two
/// members cannot lose one (as Talos's own upgrade check says); one member
/// is the whole cluster and reboots anyway.
pub fn etcd_verdict(members: &[EtcdMemberView], member: &str) -> EtcdVerdict {
    if let Some(m) = members.iter().find(|m| m.name.is_empty()) {
        return EtcdVerdict::Unhealthy(format!("etcd member {:x} has not started", m.id));
    }
    if let Some(m) = members.iter().find(|m| m.is_learner) {
        return EtcdVerdict::Unhealthy(format!("etcd member {} ({:x}) is a learner", m.name, m.id));
    }
    if members.len() == 2 {
        return EtcdVerdict::Unhealthy(format!(
            "etcd has 2 members ({}): taking {member} down loses quorum",
            members
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    EtcdVerdict::Healthy
}

/// What a node looks like while the controller waits for it to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnView {
    /// `None` while the node does not answer.
    pub boot_id: Option<String>,
    pub version: Option<String>,
    pub node_ready: bool,
}

/// Whether a rebooted machine is back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnVerdict {
    Back,
    /// Came back on another version than the target: the fallback boot slot.
    OldVersion(String),
    NotYet(String),
}

/// Back = a new boot id, the target version (talos-upgrade) and a Ready Node.
pub fn return_verdict(
    kind: OperationKind,
    target: Option<&str>,
    progress: &MachineProgress,
    seen: &ReturnView,
) -> ReturnVerdict {
    let Some(boot_id) = seen.boot_id.as_deref() else {
        return ReturnVerdict::NotYet(format!(
            "{} is rebooting (its Talos API does not answer yet)",
            progress.machine
        ));
    };
    if progress.boot_id_before.as_deref() == Some(boot_id) {
        return ReturnVerdict::NotYet(format!(
            "{} has not rebooted yet (same boot id)",
            progress.machine
        ));
    }
    if kind == OperationKind::TalosUpgrade
        && let Some(target) = target
        && seen.version.as_deref() != Some(target)
    {
        return ReturnVerdict::OldVersion(format!(
            "{} came back on {} instead of {target} (the fallback boot slot): the operation stops, and the upgrade is not issued to it again; see `talosctl dmesg` on the node for why the new version did not boot",
            progress.machine,
            seen.version.as_deref().unwrap_or("an unknown version")
        ));
    }
    if !seen.node_ready {
        return ReturnVerdict::NotYet(format!(
            "{} rebooted; waiting for Node {} to be Ready",
            progress.machine,
            progress.node_name.as_deref().unwrap_or("(unknown)")
        ));
    }
    ReturnVerdict::Back
}

/// Whether a step's bound has passed (`start` + `bound`): the one place a
/// bound is measured (a machine's step from its `step_start_time`, a
/// component step from its `start_time`). No start, no bound.
pub fn bound_passed(start: Option<&Time>, now: &Time, bound: Duration) -> bool {
    let Some(start) = start else {
        return false;
    };
    let elapsed = now.0.duration_since(start.0);
    let Ok(elapsed) = Duration::try_from(elapsed) else {
        return false;
    };
    elapsed >= bound
}

/// Why `spec.installerImage` may not be used, or `None`: an image outside
/// Sidero Labs' registries ([`ichor_api::TRUSTED_INSTALLER_REGISTRIES`])
/// becomes what runs as root on the nodes, so it needs the annotation an
/// admission policy lets only an admin set.
pub fn installer_image_refusal(spec_image: Option<&str>, opted_in: bool) -> Option<String> {
    let image = spec_image?;
    let trusted = ichor_api::TRUSTED_INSTALLER_REGISTRIES
        .iter()
        .any(|registry| image.starts_with(registry));
    (!trusted && !opted_in).then(|| {
        format!(
            "spec.installerImage {image:?} is not from {}: the installer runs as root on every targeted node, so another registry needs the annotation {}: \"true\", which only a user allowed the any-installer-image verb may set (see docs/security.md); or leave spec.installerImage out to keep each machine's own installer repository",
            ichor_api::TRUSTED_INSTALLER_REGISTRIES.join(" or "),
            ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION
        )
    })
}

/// The installer image for a machine: `spec.installerImage`, else the
/// machine's own installer repository (schematic kept) at the target tag,
/// else the Image Factory's image of the empty schematic.
pub fn installer_image(
    spec_image: Option<&str>,
    live_image: Option<&str>,
    version: &str,
) -> String {
    if let Some(image) = spec_image {
        return image.to_string();
    }
    if let Some(live) = live_image {
        let without_digest = live.split('@').next().unwrap_or(live);
        let (repo, last) = match without_digest.rsplit_once('/') {
            Some((head, last)) => (Some(head), last),
            None => (None, without_digest),
        };
        let name = last.split(':').next().unwrap_or(last);
        return match repo {
            Some(head) => format!("{head}/{name}:{version}"),
            None => format!("{name}:{version}"),
        };
    }
    format!("{DEFAULT_INSTALLER_REPOSITORY}:{version}")
}

/// The Image Factory's installer of the empty schematic (Talos's default).
pub const DEFAULT_INSTALLER_REPOSITORY: &str = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// The message of a succeeded operation, naming the machines it skipped.
pub fn succeeded_message(status: &TalosOperationStatus) -> String {
    let skipped = skipped_now(status);
    if skipped.is_empty() {
        "every machine is done".to_string()
    } else {
        format!("every machine is done; {}", skipped.join(", "))
    }
}

/// The skipped machines as the status says now: `w-2 skipped (held)`.
pub fn skipped_now(status: &TalosOperationStatus) -> Vec<String> {
    status
        .machines
        .iter()
        .filter(|p| p.step == MachineStep::Skipped)
        .map(|p| {
            format!(
                "{} {}",
                p.machine,
                p.message.as_deref().unwrap_or("skipped")
            )
        })
        .collect()
}

/// The role words used in messages.
pub fn role_words(role: MachineRole) -> &'static str {
    role_name(role)
}

#[cfg(test)]
mod tests {
    //! Every rule of the plan and the next step, from the fixtures
    //! `src/fixtures/machines-lab.yaml` (3 control planes, 2 workers, in
    //! scrambled order) and `operation-talos-upgrade.yaml`.
    use super::*;
    use ichor_api::machine::TalosMachine;
    use ichor_api::operation::{ComponentPhase, KubernetesComponent, TalosOperation};
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    fn machines() -> Vec<MachineFacts> {
        let list: Vec<TalosMachine> =
            serde_yaml_ng::from_str(include_str!("../fixtures/machines-lab.yaml"))
                .expect("fixture");
        list.into_iter()
            .map(|m| MachineFacts {
                name: m.metadata.name.clone().unwrap_or_default(),
                role: m.spec.role,
                held: m.spec.hold,
                node_name: m.metadata.name.clone(),
                talos_version: m.status.and_then(|s| s.talos_version),
            })
            .collect()
    }

    fn op(kind: OperationKind) -> TalosOperationSpec {
        let o: TalosOperation =
            serde_yaml_ng::from_str(include_str!("../fixtures/operation-talos-upgrade.yaml"))
                .expect("fixture");
        let mut spec = o.spec;
        spec.kind = kind;
        if kind == OperationKind::Reboot {
            spec.version = None;
        }
        if kind == OperationKind::KubernetesUpgrade {
            spec.version = Some("1.37.0".into());
        }
        spec
    }

    fn hold(ms: &mut [MachineFacts], name: &str) {
        ms.iter_mut()
            .find(|m| m.name == name)
            .expect("machine")
            .held = true;
    }

    fn entries(outcome: PlanOutcome) -> Vec<PlanEntry> {
        match outcome {
            PlanOutcome::Plan(p) => p,
            PlanOutcome::Refused { message, .. } => panic!("refused: {message}"),
        }
    }

    fn order(plan: &[PlanEntry]) -> Vec<(String, u32, PlannedAction)> {
        plan.iter()
            .map(|e| (e.machine.clone(), e.batch, e.action))
            .collect()
    }

    fn row(m: &str, b: u32, a: PlannedAction) -> (String, u32, PlannedAction) {
        (m.to_string(), b, a)
    }

    /// Control planes first, one per batch, by name; then workers one at a time.
    /// Covers: R11.2 (order)
    #[test]
    fn control_planes_first_one_at_a_time_then_workers() {
        let plan = entries(super::plan(
            &op(OperationKind::TalosUpgrade),
            &machines(),
            None,
        ));
        use PlannedAction::Upgrade as U;
        assert_eq!(
            order(&plan),
            vec![
                row("prod-cp-1", 0, U),
                row("prod-cp-2", 1, U),
                row("prod-cp-3", 2, U),
                row("prod-w-1", 3, U),
                row("prod-w-2", 4, U),
            ]
        );
    }

    /// spec.concurrency lets workers share a batch, never control planes.
    /// Covers: R11.2 (concurrency for workers only)
    #[test]
    fn concurrency_is_for_workers_only() {
        let mut spec = op(OperationKind::Reboot);
        spec.concurrency = Some(3);
        let plan = entries(super::plan(&spec, &machines(), None));
        use PlannedAction::Reboot as R;
        assert_eq!(
            order(&plan),
            vec![
                row("prod-cp-1", 0, R),
                row("prod-cp-2", 1, R),
                row("prod-cp-3", 2, R),
                row("prod-w-1", 3, R),
                row("prod-w-2", 3, R),
            ]
        );
    }

    /// The machine whose Node runs Ichor's controller goes last, in a batch of
    /// its own, even when it is a control plane (talos-upgrade, reboot).
    /// Covers: R11.2 (Ichor's node last)
    #[test]
    fn ichor_node_goes_last() {
        let mut spec = op(OperationKind::TalosUpgrade);
        spec.concurrency = Some(5);
        let plan = entries(super::plan(&spec, &machines(), Some("prod-w-1")));
        use PlannedAction::Upgrade as U;
        assert_eq!(
            order(&plan),
            vec![
                row("prod-cp-1", 0, U),
                row("prod-cp-2", 1, U),
                row("prod-cp-3", 2, U),
                row("prod-w-2", 3, U),
                row("prod-w-1", 4, U),
            ]
        );
        assert_eq!(plan[4].reason.as_deref(), Some(RUNS_CONTROLLER));

        let plan = entries(super::plan(&spec, &machines(), Some("prod-cp-1")));
        assert_eq!(plan.last().map(|e| e.machine.as_str()), Some("prod-cp-1"));
        assert_eq!(plan[0].machine, "prod-cp-2");
    }

    /// For kubernetes-upgrade Ichor's control plane is last of the control
    /// planes, not after the workers (no kubelet ahead of the API server).
    /// Covers: R11.2 (Ichor's node last), kubernetes-upgrade, ADR 0014 (version skew)
    #[test]
    fn ichor_control_plane_stays_before_workers_for_kubernetes() {
        let plan = entries(super::plan(
            &op(OperationKind::KubernetesUpgrade),
            &machines(),
            Some("prod-cp-1"),
        ));
        let names: Vec<&str> = plan.iter().map(|e| e.machine.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "prod-cp-2",
                "prod-cp-3",
                "prod-cp-1",
                "prod-w-1",
                "prod-w-2"
            ]
        );
    }

    /// A held machine is listed as skipped (held) and never gets a step; the
    /// summary names it.
    /// Covers: R11.5 (holds respected)
    #[test]
    fn held_worker_is_skipped() {
        let mut ms = machines();
        hold(&mut ms, "prod-w-1");
        let plan = entries(super::plan(&op(OperationKind::TalosUpgrade), &ms, None));
        let w1 = plan
            .iter()
            .find(|e| e.machine == "prod-w-1")
            .expect("listed");
        assert_eq!(w1.action, PlannedAction::Skip);
        assert_eq!(w1.reason.as_deref(), Some(HELD));
        assert_eq!(skipped_summary(&plan), vec!["prod-w-1 skipped (held)"]);
        let progress = initial_progress(&plan, &t(100));
        let w1 = progress
            .iter()
            .find(|p| p.machine == "prod-w-1")
            .expect("w1");
        assert_eq!(w1.step, MachineStep::Skipped);
        assert_eq!(w1.message.as_deref(), Some("skipped (held)"));
        // The other worker still follows the control planes, batches stay contiguous.
        let w2 = plan.iter().find(|e| e.machine == "prod-w-2").expect("w2");
        assert_eq!(w2.batch, 3);
    }

    /// A held control plane refuses a kubernetes-upgrade at plan time, naming it.
    /// Covers: R11.5 (kubernetes-upgrade refused while a control plane is held)
    #[test]
    fn held_control_plane_refuses_kubernetes_upgrade() {
        let mut ms = machines();
        hold(&mut ms, "prod-cp-2");
        match super::plan(&op(OperationKind::KubernetesUpgrade), &ms, None) {
            PlanOutcome::Refused { reason, message } => {
                assert_eq!(reason, reasons::CONTROL_PLANE_HELD);
                assert!(message.contains("prod-cp-2"), "{message}");
            }
            other => panic!("planned: {other:?}"),
        }
        // The same hold only skips that machine in a talos-upgrade.
        let plan = entries(super::plan(&op(OperationKind::TalosUpgrade), &ms, None));
        assert_eq!(skipped_summary(&plan), vec!["prod-cp-2 skipped (held)"]);
    }

    /// A machine already at the target is skipped; a named machine that is
    /// not in the cluster refuses the plan; target.machines narrows it.
    #[test]
    fn targets_and_versions() {
        let mut ms = machines();
        ms[0].talos_version = Some("v1.14.0".into());
        let plan = entries(super::plan(&op(OperationKind::TalosUpgrade), &ms, None));
        assert_eq!(
            skipped_summary(&plan),
            vec!["prod-cp-2 skipped (already at v1.14.0)"]
        );

        let mut spec = op(OperationKind::Reboot);
        spec.target.machines = vec!["prod-w-2".into(), "prod-cp-3".into()];
        let plan = entries(super::plan(&spec, &machines(), None));
        assert_eq!(
            order(&plan),
            vec![
                row("prod-cp-3", 0, PlannedAction::Reboot),
                row("prod-w-2", 1, PlannedAction::Reboot)
            ]
        );
        spec.target.machines = vec!["prod-w-9".into()];
        assert!(matches!(
            super::plan(&spec, &machines(), None),
            PlanOutcome::Refused { reason, .. } if reason == reasons::REFUSED
        ));
    }

    fn status_from(plan: Vec<PlanEntry>) -> TalosOperationStatus {
        TalosOperationStatus {
            machines: initial_progress(&plan, &t(0)),
            plan,
            ..Default::default()
        }
    }

    fn set_step(st: &mut TalosOperationStatus, machine: &str, step: MachineStep) {
        st.machines
            .iter_mut()
            .find(|m| m.machine == machine)
            .expect("machine")
            .step = step;
    }

    /// The next step comes from status alone: finished machines are never
    /// stepped again (resume after a restart), the batch in order.
    /// Covers: R11.6 (resume without repeating a finished machine)
    #[test]
    fn next_resumes_from_status() {
        let mut st = status_from(entries(super::plan(
            &op(OperationKind::TalosUpgrade),
            &machines(),
            None,
        )));
        assert_eq!(
            next(&st, false),
            Next::Steps(vec![("prod-cp-1".into(), MachineStep::Pending)])
        );
        set_step(&mut st, "prod-cp-1", MachineStep::Succeeded);
        set_step(&mut st, "prod-cp-2", MachineStep::Draining);
        assert_eq!(
            next(&st, false),
            Next::Steps(vec![("prod-cp-2".into(), MachineStep::Draining)])
        );
        for m in ["prod-cp-2", "prod-cp-3", "prod-w-1", "prod-w-2"] {
            set_step(&mut st, m, MachineStep::Succeeded);
        }
        assert_eq!(next(&st, false), Next::Succeed);
    }

    /// A failed machine stops the operation; nothing else is stepped.
    /// Covers: R11.4 (stop on the old version, never re-issued)
    #[test]
    fn a_failed_machine_stops_everything() {
        let mut st = status_from(entries(super::plan(
            &op(OperationKind::TalosUpgrade),
            &machines(),
            None,
        )));
        set_step(&mut st, "prod-cp-1", MachineStep::Failed);
        st.machines[0].message = Some("came back on v1.13.9".into());
        assert_eq!(
            next(&st, false),
            Next::Fail {
                machine: "prod-cp-1".into(),
                message: "came back on v1.13.9".into()
            }
        );
    }

    /// Cancel stops before the next step; a machine past its reboot finishes
    /// coming back first.
    /// Covers: R11.6 (cancel that stops)
    #[test]
    fn cancel_stops_before_the_next_step() {
        let mut spec = op(OperationKind::Reboot);
        spec.concurrency = Some(2);
        let mut st = status_from(entries(super::plan(&spec, &machines(), None)));
        for m in ["prod-cp-1", "prod-cp-2", "prod-cp-3"] {
            set_step(&mut st, m, MachineStep::Succeeded);
        }
        set_step(&mut st, "prod-w-1", MachineStep::WaitingForReturn);
        set_step(&mut st, "prod-w-2", MachineStep::Draining);
        assert_eq!(
            next(&st, true),
            Next::Steps(vec![("prod-w-1".into(), MachineStep::WaitingForReturn)])
        );
        set_step(&mut st, "prod-w-1", MachineStep::Succeeded);
        assert_eq!(next(&st, true), Next::Cancel);
        assert_eq!(
            next(&st, false),
            Next::Steps(vec![("prod-w-2".into(), MachineStep::Draining)])
        );
    }

    /// The steps of each kind and role.
    #[test]
    fn steps_by_kind_and_role() {
        use MachineRole::*;
        use MachineStep::*;
        let walk = |kind, role| {
            let mut steps = vec![Pending];
            while !steps.last().expect("step").is_terminal() {
                steps.push(step_after(kind, role, *steps.last().expect("step")));
            }
            steps
        };
        assert_eq!(
            walk(OperationKind::TalosUpgrade, Controlplane),
            vec![
                Pending,
                CheckingEtcd,
                Pulling,
                Upgrading,
                Draining,
                Rebooting,
                WaitingForReturn,
                Uncordoning,
                Succeeded
            ]
        );
        assert_eq!(
            walk(OperationKind::Reboot, Worker),
            vec![
                Pending,
                Draining,
                Rebooting,
                WaitingForReturn,
                Uncordoning,
                Succeeded
            ]
        );
    }

    fn member(id: u64, name: &str) -> EtcdMemberView {
        EtcdMemberView {
            id,
            name: name.into(),
            is_learner: false,
        }
    }

    /// etcd: every member started, no learner, quorum without this one.
    /// Covers: R11.2 (etcd healthy before each control plane)
    #[test]
    fn etcd_rules() {
        let three = [member(1, "cp-1"), member(2, "cp-2"), member(3, "cp-3")];
        assert_eq!(etcd_verdict(&three, "cp-1"), EtcdVerdict::Healthy);
        let mut not_started = three.clone();
        not_started[2].name.clear();
        assert_eq!(
            etcd_verdict(&not_started, "cp-1"),
            EtcdVerdict::Unhealthy("etcd member 3 has not started".into())
        );
        let mut learner = three.clone();
        learner[1].is_learner = true;
        assert!(matches!(
            etcd_verdict(&learner, "cp-1"),
            EtcdVerdict::Unhealthy(m) if m.contains("cp-2") && m.contains("learner")
        ));
        assert!(matches!(
            etcd_verdict(&three[..2], "cp-1"),
            EtcdVerdict::Unhealthy(m) if m.contains("loses quorum")
        ));
        assert_eq!(etcd_verdict(&three[..1], "cp-1"), EtcdVerdict::Healthy);
    }

    /// Back = new boot id + target version + Node Ready; the old version is
    /// the fallback slot, which stops everything.
    /// Covers: R11.4 (return; fallback boot slot)
    #[test]
    fn return_rules() {
        let p = MachineProgress {
            machine: "prod-w-1".into(),
            node_name: Some("prod-w-1".into()),
            boot_id_before: Some("a".into()),
            ..Default::default()
        };
        let seen = |boot: Option<&str>, version: &str, ready: bool| ReturnView {
            boot_id: boot.map(str::to_string),
            version: Some(version.into()),
            node_ready: ready,
        };
        let up = OperationKind::TalosUpgrade;
        let v = Some("v1.14.0");
        assert!(matches!(
            return_verdict(up, v, &p, &seen(None, "v1.13.9", false)),
            ReturnVerdict::NotYet(_)
        ));
        assert!(
            matches!(return_verdict(up, v, &p, &seen(Some("a"), "v1.13.9", true)), ReturnVerdict::NotYet(m) if m.contains("same boot id"))
        );
        assert!(
            matches!(return_verdict(up, v, &p, &seen(Some("b"), "v1.13.9", true)), ReturnVerdict::OldVersion(m) if m.contains("v1.13.9") && m.contains("not issued to it again"))
        );
        assert!(
            matches!(return_verdict(up, v, &p, &seen(Some("b"), "v1.14.0", false)), ReturnVerdict::NotYet(m) if m.contains("Ready"))
        );
        assert_eq!(
            return_verdict(up, v, &p, &seen(Some("b"), "v1.14.0", true)),
            ReturnVerdict::Back
        );
        // A reboot does not look at the version.
        assert_eq!(
            return_verdict(
                OperationKind::Reboot,
                None,
                &p,
                &seen(Some("b"), "v1.13.9", true)
            ),
            ReturnVerdict::Back
        );
    }

    /// The version path: the same minor or the next, nothing else.
    /// Covers: kubernetes-upgrade, ADR 0014 (version path check)
    #[test]
    fn kubernetes_version_paths() {
        assert!(kubernetes_path("v1.36.2", "1.37.0").is_ok());
        assert!(kubernetes_path("v1.36.2", "v1.36.5").is_ok());
        let skip = kubernetes_path("v1.35.0", "v1.37.0")
            .expect_err("two minors")
            .to_string();
        assert!(skip.contains("v1.36.x first"), "{skip}");
        let down = kubernetes_path("v1.37.0", "v1.36.0")
            .expect_err("downgrade")
            .to_string();
        assert!(down.contains("downgrade"), "{down}");
        assert!(kubernetes_path("v1.36.0", "latest").is_err());
        assert_eq!(
            lowest_version([
                "registry.k8s.io/kube-apiserver:v1.36.2",
                "ghcr.io/siderolabs/kubelet:v1.36.0",
                "registry.k8s.io/kube-scheduler:v1.37.0@sha256:00",
            ]),
            Some("v1.36.0".to_string())
        );
    }

    /// The removed-API check names the resource and the objects that use it.
    /// Covers: kubernetes-upgrade, ADR 0014 (removed-API check with what uses it)
    #[test]
    fn removed_apis_on_the_path() {
        assert_eq!(
            removed_on_path("v1.36.1", "v1.37.0"),
            vec![
                ("workloads", "v1alpha2", "scheduling.k8s.io"),
                ("podgroups", "v1alpha2", "scheduling.k8s.io")
            ]
        );
        assert!(removed_on_path("v1.37.0", "v1.37.2").is_empty());
        assert_eq!(removed_on_path("v1.24.3", "v1.25.0").len(), 1);
        assert_eq!(removed_api_refusal("v1.37.0", &[]), None);
        let refusal = removed_api_refusal(
            "v1.37.0",
            &[(
                "workloads.v1alpha2.scheduling.k8s.io".into(),
                (1..=7).map(|i| format!("default/w{i}")).collect(),
            )],
        )
        .expect("refused");
        assert!(
            refusal.contains("workloads.v1alpha2.scheduling.k8s.io (default/w1, default/w2, default/w3, default/w4, default/w5 and 2 more)"),
            "{refusal}"
        );
    }

    /// The component steps: each control-plane component on every control
    /// plane in plan order, kube-proxy on control planes, then every kubelet,
    /// then the bootstrap-manifests sync; held machines get none.
    /// Covers: kubernetes-upgrade, ADR 0014 (apiserver, controller-manager, scheduler per control plane, kube-proxy, kubelets node by node), R11.5
    #[test]
    fn component_steps_in_order() {
        let mut ms = machines();
        hold(&mut ms, "prod-w-2");
        let plan = entries(super::plan(
            &op(OperationKind::KubernetesUpgrade),
            &ms,
            Some("prod-cp-1"),
        ));
        let steps: Vec<String> = component_plan(&plan)
            .iter()
            .map(|c| format!("{} {}", c.component.as_str(), c.machine))
            .collect();
        let mut want = Vec::new();
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
        ] {
            for m in ["prod-cp-2", "prod-cp-3", "prod-cp-1"] {
                want.push(format!("{c} {m}"));
            }
        }
        for m in ["prod-cp-2", "prod-cp-3", "prod-cp-1", "prod-w-1"] {
            want.push(format!("kubelet {m}"));
        }
        // Last, the bootstrap-manifests sync on the first control plane.
        want.push("bootstrap-manifests prod-cp-2".to_string());
        assert_eq!(steps, want);
    }

    /// The next component step from status; cancel stops before a step that
    /// has not started, never in the middle of one.
    /// Covers: R11.6 (cancel; resume from status)
    #[test]
    fn next_component_from_status() {
        let plan = entries(super::plan(
            &op(OperationKind::KubernetesUpgrade),
            &machines(),
            None,
        ));
        let mut st = status_from(plan.clone());
        st.components = component_plan(&plan);
        assert_eq!(next_component(&st, false), NextComponent::Step(0));
        assert_eq!(next_component(&st, true), NextComponent::Cancel);
        st.components[0].phase = ComponentPhase::Succeeded;
        st.components[1].phase = ComponentPhase::Waiting;
        assert_eq!(next_component(&st, true), NextComponent::Step(1));
        machines_from_components(&mut st, &t(5));
        let cp2 = st
            .machines
            .iter()
            .find(|m| m.machine == "prod-cp-2")
            .expect("cp2");
        assert_eq!(cp2.step, MachineStep::Upgrading);
        for c in st.components.iter_mut() {
            c.phase = ComponentPhase::Succeeded;
        }
        assert_eq!(next_component(&st, false), NextComponent::Succeed);
        machines_from_components(&mut st, &t(6));
        assert!(st.machines.iter().all(|m| m.step == MachineStep::Succeeded));
        st.components[3].phase = ComponentPhase::Failed;
        st.components[3].message = Some("timed out".into());
        assert!(
            matches!(next_component(&st, false), NextComponent::Fail { message, .. } if message == "timed out")
        );
    }

    #[test]
    fn component_verdicts() {
        use KubernetesComponent::Kubelet;
        let want = "ghcr.io/siderolabs/kubelet:v1.37.0";
        assert!(
            component_verdict(
                Kubelet,
                "w",
                want,
                Some("ghcr.io/siderolabs/kubelet:v1.36.0"),
                Ok(())
            )
            .is_some()
        );
        assert_eq!(
            component_verdict(
                Kubelet,
                "w",
                want,
                Some(want),
                Err("Node w reports v1.36.0".into())
            ),
            Some("Node w reports v1.36.0".into())
        );
        assert_eq!(
            component_verdict(Kubelet, "w", want, Some(want), Ok(())),
            None
        );
    }

    #[test]
    fn bounds_count_from_the_step_start() {
        let p = MachineProgress {
            step_start_time: Some(t(100)),
            ..Default::default()
        };
        let start = p.step_start_time.as_ref();
        assert!(!bound_passed(start, &t(159), Duration::from_secs(60)));
        assert!(bound_passed(start, &t(160), Duration::from_secs(60)));
        assert!(!bound_passed(
            MachineProgress::default().step_start_time.as_ref(),
            &t(1000),
            Duration::ZERO
        ));
    }

    /// Covers: R18.2
    #[test]
    fn an_installer_image_from_elsewhere_needs_the_admins_opt_in() {
        assert_eq!(installer_image_refusal(None, false), None);
        for trusted in [
            "ghcr.io/siderolabs/installer:v1.14.0",
            "factory.talos.dev/installer/abc123:v1.14.0",
        ] {
            assert_eq!(
                installer_image_refusal(Some(trusted), false),
                None,
                "{trusted}"
            );
        }
        for other in [
            "evil.example/installer:v1.14.0",
            "ghcr.io/siderolabs.evil/installer:v1",
            "ghcr.io/someone/installer:v1.14.0",
        ] {
            let refusal = installer_image_refusal(Some(other), false).expect("refused");
            assert!(
                refusal.contains(ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION),
                "{refusal}"
            );
            assert_eq!(installer_image_refusal(Some(other), true), None);
        }
    }

    #[test]
    fn installer_images() {
        assert_eq!(
            installer_image(
                None,
                Some("factory.talos.dev/metal-installer/abc:v1.13.9"),
                "v1.14.0"
            ),
            "factory.talos.dev/metal-installer/abc:v1.14.0"
        );
        assert_eq!(
            installer_image(
                None,
                Some("localhost:5000/installer:v1.13.9@sha256:00"),
                "v1.14.0"
            ),
            "localhost:5000/installer:v1.14.0"
        );
        assert_eq!(
            installer_image(Some("my/installer:v9"), Some("x:y"), "v1.14.0"),
            "my/installer:v9"
        );
        assert_eq!(
            installer_image(None, None, "v1.14.0"),
            format!("{DEFAULT_INSTALLER_REPOSITORY}:v1.14.0")
        );
    }
}
