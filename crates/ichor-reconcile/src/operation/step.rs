//! A machine's step of a talos-upgrade or a reboot as a pure transition:
//! `(progress, observation, now, bound) → (progress, effect, outcome)`.
//!
//! The controller reads what the step looks at (the node's version and boot
//! id, etcd's members, what a drain left, the node's return), calls the
//! step's function here, then carries out the [`Effect`] it names. A Talos
//! effect the node refuses fails the step ([`refused`]); [`record`] then
//! moves the machine's progress on. Every bound is asked of
//! [`super::bound_passed`], from the step's start.

use std::time::Duration;

use ichor_api::conditions::reasons;
use ichor_api::machine::MachineRole;
use ichor_api::operation::{MachineProgress, MachineStep, OperationKind, TalosOperationSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{
    EtcdMemberView, EtcdVerdict, HELD, ReturnVerdict, ReturnView, bound_passed, etcd_verdict,
    installer_image, return_verdict, skipped_words, step_after,
};
use crate::why::Unanswered;

/// The bounds of the waiting steps, and how often a wait looks again.
#[derive(Debug, Clone)]
pub struct OperationBounds {
    /// etcd healthy enough to take a control plane down.
    pub etcd: Duration,
    /// A drain (evictions refused by a PodDisruptionBudget are retried until then).
    pub drain: Duration,
    /// A rebooted node back: new boot id, target version, Node Ready.
    pub node_return: Duration,
    /// kubernetes-upgrade: a node runs a component's new image (from the
    /// step's start; `talosctl upgrade-k8s` waits 5 minutes for a pod).
    pub component: Duration,
    /// One Talos call that pulls or installs the installer image (a
    /// multi-hundred-megabyte image over a slow registry takes minutes; the
    /// other calls keep `Config::talos_call_timeout`).
    pub image: Duration,
    /// How often a wait looks again.
    pub poll: Duration,
}

impl Default for OperationBounds {
    fn default() -> Self {
        OperationBounds {
            etcd: Duration::from_secs(300),
            drain: Duration::from_secs(300),
            node_return: Duration::from_secs(900),
            component: Duration::from_secs(300),
            image: Duration::from_secs(600),
            poll: Duration::from_secs(5),
        }
    }
}

/// The outcome of one step of one machine (or one component step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Done; the machine moves to its next step.
    Advanced,
    /// Not yet: why (a reason of `Waiting`) and what is awaited.
    Wait(&'static str, String),
    /// The machine failed: the reason (of `Complete`) and why.
    Failed(&'static str, String),
}

/// What the controller carries out after a step's transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing.
    None,
    /// Pull the installer image onto the node (a Talos call bounded by
    /// [`OperationBounds::image`]).
    PullInstaller(String),
    /// Write the installer image to the node's other boot slot (bounded
    /// the same way).
    InstallInstaller(String),
    /// Put the Node back into service.
    Uncordon(String),
    /// Reboot the node. `forfeit_leadership`: a control plane first hands
    /// its etcd leadership over, when it has peers. `legacy_image`: run the
    /// pre-1.13 Upgrade with this image, which reboots by itself, instead.
    Reboot {
        forfeit_leadership: bool,
        legacy_image: Option<String>,
    },
}

/// A step's transition: what to carry out, and the outcome once it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub effect: Effect,
    pub outcome: StepOutcome,
}

impl Transition {
    fn just(outcome: StepOutcome) -> Self {
        Transition {
            effect: Effect::None,
            outcome,
        }
    }

    fn advance_after(effect: Effect) -> Self {
        Transition {
            effect,
            outcome: StepOutcome::Advanced,
        }
    }
}

/// The outcome of a step whose Talos effect the node refused (`words`: the
/// error with each of its causes, [`ichor_api::error_text::chain`], so the node's reason is kept).
pub fn refused(words: String) -> StepOutcome {
    StepOutcome::Failed(reasons::STEP_FAILED, words)
}

/// What a Pending machine's node runs, read before it is touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStart {
    pub version: String,
    pub boot_id: String,
    /// Its Node's name, when the node says one.
    pub node_name: Option<String>,
    /// The installer image of its live config (read for a talos-upgrade).
    pub live_image: Option<String>,
}

/// What the controller saw of a Pending machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartView {
    /// `spec.hold` is set (the node is not read).
    Held,
    /// The node, or the words of the first read that failed (the error
    /// with each of its causes, [`ichor_api::error_text::chain`]).
    Node(Result<NodeStart, Unanswered>),
}

