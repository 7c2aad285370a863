//! Health gates: carries out what `ichor_gate` decides. Before a batch
//! starts (so before the operation's first machine, and after each machine
//! before the next), after the last machine, and before each component
//! step of a kubernetes-upgrade, the built-in gates (every
//! Node Ready, etcd healthy with all members, no control-plane static pod
//! crash-looping) and the spec's CEL checks are read and judged. A failing
//! one waits within its timeout, then pauses the operation (phase Paused,
//! `status.healthGate`); it runs again when the gate passes or the
//! operation carries `ichor.maesh.dev/skip-gates`.

use std::collections::BTreeSet;

use ichor_api::conditions::{Status, reasons, types};
use ichor_api::machine::{MachineRole, TalosMachine};
use ichor_api::operation::{
    ComponentPhase, HEALTH_CHECK_FAILED, HealthCheckTarget, MachineStep, OperationPhase,
    TalosOperationStatus,
};
use ichor_gate::builtin::{self, EtcdMember, EtcdRead, EtcdScope};
use ichor_gate::{CompiledCheck, GateDecision, GateFailure};
use ichor_reconcile::operation::Next;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery::{self, Scope};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Run, publish};
use crate::{Error, Result};

/// A check's target in words: `Deployment web/api`, `Pod web -l app=api`.
fn target_words(t: &HealthCheckTarget) -> String {
    let place = match (&t.namespace, &t.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        (Some(ns), None) => ns.clone(),
        (None, None) => "(all namespaces)".to_string(),
    };
    match &t.label_selector {
        Some(sel) => format!("{} {place} -l {sel}", t.kind),
        None => format!("{} {place}", t.kind),
    }
}

/// Whether `next` is a point the gates are judged at: a batch about to
/// start a machine, or the end.
fn gate_point(next: &Next) -> bool {
    match next {
        Next::Succeed => true,
        Next::Steps(steps) => steps.iter().any(|(_, s)| *s == MachineStep::Pending),
        Next::Cancel | Next::Fail { .. } => false,
    }
}

/// Before a batch holding a control plane, that machine's own etcd check
/// (bounded, failing the operation naming the member) judges the members'
/// health; the gate only sees that none is missing.
fn etcd_scope(status: &TalosOperationStatus, next: &Next) -> EtcdScope {
    let Next::Steps(steps) = next else {
        return EtcdScope::Full;
    };
    let control_plane = steps.iter().any(|(machine, _)| {
        status
            .plan
            .iter()
            .any(|p| &p.machine == machine && p.role == MachineRole::Controlplane)
    });
    if control_plane {
        EtcdScope::MembersOnly
    } else {
        EtcdScope::Full
    }
}

