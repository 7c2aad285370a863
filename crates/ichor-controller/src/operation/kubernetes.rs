//! kubernetes-upgrade, run: the checks at plan time (the version path, the
//! APIs the path removes) and one component step at a time, as `talosctl
//! upgrade-k8s` orders them. Each step is a machine-config change this
//! controller renders (the live config with one image at the target,
//! [`ichor_render::component_step`]) and applies in no-reboot mode, as a
//! class B apply: the controller stays the only writer of the node. A step
//! is recorded before its write and then waited for: the node's config
//! resource names the new image and, where Kubernetes shows it, the
//! component's pod runs it and is Ready (control plane) or the Node reports
//! the new kubelet version and is Ready (kubelet).

use ichor_api::conditions::{Status, reasons, types};
use ichor_api::operation::{
    ComponentPhase, KubernetesComponent, OperationKind, OperationPhase, PlanEntry,
    TalosOperationStatus,
};
use ichor_api::{MachineRole, TalosCluster, TalosMachine};
use ichor_talos::config::MachineConfig;
use ichor_talos_client::resources::KubernetesComponent as WireComponent;
use ichor_talos_client::{ApplyMode, ApplyRequest};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::controller::Action;

use super::{Run, StepOutcome, talos_error};
use crate::{Error, Result};
use ichor_reconcile::operation::{self as decide, NextComponent, removed, support};

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

/// The components' extra arguments in a machine's live config.
fn component_args(
    m: &TalosMachine,
    live: &[u8],
) -> Result<
    std::collections::BTreeMap<removed::Component, std::collections::BTreeMap<String, String>>,
> {
    let name = m.metadata.name.clone().unwrap_or_default();
    let bad = |reason: String| Error::LiveConfig {
        namespace: m.metadata.namespace.clone().unwrap_or_default(),
        machine: name.clone(),
        address: m.spec.address.clone(),
        reason,
    };
    let text = String::from_utf8_lossy(live);
    let config = MachineConfig::parse_live(&text, &format!("the live config of {name}"))
        .map_err(|e| bad(e.to_string()))?;
    let docs = config.to_mappings().map_err(|e| bad(e.to_string()))?;
    let docs: Vec<serde_json::Value> = docs
        .iter()
        .filter_map(|d| serde_json::to_value(d).ok())
        .collect();
    Ok(removed::component_args(&docs))
}

