//! kubernetes-upgrade, at plan time: what the planned machines run (their
//! Talos, their Kubernetes images, their components' settings) and the
//! objects of APIs the path removes, read for the checks
//! `ichor_reconcile::operation::version_path_refusal` and
//! `removed_api_refusal` make.

use ichor_api::conditions::reasons;
use ichor_api::operation::{KubernetesComponent, PlanEntry};
use ichor_api::{MachineRole, TalosCluster, TalosMachine};
use ichor_reconcile::operation::{self as decide, ComponentArgs, removed};
use ichor_reconcile::why::Unanswered;
use ichor_talos::config::MachineConfig;
use kube::ResourceExt as _;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::image_on;
use crate::operation::Run;
use crate::operation::step::talos_error;
use crate::{Error, Result};

/// The components' extra arguments in a machine's live config.
fn component_args(m: &TalosMachine, live: &[u8]) -> Result<ComponentArgs> {
    let name = m.metadata.name.clone().unwrap_or_default();
    let bad = |e: ichor_talos::config::ConfigError| Error::LiveConfig {
        namespace: m.metadata.namespace.clone().unwrap_or_default(),
        machine: name.clone(),
        address: m.spec.address.clone(),
        source: Box::new(e.into()),
    };
    let text = String::from_utf8_lossy(live);
    let config =
        MachineConfig::parse_live(&text, &format!("the live config of {name}")).map_err(bad)?;
    let docs = config.to_mappings().map_err(bad)?;
    let docs: Vec<serde_json::Value> = docs
        .iter()
        .filter_map(|d| serde_json::to_value(d).ok())
        .collect();
    Ok(removed::component_args(&docs))
}

/// What the version-path checks read of the planned machines.
#[derive(Default)]
struct PathFacts {
    images: Vec<String>,
    talos_versions: Vec<(String, String)>,
    settings: Vec<(String, ComponentArgs)>,
}

impl Run<'_> {
    /// The plan-time refusal of a kubernetes-upgrade, if any: the version
    /// path from the lowest version the nodes run, then each machine's
    /// Talos against the target, then the settings and the objects of APIs
    /// the path removes.
    /// `(reason, message)`.
    pub(in crate::operation) async fn kubernetes_refusal(
        &mut self,
        plan: &[PlanEntry],
        cluster: &TalosCluster,
    ) -> Result<Option<(&'static str, String)>> {
        let to = decide::kubernetes_tag(self.op.spec.version.as_deref().unwrap_or_default());
        let mut facts = PathFacts::default();
        for e in plan
            .iter()
            .filter(|e| e.action != ichor_api::PlannedAction::Skip)
        {
            let Some(m) = self.machine(&e.machine).await? else {
                continue;
            };
            // A node that does not answer leaves the path unchecked: no plan.
            if let Err(why) = self.read_path_facts(e, &m, cluster, &mut facts).await? {
                return Ok(Some((
                    reasons::REFUSED,
                    format!(
                        "cannot check the version path: the Kubernetes version of TalosMachine {} cannot be read ({why}); make its Talos API reachable and create the operation again",
                        e.machine
                    ),
                )));
            }
        }
        let from = match decide::version_path_refusal(
            &to,
            &facts.images,
            &facts.talos_versions,
            &facts.settings,
        ) {
            Ok(from) => from,
            Err(refusal) => return Ok(Some(refusal)),
        };
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

    /// Reads what the version-path checks need of planned machine `m`: its
    /// Talos version, its components' settings, its kubelet's (and a control
    /// plane's API server's) image. `Err` with why when its node cannot say.
    async fn read_path_facts(
        &mut self,
        e: &PlanEntry,
        m: &TalosMachine,
        cluster: &TalosCluster,
        facts: &mut PathFacts,
    ) -> Result<std::result::Result<(), Unanswered>> {
        let words =
            |err: &(dyn std::error::Error + 'static)| Unanswered(ichor_api::error_text::chain(err));
        let talos = match self.client(m, cluster).await {
            Ok(t) => t,
            Err(err) => return Ok(Err(words(&err))),
        };
        match talos.version("").await {
            Ok(v) => facts.talos_versions.push((e.machine.clone(), v.tag)),
            Err(err) => return Ok(Err(words(&talos_error(m, err)))),
        }
        match talos.machine_config("").await {
            Ok(live) => facts
                .settings
                .push((e.machine.clone(), component_args(m, &live)?)),
            Err(err) => return Ok(Err(words(&talos_error(m, err)))),
        }
        let mut components = vec![KubernetesComponent::Kubelet];
        if e.role == MachineRole::Controlplane {
            components.push(KubernetesComponent::ApiServer);
        }
        for c in components {
            match image_on(&talos, c).await {
                Ok(image) => facts.images.extend(image.filter(|i| !i.is_empty())),
                Err(err) => return Ok(Err(words(&talos_error(m, err)))),
            }
        }
        Ok(Ok(()))
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
}
