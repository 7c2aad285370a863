//! The hand-over's steps (preset cilium) and the ichor-cni Job's: the
//! `CNIHandover` condition and the actions that move it on.

use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{MachineRole, TalosCluster, TalosMachine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_core::ResourceExt as _;

use super::{ClusterAction, Decision, HANDOVER_POLL, HandoverCheck, Observed, Settings};
use crate::cni_job::JobState;

/// `CNIHandover` and the ichor-cni Job (preset cilium). Once True the
/// condition stays True: the hand-over is a moment.
pub(super) fn decide(
    cluster: &TalosCluster,
    observed: &Observed,
    settings: &Settings,
    now: &Time,
    decision: &mut Decision,
) {
    let generation = cluster.metadata.generation;
    let handed_over = conditions::is_true(&decision.status.conditions, types::CNI_HANDOVER);
    let check = match &observed.handover {
        Some(Ok(check)) => check,
        Some(Err(invalid)) => {
            if !handed_over {
                conditions::set(
                    &mut decision.status.conditions,
                    conditions::new(
                        types::CNI_HANDOVER,
                        Status::False,
                        reasons::INVALID_VALUES,
                        invalid.0.clone(),
                        generation,
                        now.clone(),
                    ),
                );
            }
            return;
        }
        None => return,
    };
    let job = job_step(
        cluster,
        check,
        observed.job.as_ref(),
        settings,
        now,
        decision,
    );
    if handed_over {
        // Talos's apply at boot records again the objects its inline
        // manifests name: while a control plane still carries the entry
        // (a machine joined after the hand-over, or a held one), the
        // inventory step is taken again.
        inventory_action(observed, decision);
        return;
    }
    let c = job_condition(cluster, check, job.as_ref(), settings, now, decision);
    let c = match c.status.as_str() {
        "True" => after_release(cluster, observed, c, now, decision),
        _ => c,
    };
    // What the condition waits for is watched (the record, the DaemonSet,
    // the Nodes, the machines), except a running Job: only that is polled.
    if c.status != "True"
        && decision.requeue != settings.error_requeue
        && matches!(job, Some(JobState::Running { .. }))
    {
        decision.requeue = HANDOVER_POLL;
    }
    conditions::set(&mut decision.status.conditions, c);
}

/// `CNIHandover` before the later steps, from the Job's state after the
/// Job step (a failed Job sets the wait before the next attempt).
fn job_condition(
    cluster: &TalosCluster,
    check: &HandoverCheck,
    job: Option<&JobState>,
    settings: &Settings,
    now: &Time,
    decision: &mut Decision,
) -> Condition {
    let generation = cluster.metadata.generation;
    match job {
        Some(JobState::Running { name: job }) => job_running(cluster, check, job, settings, now),
        Some(JobState::Failed {
            name: job, message, ..
        }) => {
            let failures = decision
                .status
                .cni
                .as_ref()
                .and_then(|c| c.job_failures.as_ref())
                .map_or(1, |f| f.count);
            let seed = format!(
                "{}/{}",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            );
            decision.requeue = crate::cni_job::job_backoff(failures, &seed);
            job_failed(
                job,
                message,
                failures,
                decision.requeue,
                settings,
                now,
                generation,
            )
        }
        Some(JobState::Waiting {
            failures,
            next,
            message,
        }) => job_waiting(*failures, next, message, settings, now, generation),
        _ => handover_condition(
            check,
            &settings.storage_namespace,
            &settings.release_namespace,
            generation,
            now,
        ),
    }
}

/// Steps 2 and 3 of the hand-over, once the release holds (`released` is its
/// True condition): the inline entry gone from every control plane's live
/// config, then Talos's inventory cleared of the release's objects (an
/// action). True only past both.
fn after_release(
    cluster: &TalosCluster,
    observed: &Observed,
    released: Condition,
    now: &Time,
    decision: &mut Decision,
) -> Condition {
    let generation = cluster.metadata.generation;
    let pending = inline_pending(cluster, &observed.machines);
    if !pending.is_empty() {
        return conditions::new(
            types::CNI_HANDOVER,
            Status::False,
            reasons::REMOVING_INLINE_MANIFEST,
            format!(
                "{}; Ichor is removing the inline Cilium manifest from the control planes' configs (a no-reboot apply), still on: {}",
                released.message,
                pending.join(", ")
            ),
            generation,
            now.clone(),
        );
    }
    let inventory_note = match inventory_action(observed, decision) {
        Some(n) => {
            format!(
                "{n} objects of the release were removed from Talos's inventory {}/{} now",
                ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
                ichor_talos::bootstrap_inventory::INVENTORY_NAME
            )
        }
        None => format!(
            "Talos's inventory {}/{} names none of the release's objects",
            ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
            ichor_talos::bootstrap_inventory::INVENTORY_NAME
        ),
    };
    conditions::new(
        types::CNI_HANDOVER,
        Status::True,
        reasons::HANDED_OVER,
        format!(
            "{}; no control plane's config carries the inline Cilium manifest; {inventory_note}, so talosctl upgrade-k8s cannot prune Cilium",
            released.message
        ),
        generation,
        now.clone(),
    )
}

/// The inventory step, when Talos's inventory (as read) names objects of the
/// release: the action, and how many objects it removes.
fn inventory_action(observed: &Observed, decision: &mut Decision) -> Option<usize> {
    let inventory = observed.inventory.as_ref()?;
    let config_map = inventory.config_map.clone()?;
    let data = config_map.data.clone().unwrap_or_default();
    let step = crate::inventory::decide(&inventory.release, Some(&data))?;
    let n = step.strip.len();
    decision.actions.push(ClusterAction::ReleaseInventory {
        config_map: Box::new(config_map),
        step,
    });
    Some(n)
}

/// The control-plane machines whose live config still carries the inline
/// Cilium entry (or the inline manifest taken over from a previous install),
/// or whose config was not read yet.
pub fn inline_pending(cluster: &TalosCluster, machines: &[TalosMachine]) -> Vec<String> {
    let taken_over = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ichor_api::TAKEN_OVER_INLINE_MANIFEST_ANNOTATION));
    let mut pending: Vec<String> = machines
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
        .filter_map(
            |m| match m.status.as_ref().and_then(|s| s.inline_manifests.as_ref()) {
                None => Some(format!("{} (config not read yet)", m.name_any())),
                Some(names)
                    if names.iter().any(|n| {
                        n == ichor_render::cni::INLINE_CNI_NAME || Some(n) == taken_over
                    }) =>
                {
                    Some(match m.spec.hold {
                        true => format!("{} (held: release it so Ichor may apply)", m.name_any()),
                        false => m.name_any(),
                    })
                }
                Some(_) => None,
            },
        )
        .collect();
    pending.sort();
    pending
}

