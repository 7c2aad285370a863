//! Maintenance windows: carries out what
//! `ichor_reconcile::operation::window` decides. Before a machine starts
//! its first step (and before the backup that precedes the first one), the
//! windows are read again (the operation's, else its cluster's); outside
//! them the operation is Waiting with `status.nextWindow` and looks again
//! at the next window's start. Machines already started go on.

use std::time::Duration;

use ichor_api::conditions::{Status, reasons, types};
use ichor_api::operation::{MachineStep, OperationPhase, TalosOperationStatus};
use ichor_api::window::OUTSIDE_MAINTENANCE_WINDOW;
use ichor_reconcile::operation::window::{self, StartGate, WindowVerdict};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Run, publish};
use crate::Result;

/// The longest a waiting operation goes without looking at its windows
/// again (they may be edited, and the clock may move).
const RECHECK_AT_MOST: Duration = Duration::from_secs(300);

/// What the windows say about the batch at hand.
pub(super) enum Windowed<T> {
    /// Go on with this.
    Go(T),
    /// Stop this reconcile with this action (waiting, or finished).
    Stop(Action),
}

impl Run<'_> {
    /// The verdict of the operation's windows now, and the field they come
    /// from. Windows that cannot be read (the webhook refuses them, so only
    /// a cluster written without it gets here) fail the operation.
    async fn verdict(
        &self,
        status: &mut TalosOperationStatus,
    ) -> Result<Windowed<(WindowVerdict, &'static str)>> {
        if self.op.spec.dry_run {
            return Ok(Windowed::Go((WindowVerdict::Always, window::SPEC_FIELD)));
        }
        let cluster_windows = match &self.op.spec.maintenance_windows {
            Some(_) => Vec::new(),
            None => self.cluster().await?.spec.maintenance_windows,
        };
        let (windows, field) = window::effective(
            self.op.spec.maintenance_windows.as_deref(),
            &cluster_windows,
        );
        match window::parse_windows(windows, field) {
            Ok(parsed) => {
                let now = window::from_time(&self.now());
                Ok(Windowed::Go((window::window_verdict(&parsed, now), field)))
            }
            Err(e) => {
                let message = format!(
                    "{}; no machine was started. Fix the window, or create the operation with its own spec.maintenanceWindows",
                    e
                );
                self.finish(status, OperationPhase::Failed, reasons::REFUSED, message)
                    .await;
                Ok(Windowed::Stop(Action::await_change()))
            }
        }
    }

    /// Before anything of the operation has started (its backup included):
    /// `Some(action)` while outside its windows.
    pub(super) async fn window_first(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Option<Action>> {
        if !window::nothing_started(status) {
            return Ok(None);
        }
        Ok(match self.verdict(status).await? {
            Windowed::Stop(action) => Some(action),
            Windowed::Go((WindowVerdict::Closed { next }, field)) => {
                Some(self.wait_for_window(status, next, field).await?)
            }
            Windowed::Go(_) => {
                self.in_window(status);
                None
            }
        })
    }

    /// The steps of a batch that may run now: machines that have not
    /// started wait outside the windows; machines in flight go on.
    pub(super) async fn gated(
        &mut self,
        status: &mut TalosOperationStatus,
        steps: Vec<(String, MachineStep)>,
    ) -> Result<Windowed<Vec<(String, MachineStep)>>> {
        if !steps.iter().any(|(_, s)| *s == MachineStep::Pending) {
            return Ok(Windowed::Go(steps));
        }
        let (verdict, field) = match self.verdict(status).await? {
            Windowed::Go(v) => v,
            Windowed::Stop(action) => return Ok(Windowed::Stop(action)),
        };
        Ok(match window::gate_starts(steps, &verdict) {
            StartGate::Run(steps) => {
                if !matches!(verdict, WindowVerdict::Closed { .. }) {
                    self.in_window(status);
                }
                Windowed::Go(steps)
            }
            StartGate::Wait { next } => {
                Windowed::Stop(self.wait_for_window(status, next, field).await?)
            }
        })
    }

    /// Whether a component step in `phase` (kubernetes-upgrade) may run
    /// now; `Stop` when it must wait for a window.
    pub(super) async fn component_gated(
        &mut self,
        status: &mut TalosOperationStatus,
        phase: ichor_api::operation::ComponentPhase,
    ) -> Result<Windowed<()>> {
        if phase != ichor_api::operation::ComponentPhase::Pending {
            return Ok(Windowed::Go(()));
        }
        let (verdict, field) = match self.verdict(status).await? {
            Windowed::Go(v) => v,
            Windowed::Stop(action) => return Ok(Windowed::Stop(action)),
        };
        if window::component_may_run(phase, &verdict) {
            self.in_window(status);
            return Ok(Windowed::Go(()));
        }
        let next = match verdict {
            WindowVerdict::Closed { next } => next,
            _ => None,
        };
        Ok(Windowed::Stop(
            self.wait_for_window(status, next, field).await?,
        ))
    }

    /// Waiting: the phase, `status.nextWindow`, the condition, and when to
    /// look again. A cancel while waiting ends the operation (no machine
    /// waiting to start was touched).
    async fn wait_for_window(
        &self,
        status: &mut TalosOperationStatus,
        next: Option<chrono::DateTime<chrono::Utc>>,
        field: &str,
    ) -> Result<Action> {
        if self.cancel_now().await? {
            self.finish(
                status,
                OperationPhase::Failed,
                reasons::CANCELLED,
                "cancelled while waiting for its maintenance window; machines not started are left as they were"
                    .to_string(),
            )
            .await;
            return Ok(Action::await_change());
        }
        let message = window::waiting_message(next, field);
        if status.phase != Some(OperationPhase::Waiting) {
            let from = match status.phase {
                Some(OperationPhase::Running) => Some("Running"),
                _ => None,
            };
            self.ctx
                .metrics
                .operation_phase(self.op.spec.kind.as_str(), from, "Waiting");
            publish(
                self.ctx,
                self.op,
                EventType::Normal,
                OUTSIDE_MAINTENANCE_WINDOW,
                message.clone(),
            )
            .await;
        }
        status.phase = Some(OperationPhase::Waiting);
        status.next_window = next.and_then(window::to_time);
        status.message = Some(message.clone());
        self.set(
            status,
            types::WAITING,
            Status::True,
            OUTSIDE_MAINTENANCE_WINDOW,
            message,
        );
        let now = window::from_time(&self.now());
        Ok(Action::requeue(window::recheck_after(
            next,
            now,
            RECHECK_AT_MOST,
        )))
    }

    /// Inside a window (or none set): a Waiting operation runs again.
    fn in_window(&self, status: &mut TalosOperationStatus) {
        if status.phase != Some(OperationPhase::Waiting) {
            return;
        }
        self.ctx
            .metrics
            .operation_phase(self.op.spec.kind.as_str(), Some("Waiting"), "Running");
        status.phase = Some(OperationPhase::Running);
        status.next_window = None;
        status.message = Some("inside its maintenance window: machines start again".to_string());
        self.set(
            status,
            types::WAITING,
            Status::False,
            reasons::NOT_WAITING,
            String::new(),
        );
    }
}
