//! kubernetes-upgrade, run: one component step at a time, as `talosctl
//! upgrade-k8s` orders them (the checks at plan time are in [`checks`]).
//! Each step is a machine-config change this controller renders (the live
//! config with one image at the target, [`ichor_render::component_step`])
//! and applies in no-reboot mode, as a class B apply: the controller stays
//! the only writer of the node. A step is recorded before its write and
//! then waited for: the node's config resource names the new image and,
//! where Kubernetes shows it, the component's pod runs it and is Ready
//! (control plane) or the Node reports the new kubelet version and is Ready
//! (kubelet). What each phase does with what was read is decided in
//! `ichor_reconcile::operation::component`; here the reads and the writes.

use ichor_api::conditions::{Status, reasons, types};
use ichor_api::history::{RevisionApplyMode, RevisionReason};
use ichor_api::operation::{
    ComponentPhase, ComponentProgress, KubernetesComponent, OperationKind, OperationPhase,
    TalosOperationStatus,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::history::record;
use ichor_reconcile::operation::component::{self, ComponentEffect};
use ichor_reconcile::operation::step::took;
use ichor_reconcile::operation::{self as decide, NextComponent, StepOutcome};
use ichor_reconcile::why::{NotWritten, Waiting};
use ichor_talos::config::MachineConfig;
use ichor_talos_client::resources::KubernetesComponent as WireComponent;
use ichor_talos_client::{ApplyMode, ApplyRequest, TalosClient};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;

use super::Run;
use super::step::talos_error;
use super::window::Windowed;
use crate::machine::history::{self, WholeApply};
use crate::{Error, Result};

mod checks;

/// The component as the Talos API names its config resource; `None` for
/// the bootstrap-manifests step, which has none.
fn wire(c: KubernetesComponent) -> Option<WireComponent> {
    Some(match c {
        KubernetesComponent::ApiServer => WireComponent::ApiServer,
        KubernetesComponent::ControllerManager => WireComponent::ControllerManager,
        KubernetesComponent::Scheduler => WireComponent::Scheduler,
        KubernetesComponent::KubeProxy => WireComponent::KubeProxy,
        KubernetesComponent::Kubelet => WireComponent::Kubelet,
        KubernetesComponent::BootstrapManifests => return None,
    })
}

/// The image a node's Talos API reports for a component (`None` for the
/// bootstrap-manifests step).
async fn image_on(
    talos: &ichor_talos_client::TalosClient,
    c: KubernetesComponent,
) -> std::result::Result<Option<String>, ichor_talos_client::Error> {
    match wire(c) {
        Some(w) => talos.component_image("", w).await,
        None => Ok(None),
    }
}

impl Run<'_> {
    /// Runs the component steps until one waits, fails or all are done.
    pub(super) async fn drive_kubernetes(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Action> {
        loop {
            let cancel = self.cancel_now().await?;
            let (phase, reason, message) = match decide::next_component(status, cancel) {
                NextComponent::Step(i) => {
                    let phase = status.components[i].phase;
                    if let Windowed::Stop(action) = self.component_gated(status, phase).await? {
                        return Ok(action);
                    }
                    if let Some(action) = self.component_health_gate(status, phase).await? {
                        return Ok(action);
                    }
                    let outcome = self.component_step(status, i).await?;
                    match self.after_component(status, i, phase, outcome).await? {
                        Some(action) => return Ok(action),
                        None => continue,
                    }
                }
                NextComponent::Succeed => {
                    let to =
                        decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
                    let message = format!(
                        "{}; set spec.kubernetesVersion of TalosCluster {}/{} to {to}, so that Ichor's render agrees with the nodes (until then the image paths show as class C drift, which Ichor never applies)",
                        decide::succeeded_message(status),
                        self.namespace,
                        self.op.spec.target.cluster_ref.name
                    );
                    (OperationPhase::Succeeded, reasons::SUCCEEDED, message)
                }
                NextComponent::Cancel => (
                    OperationPhase::Failed,
                    reasons::CANCELLED,
                    "cancelled before the next component step; the steps done stay done, no other node was written".to_string(),
                ),
                NextComponent::Fail { step, message } => (
                    OperationPhase::Failed,
                    reasons::STEP_FAILED,
                    format!("{step}: {message}"),
                ),
            };
            self.finish(status, phase, reason, message).await;
            return Ok(Action::await_change());
        }
    }

    /// After component step `i` (in `phase` before it ran): the machines'
    /// steps follow the components', then an advanced step is written and
    /// the next one runs (`None`); a waiting one polls again; a failed one
    /// ends the operation.
    async fn after_component(
        &mut self,
        status: &mut TalosOperationStatus,
        i: usize,
        phase: ComponentPhase,
        outcome: StepOutcome,
    ) -> Result<Option<Action>> {
        let now = self.now();
        decide::machines_from_components(status, &now);
        match outcome {
            StepOutcome::Advanced => {
                let c = &status.components[i];
                self.ctx.metrics.operation_step(
                    OperationKind::KubernetesUpgrade.as_str(),
                    component::step_name(c.component, phase),
                    took(c.start_time.as_ref(), &now),
                );
                self.write(status).await?;
                Ok(None)
            }
            StepOutcome::Wait(reason, message) => {
                self.set(
                    status,
                    types::WAITING,
                    Status::True,
                    reason,
                    message.clone(),
                );
                status.message = Some(message);
                Ok(Some(Action::requeue(self.bounds().poll)))
            }
            StepOutcome::Failed(reason, message) => {
                let c = &status.components[i];
                let message = format!("{} on {}: {message}", c.component.as_str(), c.machine);
                self.finish(status, OperationPhase::Failed, reason, message)
                    .await;
                Ok(Some(Action::await_change()))
            }
        }
    }

    /// One component step: the machine may still be written
    /// ([`component::gate`]), then the phase's transition between what is
    /// read of the node and what is applied to it.
    async fn component_step(
        &mut self,
        status: &mut TalosOperationStatus,
        i: usize,
    ) -> Result<StepOutcome> {
        let cluster = self.cluster().await?;
        let now = self.now();
        let machine = status.components[i].machine.clone();
        let found = self.machine(&machine).await?;
        let m = match component::gate(&status.components[i], &self.namespace, found.as_ref()) {
            Ok(m) => m,
            Err((reason, message)) => {
                return Ok(component::fail(
                    &mut status.components[i],
                    reason,
                    message,
                    &now,
                ));
            }
        };
        let talos = self.client(m, &cluster).await?;
        if status.components[i].component == KubernetesComponent::BootstrapManifests {
            return self.manifests_step(status, i, m, &talos).await;
        }
        let version = decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
        let node = status
            .machines
            .iter()
            .find(|p| p.machine == machine)
            .and_then(|p| p.node_name.clone())
            .unwrap_or_else(|| machine.clone());
        let bound = self.bounds().component;
        let c = &mut status.components[i];
        match c.phase {
            ComponentPhase::Pending => {
                let before = image_on(&talos, c.component)
                    .await
                    .map_err(|e| talos_error(m, e))?;
                Ok(component::start(c, before, &version, &now))
            }
            ComponentPhase::Applying => {
                self.apply_component((m, &cluster), &talos, c, &version, &node, &now)
                    .await
            }
            ComponentPhase::Waiting => {
                let expected = c.image.clone().unwrap_or_default();
                let on_node = image_on(&talos, c.component)
                    .await
                    .map_err(|e| talos_error(m, e))?;
                let kube = self
                    .kube_side(c.component, &node, &expected, &version)
                    .await?;
                Ok(component::wait(c, on_node.as_deref(), kube, &now, bound))
            }
            ComponentPhase::Succeeded | ComponentPhase::Failed => Ok(StepOutcome::Advanced),
        }
    }

    /// Applying: reads the node's live config, and applies the config the
    /// transition names in no-reboot mode.
    async fn apply_component(
        &self,
        (m, cluster): (&TalosMachine, &TalosCluster),
        talos: &TalosClient,
        c: &mut ComponentProgress,
        version: &str,
        node: &str,
        now: &Time,
    ) -> Result<StepOutcome> {
        let machine = c.machine.clone();
        let bad = |e: ichor_talos::config::ConfigError| Error::LiveConfig {
            namespace: self.namespace.clone(),
            machine: machine.clone(),
            address: m.spec.address.clone(),
            source: Box::new(e.into()),
        };
        let live = talos
            .machine_config("")
            .await
            .map_err(|e| talos_error(m, e))?;
        let text = String::from_utf8_lossy(&live);
        let live = MachineConfig::parse_live(&text, &format!("the live config of {machine}"))
            .map_err(bad)?;
        let (effect, outcome) = component::apply(c, &live, version, node, now)?;
        let ComponentEffect::Apply { config, image } = effect else {
            return Ok(outcome);
        };
        let yaml = config.to_yaml().map_err(bad)?;
        let change = record::change(
            Some(&live.to_mappings().map_err(bad)?),
            &config.to_mappings().map_err(bad)?,
        );
        let request = ApplyRequest::new(yaml.clone().into_bytes(), ApplyMode::NoReboot);
        let refused = match talos.apply_configuration("", &request).await {
            Ok(_) => {
                tracing::info!(machine = %machine, component = c.component.as_str(), %image, "kubernetes-upgrade: applied in no-reboot mode");
                let apply = WholeApply {
                    reason: RevisionReason::Operation,
                    operation: self.op.metadata.name.as_deref(),
                    mode: RevisionApplyMode::NoReboot,
                    change,
                    rendered: &yaml,
                };
                // The step is written: a revision that cannot be recorded
                // must not make it run again.
                if let Err(e) = history::record_whole_on(self.ctx, m, cluster, apply, now).await {
                    tracing::warn!(machine = %machine, error = %ichor_api::error_text::chain(&e), "kubernetes-upgrade: the step's revision is not recorded");
                }
                None
            }
            Err(e) => Some(ichor_api::error_text::chain(&talos_error(m, e))),
        };
        Ok(component::written(c, image, refused, node, now))
    }

    /// The bootstrap-manifests step (see [`super::manifests`]): Pending
    /// records kube-proxy's image in the cluster; Applying reads the
    /// manifests the control plane renders for its new config, decides and
    /// applies (a rerun after a kill applies the same objects again, which
    /// changes nothing); Waiting reads kube-proxy's DaemonSet back.
    async fn manifests_step(
        &mut self,
        status: &mut TalosOperationStatus,
        i: usize,
        m: &TalosMachine,
        talos: &TalosClient,
    ) -> Result<StepOutcome> {
        let now = self.now();
        let c = &mut status.components[i];
        match c.phase {
            ComponentPhase::Pending => {
                let before = self.kube_proxy_image().await?;
                Ok(component::manifests_start(c, before, &now))
            }
            ComponentPhase::Applying => {
                let synced = self.sync_manifests(&c.machine, m, talos).await?;
                Ok(component::manifests_synced(c, synced, &now))
            }
            ComponentPhase::Waiting => {
                let live = self.kube_proxy_image().await?;
                Ok(component::manifests_wait(c, live, &now))
            }
            ComponentPhase::Succeeded | ComponentPhase::Failed => Ok(StepOutcome::Advanced),
        }
    }

    /// Reads the manifests `machine` renders, decides what to apply
    /// ([`super::manifests`]) and applies it: kube-proxy's image they name
    /// and the summary, or why nothing (more) was written.
    async fn sync_manifests(
        &self,
        machine: &str,
        m: &TalosMachine,
        talos: &TalosClient,
    ) -> Result<std::result::Result<(Option<String>, String), NotWritten>> {
        let rendered = talos.manifests("").await.map_err(|e| talos_error(m, e))?;
        let rendered: Vec<(String, Vec<serde_json::Value>)> = rendered
            .iter()
            .map(|(id, objects)| {
                (
                    id.clone(),
                    objects
                        .iter()
                        .map(super::manifests::struct_to_json)
                        .collect(),
                )
            })
            .collect();
        let objects = match super::manifests::objects(&rendered) {
            Ok(o) => o,
            Err(why) => {
                return Ok(Err(NotWritten(component::manifests_refusal(
                    machine,
                    &why.to_string(),
                ))));
            }
        };
        let plan = super::manifests::read(&self.ctx.client, objects).await?;
        if let Some(why) = super::manifests::sync(&self.ctx.client, &plan).await? {
            return Ok(Err(NotWritten(why)));
        }
        let summary = plan.summary();
        tracing::info!(machine = %machine, summary = %summary, "kubernetes-upgrade: bootstrap manifests synced");
        Ok(Ok((plan.kube_proxy_image(), summary)))
    }

    /// The image of kube-proxy's DaemonSet in the cluster, if there is one.
    async fn kube_proxy_image(&self) -> Result<Option<String>> {
        let ds = Api::<DaemonSet>::namespaced(self.ctx.client.clone(), "kube-system")
            .get_opt("kube-proxy")
            .await
            .map_err(Error::kube("reading DaemonSet kube-system/kube-proxy"))?;
        Ok(ds
            .and_then(|d| d.spec.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.image))
    }

    /// What Kubernetes shows of the component on the node, as `talosctl
    /// upgrade-k8s` waits for it: the control-plane component's pod on the
    /// node (label `k8s-app`) runs `image` and is Ready; the Node reports
    /// the kubelet `version` and is Ready. kube-proxy runs from the
    /// bootstrap manifests' DaemonSet, not per node: only the node's config
    /// is waited for.
    async fn kube_side(
        &self,
        component: KubernetesComponent,
        node: &str,
        image: &str,
        version: &str,
    ) -> Result<std::result::Result<(), Waiting>> {
        match component {
            KubernetesComponent::KubeProxy => Ok(Ok(())),
            KubernetesComponent::Kubelet => {
                let n = Api::<Node>::all(self.ctx.client.clone())
                    .get_opt(node)
                    .await
                    .map_err(Error::kube(format!("reading Node {node}")))?;
                let Some(n) = n else {
                    return Ok(Err(Waiting(format!("Node {node} is not registered"))));
                };
                let status = n.status.unwrap_or_default();
                let reported = status
                    .node_info
                    .as_ref()
                    .map(|i| i.kubelet_version.clone())
                    .unwrap_or_default();
                let ready = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                Ok(if reported != version {
                    Err(Waiting(format!(
                        "Node {node} reports kubelet {reported:?}, not {version}"
                    )))
                } else if !ready {
                    Err(Waiting(format!(
                        "Node {node} runs kubelet {version} but is not Ready"
                    )))
                } else {
                    Ok(())
                })
            }
            _ => {
                let pods = Api::<Pod>::namespaced(self.ctx.client.clone(), "kube-system")
                    .list(
                        &ListParams::default()
                            .labels(&format!("k8s-app={}", component.as_str()))
                            .fields(&format!("spec.nodeName={node}")),
                    )
                    .await
                    .map_err(Error::kube(format!(
                        "listing the {} pods on Node {node}",
                        component.as_str()
                    )))?;
                let runs = pods.items.iter().any(|p| {
                    let image_ok = p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() == Some(image))
                    });
                    let ready = p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        });
                    image_ok && ready
                });
                Ok(if runs {
                    Ok(())
                } else {
                    Err(Waiting(format!(
                        "no Ready {} pod on Node {node} runs {image} yet",
                        component.as_str()
                    )))
                })
            }
        }
    }
}