/// The Job step of the hand-over: off the desired hash and allowed to run a
/// Job, start one when there is none and the back-off after the last
/// failures has run out, and delete a failed one (counting it once, by its
/// uid, in `status.cni.jobFailures`). At the desired hash the failures are
/// forgotten. Returns the Job's state as it is after the actions (a started
/// Job is running).
fn job_step(
    cluster: &TalosCluster,
    check: &HandoverCheck,
    observed: Option<&JobState>,
    settings: &Settings,
    now: &Time,
    decision: &mut Decision,
) -> Option<JobState> {
    let cni = decision.status.cni.get_or_insert_with(Default::default);
    if check.at_desired_hash() {
        cni.job_failures = None;
        return None;
    }
    if !settings.can_start_job {
        return None;
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let seed = format!("{namespace}/{}", cluster.name_any());
    let previous = cni
        .job_failures
        .clone()
        .filter(|f| f.hash == check.desired_hash);
    match observed {
        None => {
            if let Some(f) = &previous {
                let wait = crate::cni_job::job_backoff(f.count, &seed);
                let next = Time(
                    f.last_failure
                        .0
                        .checked_add(jiff_duration(wait))
                        .unwrap_or(f.last_failure.0),
                );
                if now.0 < next.0 {
                    let left = next.0.duration_since(now.0);
                    let left = std::time::Duration::try_from(left).unwrap_or_default();
                    decision.requeue = decision
                        .requeue
                        .min(left.max(std::time::Duration::from_secs(1)));
                    return Some(JobState::Waiting {
                        failures: f.count,
                        next,
                        message: f.message.clone(),
                    });
                }
            }
            decision.actions.push(ClusterAction::StartJob {
                hash: check.desired_hash.clone(),
            });
            Some(JobState::Running {
                name: crate::cni_job::job_name(
                    &namespace,
                    &cluster.name_any(),
                    &check.desired_hash,
                ),
            })
        }
        Some(state) => {
            if let JobState::Failed { name, uid, message } = state {
                decision
                    .actions
                    .push(ClusterAction::DeleteFailedJob { name: name.clone() });
                let counted = previous.as_ref().is_some_and(|f| &f.last_job_uid == uid);
                if !counted {
                    cni.job_failures = Some(ichor_api::CniJobFailures {
                        hash: check.desired_hash.clone(),
                        count: previous.map_or(1, |f| f.count + 1),
                        last_failure: now.clone(),
                        last_job_uid: uid.clone(),
                        message: message.clone(),
                    });
                }
            }
            Some(state.clone())
        }
    }
}

/// A wait as jiff's signed duration (saturating: the waits here are minutes).
fn jiff_duration(d: std::time::Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

fn job_running(
    cluster: &TalosCluster,
    check: &HandoverCheck,
    job: &str,
    settings: &Settings,
    now: &Time,
) -> Condition {
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::JOB_RUNNING,
        format!(
            "the ichor-cni Job {}/{job} is bringing Helm release {} to this TalosCluster's effective values (hash {})",
            settings.system_namespace, check.release, check.desired_hash
        ),
        cluster.metadata.generation,
        now.clone(),
    )
}

fn job_failed(
    job: &str,
    message: &str,
    failures: u32,
    wait: std::time::Duration,
    settings: &Settings,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    job_failed_condition(
        format!(
            "the ichor-cni Job {}/{job} failed ({message}); failures in a row: {failures}. It was deleted and a new attempt starts in {}s; the Job's pod log says why",
            settings.system_namespace,
            wait.as_secs()
        ),
        now,
        generation,
    )
}

/// `CNIHandover` while the back-off after failed Jobs runs.
fn job_waiting(
    failures: u32,
    next: &Time,
    message: &str,
    settings: &Settings,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    job_failed_condition(
        format!(
            "the ichor-cni Job failed {failures} time(s) in a row (last: {message}); the next attempt starts at {} in {}. Fix what its log said, or change spec.cni to start one now",
            next.0, settings.system_namespace
        ),
        now,
        generation,
    )
}

fn job_failed_condition(message: String, now: &Time, generation: Option<i64>) -> Condition {
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::JOB_FAILED,
        message,
        generation,
        now.clone(),
    )
}

