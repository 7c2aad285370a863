//! The plan: read the cluster's machines (each Node's name asked of the
//! node), ask `ichor_reconcile::operation::plan`, and write the plan before
//! anything is touched.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::conditions::reasons;
use ichor_api::operation::{OperationKind, OperationPhase, PlanEntry, TalosOperationStatus};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::operation::path::{self, MachinePathRefused};
use ichor_reconcile::operation::{self as decide, MachineFacts, PlanOutcome};
use ichor_talos_client::{ClientOptions, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::step::talos_error;
use super::{Run, publish};
use crate::{Error, Result};

impl Run<'_> {
    /// Plans (or refuses) and writes the plan before anything is touched.
    pub(super) async fn make_plan(&mut self, status: &mut TalosOperationStatus) -> Result<Action> {
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
                let hops = match talos_hops(spec, &plan, &facts) {
                    Ok(hops) => hops,
                    Err(refused) => {
                        let message = ichor_api::error_text::chain(&refused);
                        let reason = reasons::UNSUPPORTED_VERSION_PATH;
                        self.finish(status, OperationPhase::Failed, reason, message)
                            .await;
                        return Ok(Action::await_change());
                    }
                };
                Ok(self.start_plan(status, plan, &facts, &hops, &now).await)
            }
        }
    }

    /// Kind ichor on a Helm install: refused at once with the `helm
    /// upgrade` command (R4.6a); the operation writes nothing.
    pub(super) async fn refuse_kind_ichor(&self, status: &mut TalosOperationStatus) -> Action {
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
            // The Node name and the Talos version from the node itself; the
            // machine's name and its status when it does not answer.
            let (node_name, running) = match self.client(m, cluster).await {
                Ok(c) => (
                    c.nodename("").await.ok().map(|n| n.nodename),
                    c.version("").await.ok().map(|v| v.tag),
                ),
                Err(_) => (None, None),
            };
            let node_name = node_name.filter(|n| !n.is_empty());
            facts.push(MachineFacts {
                name: m.name_any(),
                role: m.spec.role,
                held: m.spec.hold,
                node_name: node_name.or_else(|| Some(m.name_any())),
                talos_version: running
                    .or_else(|| m.status.as_ref().and_then(|s| s.talos_version.clone())),
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
        hops: &BTreeMap<String, Vec<String>>,
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
        path::start_hops(status, hops, now);
        let skipped = decide::skipped_summary(&plan);
        status.plan = plan;
        let order = status
            .plan
            .iter()
            .filter(|e| e.action != ichor_api::PlannedAction::Skip)
            .map(|e| e.machine.as_str())
            .collect::<Vec<_>>()
            .join(" → ");
        let order = match path::hops_words(status) {
            Some(hops) => format!("{order}; through {hops}"),
            None => order,
        };
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

    pub(super) async fn client(
        &mut self,
        m: &TalosMachine,
        cluster: &TalosCluster,
    ) -> Result<TalosClient> {
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

    /// The operation's TalosCluster, which must exist once planned.
    pub(super) async fn cluster(&self) -> Result<TalosCluster> {
        let cluster_name = &self.op.spec.target.cluster_ref.name;
        Api::<TalosCluster>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get(cluster_name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosCluster {}/{cluster_name}",
                self.namespace
            )))
    }

    /// TalosMachine `name`, `None` when it is gone.
    pub(super) async fn machine(&self, name: &str) -> Result<Option<TalosMachine>> {
        Api::<TalosMachine>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosMachine {}/{name}",
                self.namespace
            )))
    }
}

/// A talos-upgrade's hops per upgraded machine, from the versions its
/// nodes run (none for the other kinds).
fn talos_hops(
    spec: &ichor_api::operation::TalosOperationSpec,
    plan: &[PlanEntry],
    facts: &[MachineFacts],
) -> std::result::Result<BTreeMap<String, Vec<String>>, MachinePathRefused> {
    let Some(target) = spec.version.as_deref() else {
        return Ok(BTreeMap::new());
    };
    if spec.kind != OperationKind::TalosUpgrade {
        return Ok(BTreeMap::new());
    }
    let versions = facts
        .iter()
        .filter_map(|f| Some((f.name.clone(), f.talos_version.clone()?)))
        .collect();
    path::machine_hops(target, plan, &versions)
}
