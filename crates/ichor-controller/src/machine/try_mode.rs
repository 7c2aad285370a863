//! Try-mode applies (`applyMode: try`): the class B change goes to the node
//! in Talos's `TRY` mode with a bounded timeout; Ichor checks the node's
//! health and confirms the change with a no-reboot apply of the same config
//! only when the checks pass. When they do not, Talos puts the previous
//! config back on its own timer; Ichor sees it come back, records the
//! revision as reverted by try and holds the machine (reason TryReverted)
//! until its spec changes, so the change is not tried again in a loop.
//!
//! A reconcile never waits for the timeout: the try in flight is kept in
//! `status.tryApply` and the machine is looked at again soon
//! ([`look_again`]). The decisions ([`judge`], [`held_by_revert`]) are pure.

use std::collections::BTreeSet;
use std::time::Duration;

use ichor_api::apply::{ApplyMode as ApplyModeSetting, TryApply, TryPhase};
use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::history::{RevisionApplyMode, RevisionOutcome};
use ichor_api::{DriftClass, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::machine::ApplyPlan;
use ichor_render::RenderInput;
use ichor_talos::config::ParsedConfig;
use ichor_talos_client::{ApplyMode, ApplyRequest, TalosClient};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;

use super::Note;
use super::read::talos_error;
use crate::{Context, Error, Result};

/// What to do with a try in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Look again after this long (the checks have not passed yet, or it is
    /// too early to judge, or too late to confirm).
    Wait(Duration),
    /// The checks pass: confirm the change with a no-reboot apply.
    Confirm,
    /// The node no longer runs the config tried: Talos put the previous one back.
    Reverted,
    /// The machine moved on (held, or a spec that renders another config):
    /// the try is left to Talos's timer, whose time has now passed.
    Superseded,
}

/// What a reconcile saw of a try in flight.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen {
    /// The machine still asks for the config tried: released, with a render
    /// of the same hash.
    pub wanted: bool,
    /// The node's live config is the config tried (no class B or C drift
    /// against the render).
    pub runs_tried: bool,
    /// Why the health checks fail, `None` when they pass.
    pub unhealthy: Option<String>,
}

/// The try's timeout, as its status records it.
fn timeout_of(t: &TryApply) -> Duration {
    let ms = t.reverts_at.0.as_millisecond() - t.started.0.as_millisecond();
    Duration::from_millis(ms.max(0) as u64)
}

fn after(t: &Time, d: Duration) -> Time {
    Time(Timestamp::from_millisecond(t.0.as_millisecond() + d.as_millis() as i64).unwrap_or(t.0))
}

fn until(from: &Time, to: &Time) -> Duration {
    Duration::from_millis((to.0.as_millisecond() - from.0.as_millisecond()).max(0) as u64)
}

/// How long after the apply the checks are first judged: half the timeout,
/// so a node that gets worse has had time to show it.
fn settle(t: &TryApply) -> Duration {
    timeout_of(t) / 2
}

/// How close to the revert Ichor no longer confirms (so a confirmation never
/// races Talos's timer): a tenth of the timeout, at most 5s.
fn margin(t: &TryApply) -> Duration {
    (timeout_of(t) / 10).min(Duration::from_secs(5))
}

/// How often a try in flight is looked at.
fn poll(t: &TryApply) -> Duration {
    (timeout_of(t) / 20).clamp(Duration::from_millis(500), Duration::from_secs(5))
}

/// The decision on a try in flight.
pub(super) fn judge(t: &TryApply, seen: &Seen, now: &Time) -> Step {
    if !seen.wanted {
        // Unconfirmed, Talos reverts it at `reverts_at`: wait for that.
        let grace = after(&t.reverts_at, poll(t));
        return if now.0 >= grace.0 {
            Step::Superseded
        } else {
            Step::Wait(until(now, &grace))
        };
    }
    if !seen.runs_tried {
        return Step::Reverted;
    }
    let judged_from = after(&t.started, settle(t));
    if now.0 < judged_from.0 {
        return Step::Wait(until(now, &judged_from).max(Duration::from_millis(200)));
    }
    let last_call = Time(
        Timestamp::from_millisecond(t.reverts_at.0.as_millisecond() - margin(t).as_millis() as i64)
            .unwrap_or(t.reverts_at.0),
    );
    if now.0 >= last_call.0 {
        return Step::Wait(poll(t));
    }
    match seen.unhealthy {
        None => Step::Confirm,
        Some(_) => Step::Wait(poll(t)),
    }
}