impl Run<'_> {
    /// `Some(action)` while a gate holds the operation (waiting within a
    /// check's timeout, or Paused); `None` to go on.
    pub(super) async fn health_gate(
        &mut self,
        status: &mut TalosOperationStatus,
        next: &Next,
    ) -> Result<Option<Action>> {
        if !gate_point(next) {
            return Ok(None);
        }
        self.judge_gates(status, etcd_scope(status, next)).await
    }

    /// kubernetes-upgrade: the gates before each component step begins
    /// (the component steps' own waits judge the step in flight).
    pub(super) async fn component_health_gate(
        &mut self,
        status: &mut TalosOperationStatus,
        phase: ComponentPhase,
    ) -> Result<Option<Action>> {
        if phase != ComponentPhase::Pending {
            return Ok(None);
        }
        self.judge_gates(status, EtcdScope::Full).await
    }

    /// Judges every gate now and carries out the decision.
    async fn judge_gates(
        &mut self,
        status: &mut TalosOperationStatus,
        etcd_scope: EtcdScope,
    ) -> Result<Option<Action>> {
        if self.op.spec.dry_run {
            return Ok(None);
        }
        let checks = match ichor_gate::compile_checks(&self.op.spec.health_checks) {
            Ok(c) => c,
            Err(e) => {
                // The webhook refuses these; only an operation written
                // without it gets here.
                let message = format!(
                    "{}; no further machine was started",
                    ichor_api::error_text::chain(&e)
                );
                self.finish(status, OperationPhase::Failed, reasons::REFUSED, message)
                    .await;
                return Ok(Some(Action::await_change()));
            }
        };
        let skip = ichor_gate::skipped(self.op.annotations());
        let (failure, timeout) = if skip {
            (None, 0)
        } else {
            self.first_failure(&checks, etcd_scope).await?
        };
        let now = self.now();
        match ichor_gate::decide(status.health_gate.as_ref(), failure, timeout, skip, &now) {
            GateDecision::Go => {
                self.gates_pass(status, skip);
                Ok(None)
            }
            GateDecision::Wait(gate) => {
                let message = ichor_gate::gate_message(&gate, false);
                status.health_gate = Some(gate);
                self.hold(status, message);
                Ok(Some(Action::requeue(self.bounds().poll)))
            }
            GateDecision::Pause(gate) => {
                let message = ichor_gate::gate_message(&gate, true);
                status.health_gate = Some(gate);
                if status.phase != Some(OperationPhase::Paused) {
                    let from = match status.phase {
                        Some(OperationPhase::Waiting) => Some("Waiting"),
                        _ => Some("Running"),
                    };
                    self.ctx
                        .metrics
                        .operation_phase(self.op.spec.kind.as_str(), from, "Paused");
                    publish(
                        self.ctx,
                        self.op,
                        EventType::Warning,
                        HEALTH_CHECK_FAILED,
                        message.clone(),
                    )
                    .await;
                }
                status.phase = Some(OperationPhase::Paused);
                self.hold(status, message);
                Ok(Some(Action::requeue(self.bounds().poll)))
            }
        }
    }

    fn hold(&self, status: &mut TalosOperationStatus, message: String) {
        status.message = Some(message.clone());
        self.set(
            status,
            types::WAITING,
            Status::True,
            HEALTH_CHECK_FAILED,
            message,
        );
    }

    /// Every gate passes (or is skipped): a Paused operation runs again.
    fn gates_pass(&self, status: &mut TalosOperationStatus, skip: bool) {
        let was = status.health_gate.take();
        if was.is_none() && status.phase != Some(OperationPhase::Paused) {
            return;
        }
        if status.phase == Some(OperationPhase::Paused) {
            self.ctx
                .metrics
                .operation_phase(self.op.spec.kind.as_str(), Some("Paused"), "Running");
            status.phase = Some(OperationPhase::Running);
        }
        status.message = Some(if skip {
            "health gates skipped (ichor.maesh.dev/skip-gates): machines start again".to_string()
        } else {
            "health gates pass: machines start again".to_string()
        });
        self.set(
            status,
            types::WAITING,
            Status::False,
            reasons::NOT_WAITING,
            String::new(),
        );
    }

    /// The first gate failing now, built-ins first, and its timeout.
    async fn first_failure(
        &mut self,
        checks: &[CompiledCheck],
        etcd_scope: EtcdScope,
    ) -> Result<(Option<GateFailure>, u64)> {
        let none = BTreeSet::new();
        let nodes = Api::<Node>::all(self.ctx.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(
                "listing Nodes for the health gates".to_string(),
            ))?;
        if let Some(f) = builtin::nodes_ready(&nodes.items, &none) {
            return Ok((Some(f), 0));
        }
        if let Some(f) = self.etcd_gate(etcd_scope).await? {
            return Ok((Some(f), 0));
        }
        let pods = Api::<Pod>::namespaced(self.ctx.client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(
                "listing kube-system's pods for the health gates".to_string(),
            ))?;
        if let Some(f) = builtin::static_pods(&pods.items, &none) {
            return Ok((Some(f), 0));
        }
        for (check, spec) in checks.iter().zip(&self.op.spec.health_checks) {
            let what = target_words(&spec.target);
            let failure = match self.select(&spec.target).await {
                Ok(objects) => ichor_gate::judge_check(check, &what, &objects),
                Err(e) => Some(GateFailure {
                    check: check.name.clone(),
                    object: Some(what),
                    value: Some(format!(
                        "reading failed: {}",
                        ichor_api::error_text::chain(&e)
                    )),
                }),
            };
            if failure.is_some() {
                return Ok((failure, check.timeout_secs));
            }
        }
        Ok((None, 0))
    }

    /// etcd through the Talos API of the cluster's first control plane:
    /// as many members as control planes, all started, none a learner.
    async fn etcd_gate(&mut self, scope: EtcdScope) -> Result<Option<GateFailure>> {
        let cluster = self.cluster().await?;
        let cluster_name = cluster.name_any();
        let mut control_planes: Vec<TalosMachine> =
            Api::<TalosMachine>::namespaced(self.ctx.client.clone(), &self.namespace)
                .list(&ListParams::default())
                .await
                .map_err(Error::kube(format!(
                    "listing the TalosMachines of {} for the health gates",
                    self.namespace
                )))?
                .items
                .into_iter()
                .filter(|m| {
                    m.spec.cluster_ref.name == cluster_name
                        && m.spec.role == MachineRole::Controlplane
                })
                .collect();
        control_planes.sort_by_key(|m| m.name_any());
        let Some(first) = control_planes.first() else {
            return Ok(None);
        };
        let read = match self.client(first, &cluster).await {
            Ok(talos) => match talos.etcd_members("").await {
                Ok(ms) => EtcdRead::Members(
                    ms.into_iter()
                        .map(|m| EtcdMember {
                            id: m.id,
                            name: m.name,
                            is_learner: m.is_learner,
                        })
                        .collect(),
                ),
                Err(e) => EtcdRead::Unreadable(ichor_api::error_text::chain(&e)),
            },
            Err(e) => EtcdRead::Unreadable(ichor_api::error_text::chain(&e)),
        };
        Ok(builtin::etcd_healthy(&read, control_planes.len(), scope))
    }

    /// The objects a check's target selects, each with the words naming it.
    async fn select(
        &self,
        t: &HealthCheckTarget,
    ) -> std::result::Result<Vec<(String, serde_json::Value)>, kube::Error> {
        let (group, version) = match t.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", t.api_version.as_str()),
        };
        let gvk = kube::api::GroupVersionKind::gvk(group, version, &t.kind);
        let (resource, caps) = discovery::pinned_kind(&self.ctx.client, &gvk).await?;
        let client = self.ctx.client.clone();
        let api: Api<DynamicObject> = match (&caps.scope, &t.namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &resource),
            _ => Api::all_with(client, &resource),
        };
        let objects = match &t.name {
            Some(name) => api.get_opt(name).await?.into_iter().collect::<Vec<_>>(),
            None => {
                let mut lp = ListParams::default();
                if let Some(sel) = &t.label_selector {
                    lp = lp.labels(sel);
                }
                api.list(&lp).await?.items
            }
        };
        Ok(objects
            .into_iter()
            .map(|o| {
                let name = match o.namespace() {
                    Some(ns) => format!("{} {ns}/{}", t.kind, o.name_any()),
                    None => format!("{} {}", t.kind, o.name_any()),
                };
                (name, serde_json::to_value(&o).unwrap_or_default())
            })
            .collect())
    }
}
