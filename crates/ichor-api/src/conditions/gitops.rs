//! Where an object stands, in the three conditions GitOps tools read:
//! `Ready`, `Reconciling` and `Stalled`, the same way for every kind.
//!
//! | standing    | Ready   | Reconciling | Stalled | kstatus    | Argo CD     |
//! |-------------|---------|-------------|---------|------------|-------------|
//! | Ready       | True    | absent      | absent  | Current    | Healthy     |
//! | Progressing | Unknown | True        | absent  | InProgress | Progressing |
//! | Failing     | False   | absent      | absent  | InProgress | Degraded    |
//! | Stalled     | False   | absent      | True    | Failed     | Degraded    |
//!
//! Failing is a failure Ichor retries on its own (a node that does not
//! answer); Stalled is one that needs someone (a values file the chart
//! refuses, an operation that failed). Each kind says which of its states
//! is which in its own function here, from its status alone, so the
//! controllers, the tests and the docs agree. `docs/argocd/` holds the
//! health scripts that read the same conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::{Status, find, new, reasons, set, types};
use crate::backup::{BackupPhase, TalosBackupStatus};
use crate::operation::{OperationPhase, TalosOperationStatus};

/// The four standings of the table above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Standing {
    Ready,
    Progressing,
    Failing,
    Stalled,
}

impl Standing {
    /// The status `Ready` takes.
    pub fn ready(self) -> Status {
        match self {
            Standing::Ready => Status::True,
            Standing::Progressing => Status::Unknown,
            Standing::Failing | Standing::Stalled => Status::False,
        }
    }
}

/// A standing, with the reason and message that `Ready` (and `Reconciling`
/// or `Stalled`) carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub standing: Standing,
    pub reason: String,
    pub message: String,
}