/// The try in flight and the revisions as the API server has them now, for
/// a machine in try mode or with a try recorded: the reconcile's object
/// may come from a store that has not seen the last status write yet, and
/// a try forgotten (or confirmed twice) would write the node again.
pub(super) async fn refresh(
    target: &Target<'_>,
    mode: ApplyModeSetting,
    status: &mut TalosMachineStatus,
) -> Result<()> {
    if mode != ApplyModeSetting::Try && status.try_apply.is_none() {
        return Ok(());
    }
    let current = super::read::read_machine_now(target.machine, target.ctx).await?;
    if let Some(now) = current.status {
        status.try_apply = now.try_apply;
        status.revisions = now.revisions;
    }
    Ok(())
}

/// When to look at the machine again: soon while a try is in flight,
/// whatever its inputs (no waiting for the resync).
pub(super) fn look_again(status: &TalosMachineStatus) -> Option<Duration> {
    status
        .try_apply
        .as_ref()
        .filter(|t| t.phase == TryPhase::Trying)
        .map(poll)
}

/// The type of a reconcile's Event: a try reverted is a Warning.
pub(super) fn event_type(reason: &str) -> kube::runtime::events::EventType {
    if reason == reasons::TRY_REVERTED {
        kube::runtime::events::EventType::Warning
    } else {
        kube::runtime::events::EventType::Normal
    }
}

/// Whether a reverted try holds the machine: the same spec (generation)
/// rendering the same config. Clears a revert that no longer holds.
pub(super) fn held_by_revert(machine: &TalosMachine, status: &mut TalosMachineStatus) -> bool {
    let Some(t) = status.try_apply.as_ref() else {
        return false;
    };
    if t.phase != TryPhase::Reverted {
        return false;
    }
    let holds = t.machine_generation == machine.metadata.generation
        && status.config_hash.as_deref() == Some(t.config_hash.as_str());
    if !holds {
        status.try_apply = None;
    }
    holds
}

/// The conditions of a machine a reverted try holds.
pub(super) fn hold_conditions(machine: &TalosMachine, status: &mut TalosMachineStatus, now: &Time) {
    let Some(t) = status.try_apply.clone() else {
        return;
    };
    let generation = machine.metadata.generation;
    let why = format!(
        "revision {} was applied in try mode and not confirmed ({}), so Talos put the previous config back; Ichor applies nothing to this node until the TalosMachine's spec changes or its render gives another config (to try the same change again, set spec.hold: true and back to false)",
        t.revision,
        t.message
            .as_deref()
            .unwrap_or("the health checks did not pass")
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::HELD,
            Status::True,
            reasons::TRY_REVERTED,
            why.clone(),
            generation,
            now.clone(),
        ),
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::APPLIED,
            Status::False,
            reasons::TRY_REVERTED,
            format!("not applied: {why}"),
            generation,
            now.clone(),
        ),
    );
    // The reconcile set Held from spec.hold first: a hold that did not
    // change keeps the time it began.
    let before = machine.status.as_ref().map(|s| &s.conditions);
    for type_ in [types::HELD, types::APPLIED] {
        let since = before
            .and_then(|c| conditions::find(c, type_))
            .filter(|c| c.reason == reasons::TRY_REVERTED)
            .map(|c| c.last_transition_time.clone());
        if let (Some(since), Some(c)) = (
            since,
            status.conditions.iter_mut().find(|c| c.type_ == type_),
        ) {
            c.last_transition_time = since;
        }
    }
}

/// The machine a try is for, its cluster, its node's Talos API, and the
/// controller's context.
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub machine: &'a TalosMachine,
    pub cluster: &'a TalosCluster,
    pub talos: &'a TalosClient,
    pub ctx: &'a Context,
}

