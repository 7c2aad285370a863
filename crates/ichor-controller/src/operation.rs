//! The TalosOperation reconciler (kinds `talos-upgrade` and `reboot`).
//!
//! read (the operation, its cluster and machines) → plan or next step
//! ([`ichor_reconcile::operation`], pure) → one step at a time, each recorded
//! in `status` before it runs, so a restarted controller resumes where the
//! status says and never repeats a finished machine. The plan is written
//! before anything is touched. Per machine: etcd healthy (control planes),
//! pull the installer, write it to the other slot, cordon and drain through
//! the Eviction API (PodDisruptionBudgets honoured, no forced deletion),
//! forfeit etcd leadership, reboot, wait for a new boot id + the target
//! version + a Ready Node, uncordon. A cancel (deletion or the
//! `ichor.maesh.dev/cancel` annotation) stops before the next step.
//!
//! `kubernetes-upgrade` runs one component step at a time ([`kubernetes`]);
//! `ichor` is refused on a Helm install with the `helm upgrade` command.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::machine::MachineRole;
use ichor_api::operation::{
    MachineProgress, MachineStep, OperationKind, OperationPhase, PlanEntry, TalosOperation,
    TalosOperationStatus,
};
use ichor_api::selector::selects;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos_client::{ClientOptions, TalosClient};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::{Controller, watcher};

use crate::{Context, Error, Result, pipeline};
use ichor_reconcile::operation::{
    self as decide, EtcdMemberView, EtcdVerdict, MachineFacts, Next, PlanOutcome, ReturnVerdict,
    ReturnView,
};

pub mod ichor;
mod kubernetes;
pub mod manifests;

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosoperation";

pub use ichor_api::CANCEL_ANNOTATION;

/// Keeps a running operation until the controller has stopped it.
pub const FINALIZER: &str = "ichor.maesh.dev/operation";

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

/// Runs the TalosOperation controller until `shutdown`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ops: Api<DeserializeGuard<TalosOperation>> = match ctx.config.namespace.as_deref() {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let drive = Controller::new(ops, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(guarded_reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "TalosOperation reconcile");
            }
        });
    crate::drive_until_stopped("TalosOperation", drive, stop).await;
}

/// [`reconcile`] behind the unwind boundary: a panic fails this object only.
async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

async fn publish(ctx: &Context, op: &TalosOperation, type_: EventType, reason: &str, note: String) {
    pipeline::publish_on(ctx, "TalosOperation", &op.metadata, type_, reason, note).await;
}

fn finished(status: &TalosOperationStatus) -> bool {
    matches!(
        status.phase,
        Some(OperationPhase::Succeeded | OperationPhase::Failed)
    )
}

fn cancel_requested(op: &TalosOperation) -> bool {
    op.metadata.deletion_timestamp.is_some() || op.annotations().contains_key(CANCEL_ANNOTATION)
}

async fn reconcile(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let cached = pipeline::readable(&ctx, &obj).await?;
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    // The status is where the operation is: read it from the API server,
    // not from the watch cache, which may not hold the last step written yet
    // (a stale step could repeat a reboot).
    let Some(fresh) = Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosOperation {namespace}/{name}"
        )))?
    else {
        return Ok(Action::await_change());
    };
    let op = &fresh;
    let mut status = op.status.clone().unwrap_or_default();
    if finished(&status) {
        set_finalizer(&ctx, op, false).await?;
        return Ok(Action::await_change());
    }
    if op.metadata.deletion_timestamp.is_none() {
        set_finalizer(&ctx, op, true).await?;
    }
    let mut run = Run {
        ctx: &ctx,
        op,
        namespace: namespace.clone(),
        clients: BTreeMap::new(),
    };
    let action = run.drive(&mut status).await;
    pipeline::write_status::<TalosOperation>(&ctx.client, &namespace, &name, &status).await?;
    if finished(&status) {
        set_finalizer(&ctx, op, false).await?;
    }
    action
}