/// Pending: skips a machine held since the plan; otherwise records what it
/// runs before it is touched (version, boot id, Node name and, for a
/// talos-upgrade, the installer image).
pub fn start(
    spec: &TalosOperationSpec,
    p: &mut MachineProgress,
    seen: StartView,
    now: &Time,
) -> Transition {
    let node = match seen {
        StartView::Held => {
            p.step = MachineStep::Skipped;
            p.completion_time = Some(now.clone());
            p.message = Some(skipped_words(Some(HELD)));
            return Transition::just(StepOutcome::Advanced);
        }
        StartView::Node(Err(words)) => return Transition::just(refused(words.0)),
        StartView::Node(Ok(node)) => node,
    };
    if let Some(name) = node.node_name.filter(|n| !n.is_empty()) {
        p.node_name = Some(name);
    }
    if spec.kind == OperationKind::TalosUpgrade {
        p.image = Some(installer_image(
            spec.installer_image.as_deref(),
            node.live_image.as_deref(),
            spec.version.as_deref().unwrap_or_default(),
        ));
    }
    p.start_time = Some(now.clone());
    p.version_before = Some(node.version);
    p.boot_id_before = Some(node.boot_id);
    p.message = Some("started".to_string());
    Transition::just(StepOutcome::Advanced)
}

/// CheckingEtcd: the machine's etcd member must be healthy before its
/// control plane goes down (`members`: the list, or why it could not be
/// read, the error with each of its causes); waits for it up to `bound`.
pub fn check_etcd(
    p: &MachineProgress,
    members: Result<Vec<EtcdMemberView>, Unanswered>,
    now: &Time,
    bound: Duration,
) -> Transition {
    let verdict = match members {
        Ok(members) => etcd_verdict(&members, p.node_name.as_deref().unwrap_or(&p.machine)),
        Err(e) => EtcdVerdict::Unhealthy(format!("the etcd member list failed: {e}")),
    };
    Transition::just(match verdict {
        EtcdVerdict::Healthy => StepOutcome::Advanced,
        EtcdVerdict::Unhealthy(why) if bound_passed(p.step_start_time.as_ref(), now, bound) => {
            StepOutcome::Failed(
                reasons::ETCD_UNHEALTHY,
                format!(
                    "{why}, still after {bound:?}: the control plane was not taken down; make the member healthy (talosctl etcd members, talosctl service etcd) and create a new operation"
                ),
            )
        }
        EtcdVerdict::Unhealthy(why) => StepOutcome::Wait(reasons::WAITING_FOR_ETCD, why),
    })
}

/// Whether the machine ran a Talos older than 1.13 before the operation:
/// it pulls the installer itself during the legacy Upgrade, which reboots
/// by itself.
pub fn legacy(p: &MachineProgress) -> bool {
    p.version_before
        .as_deref()
        .and_then(crate::version::release_line)
        .is_some_and(|v| v < (1, 13))
}

/// Pulling: the installer image onto the node (nothing before 1.13).
pub fn pull(p: &MachineProgress) -> Transition {
    if legacy(p) {
        return Transition::just(StepOutcome::Advanced);
    }
    Transition::advance_after(Effect::PullInstaller(p.image.clone().unwrap_or_default()))
}

/// Upgrading: the installer image to the other boot slot (before 1.13 the
/// legacy Upgrade runs at the reboot step instead, after the drain).
pub fn install(p: &MachineProgress) -> Transition {
    if legacy(p) {
        return Transition::just(StepOutcome::Advanced);
    }
    Transition::advance_after(Effect::InstallInstaller(
        p.image.clone().unwrap_or_default(),
    ))
}

/// What a drain left on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    Done,
    Blocked(String),
}

/// The Node a machine's steps act on (its name when the node gave none).
pub fn node_of(p: &MachineProgress) -> String {
    p.node_name.clone().unwrap_or_else(|| p.machine.clone())
}