/// Applies `plan` in `TRY` mode with `timeout` and records the try in flight.
pub(super) async fn start(
    target: &Target<'_>,
    plan: &ApplyPlan,
    timeout: Duration,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let Target {
        machine,
        cluster,
        talos,
        ctx,
    } = *target;
    if let Some(note) = super::write::refused_since_read(machine, ctx, status, now).await? {
        return Ok(Some(note));
    }
    let generation = machine.metadata.generation;
    let mut request = ApplyRequest::new(plan.desired_yaml.clone().into_bytes(), ApplyMode::Try);
    request.try_timeout = Some(timeout);
    if let Err(e) = talos.apply_configuration("", &request).await {
        super::write::set_apply_refused(status, "try-mode", plan, &e, generation, now);
        return Err(talos_error(machine, e));
    }
    tracing::info!(machine = %machine.name_any(), paths = ?plan.paths, ?timeout, "applied class B drift in try mode");
    ctx.metrics.try_apply("tried");
    let (revision, kept) = super::history::record_apply_in(
        ctx,
        machine,
        cluster,
        plan,
        status,
        now,
        RevisionApplyMode::Try,
    )
    .await;
    let reverts_at = after(now, timeout);
    status.try_apply = Some(TryApply {
        phase: TryPhase::Trying,
        revision: revision.number,
        config_hash: status.config_hash.clone().unwrap_or_default(),
        machine_generation: generation,
        started: now.clone(),
        reverts_at: reverts_at.clone(),
        message: None,
    });
    let note = format!(
        "applied {} in try mode: Talos puts the previous config back at {} unless Ichor confirms the change once the node's health checks pass; {}",
        plan.paths.join(", "),
        reverts_at.0,
        super::write::revision_words(&revision, kept.err())
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::APPLIED,
            Status::Unknown,
            reasons::TRYING,
            note.clone(),
            generation,
            now.clone(),
        ),
    );
    Ok(Some((reasons::TRYING, note)))
}

/// Follows a try in flight: judges it ([`judge`]) on what the node and the
/// cluster show, and confirms it, records its revert, or waits.
pub(super) async fn follow(
    target: &Target<'_>,
    live: &ParsedConfig,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let Target {
        machine,
        talos,
        ctx,
        ..
    } = *target;
    let Some(mut t) = status.try_apply.clone() else {
        return Ok(None);
    };
    let wanted =
        !machine.spec.hold && status.config_hash.as_deref() == Some(t.config_hash.as_str());
    let runs_tried = !status.drift.iter().any(|e| e.class != DriftClass::A);
    let unhealthy = if wanted && runs_tried {
        health(machine, talos, ctx).await?
    } else {
        None
    };
    let seen = Seen {
        wanted,
        runs_tried,
        unhealthy: unhealthy.clone(),
    };
    if unhealthy.is_some() {
        t.message = unhealthy;
    }
    match judge(&t, &seen, now) {
        Step::Wait(_) => {
            status.try_apply = Some(t);
            Ok(None)
        }
        Step::Confirm => confirm(target, live, &t, status, now).await,
        Step::Reverted => {
            set_outcome(status, t.revision, RevisionOutcome::RevertedByTry);
            ctx.metrics.try_apply("reverted");
            t.phase = TryPhase::Reverted;
            status.try_apply = Some(t.clone());
            hold_conditions(machine, status, now);
            let note = format!(
                "revision {} was not confirmed ({}): Talos put the previous config back; the machine is held (Held=True, TryReverted) until its spec changes",
                t.revision,
                t.message
                    .as_deref()
                    .unwrap_or("the health checks did not pass in time")
            );
            Ok(Some((reasons::TRY_REVERTED, note)))
        }
        Step::Superseded => {
            set_outcome(status, t.revision, RevisionOutcome::RevertedByTry);
            ctx.metrics.try_apply("reverted");
            status.try_apply = None;
            Ok(None)
        }
    }
}

fn set_outcome(status: &mut TalosMachineStatus, revision: u64, outcome: RevisionOutcome) {
    if let Some(r) = status.revisions.iter_mut().find(|r| r.number == revision) {
        r.outcome = outcome;
    }
}

/// The no-reboot apply of the config tried (rendered again: the same hash is
/// the same config), which cancels Talos's revert.
async fn confirm(
    target: &Target<'_>,
    live: &ParsedConfig,
    t: &TryApply,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let Target {
        machine,
        cluster,
        talos,
        ctx,
    } = *target;
    let render = ichor_render::render_machine_from(
        &RenderInput::from_objects(cluster, machine, &live.config),
        &live.mappings,
    )?;
    let generation = machine.metadata.generation;
    if render.hash != t.config_hash {
        // The inputs moved on between two reads: judged again next time.
        return Ok(None);
    }
    let request = ApplyRequest::new(render.yaml()?.into_bytes(), ApplyMode::NoReboot);
    talos
        .apply_configuration("", &request)
        .await
        .map_err(|e| talos_error(machine, e))?;
    let key = super::write::metrics_key(machine);
    ctx.metrics.applied_to(&key, "applied", now.0.as_second());
    ctx.metrics.try_apply("confirmed");
    set_outcome(status, t.revision, RevisionOutcome::Applied);
    status.try_apply = None;
    let note = format!(
        "revision {} confirmed: the node's health checks passed, so the config tried was applied again in no-reboot mode (config hash {})",
        t.revision, t.config_hash
    );
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::APPLIED,
            Status::True,
            reasons::APPLIED,
            note.clone(),
            generation,
            now.clone(),
        ),
    );
    Ok(Some((reasons::APPLIED, note)))
}

