//! The kubernetes-upgrade's decisions: the version path and what it
//! removes (checked at plan time, as `talosctl upgrade-k8s` checks them),
//! the component steps in the order they run, the next one from the status
//! alone, and each machine's step as its components' say.

use std::collections::BTreeMap;

use ichor_api::conditions::reasons;
use ichor_api::machine::MachineRole;
use ichor_api::operation::{
    ComponentPhase, ComponentProgress, KubernetesComponent, MachineStep, PlanEntry, PlannedAction,
    TalosOperationStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{removed, support};
use crate::version::release;
use crate::why::Waiting;

/// `v1.37.0` for `1.37.0` or `v1.37.0`: the tag of Kubernetes images and
/// the kubelet's reported version.
pub fn kubernetes_tag(version: &str) -> String {
    format!("v{}", version.trim().trim_start_matches('v'))
}

/// (major, minor, patch) of `v1.37.0` / `1.37.0-rc.1` (pre-release ignored),
/// `v1.37` read as `v1.37.0`: the support check's reading (`support`); every
/// other decision reads versions through [`crate::version`].
pub fn semver(version: &str) -> Option<(u64, u64, u64)> {
    let v = version.trim().trim_start_matches('v');
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor, patch))
}

/// The tag of an image (`registry.k8s.io/kube-apiserver:v1.36.2` → `v1.36.2`).
pub fn image_tag(image: &str) -> Option<&str> {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split_once(':').map(|(_, tag)| tag)
}

/// The lowest Kubernetes version among the images the nodes run (what
/// `talosctl upgrade-k8s` takes as the version it upgrades from).
pub fn lowest_version<'a>(images: impl IntoIterator<Item = &'a str>) -> Option<String> {
    images
        .into_iter()
        .filter_map(image_tag)
        .filter_map(|t| release(t).map(|v| (v, t)))
        .min_by_key(|(v, _)| *v)
        .map(|(_, t)| kubernetes_tag(t))
}

/// Why a kubernetes-upgrade's version path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("cannot read the version path {from} → {to}: versions look like v1.37.0")]
    Unreadable { from: String, to: String },
    #[error("the cluster runs Kubernetes {from}; a downgrade to {to} is not supported")]
    Downgrade { from: String, to: String },
    #[error(
        "the cluster runs Kubernetes {from}; {to} is more than one minor version ahead: upgrade to the newest {next}.x first, then to {to}"
    )]
    TooFar {
        from: String,
        to: String,
        /// The minor to upgrade to first (`v1.36`).
        next: String,
    },
}

/// The version path of a kubernetes-upgrade: the same minor or the next
/// one, as `talosctl upgrade-k8s` allows (each minor's removals are checked
/// on the way; skipping one would skip its checks and break version skew).
pub fn kubernetes_path(from: &str, to: &str) -> Result<(), PathRefused> {
    let (Some(f), Some(t)) = (release(from), release(to)) else {
        return Err(PathRefused::Unreadable {
            from: from.to_owned(),
            to: to.to_owned(),
        });
    };
    if f.0 == t.0 && (t.1 == f.1 || t.1 == f.1 + 1) {
        return Ok(());
    }
    Err(if t < f {
        PathRefused::Downgrade {
            from: from.to_owned(),
            to: to.to_owned(),
        }
    } else {
        PathRefused::TooFar {
            from: from.to_owned(),
            to: to.to_owned(),
            next: format!("v{}.{}", f.0, f.1 + 1),
        }
    })
}

/// The API resources (`plural.version.group`) a Kubernetes minor removes,
/// by the minor that removes them: objects of these left in the cluster are
/// lost to the upgrade.
pub const REMOVED_API_RESOURCES: &[(u64, &str)] = &[
    (25, "podsecuritypolicies.v1beta1.policy"),
    (29, "clustercidrs.v1alpha1.networking.k8s.io"),
    (32, "podschedulingcontexts.v1alpha3.resource.k8s.io"),
    (37, "workloads.v1alpha2.scheduling.k8s.io"),
    (37, "podgroups.v1alpha2.scheduling.k8s.io"),
];