/// Draining: done when the drain left nothing; past `bound` the machine
/// fails and its Node goes back into service (it is not rebooted).
pub fn drain(p: &MachineProgress, left: DrainState, now: &Time, bound: Duration) -> Transition {
    let why = match left {
        DrainState::Done => return Transition::just(StepOutcome::Advanced),
        DrainState::Blocked(why) => why,
    };
    if !bound_passed(p.step_start_time.as_ref(), now, bound) {
        return Transition::just(StepOutcome::Wait(reasons::WAITING_FOR_DRAIN, why));
    }
    let node = node_of(p);
    Transition {
        outcome: StepOutcome::Failed(
            reasons::DRAIN_TIMEOUT,
            format!(
                "the drain of Node {node} did not finish within {bound:?}: {why}; no pod was deleted by force, the node was not rebooted and is uncordoned again"
            ),
        ),
        // Not rebooted: the node goes back into service.
        effect: Effect::Uncordon(node),
    }
}

/// What the controller saw of a node at its reboot step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootView {
    /// The address the node was asked at.
    pub address: String,
    /// Its boot id, or why it did not answer (the error with each of its
    /// causes).
    pub boot_id: Result<String, Unanswered>,
}

/// Rebooting, from the node's boot id (or why it does not answer). The step is entered again only when the reboot's result was
/// not recorded (a restart in between): a node that answers with another
/// boot id has rebooted. One that does not answer proves nothing — a
/// passing network error looks the same as a reboot — so it is waited for
/// up to `bound`, never taken as rebooted: the node would stay drained and
/// cordoned. Otherwise the reboot is issued.
pub fn reboot(
    kind: OperationKind,
    role: MachineRole,
    p: &MachineProgress,
    seen: BootView,
    now: &Time,
    bound: Duration,
) -> Transition {
    match seen.boot_id {
        Err(e) => {
            return Transition::just(return_wait(
                format!(
                    "node {} does not answer ({e}); the reboot is issued or checked once it does",
                    seen.address
                ),
                p,
                now,
                bound,
            ));
        }
        Ok(b) if p.boot_id_before.as_deref() != Some(b.as_str()) => {
            return Transition::just(StepOutcome::Advanced);
        }
        Ok(_) => {}
    }
    let legacy_upgrade = kind == OperationKind::TalosUpgrade && legacy(p);
    Transition::advance_after(Effect::Reboot {
        forfeit_leadership: role == MachineRole::Controlplane,
        legacy_image: legacy_upgrade.then(|| p.image.clone().unwrap_or_default()),
    })
}

/// Waiting for a node that does not answer or is not back yet: fails past
/// `bound` (the node's return bound).
fn return_wait(why: String, p: &MachineProgress, now: &Time, bound: Duration) -> StepOutcome {
    if bound_passed(p.step_start_time.as_ref(), now, bound) {
        StepOutcome::Failed(
            reasons::RETURN_TIMEOUT,
            format!("{why}, still after {bound:?}; check the node's console"),
        )
    } else {
        StepOutcome::Wait(reasons::WAITING_FOR_RETURN, why)
    }
}

/// WaitingForReturn: the rebooted machine is back when it has a new boot
/// id, runs the target version and its Node is Ready; fails past `bound`,
/// or at once when it booted the old version.
pub fn await_return(
    spec: &TalosOperationSpec,
    p: &mut MachineProgress,
    seen: ReturnView,
    now: &Time,
    bound: Duration,
) -> Transition {
    Transition::just(
        match return_verdict(spec.kind, spec.version.as_deref(), p, &seen) {
            ReturnVerdict::Back => {
                p.boot_id_after = seen.boot_id;
                p.version_after = seen.version;
                StepOutcome::Advanced
            }
            ReturnVerdict::OldVersion(why) => {
                p.boot_id_after = seen.boot_id;
                p.version_after = seen.version;
                StepOutcome::Failed(reasons::BOOTED_OLD_VERSION, why)
            }
            ReturnVerdict::NotYet(why) => return_wait(why, p, now, bound),
        },
    )
}

/// Uncordoning: the Node back into service.
pub fn uncordon(p: &MachineProgress) -> Transition {
    Transition::advance_after(Effect::Uncordon(node_of(p)))
}