/// Why the node is not healthy, `None` when it is: its Node Ready (the
/// operations' `nodes-ready` gate, on this node), and every Talos service
/// machined runs neither failed nor reporting an unhealthy check.
async fn health(
    machine: &TalosMachine,
    talos: &TalosClient,
    ctx: &Context,
) -> Result<Option<String>> {
    let services = talos
        .services("")
        .await
        .map_err(|e| talos_error(machine, e))?;
    if let Some(s) = services
        .iter()
        .find(|s| s.state == "Failed" || (!s.health_unknown && !s.healthy))
    {
        return Ok(Some(format!(
            "Talos service {} is {}{}",
            s.id,
            if s.state == "Failed" {
                "Failed"
            } else {
                "unhealthy"
            },
            if s.health_message.is_empty() {
                String::new()
            } else {
                format!(": {}", s.health_message)
            }
        )));
    }
    let name = talos
        .nodename("")
        .await
        .map_err(|e| talos_error(machine, e))?
        .nodename;
    let node = Api::<Node>::all(ctx.client.clone())
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading Node {name}")))?;
    Ok(node.and_then(|n| {
        ichor_gate::builtin::nodes_ready(&[n], &BTreeSet::new()).map(|f| {
            format!(
                "{} {}",
                f.object.unwrap_or_default(),
                f.value.unwrap_or_default()
            )
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Time {
        Time(Timestamp::from_millisecond(ms).unwrap())
    }

    /// A 10s try started at 0.
    fn trying() -> TryApply {
        TryApply {
            phase: TryPhase::Trying,
            revision: 3,
            config_hash: "h".into(),
            machine_generation: Some(2),
            started: at(0),
            reverts_at: at(10_000),
            message: None,
        }
    }

    fn seen(wanted: bool, runs_tried: bool, unhealthy: Option<&str>) -> Seen {
        Seen {
            wanted,
            runs_tried,
            unhealthy: unhealthy.map(String::from),
        }
    }

    /// Covers: R16.3
    #[test]
    fn a_try_is_confirmed_only_when_healthy_after_it_settled_and_before_the_revert() {
        let t = trying();
        let healthy = seen(true, true, None);
        // Too early to judge: the node has had no time to get worse.
        assert!(matches!(judge(&t, &healthy, &at(1_000)), Step::Wait(_)));
        assert_eq!(judge(&t, &healthy, &at(5_000)), Step::Confirm);
        let sick = seen(true, true, Some("Node w-1 Ready=False"));
        assert!(matches!(judge(&t, &sick, &at(5_000)), Step::Wait(_)));
        // Too close to Talos's revert: never confirmed then.
        assert!(matches!(judge(&t, &healthy, &at(9_500)), Step::Wait(_)));
        // The config came back: reverted, whatever the time.
        assert_eq!(
            judge(&t, &seen(true, false, None), &at(10_200)),
            Step::Reverted
        );
    }

    /// Covers: R16.3
    #[test]
    fn a_try_the_machine_moved_away_from_is_left_to_the_timer() {
        let t = trying();
        let moved = seen(false, true, None);
        assert!(matches!(judge(&t, &moved, &at(5_000)), Step::Wait(_)));
        assert_eq!(judge(&t, &moved, &at(11_000)), Step::Superseded);
    }

    /// Covers: R16.3
    #[test]
    fn a_revert_holds_until_the_spec_or_the_render_changes() {
        let mut m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "w-1", "namespace": "ns", "generation": 2},
            "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": "10.5.0.3", "hold": false}
        }))
        .unwrap();
        let mut status = TalosMachineStatus {
            config_hash: Some("h".into()),
            try_apply: Some(TryApply {
                phase: TryPhase::Reverted,
                ..trying()
            }),
            ..TalosMachineStatus::default()
        };
        assert!(held_by_revert(&m, &mut status));
        hold_conditions(&m, &mut status, &at(0));
        let held = conditions::find(&status.conditions, types::HELD).unwrap();
        assert_eq!(
            (held.status.as_str(), held.reason.as_str()),
            ("True", reasons::TRY_REVERTED)
        );
        m.metadata.generation = Some(4);
        assert!(!held_by_revert(&m, &mut status));
        assert!(status.try_apply.is_none());
    }
}
