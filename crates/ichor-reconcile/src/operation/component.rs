//! A kubernetes-upgrade's component step as pure transitions, one per
//! phase: `(progress, observation, now, bound) → (progress, effect,
//! outcome)`.
//!
//! Pending records the image the node ran before and moves to Applying
//! (written before the node is); Applying renders the node's live config
//! with the component at the target ([`ichor_render::component_step`]) and
//! names the config to apply in no-reboot mode ([`ComponentEffect`]),
//! recorded once written ([`written`]); Waiting waits for the node (and
//! Kubernetes) to run the new image, up to the component bound
//! ([`super::bound_passed`]). The bootstrap-manifests step
//! has its own Pending, record and Waiting here; the controller reads and
//! applies the manifests.

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::conditions::reasons;
use ichor_api::machine::MachineRole;
use ichor_api::operation::{ComponentPhase, ComponentProgress, KubernetesComponent};
use ichor_talos::config::MachineConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{StepOutcome, bound_passed, component_verdict};
use crate::why::{NotWritten, Waiting};

/// The machine of component step `c` if the step may run on it as it is
/// now (`machine`: `None` when the TalosMachine is gone from `namespace`),
/// else the reason and words of the step's failure. A machine held after
/// the plan is never written, and the upgrade stops there; a step already
/// written finishes its wait.
pub fn gate<'m>(
    c: &ComponentProgress,
    namespace: &str,
    machine: Option<&'m TalosMachine>,
) -> Result<&'m TalosMachine, (&'static str, String)> {
    let Some(m) = machine else {
        return Err((
            reasons::STEP_FAILED,
            format!("TalosMachine {namespace}/{} is gone", c.machine),
        ));
    };
    if !m.spec.hold || c.phase == ComponentPhase::Waiting {
        return Ok(m);
    }
    // A control plane held now would leave the control planes on different
    // versions.
    let reason = if m.spec.role == MachineRole::Controlplane {
        reasons::CONTROL_PLANE_HELD
    } else {
        reasons::STEP_FAILED
    };
    Err((
        reason,
        format!(
            "TalosMachine {} was put on hold after the plan; it was not written, and the upgrade stops here so no component runs ahead of it; release the hold and create a new operation",
            c.machine
        ),
    ))
}

/// The step fails: done now, with why.
pub fn fail(
    c: &mut ComponentProgress,
    reason: &'static str,
    message: String,
    now: &Time,
) -> StepOutcome {
    c.phase = ComponentPhase::Failed;
    c.completion_time = Some(now.clone());
    c.message = Some(message.clone());
    StepOutcome::Failed(reason, message)
}

/// Pending: records the image the node runs before (`image_before`) and
/// moves to Applying, which is written before the node is.
pub fn start(
    c: &mut ComponentProgress,
    image_before: Option<String>,
    version: &str,
    now: &Time,
) -> StepOutcome {
    c.image_before = image_before;
    c.start_time = Some(now.clone());
    c.phase = ComponentPhase::Applying;
    c.message = Some(format!("writing {} {version}", c.component.as_str()));
    StepOutcome::Advanced
}

/// What the controller carries out after the Applying transition.
#[derive(Debug, Clone)]
pub enum ComponentEffect {
    None,
    /// Apply `config` to the node in no-reboot mode (a class B apply: the
    /// controller stays the only writer of the node), then record it with
    /// [`written`].
    Apply {
        config: MachineConfig,
        image: String,
    },
}

/// Applying, from the node's live config: the config with the component at
/// `version` (`node`: the Node the step waits for next). A config without
/// a place for the component's image fails the step, nothing written; one
/// already at the image needs no apply.
pub fn apply(
    c: &mut ComponentProgress,
    live: &MachineConfig,
    version: &str,
    node: &str,
    now: &Time,
) -> Result<(ComponentEffect, StepOutcome), ichor_render::Error> {
    let step = ichor_render::component_step(live, c.component, version, &c.machine)?;
    let Some(image) = step.image else {
        let message = format!(
            "the config of {} has no place for {} (no image path for it): nothing was written",
            c.machine,
            c.component.as_str()
        );
        let failed = fail(c, reasons::STEP_FAILED, message, now);
        return Ok((ComponentEffect::None, failed));
    };
    Ok(match step.config {
        Some(config) => (
            ComponentEffect::Apply { config, image },
            StepOutcome::Advanced,
        ),
        None => (ComponentEffect::None, written(c, image, None, node, now)),
    })
}

/// Applying, once the node took the config with `image` (or `refused` it:
/// the error with each of its causes, [`ichor_api::error_text::chain`]): Waiting for `node` to run it.
pub fn written(
    c: &mut ComponentProgress,
    image: String,
    refused: Option<String>,
    node: &str,
    now: &Time,
) -> StepOutcome {
    if let Some(words) = refused {
        let message = format!("the node refused the no-reboot apply of {image}: {words}");
        return fail(c, reasons::STEP_FAILED, message, now);
    }
    c.message = Some(format!("written; waiting for {node} to run {image}"));
    c.image = Some(image);
    c.phase = ComponentPhase::Waiting;
    StepOutcome::Advanced
}

