//! What the TalosMachine reconcile writes to the node: the class B apply
//! in no-reboot mode, the read-back, and what it recorded. (The status is
//! written by the reconcile itself.)

use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::machine::{
    ApplyPlan, drifted, inline_manifest_names, read_back_condition, still_released,
};
use ichor_talos_client::{ApplyMode, ApplyRequest, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;

use super::Note;
use super::read::{live_config_error, read_live, read_machine_now, talos_error};
use crate::{Context, Result};

/// Applies `plan` in no-reboot mode, reads the config back and records
/// the outcome ([`read_back_condition`]). Right before the apply the
/// machine is read again: a hold taken back (or a spec changed) since the
/// reconcile's read means no apply ([`still_released`]).
pub(super) async fn apply_and_read_back(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    talos: &TalosClient,
    ctx: &Context,
    plan: &ApplyPlan,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let generation = machine.metadata.generation;
    if let Some(note) = refused_since_read(machine, ctx, status, now).await? {
        return Ok(Some(note));
    }
    let request = ApplyRequest::new(plan.desired_yaml.clone().into_bytes(), ApplyMode::NoReboot);
    let key = metrics_key(machine);
    if let Err(e) = talos.apply_configuration("", &request).await {
        ctx.metrics.applied_to(&key, "failed", now.0.as_second());
        set_apply_refused(status, "no-reboot", plan, &e, generation, now);
        return Err(talos_error(machine, e));
    }
    tracing::info!(machine = %key, paths = ?plan.paths, "applied class B drift in no-reboot mode");
    let (revision, kept) =
        super::history::record_apply(ctx, machine, cluster, plan, status, now).await;
    let revision_note = revision_words(&revision, kept.err());
    let read_back = read_live(talos, machine).await?.config;
    status.inline_manifests = Some(inline_manifest_names(&read_back));
    let after = ichor_render::compare(&read_back, &plan.desired)?;
    status.drift = after.entries.clone();
    conditions::set(&mut status.conditions, drifted(&after, generation, now));
    let read_back_yaml = read_back
        .to_yaml()
        .map_err(|e| live_config_error(machine, e.into()))?;
    let hash = status.config_hash.clone().unwrap_or_default();
    let (applied, note) =
        read_back_condition(plan, &read_back_yaml, &after, &hash, generation, now);
    let outcome = if applied.status == "True" {
        "applied"
    } else {
        "read_back_mismatch"
    };
    ctx.metrics.applied_to(&key, outcome, now.0.as_second());
    conditions::set(&mut status.conditions, applied);
    let note = match note {
        Some(n) => format!("{n}; {revision_note}"),
        None => revision_note,
    };
    Ok(Some((reasons::APPLIED, note)))
}

/// Reads the machine again right before an apply: a hold taken back (or a
/// spec changed) since the reconcile's read means no apply
/// ([`still_released`]); the condition and the Event's note say why.
pub(super) async fn refused_since_read(
    machine: &TalosMachine,
    ctx: &Context,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let current = read_machine_now(machine, ctx).await?;
    let Some(refused) = still_released(machine, &current, now) else {
        return Ok(None);
    };
    let note = (
        if refused.reason == reasons::HOLD_TAKEN_BACK {
            reasons::HOLD_TAKEN_BACK
        } else {
            reasons::SPEC_CHANGED
        },
        refused.message.clone(),
    );
    conditions::set(&mut status.conditions, refused);
    Ok(Some(note))
}

/// The Event's words for a revision: its number, why, who, and the paths
/// (never values), and whether its inputs could not be kept.
pub(super) fn revision_words(
    revision: &ichor_api::history::MachineRevision,
    not_kept: Option<crate::Error>,
) -> String {
    let who = revision
        .changed_by
        .as_ref()
        .map_or("no spec change named a writer".to_owned(), |b| {
            format!("spec changed by {}", b.user)
        });
    let mut words = format!(
        "revision {} ({:?}, {who}): {}",
        revision.number,
        revision.reason,
        revision.changed_paths.join(", ")
    );
    if let Some(e) = not_kept {
        words.push_str(&format!(
            "; its inputs could not be kept for a rollback: {}",
            ichor_api::error_text::chain(&e)
        ));
    }
    words
}

/// The Applied condition of an apply the node refused (`mode`: how it was
/// asked, in words); the reconcile retries.
pub(super) fn set_apply_refused(
    status: &mut TalosMachineStatus,
    mode: &str,
    plan: &ApplyPlan,
    error: &ichor_talos_client::Error,
    generation: Option<i64>,
    now: &Time,
) {
    conditions::set(
        &mut status.conditions,
        conditions::new(
            types::APPLIED,
            Status::False,
            reasons::APPLY_FAILED,
            format!(
                "the node refused the {mode} apply of {}: {}; Ichor retries; check the node with talosctl",
                plan.paths.join(", "),
                ichor_api::error_text::chain(error)
            ),
            generation,
            now.clone(),
        ),
    );
}

/// The key a machine's apply metrics carry: `namespace/name`.
pub(super) fn metrics_key(machine: &TalosMachine) -> String {
    format!(
        "{}/{}",
        machine.namespace().unwrap_or_default(),
        machine.name_any()
    )
}