impl Summary {
    pub fn new(standing: Standing, reason: &str, message: impl Into<String>) -> Self {
        Summary {
            standing,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// The standing `standing` with the reason and message of `c`.
    fn from_condition(standing: Standing, c: &Condition) -> Self {
        Summary::new(standing, &c.reason, c.message.clone())
    }
}

/// Writes `summary` into `conditions`: `Ready`, and `Reconciling` or
/// `Stalled` when the standing calls for one (the other is removed: Flux
/// allows at most one of them). A Ready object's conditions all carry
/// `generation`: each was evaluated in the reconcile that found it Ready,
/// which Flux's checker asks for.
pub fn settle(
    conditions: &mut Vec<Condition>,
    summary: &Summary,
    generation: Option<i64>,
    now: &Time,
) {
    let condition = |type_: &str, status: Status| {
        new(
            type_,
            status,
            &summary.reason,
            summary.message.clone(),
            generation,
            now.clone(),
        )
    };
    set(
        conditions,
        condition(types::READY, summary.standing.ready()),
    );
    for (type_, wanted) in [
        (
            types::RECONCILING,
            summary.standing == Standing::Progressing,
        ),
        (types::STALLED, summary.standing == Standing::Stalled),
    ] {
        if wanted {
            set(conditions, condition(type_, Status::True));
        } else {
            conditions.retain(|c| c.type_ != type_);
        }
    }
    if summary.standing == Standing::Ready {
        for c in conditions.iter_mut() {
            c.observed_generation = generation;
        }
    }
}

/// TalosCluster: from `Ready` of its machines (`machines_ready`, as
/// `ichor_reconcile::cluster::ready` builds it) and `CNIHandover`. A values
/// file that gives no effective values stalls it; a failed ichor-cni Job
/// (retried after a back-off) or a machine not Ready fails it; a hand-over
/// under way makes it Progressing.
pub fn cluster(machines_ready: &Condition, conditions: &[Condition]) -> Summary {
    let handover = find(conditions, types::CNI_HANDOVER).filter(|c| c.status != "True");
    let handover_reason = handover.map(|c| c.reason.as_str());
    if let Some(c) = handover.filter(|_| handover_reason == Some(reasons::INVALID_VALUES)) {
        return Summary::from_condition(Standing::Stalled, c);
    }
    if machines_ready.status != "True" {
        return Summary::from_condition(Standing::Failing, machines_ready);
    }
    match (handover, handover_reason) {
        (Some(c), Some(reasons::JOB_FAILED)) => Summary::from_condition(Standing::Failing, c),
        (
            Some(c),
            Some(
                reasons::WAITING_FOR_RELEASE
                | reasons::WAITING_FOR_DAEMON_SET
                | reasons::JOB_RUNNING
                | reasons::REMOVING_INLINE_MANIFEST,
            ),
        ) => Summary::from_condition(Standing::Progressing, c),
        _ => Summary::from_condition(Standing::Ready, machines_ready),
    }
}

/// TalosMachine: from its `Ready` (as `ichor_reconcile::machine::
/// ready_condition` builds it). A config that cannot be rendered (a bad
/// patch) stalls it; any other error is retried. Drift is not a failure:
/// a held machine with drift is what its owner asked for, and `Drifted`
/// says it.
pub fn machine(ready: &Condition) -> Summary {
    let standing = match (ready.status.as_str(), ready.reason.as_str()) {
        ("True", _) => Standing::Ready,
        (_, reasons::RENDER_FAILED) => Standing::Stalled,
        _ => Standing::Failing,
    };
    Summary::from_condition(standing, ready)
}

/// TalosOperation: from its phase. Pending, Running and Waiting (outside
/// its window) are Progressing; Paused (a failed health gate) is Failing;
/// Succeeded is Ready; Failed (refused, cancelled or failed) is Stalled,
/// with the reason of `Complete`.
pub fn operation(status: &TalosOperationStatus) -> Summary {
    let message = status.message.clone().unwrap_or_default();
    let complete = find(&status.conditions, types::COMPLETE);
    let done = |standing, fallback: &str| match complete {
        Some(c) => Summary::new(standing, &c.reason, non_empty(&c.message, &message)),
        None => Summary::new(standing, fallback, message.clone()),
    };
    match status.phase.unwrap_or_default() {
        OperationPhase::Pending => Summary::new(Standing::Progressing, reasons::PENDING, message),
        OperationPhase::Running => Summary::new(Standing::Progressing, reasons::RUNNING, message),
        OperationPhase::Waiting => {
            Summary::new(Standing::Progressing, reasons::OUTSIDE_WINDOW, message)
        }
        OperationPhase::Paused => {
            Summary::new(Standing::Failing, reasons::HEALTH_GATE_FAILED, message)
        }
        OperationPhase::Succeeded => done(Standing::Ready, reasons::SUCCEEDED),
        OperationPhase::Failed => done(Standing::Stalled, reasons::FAILED),
    }
}

/// TalosBackup: from its phase. A failed backup stays failed (a new
/// backup is a new object), so it is Stalled.
pub fn backup(status: &TalosBackupStatus) -> Summary {
    let message = status.message.clone().unwrap_or_default();
    match status.phase {
        BackupPhase::Pending => Summary::new(
            Standing::Progressing,
            reasons::PENDING,
            non_empty(&message, "waiting for the controller to take it"),
        ),
        BackupPhase::Running => Summary::new(
            Standing::Progressing,
            reasons::RUNNING,
            non_empty(&message, "the controller is taking it"),
        ),
        BackupPhase::Succeeded => Summary::new(
            Standing::Ready,
            reasons::BACKUP_SUCCEEDED,
            match &status.location {
                Some(at) => format!("written to {at}"),
                None => "written".to_owned(),
            },
        ),
        BackupPhase::Failed => Summary::new(Standing::Stalled, reasons::BACKUP_FAILED, message),
    }
}

fn non_empty(first: &str, otherwise: &str) -> String {
    if first.is_empty() {
        otherwise.to_owned()
    } else {
        first.to_owned()
    }
}

#[cfg(test)]
mod tests;