/// Waiting: done when the node runs the new image (`on_node`, as its Talos
/// API reports it) and, where Kubernetes shows it, the pod or Node says so
/// (`kube`); fails past `bound` from the step's start.
pub fn wait(
    c: &mut ComponentProgress,
    on_node: Option<&str>,
    kube: Result<(), Waiting>,
    now: &Time,
    bound: Duration,
) -> StepOutcome {
    let expected = c.image.clone().unwrap_or_default();
    let Some(why) = component_verdict(c.component, &c.machine, &expected, on_node, kube) else {
        c.phase = ComponentPhase::Succeeded;
        c.completion_time = Some(now.clone());
        c.message = Some(format!("runs {expected}"));
        return StepOutcome::Advanced;
    };
    if bound_passed(c.start_time.as_ref(), now, bound) {
        let message = format!(
            "{why}, still after {bound:?}; the config is written, check the component on the node (talosctl logs, kubectl -n kube-system get pods -o wide)"
        );
        return fail(c, reasons::COMPONENT_TIMEOUT, message, now);
    }
    c.message = Some(why.clone());
    StepOutcome::Wait(
        reasons::WAITING_FOR_COMPONENT,
        format!("{}: {why}", c.machine),
    )
}

/// The bootstrap-manifests step, Pending: records kube-proxy's image in the
/// cluster (`before`) and moves to Applying.
pub fn manifests_start(
    c: &mut ComponentProgress,
    before: Option<String>,
    now: &Time,
) -> StepOutcome {
    c.image_before = before;
    c.start_time = Some(now.clone());
    c.phase = ComponentPhase::Applying;
    c.message = Some(format!(
        "reading the bootstrap manifests {} renders for its new config",
        c.machine
    ));
    StepOutcome::Advanced
}

/// The bootstrap-manifests step, Applying, once the controller read and
/// synced the manifests: `Ok` with kube-proxy's image they name and the
/// sync's summary, or `Err` with why nothing (more) was written.
pub fn manifests_synced(
    c: &mut ComponentProgress,
    synced: Result<(Option<String>, String), NotWritten>,
    now: &Time,
) -> StepOutcome {
    match synced {
        Ok((image, summary)) => {
            c.image = image;
            c.phase = ComponentPhase::Waiting;
            c.message = Some(summary);
            StepOutcome::Advanced
        }
        Err(why) => fail(c, reasons::STEP_FAILED, why.0, now),
    }
}

/// Why the manifests a control plane serves cannot be applied.
pub fn manifests_refusal(machine: &str, why: &str) -> String {
    format!("{machine} serves a bootstrap manifest Ichor cannot apply: {why}; nothing was written")
}

/// The bootstrap-manifests step, Waiting: done when kube-proxy's DaemonSet
/// runs the image the manifests name (`live`), or they name none.
pub fn manifests_wait(c: &mut ComponentProgress, live: Option<String>, now: &Time) -> StepOutcome {
    let expected = c.image.clone();
    if expected.is_none() || live == expected {
        c.phase = ComponentPhase::Succeeded;
        c.completion_time = Some(now.clone());
        return StepOutcome::Advanced;
    }
    let why = format!(
        "DaemonSet kube-system/kube-proxy runs {}, not {}",
        live.as_deref().unwrap_or("nothing"),
        expected.unwrap_or_default()
    );
    StepOutcome::Wait(
        reasons::WAITING_FOR_COMPONENT,
        format!("{}: {why}", c.machine),
    )
}

/// A component step's name in metrics: `kube-apiserver/apply`, `kubelet/wait`.
pub fn step_name(component: KubernetesComponent, phase: ComponentPhase) -> &'static str {
    use ComponentPhase::*;
    use KubernetesComponent::*;
    match (component, phase) {
        (ApiServer, Pending) => "kube-apiserver/start",
        (ApiServer, Applying) => "kube-apiserver/apply",
        (ApiServer, _) => "kube-apiserver/wait",
        (ControllerManager, Pending) => "kube-controller-manager/start",
        (ControllerManager, Applying) => "kube-controller-manager/apply",
        (ControllerManager, _) => "kube-controller-manager/wait",
        (Scheduler, Pending) => "kube-scheduler/start",
        (Scheduler, Applying) => "kube-scheduler/apply",
        (Scheduler, _) => "kube-scheduler/wait",
        (KubeProxy, Pending) => "kube-proxy/start",
        (KubeProxy, Applying) => "kube-proxy/apply",
        (KubeProxy, _) => "kube-proxy/wait",
        (Kubelet, Pending) => "kubelet/start",
        (Kubelet, Applying) => "kubelet/apply",
        (Kubelet, _) => "kubelet/wait",
        (BootstrapManifests, Pending) => "bootstrap-manifests/start",
        (BootstrapManifests, Applying) => "bootstrap-manifests/apply",
        (BootstrapManifests, _) => "bootstrap-manifests/wait",
    }
}
