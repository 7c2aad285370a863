//! Driving an operation: the next thing to do from the status alone, a
//! batch of machine steps each written before the next, the conditions,
//! and the end.

use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::operation::{
    MachineStep, OperationKind, OperationPhase, TalosOperation, TalosOperationStatus,
};
use ichor_reconcile::operation::{
    self as decide, Next, OperationBounds, StepOutcome, duration, path,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::window::Windowed;
use super::{Run, cancel_requested, publish};
use crate::{Error, Result, pipeline};

impl Run<'_> {
    pub(super) fn now(&self) -> Time {
        (self.ctx.clock)()
    }

    pub(super) fn bounds(&self) -> &OperationBounds {
        &self.ctx.config.operation_bounds
    }

    pub(super) async fn drive(&mut self, status: &mut TalosOperationStatus) -> Result<Action> {
        let generation = self.op.metadata.generation;
        status.observed_generation = generation;
        if self.op.spec.kind == OperationKind::Ichor {
            return if status.phase == Some(OperationPhase::Running) {
                self.drive_ichor(status).await
            } else {
                self.start_ichor_upgrade(status).await
            };
        }
        if status.plan.is_empty() {
            return self.make_plan(status).await;
        }
        if let Some(action) = self.before_machines(status).await? {
            return Ok(action);
        }
        if self.op.spec.kind == OperationKind::KubernetesUpgrade {
            return self.drive_kubernetes(status).await;
        }
        loop {
            let cancel = self.cancel_now().await?;
            let next = decide::next(status, cancel);
            if let Some(action) = self.health_gate(status, &next).await? {
                return Ok(action);
            }
            match next {
                Next::Succeed if path::next_hop(status).is_some() => {
                    self.next_hop(status).await?;
                    if let Some(action) = self.pre_pull_first(status).await? {
                        return Ok(action);
                    }
                }
                Next::Succeed => {
                    let message = decide::succeeded_message(status);
                    self.finish(
                        status,
                        OperationPhase::Succeeded,
                        reasons::SUCCEEDED,
                        message,
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                Next::Cancel => {
                    self.finish(
                        status,
                        OperationPhase::Failed,
                        reasons::CANCELLED,
                        "cancelled before the next step; machines not started are left as they were"
                            .to_string(),
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                Next::Fail { machine, message } => {
                    self.finish(
                        status,
                        OperationPhase::Failed,
                        reasons::STEP_FAILED,
                        format!("{machine}: {message}"),
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                Next::Steps(steps) => {
                    let steps = match self.gated(status, steps).await? {
                        Windowed::Go(steps) => steps,
                        Windowed::Stop(action) => return Ok(action),
                    };
                    if let Some(action) = self.run_batch(status, steps).await? {
                        return Ok(action);
                    }
                }
            }
        }
    }

    /// Runs the current step of each machine of a batch, writing the status
    /// after each. `None` when some machine advanced (the caller decides
    /// again at once); otherwise what to do: poll again while every machine
    /// waits, or stop when one failed.
    async fn run_batch(
        &mut self,
        status: &mut TalosOperationStatus,
        steps: Vec<(String, MachineStep)>,
    ) -> Result<Option<Action>> {
        let mut waiting = Vec::new();
        let mut advanced = false;
        for (machine, step) in steps {
            match self.step(status, &machine, step).await? {
                StepOutcome::Advanced => advanced = true,
                StepOutcome::Wait(reason, message) => {
                    waiting.push((reason, format!("{machine}: {message}")));
                }
                StepOutcome::Failed(reason, message) => {
                    let message = format!("{machine}: {message}");
                    self.finish(status, OperationPhase::Failed, reason, message)
                        .await;
                    return Ok(Some(Action::await_change()));
                }
            }
            // Every step is recorded before the next one runs.
            self.write(status).await?;
        }
        if !advanced {
            let (reason, _) = waiting
                .first()
                .cloned()
                .unwrap_or((reasons::NOT_WAITING, String::new()));
            let message = waiting
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            self.set(
                status,
                types::WAITING,
                Status::True,
                reason,
                message.clone(),
            );
            status.message = Some(message);
            return Ok(Some(Action::requeue(self.bounds().poll)));
        }
        let now_waiting = waiting.is_empty();
        if now_waiting {
            self.set(
                status,
                types::WAITING,
                Status::False,
                reasons::NOT_WAITING,
                String::new(),
            );
        }
        Ok(None)
    }

    /// What comes before any machine's step on each pass: the window, the
    /// silence kept, the pre-pull and the backup. `Some(action)` when the
    /// pass stops there.
    async fn before_machines(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Option<Action>> {
        if let Some(action) = self.window_first(status).await? {
            return Ok(Some(action));
        }
        self.keep_silence(status).await;
        if let Some(action) = self.pre_pull_first(status).await? {
            return Ok(Some(action));
        }
        self.backup_first(status).await
    }

    /// Every machine is done with the current hop: the next one starts
    /// (recorded before any of its steps).
    async fn next_hop(&self, status: &mut TalosOperationStatus) -> Result<()> {
        let Some(hop) = path::next_hop(status) else {
            return Ok(());
        };
        path::enter_hop(status, &hop, &self.now());
        let note = format!("every machine reached the previous hop; now to {hop}");
        status.message = Some(note.clone());
        publish(self.ctx, self.op, EventType::Normal, "NextHop", note).await;
        self.write(status).await
    }

    /// The Skipped condition: which machines the operation left alone.
    pub(super) fn set_skipped(&self, status: &mut TalosOperationStatus, skipped: &[String]) {
        let reason = if skipped.is_empty() {
            reasons::NONE_SKIPPED
        } else {
            reasons::MACHINES_SKIPPED
        };
        self.set(
            status,
            types::SKIPPED,
            Status::from(!skipped.is_empty()),
            reason,
            skipped.join(", "),
        );
    }

    pub(super) fn set(
        &self,
        status: &mut TalosOperationStatus,
        type_: &str,
        s: Status,
        reason: &str,
        message: String,
    ) {
        conditions::set(
            &mut status.conditions,
            conditions::new(
                type_,
                s,
                reason,
                message,
                self.op.metadata.generation,
                self.now(),
            ),
        );
    }

    pub(super) async fn write(&self, status: &TalosOperationStatus) -> Result<()> {
        let status = super::settled(status, self.op, self.now());
        pipeline::write_status::<TalosOperation>(
            &self.ctx.client,
            &self.namespace,
            &self.op.name_any(),
            &status,
        )
        .await
    }

    /// The cancel as it is now (read again: a step may have taken a while).
    pub(super) async fn cancel_now(&self) -> Result<bool> {
        if cancel_requested(self.op) {
            return Ok(true);
        }
        let name = self.op.name_any();
        let fresh = Api::<TalosOperation>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosOperation {}/{name}",
                self.namespace
            )))?;
        Ok(fresh.is_none_or(|o| cancel_requested(&o)))
    }

    pub(super) async fn finish(
        &self,
        status: &mut TalosOperationStatus,
        phase: OperationPhase,
        reason: &str,
        message: String,
    ) {
        let ok = phase == OperationPhase::Succeeded;
        let phase_name = if ok { "Succeeded" } else { "Failed" };
        self.ctx
            .metrics
            .operation_finished(self.op.spec.kind.as_str(), phase_name);
        let from = match status.phase {
            Some(OperationPhase::Running) => Some("Running"),
            Some(OperationPhase::Waiting) => Some("Waiting"),
            _ => None,
        };
        self.ctx
            .metrics
            .operation_phase(self.op.spec.kind.as_str(), from, phase_name);
        status.phase = Some(phase);
        status.completion_time = Some(self.now());
        if let Some(start) = &status.start_time {
            status.duration = Some(duration::words(duration::between(start, &self.now())));
        }
        self.expire_silence(status).await;
        status.next_window = None;
        status.message = Some(message.clone());
        self.set(
            status,
            types::COMPLETE,
            Status::from(ok),
            reason,
            message.clone(),
        );
        self.set(
            status,
            types::WAITING,
            Status::False,
            reasons::NOT_WAITING,
            String::new(),
        );
        let skipped = decide::skipped_now(status);
        self.set_skipped(status, &skipped);
        let type_ = if ok {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(self.ctx, self.op, type_, reason, message).await;
    }
}