impl Run<'_> {
    /// The plan-time refusal of a kubernetes-upgrade, if any: the version
    /// path from the lowest version the nodes run, then each machine's
    /// Talos against the target, then the settings and the objects of APIs
    /// the path removes.
    /// `(reason, message)`.
    pub(super) async fn kubernetes_refusal(
        &mut self,
        plan: &[PlanEntry],
        cluster: &TalosCluster,
    ) -> Result<Option<(&'static str, String)>> {
        let to = decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
        let mut images = Vec::new();
        let mut talos_versions = Vec::new();
        let mut settings = Vec::new();
        for e in plan
            .iter()
            .filter(|e| e.action != ichor_api::PlannedAction::Skip)
        {
            let Some(m) = self.machine(&e.machine).await? else {
                continue;
            };
            // A node that does not answer leaves the path unchecked: no plan.
            let unreadable = |why: String| {
                Some((
                    reasons::REFUSED,
                    format!(
                        "cannot check the version path: the Kubernetes version of TalosMachine {} cannot be read ({why}); make its Talos API reachable and create the operation again",
                        e.machine
                    ),
                ))
            };
            let talos = match self.client(&m, cluster).await {
                Ok(t) => t,
                Err(err) => return Ok(unreadable(err.to_string())),
            };
            match talos.version("").await {
                Ok(v) => talos_versions.push((e.machine.clone(), v.tag)),
                Err(err) => return Ok(unreadable(talos_error(&m, err).to_string())),
            }
            match talos.machine_config("").await {
                Ok(live) => settings.push((e.machine.clone(), component_args(&m, &live)?)),
                Err(err) => return Ok(unreadable(talos_error(&m, err).to_string())),
            }
            let mut components = vec![KubernetesComponent::Kubelet];
            if e.role == MachineRole::Controlplane {
                components.push(KubernetesComponent::ApiServer);
            }
            for c in components {
                match image_on(&talos, c).await {
                    Ok(image) => images.extend(image.filter(|i| !i.is_empty())),
                    Err(err) => return Ok(unreadable(talos_error(&m, err).to_string())),
                }
            }
        }
        let Some(from) = decide::lowest_version(images.iter().map(String::as_str)) else {
            return Ok(Some((
                reasons::UNSUPPORTED_VERSION_PATH,
                "no node reports a Kubernetes image with a version tag, so the version path cannot be checked".to_string(),
            )));
        };
        if let Err(why) = decide::kubernetes_path(&from, &to) {
            return Ok(Some((reasons::UNSUPPORTED_VERSION_PATH, why)));
        }
        // Every machine the new version reaches must run it on its Talos,
        // as talosctl checks each node's Version first.
        if let Some(why) = support::refusal(&to, &talos_versions) {
            return Ok(Some((reasons::UNSUPPORTED_BY_TALOS, why)));
        }
        // The flags, admission plugins and feature gates the path removes:
        // a component given one would not start.
        let in_use: Vec<(String, Vec<String>)> = settings
            .iter()
            .map(|(m, args)| (m.clone(), removed::removed_in_use(&from, &to, args)))
            .collect();
        if let Some(why) = removed::refusal(&to, &in_use) {
            return Ok(Some((reasons::REMOVED_SETTING_IN_USE, why)));
        }
        let mut in_use = Vec::new();
        for (plural, version, group) in decide::removed_on_path(&from, &to) {
            let resource = format!("{plural}.{version}.{group}");
            let objects = self.objects_of(group, version, plural).await?;
            if !objects.is_empty() {
                in_use.push((resource, objects));
            }
        }
        Ok(decide::removed_api_refusal(&to, &in_use).map(|m| (reasons::REMOVED_API_IN_USE, m)))
    }

    /// The objects (`namespace/name`) of a resource the API server may no
    /// longer serve; none when it does not serve it.
    async fn objects_of(&self, group: &str, version: &str, plural: &str) -> Result<Vec<String>> {
        let gvk = GroupVersionKind::gvk(group, version, "");
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api = Api::<DynamicObject>::all_with(self.ctx.client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(list
                .items
                .iter()
                .map(|o| match o.namespace() {
                    Some(ns) => format!("{ns}/{}", o.name_any()),
                    None => o.name_any(),
                })
                .collect()),
            // Not served: nothing can use it.
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
            // The API server authorizes before it looks the resource up, so
            // a 403 says nothing of whether it is served: discovery (open to
            // every authenticated user) says.
            Err(kube::Error::Api(e)) if e.code == 403 => {
                if !self.serves(group, version, plural).await? {
                    return Ok(Vec::new());
                }
                // Served, but this controller may not read it: the check
                // cannot say it is unused, so the plan names it.
                Ok(vec![format!(
                    "objects Ichor may not list (grant the controller list on {plural}.{group}, or check them yourself and delete them)"
                )])
            }
            Err(e) => Err(Error::kube(format!(
                "listing {plural}.{version}.{group}, an API that Kubernetes {} removes",
                self.op.spec.version.as_deref().unwrap_or_default()
            ))(e)),
        }
    }

    /// Whether the API server serves `plural` in `group/version` (its
    /// discovery document lists it).
    async fn serves(&self, group: &str, version: &str, plural: &str) -> Result<bool> {
        match self
            .ctx
            .client
            .list_api_group_resources(&format!("{group}/{version}"))
            .await
        {
            Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(Error::kube(format!(
                "reading the API server's discovery of {group}/{version}"
            ))(e)),
        }
    }

    async fn machine(&self, name: &str) -> Result<Option<TalosMachine>> {
        Api::<TalosMachine>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosMachine {}/{name}",
                self.namespace
            )))
    }

    /// Runs the component steps until one waits, fails or all are done.
    pub(super) async fn drive_kubernetes(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Action> {
        loop {
            let cancel = self.cancel_now().await?;
            match decide::next_component(status, cancel) {
                NextComponent::Succeed => {
                    let to =
                        decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
                    let message = format!(
                        "{}; set spec.kubernetesVersion of TalosCluster {}/{} to {to}, so that Ichor's render agrees with the nodes (until then the image paths show as class C drift, which Ichor never applies)",
                        super::succeeded_message(status),
                        self.namespace,
                        self.op.spec.target.cluster_ref.name
                    );
                    self.finish(
                        status,
                        OperationPhase::Succeeded,
                        reasons::SUCCEEDED,
                        message,
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                NextComponent::Cancel => {
                    self.finish(
                        status,
                        OperationPhase::Failed,
                        reasons::CANCELLED,
                        "cancelled before the next component step; the steps done stay done, no other node was written".to_string(),
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                NextComponent::Fail { step, message } => {
                    self.finish(
                        status,
                        OperationPhase::Failed,
                        reasons::STEP_FAILED,
                        format!("{step}: {message}"),
                    )
                    .await;
                    return Ok(Action::await_change());
                }
                NextComponent::Step(i) => {
                    let phase = status.components[i].phase;
                    let outcome = self.component_step(status, i).await?;
                    let now = self.now();
                    decide::machines_from_components(status, &now);
                    match outcome {
                        StepOutcome::Advanced => {
                            let c = &status.components[i];
                            let took = c
                                .start_time
                                .as_ref()
                                .and_then(|s| {
                                    std::time::Duration::try_from(now.0.duration_since(s.0)).ok()
                                })
                                .unwrap_or_default();
                            self.ctx.metrics.operation_step(
                                OperationKind::KubernetesUpgrade.as_str(),
                                component_step_name(c.component, phase),
                                took,
                            );
                            self.write(status).await?;
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
                            return Ok(Action::requeue(self.bounds().poll));
                        }
                        StepOutcome::Failed(reason, message) => {
                            let c = &status.components[i];
                            let message =
                                format!("{} on {}: {message}", c.component.as_str(), c.machine);
                            self.finish(status, OperationPhase::Failed, reason, message)
                                .await;
                            return Ok(Action::await_change());
                        }
                    }
                }
            }
        }
    }

    /// One component step: Pending records the image before and moves to
    /// Applying (written before the node is); Applying renders and applies;
    /// Waiting waits for the node (and Kubernetes) to run the new image.
    async fn component_step(
        &mut self,
        status: &mut TalosOperationStatus,
        i: usize,
    ) -> Result<StepOutcome> {
        let cluster_name = self.op.spec.target.cluster_ref.name.clone();
        let cluster = Api::<TalosCluster>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get(&cluster_name)
            .await
            .map_err(Error::kube(format!(
                "reading TalosCluster {}/{cluster_name}",
                self.namespace
            )))?;
        let now = self.now();
        let (component, machine) = (
            status.components[i].component,
            status.components[i].machine.clone(),
        );
        let Some(m) = self.machine(&machine).await? else {
            return Ok(self.fail_component(
                status,
                i,
                reasons::STEP_FAILED,
                format!("TalosMachine {}/{machine} is gone", self.namespace),
            ));
        };
        if m.spec.hold && status.components[i].phase != ComponentPhase::Waiting {
            // Held after the plan: never written. A control plane held now
            // would leave the control planes on different versions.
            let reason = if m.spec.role == MachineRole::Controlplane {
                reasons::CONTROL_PLANE_HELD
            } else {
                reasons::STEP_FAILED
            };
            return Ok(self.fail_component(
                status,
                i,
                reason,
                format!("TalosMachine {machine} was put on hold after the plan; it was not written, and the upgrade stops here so no component runs ahead of it; release the hold and create a new operation"),
            ));
        }
        let talos = self.client(&m, &cluster).await?;
        if component == KubernetesComponent::BootstrapManifests {
            return self.manifests_step(status, i, &m, &talos).await;
        }
        let version = decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
        let node_name = status
            .machines
            .iter()
            .find(|p| p.machine == machine)
            .and_then(|p| p.node_name.clone())
            .unwrap_or_else(|| machine.clone());
        let c = &mut status.components[i];
        match c.phase {
            ComponentPhase::Pending => {
                c.image_before = image_on(&talos, component)
                    .await
                    .map_err(|e| talos_error(&m, e))?;
                c.start_time = Some(now);
                c.phase = ComponentPhase::Applying;
                c.message = Some(format!("writing {} {version}", component.as_str()));
                Ok(StepOutcome::Advanced)
            }
            ComponentPhase::Applying => {
                let live = talos
                    .machine_config("")
                    .await
                    .map_err(|e| talos_error(&m, e))?;
                let text = String::from_utf8_lossy(&live);
                let live =
                    MachineConfig::parse_live(&text, &format!("the live config of {machine}"))
                        .map_err(|e| Error::LiveConfig {
                            namespace: self.namespace.clone(),
                            machine: machine.clone(),
                            address: m.spec.address.clone(),
                            reason: e.to_string(),
                        })?;
                let step = ichor_render::component_step(&live, component, &version, &machine)?;
                let Some(image) = step.image else {
                    let message = format!(
                        "the config of {machine} has no place for {} (no image path for it): nothing was written",
                        component.as_str()
                    );
                    return Ok(self.fail_component(status, i, reasons::STEP_FAILED, message));
                };
                if let Some(config) = step.config {
                    let yaml = config.to_yaml().map_err(|e| Error::LiveConfig {
                        namespace: self.namespace.clone(),
                        machine: machine.clone(),
                        address: m.spec.address.clone(),
                        reason: e.to_string(),
                    })?;
                    let request = ApplyRequest::new(yaml.into_bytes(), ApplyMode::NoReboot);
                    if let Err(e) = talos.apply_configuration("", &request).await {
                        let message = format!(
                            "the node refused the no-reboot apply of {image}: {}",
                            talos_error(&m, e)
                        );
                        return Ok(self.fail_component(status, i, reasons::STEP_FAILED, message));
                    }
                    tracing::info!(machine = %machine, component = component.as_str(), %image, "kubernetes-upgrade: applied in no-reboot mode");
                }
                let c = &mut status.components[i];
                c.image = Some(image.clone());
                c.phase = ComponentPhase::Waiting;
                c.message = Some(format!("written; waiting for {node_name} to run {image}"));
                Ok(StepOutcome::Advanced)
            }
            ComponentPhase::Waiting => {
                let expected = c.image.clone().unwrap_or_default();
                let on_node = image_on(&talos, component)
                    .await
                    .map_err(|e| talos_error(&m, e))?;
                let kube = self
                    .kube_side(component, &node_name, &expected, &version)
                    .await?;
                match decide::component_verdict(
                    component,
                    &machine,
                    &expected,
                    on_node.as_deref(),
                    kube,
                ) {
                    None => {
                        let c = &mut status.components[i];
                        c.phase = ComponentPhase::Succeeded;
                        c.completion_time = Some(now);
                        c.message = Some(format!("runs {expected}"));
                        Ok(StepOutcome::Advanced)
                    }
                    Some(why) => {
                        let bound = self.bounds().component;
                        let started = status.components[i].start_time.clone();
                        let passed = started.is_some_and(|s| {
                            now.0
                                .duration_since(s.0)
                                .try_into()
                                .is_ok_and(|d: std::time::Duration| d >= bound)
                        });
                        if passed {
                            let message = format!(
                                "{why}, still after {bound:?}; the config is written, check the component on the node (talosctl logs, kubectl -n kube-system get pods -o wide)"
                            );
                            Ok(self.fail_component(status, i, reasons::COMPONENT_TIMEOUT, message))
                        } else {
                            status.components[i].message = Some(why.clone());
                            Ok(StepOutcome::Wait(
                                reasons::WAITING_FOR_COMPONENT,
                                format!("{machine}: {why}"),
                            ))
                        }
                    }
                }
            }
            ComponentPhase::Succeeded | ComponentPhase::Failed => Ok(StepOutcome::Advanced),
        }
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
        talos: &ichor_talos_client::TalosClient,
    ) -> Result<StepOutcome> {
        let now = self.now();
        let machine = status.components[i].machine.clone();
        match status.components[i].phase {
            ComponentPhase::Pending => {
                let before = self.kube_proxy_image().await?;
                let c = &mut status.components[i];
                c.image_before = before;
                c.start_time = Some(now);
                c.phase = ComponentPhase::Applying;
                c.message = Some(format!(
                    "reading the bootstrap manifests {machine} renders for its new config"
                ));
                Ok(StepOutcome::Advanced)
            }
            ComponentPhase::Applying => {
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
                        let message = format!(
                            "{machine} serves a bootstrap manifest Ichor cannot apply: {why}; nothing was written"
                        );
                        return Ok(self.fail_component(status, i, reasons::STEP_FAILED, message));
                    }
                };
                let plan = super::manifests::read(&self.ctx.client, objects).await?;
                if let Some(why) = super::manifests::sync(&self.ctx.client, &plan).await? {
                    return Ok(self.fail_component(status, i, reasons::STEP_FAILED, why));
                }
                let summary = plan.summary();
                tracing::info!(machine = %machine, summary = %summary, "kubernetes-upgrade: bootstrap manifests synced");
                let c = &mut status.components[i];
                c.image = plan.kube_proxy_image();
                c.phase = ComponentPhase::Waiting;
                c.message = Some(summary);
                Ok(StepOutcome::Advanced)
            }
            ComponentPhase::Waiting => {
                let expected = status.components[i].image.clone();
                let live = self.kube_proxy_image().await?;
                if expected.is_none() || live == expected {
                    let c = &mut status.components[i];
                    c.phase = ComponentPhase::Succeeded;
                    c.completion_time = Some(now);
                    return Ok(StepOutcome::Advanced);
                }
                let why = format!(
                    "DaemonSet kube-system/kube-proxy runs {}, not {}",
                    live.as_deref().unwrap_or("nothing"),
                    expected.unwrap_or_default()
                );
                Ok(StepOutcome::Wait(
                    reasons::WAITING_FOR_COMPONENT,
                    format!("{machine}: {why}"),
                ))
            }
            ComponentPhase::Succeeded | ComponentPhase::Failed => Ok(StepOutcome::Advanced),
        }
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

    fn fail_component(
        &self,
        status: &mut TalosOperationStatus,
        i: usize,
        reason: &'static str,
        message: String,
    ) -> StepOutcome {
        let c = &mut status.components[i];
        c.phase = ComponentPhase::Failed;
        c.completion_time = Some(self.now());
        c.message = Some(message.clone());
        StepOutcome::Failed(reason, message)
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
    ) -> Result<std::result::Result<(), String>> {
        match component {
            KubernetesComponent::KubeProxy => Ok(Ok(())),
            KubernetesComponent::Kubelet => {
                let n = Api::<Node>::all(self.ctx.client.clone())
                    .get_opt(node)
                    .await
                    .map_err(Error::kube(format!("reading Node {node}")))?;
                let Some(n) = n else {
                    return Ok(Err(format!("Node {node} is not registered")));
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
                    Err(format!(
                        "Node {node} reports kubelet {reported:?}, not {version}"
                    ))
                } else if !ready {
                    Err(format!(
                        "Node {node} runs kubelet {version} but is not Ready"
                    ))
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
                    Err(format!(
                        "no Ready {} pod on Node {node} runs {image} yet",
                        component.as_str()
                    ))
                })
            }
        }
    }
}

/// A component step's name in metrics: `kube-apiserver/apply`, `kubelet/wait`.
fn component_step_name(component: KubernetesComponent, phase: ComponentPhase) -> &'static str {
    use ComponentPhase::*;
    use KubernetesComponent::*;
    match (component, phase) {
        (ApiServer, Pending) => "kube-apiserver/start",
        (ApiServer, Applying) => "kube-apiserver/apply",
        (ApiServer, _) => "kube-apiserver/wait",
        (ControllerManager, Pending) => "kube-controller-manager/start",
        (ControllerManager, Applying) => "kube-controller-manager/apply",
        (ControllerManager, _) => "kube-controller-manager/wait",
        (Scheduler, Pending) => "kube-scheduler/start",
        (Scheduler, Applying) => "kube-scheduler/apply",
        (Scheduler, _) => "kube-scheduler/wait",
        (KubeProxy, Pending) => "kube-proxy/start",
        (KubeProxy, Applying) => "kube-proxy/apply",
        (KubeProxy, _) => "kube-proxy/wait",
        (Kubelet, Pending) => "kubelet/start",
        (Kubelet, Applying) => "kubelet/apply",
        (Kubelet, _) => "kubelet/wait",
        (BootstrapManifests, Pending) => "bootstrap-manifests/start",
        (BootstrapManifests, Applying) => "bootstrap-manifests/apply",
        (BootstrapManifests, _) => "bootstrap-manifests/wait",
    }
}
