//! A machine's step, carried out: the controller reads what the step looks
//! at, asks the step's transition (`ichor_reconcile::operation::step`),
//! carries out the effect it names, and records the outcome in the
//! machine's progress. Nothing here decides.

use ichor_api::conditions::reasons;
use ichor_api::operation::{
    MachineProgress, MachineStep, OperationKind, TalosOperationSpec, TalosOperationStatus,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::operation::step::{
    self, BootView, Effect, NodeStart, StartView, StepOutcome, Transition,
};
use ichor_reconcile::operation::{EtcdMemberView, ReturnView, duration, path, pre_pull};
use ichor_reconcile::why::Unanswered;
use ichor_talos_client::TalosClient;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::{Run, publish};
use crate::{Error, Result};

impl Run<'_> {
    /// Runs `step` of `machine` and records the result in its progress.
    pub(super) async fn step(
        &mut self,
        status: &mut TalosOperationStatus,
        machine: &str,
        step: MachineStep,
    ) -> Result<StepOutcome> {
        let op = self.op;
        let cluster = self.cluster().await?;
        let m = self.machine(machine).await?;
        let now = self.now();
        let index = status
            .machines
            .iter()
            .position(|p| p.machine == machine)
            .expect("next() names machines of the status");
        // The current hop's version and installer (the target's when the
        // operation has one hop).
        let spec = path::hop_spec(&op.spec, status);
        let image = status.machines[index].image.as_deref();
        let pulled_ahead = pre_pull::pulled_ahead(status, machine, image);
        let p = &mut status.machines[index];
        let Some(m) = m else {
            let gone = format!("TalosMachine {}/{machine} is gone", self.namespace);
            return Ok(step::fail(p, reasons::STEP_FAILED, gone, &now));
        };
        let role = m.spec.role;
        let outcome = if step == MachineStep::Pulling && pulled_ahead {
            StepOutcome::Advanced
        } else {
            self.run_step(&m, &cluster, &spec, p, step, &now).await?
        };
        if outcome == StepOutcome::Advanced {
            let took = step::took(p.step_start_time.as_ref(), &now);
            self.ctx
                .metrics
                .operation_step(op.spec.kind.as_str(), step::step_name(p.step), took);
        }
        let version = spec.version.as_deref();
        let done = step::record(op.spec.kind, role, p, &outcome, &now, version);
        if done || matches!(outcome, StepOutcome::Failed(..)) {
            p.duration = Some(duration::add(
                p.duration.as_deref(),
                p.start_time.as_ref(),
                &now,
            ));
        }
        if done {
            let done = format!("{machine}: done");
            publish(self.ctx, op, EventType::Normal, "MachineDone", done).await;
        }
        Ok(outcome)
    }

    /// Reads what `step` looks at, asks its transition, and carries out
    /// the effect.
    async fn run_step(
        &mut self,
        m: &TalosMachine,
        cluster: &TalosCluster,
        spec: &TalosOperationSpec,
        p: &mut MachineProgress,
        step: MachineStep,
        now: &Time,
    ) -> Result<StepOutcome> {
        let role = m.spec.role;
        let talos = self.client(m, cluster).await?;
        let bounds = self.bounds().clone();
        let transition = match step {
            MachineStep::Pending => {
                let seen = self.observe_start(m, &talos).await;
                step::start(spec, p, seen, now)
            }
            MachineStep::CheckingEtcd => {
                step::check_etcd(p, observe_etcd(&talos).await, now, bounds.etcd)
            }
            MachineStep::Pulling => step::pull(p),
            MachineStep::Upgrading => step::install(p),
            MachineStep::Draining => {
                let left = self.drain(&step::node_of(p)).await?;
                step::drain(p, left, now, bounds.drain)
            }
            MachineStep::Rebooting => {
                let seen = BootView {
                    address: m.spec.address.clone(),
                    boot_id: talos
                        .boot_id("")
                        .await
                        .map_err(|e| Unanswered(ichor_api::error_text::chain(&e))),
                };
                step::reboot(spec.kind, role, p, seen, now, bounds.node_return)
            }
            MachineStep::WaitingForReturn => {
                let seen = self.observe_return(&talos, p).await?;
                step::await_return(spec, p, seen, now, bounds.node_return)
            }
            MachineStep::Uncordoning => step::uncordon(p),
            MachineStep::Succeeded | MachineStep::Failed | MachineStep::Skipped => {
                return Ok(StepOutcome::Advanced);
            }
        };
        self.carry_out(m, &talos, transition).await
    }

    /// Carries out a transition's effect. A Talos effect the node refuses
    /// fails the step; a refused Kubernetes call fails the reconcile (which
    /// is retried, the step not recorded).
    async fn carry_out(
        &self,
        m: &TalosMachine,
        talos: &TalosClient,
        t: Transition,
    ) -> Result<StepOutcome> {
        let image_calls = || talos.clone().with_call_timeout(self.bounds().image);
        let refused = match t.effect {
            Effect::None => None,
            Effect::PullInstaller(image) => image_calls().pull_installer("", &image).await.err(),
            Effect::InstallInstaller(image) => {
                image_calls().lifecycle_upgrade("", &image).await.err()
            }
            Effect::Uncordon(node) => {
                self.cordon(&node, false).await?;
                None
            }
            Effect::Reboot {
                forfeit_leadership,
                legacy_image,
            } => reboot(talos, forfeit_leadership, legacy_image).await.err(),
        };
        Ok(match refused {
            Some(e) => step::refused(ichor_api::error_text::chain(&talos_error(m, e))),
            None => t.outcome,
        })
    }

    /// What a Pending machine's node runs. A held machine's node is not
    /// read: the transition skips it whatever it runs.
    async fn observe_start(&self, m: &TalosMachine, talos: &TalosClient) -> StartView {
        if m.spec.hold {
            return StartView::Held;
        }
        let words = |e| Unanswered(ichor_api::error_text::chain(&talos_error(m, e)));
        let version = match talos.version("").await {
            Ok(v) => v.tag,
            Err(e) => return StartView::Node(Err(words(e))),
        };
        let boot_id = match talos.boot_id("").await {
            Ok(b) => b,
            Err(e) => return StartView::Node(Err(words(e))),
        };
        let node_name = talos.nodename("").await.ok().map(|n| n.nodename);
        // Only a talos-upgrade writes an installer, named after the live one.
        let live_image = match self.op.spec.kind {
            OperationKind::TalosUpgrade => {
                let live = talos.machine_config("").await.ok();
                live.as_deref().and_then(step::install_image)
            }
            _ => None,
        };
        StartView::Node(Ok(NodeStart {
            version,
            boot_id,
            node_name,
            live_image,
        }))
    }

    /// What a rebooted machine looks like now.
    async fn observe_return(&self, talos: &TalosClient, p: &MachineProgress) -> Result<ReturnView> {
        Ok(ReturnView {
            boot_id: talos.boot_id("").await.ok(),
            version: talos.version("").await.ok().map(|v| v.tag),
            node_ready: self.node_ready(&step::node_of(p)).await?,
        })
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
}

/// The etcd member list, or why it could not be read.
async fn observe_etcd(talos: &TalosClient) -> std::result::Result<Vec<EtcdMemberView>, Unanswered> {
    let members = talos
        .etcd_members("")
        .await
        .map_err(|e| Unanswered(ichor_api::error_text::chain(&e)))?;
    Ok(members
        .into_iter()
        .map(|m| EtcdMemberView {
            id: m.id,
            name: m.name,
            is_learner: m.is_learner,
        })
        .collect())
}

/// Reboots the node: a control plane first forfeits its etcd leadership
/// when it has peers to hand it to; `legacy_image` runs the pre-1.13
/// Upgrade, which reboots by itself, instead of a reboot.
async fn reboot(
    talos: &TalosClient,
    forfeit_leadership: bool,
    legacy_image: Option<String>,
) -> std::result::Result<(), ichor_talos_client::Error> {
    if forfeit_leadership {
        let members = talos.etcd_members("").await.map(|m| m.len()).unwrap_or(0);
        if members > 1 {
            talos.etcd_forfeit_leadership("").await?;
        }
    }
    match legacy_image {
        Some(image) => talos.legacy_upgrade("", &image).await.map(drop),
        None => talos.reboot("").await.map(drop),
    }
}

pub(super) fn talos_error(machine: &TalosMachine, source: ichor_talos_client::Error) -> Error {
    Error::Talos {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        source: Box::new(source),
    }
}