/// `CNIHandover` from a hand-over check.
pub fn handover_condition(
    check: &HandoverCheck,
    storage_ns: &str,
    release_ns: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let release = &check.release;
    if check.complete() {
        let rev = check.deployed.as_ref().map(|(r, _)| *r).unwrap_or_default();
        return conditions::new(
            types::CNI_HANDOVER,
            Status::True,
            reasons::HANDED_OVER,
            format!(
                "Helm release {release} (record in {storage_ns}, revision {rev}) is deployed at the effective-values hash {} and DaemonSet {release_ns}/{} is Ready",
                check.desired_hash, check.agent_daemonset
            ),
            generation,
            now.clone(),
        );
    }
    if !check.at_desired_hash() {
        let message = match &check.deployed {
            None => format!(
                "no deployed Helm release {release} in {storage_ns}; install Ichor's Cilium (ichor cni bootstrap, or ichor adopt)"
            ),
            Some((rev, hash)) => format!(
                "Helm release {release} revision {rev} is deployed with values hash {hash}, but this TalosCluster's effective values hash to {}; the ichor-cni Job upgrades it (or run `ichor cni helm apply` for this cluster)",
                check.desired_hash
            ),
        };
        return conditions::new(
            types::CNI_HANDOVER,
            Status::False,
            reasons::WAITING_FOR_RELEASE,
            message,
            generation,
            now.clone(),
        );
    }
    let why = check
        .daemonset
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::WAITING_FOR_DAEMON_SET,
        format!(
            "Helm release {release} is deployed at the effective-values hash; DaemonSet {release_ns}/{} is not Ready: {why}",
            check.agent_daemonset
        ),
        generation,
        now.clone(),
    )
}