/// Adds (`true`) or removes the finalizer when needed.
async fn set_finalizer(ctx: &Context, op: &TalosOperation, present: bool) -> Result<()> {
    let has = op.finalizers().iter().any(|f| f == FINALIZER);
    if has == present {
        return Ok(());
    }
    let mut list: Vec<String> = op
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_string());
    }
    let namespace = op.namespace().unwrap_or_default();
    let name = op.name_any();
    let patch = serde_json::json!({
        "metadata": { "finalizers": list, "resourceVersion": op.resource_version() }
    });
    match Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone already (its finalizer was the last one).
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "updating the finalizers of TalosOperation {namespace}/{name}"
        ))(e)),
    }
}

/// The outcome of one step of one machine.
enum StepOutcome {
    /// Done; the machine moves to its next step.
    Advanced,
    /// Not yet: why (a reason of `Waiting`) and what is awaited.
    Wait(&'static str, String),
    /// The machine failed: the reason (of `Complete`) and why.
    Failed(&'static str, String),
}

struct Run<'a> {
    ctx: &'a Context,
    op: &'a TalosOperation,
    namespace: String,
    clients: BTreeMap<String, TalosClient>,
}

impl Run<'_> {
    fn now(&self) -> Time {
        (self.ctx.clock)()
    }

    fn bounds(&self) -> &OperationBounds {
        &self.ctx.config.operation_bounds
    }