/// The resources removed on the path `from` → `to` (minors after `from`,
/// up to `to`), as (plural, version, group).
pub fn removed_on_path(from: &str, to: &str) -> Vec<(&'static str, &'static str, &'static str)> {
    let (Some(f), Some(t)) = (release(from), release(to)) else {
        return Vec::new();
    };
    REMOVED_API_RESOURCES
        .iter()
        .filter(|(minor, _)| f.0 == 1 && t.0 == 1 && *minor > f.1 && *minor <= t.1)
        .filter_map(|(_, r)| {
            let (plural, rest) = r.split_once('.')?;
            let (version, group) = rest.split_once('.')?;
            Some((plural, version, group))
        })
        .collect()
}

/// The refusal of a path whose removed APIs still hold objects, naming
/// them: `in_use` is (resource, object names) per resource that has some.
pub fn removed_api_refusal(to: &str, in_use: &[(String, Vec<String>)]) -> Option<String> {
    if in_use.is_empty() {
        return None;
    }
    let listed = in_use
        .iter()
        .map(|(resource, objects)| {
            let shown: Vec<&str> = objects.iter().take(5).map(String::as_str).collect();
            let more = objects.len().saturating_sub(shown.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{resource} ({}{tail})", shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    Some(format!(
        "Kubernetes {to} no longer serves APIs that objects in the cluster still use: {listed}; move them to the API that replaces it (or delete them), then create the operation again"
    ))
}

/// The component steps of a kubernetes-upgrade, in the order they run:
/// kube-apiserver on each control plane one at a time, then
/// kube-controller-manager, kube-scheduler and kube-proxy the same way,
/// then the kubelet of every machine (control planes first) node by node,
/// then the bootstrap-manifests sync on the first control plane. Machines
/// the plan skips get no step.
pub fn component_plan(plan: &[PlanEntry]) -> Vec<ComponentProgress> {
    let acting: Vec<&PlanEntry> = plan
        .iter()
        .filter(|e| e.action != PlannedAction::Skip)
        .collect();
    let control_planes: Vec<&PlanEntry> = acting
        .iter()
        .copied()
        .filter(|e| e.role == MachineRole::Controlplane)
        .collect();
    let step = |component, e: &PlanEntry| ComponentProgress {
        component,
        machine: e.machine.clone(),
        phase: ComponentPhase::Pending,
        image_before: None,
        image: None,
        start_time: None,
        completion_time: None,
        message: None,
    };
    let mut steps = Vec::new();
    for component in [
        KubernetesComponent::ApiServer,
        KubernetesComponent::ControllerManager,
        KubernetesComponent::Scheduler,
        KubernetesComponent::KubeProxy,
    ] {
        steps.extend(control_planes.iter().map(|e| step(component, e)));
    }
    steps.extend(acting.iter().map(|e| step(KubernetesComponent::Kubelet, e)));
    // Last, as talosctl ends: the bootstrap manifests, read from the first
    // control plane of the plan once every node runs the new version.
    if let Some(first) = control_planes.first() {
        steps.push(step(KubernetesComponent::BootstrapManifests, first));
    }
    steps
}

/// What a kubernetes-upgrade does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextComponent {
    /// Run the step at this index of `status.components`.
    Step(usize),
    Cancel,
    Succeed,
    Fail {
        step: String,
        message: String,
    },
}

/// The next component step, from the status alone (a restarted controller
/// resumes there). A cancel stops before the next step; a step already
/// written finishes its wait first.
pub fn next_component(status: &TalosOperationStatus, cancel: bool) -> NextComponent {
    if let Some(failed) = status
        .components
        .iter()
        .find(|c| c.phase == ComponentPhase::Failed)
    {
        return NextComponent::Fail {
            step: format!("{} on {}", failed.component.as_str(), failed.machine),
            message: failed.message.clone().unwrap_or_default(),
        };
    }
    match status
        .components
        .iter()
        .position(|c| c.phase != ComponentPhase::Succeeded)
    {
        None if cancel => NextComponent::Cancel,
        None => NextComponent::Succeed,
        Some(i) if cancel && status.components[i].phase == ComponentPhase::Pending => {
            NextComponent::Cancel
        }
        Some(i) => NextComponent::Step(i),
    }
}