/// Records a step's outcome in the machine's progress: an advanced machine
/// moves to the step after (its words say what it does now), a waiting one
/// says what it waits for, a failed one is done with why. True when the
/// machine is done now (an Event says so).
pub fn record(
    kind: OperationKind,
    role: MachineRole,
    p: &mut MachineProgress,
    outcome: &StepOutcome,
    now: &Time,
    version: Option<&str>,
) -> bool {
    match outcome {
        // Skipped at its start (held since the plan).
        StepOutcome::Advanced if p.step == MachineStep::Skipped => false,
        StepOutcome::Advanced => {
            let next = step_after(kind, role, p.step);
            p.step = next;
            p.step_start_time = Some(now.clone());
            // The words of the step it is in now, not of the one done.
            p.message = Some(step_words(next, p, version));
            if next == MachineStep::Succeeded {
                p.completion_time = Some(now.clone());
                p.message = Some("done".to_string());
            }
            next == MachineStep::Succeeded
        }
        StepOutcome::Wait(_, message) => {
            p.message = Some(message.clone());
            false
        }
        StepOutcome::Failed(reason, message) => {
            fail(p, reason, message.clone(), now);
            false
        }
    }
}

/// The machine fails: done now, with why.
pub fn fail(
    p: &mut MachineProgress,
    reason: &'static str,
    message: String,
    now: &Time,
) -> StepOutcome {
    p.step = MachineStep::Failed;
    p.completion_time = Some(now.clone());
    p.message = Some(message.clone());
    StepOutcome::Failed(reason, message)
}

/// How long a step took, from `start` (zero when unknown).
pub fn took(start: Option<&Time>, now: &Time) -> Duration {
    start
        .and_then(|s| Duration::try_from(now.0.duration_since(s.0)).ok())
        .unwrap_or_default()
}

/// What a machine in `step` is doing, in words (its message until the step
/// says more).
pub fn step_words(step: MachineStep, p: &MachineProgress, version: Option<&str>) -> String {
    let node = p.node_name.as_deref().unwrap_or(&p.machine);
    let image = p.image.as_deref().unwrap_or("the installer");
    match step {
        MachineStep::CheckingEtcd => "checking that etcd keeps quorum without it".to_string(),
        MachineStep::Pulling => format!("pulling {image}"),
        MachineStep::Upgrading => format!("writing {image} to the other boot slot"),
        MachineStep::Draining => format!("cordoning and draining Node {node}"),
        MachineStep::Rebooting => "rebooting".to_string(),
        MachineStep::WaitingForReturn => match version {
            Some(v) => format!("waiting for a new boot id, {v} and Node {node} Ready"),
            None => format!("waiting for a new boot id and Node {node} Ready"),
        },
        MachineStep::Uncordoning => format!("back; uncordoning Node {node}"),
        MachineStep::Succeeded => "done".to_string(),
        MachineStep::Pending | MachineStep::Failed | MachineStep::Skipped => String::new(),
    }
}

/// A step's name in metrics (the status's spelling).
pub fn step_name(step: MachineStep) -> &'static str {
    match step {
        MachineStep::Pending => "Pending",
        MachineStep::CheckingEtcd => "CheckingEtcd",
        MachineStep::Pulling => "Pulling",
        MachineStep::Upgrading => "Upgrading",
        MachineStep::Draining => "Draining",
        MachineStep::Rebooting => "Rebooting",
        MachineStep::WaitingForReturn => "WaitingForReturn",
        MachineStep::Uncordoning => "Uncordoning",
        MachineStep::Succeeded => "Succeeded",
        MachineStep::Failed => "Failed",
        MachineStep::Skipped => "Skipped",
    }
}

/// The installer image of a live config: `machine.install.image` (v1alpha1)
/// or the `UnattendedInstallConfig` document's `installer.image`.
pub fn install_image(config: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(config).ok()?;
    let parsed = ichor_talos::config::MachineConfig::parse_live(text, "the live config").ok()?;
    for mapping in parsed.to_mappings().ok()? {
        let Ok(value) = serde_json::to_value(&mapping) else {
            continue;
        };
        let found = value
            .pointer("/machine/install/image")
            .or_else(|| value.pointer("/installer/image"))
            .and_then(|v| v.as_str());
        if let Some(image) = found.filter(|s| !s.is_empty()) {
            return Some(image.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_images_from_both_shapes() {
        assert_eq!(
            install_image(
                b"version: v1alpha1\nmachine:\n  type: worker\n  install:\n    image: ghcr.io/x/installer:v1.13.9\n"
            ),
            Some("ghcr.io/x/installer:v1.13.9".into())
        );
        assert_eq!(
            install_image(
                b"version: v1alpha1\nmachine: {}\n---\napiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: f/i:v1.14.0\n"
            ),
            Some("f/i:v1.14.0".into())
        );
        assert_eq!(
            install_image(b"version: v1alpha1\nmachine:\n  type: worker\n"),
            None
        );
    }
}