    async fn drive(&mut self, status: &mut TalosOperationStatus) -> Result<Action> {
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
        if self.op.spec.kind == OperationKind::KubernetesUpgrade {
            return self.drive_kubernetes(status).await;
        }
        loop {
            let cancel = self.cancel_now().await?;
            match decide::next(status, cancel) {
                Next::Succeed => {
                    let message = succeeded_message(status);
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

    /// The Skipped condition: which machines the operation left alone.
    fn set_skipped(&self, status: &mut TalosOperationStatus, skipped: &[String]) {
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

    fn set(
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

    async fn write(&self, status: &TalosOperationStatus) -> Result<()> {
        pipeline::write_status::<TalosOperation>(
            &self.ctx.client,
            &self.namespace,
            &self.op.name_any(),
            status,
        )
        .await
    }

    /// The cancel as it is now (read again: a step may have taken a while).
    async fn cancel_now(&self) -> Result<bool> {
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

    async fn finish(
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
        let from = (status.phase == Some(OperationPhase::Running)).then_some("Running");
        self.ctx
            .metrics
            .operation_phase(self.op.spec.kind.as_str(), from, phase_name);
        status.phase = Some(phase);
        status.completion_time = Some(self.now());
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
        let skipped = skipped_now(status);
        self.set_skipped(status, &skipped);
        let type_ = if ok {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(self.ctx, self.op, type_, reason, message).await;
    }

    /// Plans (or refuses) and writes the plan before anything is touched.
    async fn make_plan(&mut self, status: &mut TalosOperationStatus) -> Result<Action> {
        let spec = &self.op.spec;
        let cluster_name = spec.target.cluster_ref.name.clone();
        let cluster = Api::<TalosCluster>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(&cluster_name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosCluster {}/{cluster_name}",
                self.namespace
            )))?;
        let Some(cluster) = cluster else {
            status.start_time = Some(self.now());
            self.finish(
                status,
                OperationPhase::Failed,
                reasons::REFUSED,
                format!(
                    "TalosCluster {}/{cluster_name} does not exist; create the operation for an existing cluster",
                    self.namespace
                ),
            )
            .await;
            return Ok(Action::await_change());
        };
        let opted_in = self
            .op
            .annotations()
            .get(ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION)
            .is_some_and(|v| v == "true");
        if let Some(refusal) =
            decide::installer_image_refusal(spec.installer_image.as_deref(), opted_in)
        {
            status.start_time = Some(self.now());
            self.finish(status, OperationPhase::Failed, reasons::REFUSED, refusal)
                .await;
            return Ok(Action::await_change());
        }
        let facts = self.machine_facts(&cluster_name, &cluster).await?;
        let now = self.now();
        status.start_time = Some(now.clone());
        match decide::plan(spec, &facts, self.ctx.config.node_name.as_deref()) {
            PlanOutcome::Refused { reason, message } => {
                self.finish(status, OperationPhase::Failed, reason, message)
                    .await;
                Ok(Action::await_change())
            }
            PlanOutcome::Plan(plan) => {
                if spec.kind == OperationKind::KubernetesUpgrade
                    && let Some((reason, message)) =
                        self.kubernetes_refusal(&plan, &cluster).await?
                {
                    self.finish(status, OperationPhase::Failed, reason, message)
                        .await;
                    return Ok(Action::await_change());
                }
                Ok(self.start_plan(status, plan, &facts, &now).await)
            }
        }
    }

    /// Kind ichor on a Helm install: refused at once with the `helm
    /// upgrade` command (R4.6a); the operation writes nothing.
    async fn refuse_kind_ichor(&self, status: &mut TalosOperationStatus) -> Action {
        let spec = &self.op.spec;
        let message = format!(
            "Ichor was installed with Helm, so Helm upgrades it: helm upgrade ichor <chart> --namespace {} --version {} (the operation writes nothing)",
            self.ctx.config.system_namespace,
            spec.version
                .as_deref()
                .unwrap_or("<version>")
                .trim_start_matches('v')
        );
        status.start_time = Some(self.now());
        self.finish(status, OperationPhase::Failed, reasons::REFUSED, message)
            .await;
        Action::await_change()
    }

    /// What the plan needs to know of each TalosMachine of cluster
    /// `cluster_name`, its Node name asked of the node itself.
    async fn machine_facts(
        &mut self,
        cluster_name: &str,
        cluster: &TalosCluster,
    ) -> Result<Vec<MachineFacts>> {
        let machines = self.machines(cluster_name).await?;
        let mut facts = Vec::with_capacity(machines.len());
        for m in &machines {
            // The Node name from the node itself; the machine's name when it does not answer.
            let node_name = match self.client(m, cluster).await {
                Ok(c) => c.nodename("").await.ok().map(|n| n.nodename),
                Err(_) => None,
            }
            .filter(|n| !n.is_empty());
            facts.push(MachineFacts {
                name: m.name_any(),
                role: m.spec.role,
                held: m.spec.hold,
                node_name: node_name.or_else(|| Some(m.name_any())),
                talos_version: m.status.as_ref().and_then(|s| s.talos_version.clone()),
            });
        }
        Ok(facts)
    }

    /// Records a fresh `plan` in the status (its progress, what is skipped)
    /// and announces it; the machines start on the next pass, after the
    /// status write.
    async fn start_plan(
        &self,
        status: &mut TalosOperationStatus,
        plan: Vec<PlanEntry>,
        facts: &[MachineFacts],
        now: &Time,
    ) -> Action {
        let spec = &self.op.spec;
        status.machines = decide::initial_progress(&plan, now);
        for p in &mut status.machines {
            p.node_name = facts
                .iter()
                .find(|f| f.name == p.machine)
                .and_then(|f| f.node_name.clone());
        }
        let skipped = decide::skipped_summary(&plan);
        status.plan = plan;
        let order = status
            .plan
            .iter()
            .filter(|e| e.action != ichor_api::PlannedAction::Skip)
            .map(|e| e.machine.as_str())
            .collect::<Vec<_>>()
            .join(" → ");
        self.set_skipped(status, &skipped);
        publish(
            self.ctx,
            self.op,
            EventType::Normal,
            "Planned",
            format!("{}: {order}", spec.kind.as_str()),
        )
        .await;
        if spec.kind == OperationKind::KubernetesUpgrade {
            status.components = decide::component_plan(&status.plan);
        }
        if spec.dry_run {
            self.finish(
                status,
                OperationPhase::Succeeded,
                reasons::DRY_RUN,
                format!("dry run: the plan is written ({order}); nothing was touched"),
            )
            .await;
            return Action::await_change();
        }
        self.ctx
            .metrics
            .operation_phase(spec.kind.as_str(), None, "Running");
        status.phase = Some(OperationPhase::Running);
        status.message = Some(format!("planned: {order}"));
        // The plan is written before any step (the status write follows).
        Action::requeue(Duration::from_millis(10))
    }

    async fn machines(&self, cluster: &str) -> Result<Vec<TalosMachine>> {
        let list = Api::<TalosMachine>::namespaced(self.ctx.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(format!(
                "listing the TalosMachines of {}",
                self.namespace
            )))?;
        Ok(list
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_ref.name == cluster)
            .collect())
    }

    async fn client(&mut self, m: &TalosMachine, cluster: &TalosCluster) -> Result<TalosClient> {
        let name = m.name_any();
        if let Some(c) = self.clients.get(&name) {
            return Ok(c.clone());
        }
        let endpoint = crate::machine::endpoint(&m.spec.address, self.ctx.config.talos_port);
        let client = self
            .ctx
            .credentials
            .talos_client(
                &self.ctx.client,
                cluster,
                &endpoint,
                ClientOptions {
                    call_timeout: self.ctx.config.talos_call_timeout,
                    ..ClientOptions::default()
                },
            )
            .await?
            .map_err(|e| talos_error(m, e))?;
        self.clients.insert(name, client.clone());
        Ok(client)
    }

    /// Runs `step` of `machine` and records the result in its progress.
    async fn step(
        &mut self,
        status: &mut TalosOperationStatus,
        machine: &str,
        step: MachineStep,
    ) -> Result<StepOutcome> {
        let spec = self.op.spec.clone();
        let cluster_name = &spec.target.cluster_ref.name;
        let cluster = Api::<TalosCluster>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get(cluster_name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosCluster {}/{cluster_name}",
                self.namespace
            )))?;
        let m = Api::<TalosMachine>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(machine)
            .await
            .map_err(Error::kube(format!(
                "reading TalosMachine {}/{machine}",
                self.namespace
            )))?;
        let now = self.now();
        let index = status
            .machines
            .iter()
            .position(|p| p.machine == machine)
            .expect("next() names machines of the status");
        let Some(m) = m else {
            return Ok(self.fail(
                &mut status.machines[index],
                reasons::STEP_FAILED,
                format!("TalosMachine {}/{machine} is gone", self.namespace),
            ));
        };
        let role = m.spec.role;
        let outcome = self
            .run_step(&m, &cluster, role, &mut status.machines[index], step, &now)
            .await?;
        let p = &mut status.machines[index];
        match &outcome {
            StepOutcome::Advanced => {
                let took = p
                    .step_start_time
                    .as_ref()
                    .and_then(|s| Duration::try_from(now.0.duration_since(s.0)).ok())
                    .unwrap_or_default();
                self.ctx
                    .metrics
                    .operation_step(spec.kind.as_str(), step_name(p.step), took);
                let next = decide::step_after(spec.kind, role, p.step);
                if p.step == MachineStep::Skipped {
                    // Skipped at its start (held since the plan).
                } else {
                    p.step = next;
                    p.step_start_time = Some(now.clone());
                    // The words of the step it is in now, not of the one done.
                    p.message = Some(step_words(next, p, spec.version.as_deref()));
                    if next == MachineStep::Succeeded {
                        p.completion_time = Some(now.clone());
                        p.message = Some("done".to_string());
                        publish(
                            self.ctx,
                            self.op,
                            EventType::Normal,
                            "MachineDone",
                            format!("{machine}: done"),
                        )
                        .await;
                    }
                }
            }
            StepOutcome::Wait(_, message) => p.message = Some(message.clone()),
            StepOutcome::Failed(_, message) => {
                p.step = MachineStep::Failed;
                p.completion_time = Some(now.clone());
                p.message = Some(message.clone());
            }
        }
        Ok(outcome)
    }

    fn fail(&self, p: &mut MachineProgress, reason: &'static str, message: String) -> StepOutcome {
        p.step = MachineStep::Failed;
        p.completion_time = Some(self.now());
        p.message = Some(message.clone());
        StepOutcome::Failed(reason, message)
    }

    async fn run_step(
        &mut self,
        m: &TalosMachine,
        cluster: &TalosCluster,
        role: MachineRole,
        p: &mut MachineProgress,
        step: MachineStep,
        now: &Time,
    ) -> Result<StepOutcome> {
        let upgrade = self.op.spec.kind == OperationKind::TalosUpgrade;
        let talos = self.client(m, cluster).await?;
        let legacy = p
            .version_before
            .as_deref()
            .and_then(parse_minor)
            .is_some_and(|v| v < (1, 13));
        Ok(match step {
            MachineStep::Pending => self.start_machine(m, &talos, p, now).await,
            MachineStep::CheckingEtcd => self.check_etcd(&talos, p, now).await,
            MachineStep::Pulling => {
                if legacy {
                    // Before 1.13 the node pulls the installer itself during Upgrade.
                    return Ok(StepOutcome::Advanced);
                }
                let image = p.image.clone().unwrap_or_default();
                let talos = talos.clone().with_call_timeout(self.bounds().image);
                match talos.pull_installer("", &image).await {
                    Ok(_) => StepOutcome::Advanced,
                    Err(e) => step_failed(m, e),
                }
            }
            MachineStep::Upgrading => {
                if legacy {
                    // The legacy Upgrade reboots by itself: it runs at the reboot step, after the drain.
                    return Ok(StepOutcome::Advanced);
                }
                let image = p.image.clone().unwrap_or_default();
                let talos = talos.clone().with_call_timeout(self.bounds().image);
                match talos.lifecycle_upgrade("", &image).await {
                    Ok(_) => StepOutcome::Advanced,
                    Err(e) => step_failed(m, e),
                }
            }
            MachineStep::Draining => self.drain_step(p, now).await?,
            MachineStep::Rebooting => {
                let bound = self.bounds().node_return;
                reboot_machine(m, &talos, role, p, upgrade && legacy, (now, bound)).await
            }
            MachineStep::WaitingForReturn => self.await_return(&talos, p, now).await?,
            MachineStep::Uncordoning => {
                let node = p.node_name.clone().unwrap_or_else(|| p.machine.clone());
                self.cordon(&node, false).await?;
                StepOutcome::Advanced
            }
            MachineStep::Succeeded | MachineStep::Failed | MachineStep::Skipped => {
                StepOutcome::Advanced
            }
        })
    }

    /// Pending: skips a machine held since the plan; otherwise records what
    /// it runs before it is touched (version, boot id, Node name and, for a
    /// talos-upgrade, the installer image).
    async fn start_machine(
        &self,
        m: &TalosMachine,
        talos: &TalosClient,
        p: &mut MachineProgress,
        now: &Time,
    ) -> StepOutcome {
        let spec = &self.op.spec;
        if m.spec.hold {
            p.step = MachineStep::Skipped;
            p.completion_time = Some(now.clone());
            p.message = Some(decide::skipped_words(Some(decide::HELD)));
            return StepOutcome::Advanced;
        }
        let version = match talos.version("").await {
            Ok(v) => v.tag,
            Err(e) => return step_failed(m, e),
        };
        let boot_id = match talos.boot_id("").await {
            Ok(b) => b,
            Err(e) => return step_failed(m, e),
        };
        if let Ok(n) = talos.nodename("").await
            && !n.nodename.is_empty()
        {
            p.node_name = Some(n.nodename);
        }
        if spec.kind == OperationKind::TalosUpgrade {
            let live = talos.machine_config("").await.ok();
            let live_image = live.as_deref().and_then(install_image);
            p.image = Some(decide::installer_image(
                spec.installer_image.as_deref(),
                live_image.as_deref(),
                spec.version.as_deref().unwrap_or_default(),
            ));
        }
        p.start_time = Some(now.clone());
        p.version_before = Some(version);
        p.boot_id_before = Some(boot_id);
        p.message = Some("started".to_string());
        StepOutcome::Advanced
    }

    /// CheckingEtcd: the machine's etcd member must be healthy before its
    /// control plane goes down; waits for it up to the etcd bound.
    async fn check_etcd(
        &self,
        talos: &TalosClient,
        p: &MachineProgress,
        now: &Time,
    ) -> StepOutcome {
        let verdict = match talos.etcd_members("").await {
            Ok(members) => decide::etcd_verdict(
                &members
                    .into_iter()
                    .map(|m| EtcdMemberView {
                        id: m.id,
                        name: m.name,
                        is_learner: m.is_learner,
                    })
                    .collect::<Vec<_>>(),
                p.node_name.as_deref().unwrap_or(&p.machine),
            ),
            Err(e) => EtcdVerdict::Unhealthy(format!("the etcd member list failed: {e}")),
        };
        match verdict {
            EtcdVerdict::Healthy => StepOutcome::Advanced,
            EtcdVerdict::Unhealthy(why) => {
                let bound = self.bounds().etcd;
                if decide::bound_passed(p, now, bound) {
                    StepOutcome::Failed(
                        reasons::ETCD_UNHEALTHY,
                        format!(
                            "{why}, still after {bound:?}: the control plane was not taken down; make the member healthy (talosctl etcd members, talosctl service etcd) and create a new operation"
                        ),
                    )
                } else {
                    StepOutcome::Wait(reasons::WAITING_FOR_ETCD, why)
                }
            }
        }
    }

    /// Draining: drains the machine's Node; past the drain bound the machine
    /// fails and its Node goes back into service (it is not rebooted).
    async fn drain_step(&self, p: &MachineProgress, now: &Time) -> Result<StepOutcome> {
        let node = p.node_name.clone().unwrap_or_else(|| p.machine.clone());
        Ok(match self.drain(&node).await? {
            DrainState::Done => StepOutcome::Advanced,
            DrainState::Blocked(why) => {
                let bound = self.bounds().drain;
                if decide::bound_passed(p, now, bound) {
                    // Not rebooted: the node goes back into service.
                    self.cordon(&node, false).await?;
                    StepOutcome::Failed(
                        reasons::DRAIN_TIMEOUT,
                        format!(
                            "the drain of Node {node} did not finish within {bound:?}: {why}; no pod was deleted by force, the node was not rebooted and is uncordoned again"
                        ),
                    )
                } else {
                    StepOutcome::Wait(reasons::WAITING_FOR_DRAIN, why)
                }
            }
        })
    }

    /// WaitingForReturn: the rebooted machine is back when it has a new boot
    /// id, runs the target version and its Node is Ready; fails past the
    /// return bound, or at once when it booted the old version.
    async fn await_return(
        &self,
        talos: &TalosClient,
        p: &mut MachineProgress,
        now: &Time,
    ) -> Result<StepOutcome> {
        let spec = &self.op.spec;
        let node = p.node_name.clone().unwrap_or_else(|| p.machine.clone());
        let seen = ReturnView {
            boot_id: talos.boot_id("").await.ok(),
            version: talos.version("").await.ok().map(|v| v.tag),
            node_ready: self.node_ready(&node).await?,
        };
        Ok(
            match decide::return_verdict(spec.kind, spec.version.as_deref(), p, &seen) {
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
                ReturnVerdict::NotYet(why) => {
                    let bound = self.bounds().node_return;
                    if decide::bound_passed(p, now, bound) {
                        StepOutcome::Failed(
                            reasons::RETURN_TIMEOUT,
                            format!("{why}, still after {bound:?}; check the node's console"),
                        )
                    } else {
                        StepOutcome::Wait(reasons::WAITING_FOR_RETURN, why)
                    }
                }
            },
        )
    }

    async fn node_ready(&self, node: &str) -> Result<bool> {
        let n = Api::<Node>::all(self.ctx.client.clone())
            .get_opt(node)
            .await
            .map_err(Error::kube(format!("reading Node {node}")))?;
        Ok(n.and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")))
    }

    async fn cordon(&self, node: &str, unschedulable: bool) -> Result<()> {
        let patch = serde_json::json!({ "spec": { "unschedulable": unschedulable } });
        Api::<Node>::all(self.ctx.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "{} Node {node}",
                if unschedulable {
                    "cordoning"
                } else {
                    "uncordoning"
                }
            )))?;
        Ok(())
    }

    /// Cordons, then asks the Eviction API to evict every pod on the node
    /// except DaemonSet and mirror pods. Done when none is left; blocked
    /// (naming the PodDisruptionBudget) while an eviction is refused.
    async fn drain(&self, node: &str) -> Result<DrainState> {
        self.cordon(node, true).await?;
        let pods = Api::<Pod>::all(self.ctx.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(Error::kube(format!("listing the pods on Node {node}")))?;
        let mut blocked = Vec::new();
        let mut left = 0usize;
        for pod in pods.items.iter().filter(|p| evictable(p)) {
            left += 1;
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let name = pod.name_any();
            // A budget that allows no disruption now is not asked: the API
            // server would answer 429 with a Retry-After the client waits out.
            if let Some(pdb) = self.blocking_pdb(pod).await? {
                blocked.push(format!(
                    "PodDisruptionBudget {ns}/{pdb} does not allow evicting pod {ns}/{name}"
                ));
                continue;
            }
            let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &ns);
            let params = EvictParams::default();
            match tokio::time::timeout(EVICTION_CALL, api.evict(&name, &params)).await {
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => left -= 1,
                Ok(Err(kube::Error::Api(e))) if e.code == 429 => {
                    let cause = e
                        .details
                        .as_ref()
                        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                        .map(|c| c.message.clone())
                        .unwrap_or_else(|| e.message.clone());
                    blocked.push(format!("the eviction of pod {ns}/{name} is refused: {cause}"));
                }
                Ok(Err(e)) => {
                    return Err(Error::kube(format!("evicting pod {ns}/{name} from Node {node}"))(e));
                }
                Err(_) => blocked.push(format!(
                    "the eviction of pod {ns}/{name} got no answer within {EVICTION_CALL:?} (the API server asks to retry later)"
                )),
            }
        }
        Ok(if !blocked.is_empty() {
            DrainState::Blocked(blocked.join("; "))
        } else if left == 0 {
            DrainState::Done
        } else {
            DrainState::Blocked(format!(
                "{left} pod(s) on Node {node} are still terminating"
            ))
        })
    }

    /// The PodDisruptionBudget that selects the pod and allows no
    /// disruption now (or has not been processed since its last change).
    async fn blocking_pdb(&self, pod: &Pod) -> Result<Option<String>> {
        let ns = pod.namespace().unwrap_or_default();
        let pdbs = Api::<PodDisruptionBudget>::namespaced(self.ctx.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(format!(
                "listing the PodDisruptionBudgets of {ns}"
            )))?;
        let labels = pod.labels();
        Ok(pdbs
            .items
            .iter()
            .filter(|pdb| {
                pdb.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|sel| selects(sel, labels))
            })
            .find(|pdb| {
                let processed = pdb.status.as_ref().is_some_and(|s| {
                    s.observed_generation.unwrap_or(0) >= pdb.metadata.generation.unwrap_or(0)
                });
                let allowed = pdb
                    .status
                    .as_ref()
                    .and_then(|s| s.disruptions_allowed)
                    .unwrap_or(0);
                !processed || allowed < 1
            })
            .map(|pdb| pdb.name_any()))
    }
}

/// Bound on one eviction call (the client retries a 429 after its Retry-After).
const EVICTION_CALL: Duration = Duration::from_secs(5);

enum DrainState {
    Done,
    Blocked(String),
}

/// Not DaemonSet pods (they come back at once) nor mirror pods (static pods
/// the kubelet owns), as kubectl drain skips them.
fn evictable(pod: &Pod) -> bool {
    let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    let done = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !daemon && !mirror && !done
}

/// The message of a succeeded operation, naming the machines it skipped.
fn succeeded_message(status: &TalosOperationStatus) -> String {
    let skipped = skipped_now(status);
    if skipped.is_empty() {
        "every machine is done".to_string()
    } else {
        format!("every machine is done; {}", skipped.join(", "))
    }
}

/// The skipped machines as the status says now: `w-2 skipped (held)`.
fn skipped_now(status: &TalosOperationStatus) -> Vec<String> {
    status
        .machines
        .iter()
        .filter(|p| p.step == MachineStep::Skipped)
        .map(|p| {
            format!(
                "{} {}",
                p.machine,
                p.message.as_deref().unwrap_or("skipped")
            )
        })
        .collect()
}

/// What a machine in `step` is doing, in words (its message until the step
/// says more).
fn step_words(step: MachineStep, p: &MachineProgress, version: Option<&str>) -> String {
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
fn step_name(step: MachineStep) -> &'static str {
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

fn parse_minor(v: &str) -> Option<(u64, u64)> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut parts = v.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The installer image of a live config: `machine.install.image` (v1alpha1)
/// or the `UnattendedInstallConfig` document's `installer.image`.
fn install_image(config: &[u8]) -> Option<String> {
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

/// A failed Talos API call fails the machine's step.
fn step_failed(m: &TalosMachine, e: ichor_talos_client::Error) -> StepOutcome {
    StepOutcome::Failed(reasons::STEP_FAILED, talos_error(m, e).to_string())
}

/// Rebooting: a control plane first hands its etcd leadership over (when it
/// has peers); `legacy_upgrade` runs the pre-1.13 Upgrade, which reboots by
/// itself, instead of a reboot. `(now, bound)`: how long a node that does
/// not answer is waited for.
async fn reboot_machine(
    m: &TalosMachine,
    talos: &TalosClient,
    role: MachineRole,
    p: &MachineProgress,
    legacy_upgrade: bool,
    (now, bound): (&Time, std::time::Duration),
) -> StepOutcome {
    // The step is entered again only when the reboot's result was not
    // recorded (a restart in between). A node that answers with another
    // boot id has rebooted. One that does not answer proves nothing — a
    // passing network error looks the same as a reboot — so it is waited
    // for, never taken as rebooted: the node would stay drained and cordoned.
    match talos.boot_id("").await {
        Err(e) => {
            let why = format!(
                "node {} does not answer ({e}); the reboot is issued or checked once it does",
                m.spec.address
            );
            return if decide::bound_passed(p, now, bound) {
                StepOutcome::Failed(
                    reasons::RETURN_TIMEOUT,
                    format!("{why}, still after {bound:?}; check the node's console"),
                )
            } else {
                StepOutcome::Wait(reasons::WAITING_FOR_RETURN, why)
            };
        }
        Ok(b) if p.boot_id_before.as_deref() != Some(b.as_str()) => {
            return StepOutcome::Advanced;
        }
        Ok(_) => {}
    }
    if role == MachineRole::Controlplane {
        let members = talos.etcd_members("").await.map(|m| m.len()).unwrap_or(0);
        if members > 1
            && let Err(e) = talos.etcd_forfeit_leadership("").await
        {
            return step_failed(m, e);
        }
    }
    let result = if legacy_upgrade {
        talos
            .legacy_upgrade("", p.image.as_deref().unwrap_or_default())
            .await
    } else {
        talos.reboot("").await
    };
    match result {
        Ok(_) => StepOutcome::Advanced,
        Err(e) => step_failed(m, e),
    }
}

fn talos_error(machine: &TalosMachine, source: ichor_talos_client::Error) -> Error {
    Error::Talos {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        source: Box::new(source),
    }
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