/// Whether a node runs a component's new image: the Talos side (`node`,
/// the image of the component's config resource) and, where Kubernetes
/// shows it, the Kubernetes side (`kube`: `Ok` when the pod or Node says
/// so, `Err` with what it says). `None` when it does; else what is awaited.
pub fn component_verdict(
    component: KubernetesComponent,
    machine: &str,
    expected: &str,
    node: Option<&str>,
    kube: Result<(), Waiting>,
) -> Option<String> {
    if node != Some(expected) {
        return Some(format!(
            "{machine} has not taken {} {expected} yet (it reports {})",
            component.as_str(),
            node.unwrap_or("no image")
        ));
    }
    kube.err().map(|w| w.0)
}

/// Each machine's step as its component steps say: Upgrading once one has
/// started, Succeeded when all are, Failed when one failed.
pub fn machines_from_components(status: &mut TalosOperationStatus, now: &Time) {
    for p in status
        .machines
        .iter_mut()
        .filter(|p| p.step != MachineStep::Skipped)
    {
        let steps: Vec<&ComponentProgress> = status
            .components
            .iter()
            .filter(|c| c.machine == p.machine)
            .collect();
        let started = steps.iter().any(|c| c.phase != ComponentPhase::Pending);
        let failed = steps.iter().find(|c| c.phase == ComponentPhase::Failed);
        let done = !steps.is_empty() && steps.iter().all(|c| c.phase == ComponentPhase::Succeeded);
        if let Some(f) = failed {
            p.step = MachineStep::Failed;
            p.message = f.message.clone();
        } else if done {
            if p.step != MachineStep::Succeeded {
                p.completion_time = Some(now.clone());
            }
            p.step = MachineStep::Succeeded;
            p.message = Some("every component runs the new version".to_string());
        } else if started {
            if p.start_time.is_none() {
                p.start_time = Some(now.clone());
            }
            p.step = MachineStep::Upgrading;
            if let Some(c) = steps.iter().find(|c| {
                c.phase != ComponentPhase::Succeeded && c.phase != ComponentPhase::Pending
            }) {
                p.message = Some(format!(
                    "{}: {}",
                    c.component.as_str(),
                    c.message.clone().unwrap_or_default()
                ));
            }
        }
    }
}

/// The components' extra arguments of one machine's live config, by component.
pub type ComponentArgs = BTreeMap<removed::Component, BTreeMap<String, String>>;

/// The plan-time refusal of a kubernetes-upgrade to `to` from what the
/// planned machines run, as `talosctl upgrade-k8s` checks it: the version
/// path from the lowest version of the Kubernetes `images` the nodes report,
/// then each machine's Talos against the target (`talos_versions`:
/// machine, version), then the flags, admission plugins and feature gates
/// the path removes (`settings`: machine, its components' arguments). `Ok`
/// with the version the path starts from when none refuses it; else the
/// reason and the words.
pub fn version_path_refusal(
    to: &str,
    images: &[String],
    talos_versions: &[(String, String)],
    settings: &[(String, ComponentArgs)],
) -> Result<String, (&'static str, String)> {
    let Some(from) = lowest_version(images.iter().map(String::as_str)) else {
        return Err((
            reasons::UNSUPPORTED_VERSION_PATH,
            "no node reports a Kubernetes image with a version tag, so the version path cannot be checked".to_string(),
        ));
    };
    kubernetes_path(&from, to)
        .map_err(|why| (reasons::UNSUPPORTED_VERSION_PATH, why.to_string()))?;
    // Every machine the new version reaches must run it on its Talos,
    // as talosctl checks each node's Version first.
    if let Some(why) = support::refusal(to, talos_versions) {
        return Err((reasons::UNSUPPORTED_BY_TALOS, why));
    }
    // A component given a setting the path removes would not start.
    let in_use: Vec<(String, Vec<String>)> = settings
        .iter()
        .map(|(m, args)| (m.clone(), removed::removed_in_use(&from, to, args)))
        .collect();
    if let Some(why) = removed::refusal(to, &in_use) {
        return Err((reasons::REMOVED_SETTING_IN_USE, why));
    }
    Ok(from)
}
