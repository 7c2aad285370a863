//! The operations page and the page of one operation: its plan joined
//! with each machine's progress.

use std::collections::BTreeMap;

use ichor_api::conditions::{self, reasons, types};
use ichor_api::{OperationPhase, TalosOperation};
use kube::ResourceExt as _;

use super::*;

/// One operation in a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRow {
    pub namespace: String,
    pub name: String,
    pub kind: &'static str,
    pub cluster: String,
    pub version: Option<String>,
    /// Pending, Running, Waiting, Succeeded or Failed.
    pub phase: &'static str,
    pub message: Option<String>,
    /// Machines finished, of machines planned (skips count as finished).
    pub done: (usize, usize),
    /// When it was created (RFC 3339), for the order.
    pub created: String,
}

fn phase_name(op: &TalosOperation) -> &'static str {
    match op.status.as_ref().and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => "Pending",
        Some(OperationPhase::Running) => "Running",
        Some(OperationPhase::Waiting) => "Waiting",
        Some(OperationPhase::Paused) => "Paused",
        Some(OperationPhase::Succeeded) => "Succeeded",
        Some(OperationPhase::Failed) => "Failed",
    }
}

/// The row of one operation.
pub fn operation_row(op: &TalosOperation) -> OperationRow {
    let status = op.status.clone().unwrap_or_default();
    OperationRow {
        namespace: op.namespace().unwrap_or_default(),
        name: op.name_any(),
        kind: op.spec.kind.as_str(),
        cluster: op.spec.target.cluster_ref.name.clone(),
        version: op.spec.version.clone(),
        phase: phase_name(op),
        message: status.message.clone(),
        done: (
            status
                .machines
                .iter()
                .filter(|m| m.step.is_terminal())
                .count(),
            status.plan.len(),
        ),
        created: op
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    }
}

pub(super) fn sort_operations(rows: &mut [OperationRow]) {
    rows.sort_by(|a, b| {
        b.created
            .cmp(&a.created)
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
}

/// The operations page: every operation, newest first.
pub fn operations_page(inv: &Inventory) -> Vec<OperationRow> {
    let mut rows: Vec<OperationRow> = inv.operations.iter().map(|o| operation_row(o)).collect();
    sort_operations(&mut rows);
    rows
}

/// One machine of an operation: its plan entry and its progress, named by
/// the TalosMachine and its Node alike (one name per machine everywhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRow {
    pub machine: String,
    /// The Kubernetes Node, once the controller has recorded it.
    pub node: Option<String>,
    pub role: &'static str,
    pub batch: u32,
    /// upgrade, reboot or skip.
    pub action: &'static str,
    /// Why it is skipped or placed where it is.
    pub reason: Option<String>,
    /// Pending, Draining, Rebooting, …, Succeeded.
    pub step: String,
    pub message: Option<String>,
    pub version_before: Option<String>,
    pub version_after: Option<String>,
}

/// The page of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationPage {
    pub row: OperationRow,
    pub progress: Vec<ProgressRow>,
    pub conditions: Vec<ConditionRow>,
    /// Cancel is offered while the operation has not finished and the user may patch it.
    pub can_cancel: bool,
    /// Whether a cancel was already asked for.
    pub cancel_requested: bool,
}

pub use ichor_api::CANCEL_ANNOTATION;

/// The page of one operation; None when there is no such operation.
pub fn operation_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    perms: Permissions,
) -> Option<OperationPage> {
    let op = inv
        .operations
        .iter()
        .find(|o| o.namespace().as_deref() == Some(namespace) && o.name_any() == name)?;
    let status = op.status.clone().unwrap_or_default();
    let progress_of: BTreeMap<&str, &ichor_api::MachineProgress> = status
        .machines
        .iter()
        .map(|p| (p.machine.as_str(), p))
        .collect();
    let progress = status
        .plan
        .iter()
        .map(|e| {
            let p = progress_of.get(e.machine.as_str());
            ProgressRow {
                machine: e.machine.clone(),
                node: p.and_then(|p| p.node_name.clone()),
                role: role_name(e.role),
                batch: e.batch,
                action: match e.action {
                    ichor_api::PlannedAction::Upgrade => "upgrade",
                    ichor_api::PlannedAction::Reboot => "reboot",
                    ichor_api::PlannedAction::Skip => "skip",
                },
                reason: e.reason.clone(),
                step: p
                    .map(|p| format!("{:?}", p.step))
                    .unwrap_or_else(|| "Pending".into()),
                message: p.and_then(|p| p.message.clone()),
                version_before: p.and_then(|p| p.version_before.clone()),
                version_after: p.and_then(|p| p.version_after.clone()),
            }
        })
        .collect();
    let cancel_requested = op.annotations().contains_key(CANCEL_ANNOTATION);
    Some(OperationPage {
        row: operation_row(op),
        progress,
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionRow {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
        can_cancel: perms.patch_operations && !is_finished(op) && !cancel_requested,
        cancel_requested,
    })
}

/// Whether the operation was cancelled (its Complete condition says so).
pub fn was_cancelled(op: &TalosOperation) -> bool {
    op.status.as_ref().is_some_and(|s| {
        conditions::find(&s.conditions, types::COMPLETE)
            .is_some_and(|c| c.reason == reasons::CANCELLED)
    })
}
