//! `ichor reclaim` end to end: the inspection → the plan (`ichor_adopt::reclaim`)
//! → consent → the phases. Each phase is one function here, named as its
//! entry of [`ReclaimOutcome::phases`], and idempotent (deletes accept what
//! is gone, files already written are kept when they are the same, records
//! already copied are compared), so a rerun after a kill finishes the job.
//!
//! No phase writes to a node: there is no Talos client here at all. What
//! talosctl needs (the bundle, a talosconfig) is written to disk first,
//! before anything is deleted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_adopt::install;
use ichor_adopt::plan::IchorPresence;
use ichor_adopt::reclaim::{
    self, CiliumChoice, ClusterReclaim, CrdChoice, FoundCluster, FoundMachine, FoundOperation,
    FoundRecord, IchorChoice, ReclaimInspection, ReclaimPlan, ReclaimRequest,
};
use ichor_adopt::{Refusal, waits};
use ichor_api::error_text::chain;
use ichor_api::{IchorInstallation, TalosCluster, TalosMachine, TalosOperation};
use ichor_helm::SecretStorage;
use ichor_helm::storage::StorageError;
use ichor_helm::wait::{Wait, WaitError, wait_until};
use ichor_talos::private_file::{self, PrivateFileError};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{DEFAULT_CERT_VALIDITY, Role, Talosconfig};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::inspect::{self, InspectError};

/// The field manager Ichor's Helm engine applies Cilium's objects with.
const ICHOR_FIELD_MANAGER: &str = ichor_helm::engine::DEFAULT_FIELD_MANAGER;
/// The field manager the helm CLI applies with (its binary's name): after
/// the hand-back, a `helm upgrade` with server-side apply finds its own fields.
pub const HELM_FIELD_MANAGER: &str = "helm";
/// Where a plain Helm release keeps its records: its own namespace.
const HANDED_BACK_NAMESPACE: &str = ichor_cilium::RELEASE_NAMESPACE;

/// Why reclaim stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    #[error("{}", .0.iter().map(|r| r.message.as_str()).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<Refusal>),
    #[error("reclaim was not confirmed; nothing was written")]
    NotConfirmed,
    #[error(transparent)]
    Inspect(#[from] Box<InspectError>),
    #[error("{0}")]
    Files(String),
    #[error("{what} failed. Run ichor reclaim again to continue")]
    Write {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "handing Cilium's Helm records back to kube-system failed. Run ichor reclaim again to continue"
    )]
    Records(#[from] Box<StorageError>),
    /// The deployed revision's manifest, whose objects reclaim hands to helm.
    #[error("the manifest of Cilium's release revision {revision} does not parse")]
    Manifest {
        revision: u32,
        #[source]
        source: ichor_helm::manifest::ManifestError,
    },
    /// The talosconfig minted from the cluster's bundle.
    #[error(
        "making the talosconfig of TalosCluster {namespace}/{cluster} failed; nothing was deleted"
    )]
    Talosconfig {
        namespace: String,
        cluster: String,
        #[source]
        source: ichor_talos::talosconfig::TalosconfigError,
    },
    #[error("{0}")]
    Wait(String),
}

impl From<InspectError> for ReclaimError {
    fn from(e: InspectError) -> Self {
        ReclaimError::Inspect(Box::new(e))
    }
}

impl From<StorageError> for ReclaimError {
    fn from(e: StorageError) -> Self {
        ReclaimError::Records(Box::new(e))
    }
}

fn failed(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ReclaimError {
    let what = what.into();
    move |source| ReclaimError::Write { what, source }
}

/// Everything `ichor reclaim` was told.
#[derive(Debug, Clone)]
pub struct ReclaimOptions {
    pub output_dir: PathBuf,
    pub keep_cilium_record: bool,
    pub delete_crds: bool,
    /// The bound of each wait.
    pub timeout: Duration,
    /// How often waits look (tests shorten it).
    pub poll_interval: Duration,
}

impl ReclaimOptions {
    fn request(&self) -> ReclaimRequest {
        ReclaimRequest {
            output_dir: self.output_dir.display().to_string(),
            keep_cilium_record: self.keep_cilium_record,
            delete_crds: self.delete_crds,
        }
    }
}

/// The operator's side of reclaim: where lines go, and consent.
pub trait ReclaimOperator: Send + Sync {
    fn say(&self, line: &str);
    /// Asks for consent to the plan; false ends reclaim with nothing written.
    fn consent(&self, plan: &ReclaimPlan) -> bool;
}

/// What reclaim did: each phase that ran, with the seconds it took.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReclaimOutcome {
    pub phases: Vec<(String, f64)>,
    pub plan: Option<ReclaimPlan>,
}

/// Reads what reclaim needs, bounded; writes nothing.
pub async fn inspect(kube: &kube::Client) -> Result<ReclaimInspection, ReclaimError> {
    let (clusters, machines, operations) = tokio::try_join!(
        list_if_served::<TalosCluster>(kube, "TalosClusters"),
        list_if_served::<TalosMachine>(kube, "TalosMachines"),
        list_if_served::<TalosOperation>(kube, "TalosOperations"),
    )?;
    let ichor = match inspect::ichor_presence(kube).await {
        Ok(p) => p,
        // The chart was uninstalled and its IchorInstallation kept (with the
        // CRDs): Ichor is gone; the leftover object goes with the uninstall.
        Err(InspectError::HelmInstallGone { .. }) => IchorPresence::Absent,
        Err(e) => return Err(e.into()),
    };
    let records = |ns: &str| {
        let storage = SecretStorage::new(kube.clone(), ns);
        async move {
            Ok::<_, ReclaimError>(
                storage
                    .history(ichor_cilium::RELEASE_NAME)
                    .await?
                    .into_iter()
                    .map(|s| FoundRecord {
                        revision: s.release.version,
                        status: s.release.status().as_str().to_string(),
                    })
                    .collect::<Vec<_>>(),
            )
        }
    };
    let cilium_records = records(ichor_cilium::STORAGE_NAMESPACE).await?;
    let handed_back_records = records(HANDED_BACK_NAMESPACE).await?;
    let crds = Api::<CustomResourceDefinition>::all(kube.clone())
        .list(&ListParams::default())
        .await
        .map_err(failed("reading the CustomResourceDefinitions"))?
        .items
        .into_iter()
        .filter(|c| c.spec.group == ichor_api::GROUP)
        .filter_map(|c| c.metadata.name)
        .collect();
    let clusters = clusters
        .iter()
        .map(|c| {
            let ns = c.metadata.namespace.clone().unwrap_or_default();
            let name = c.metadata.name.clone().unwrap_or_default();
            FoundCluster {
                machines: machines
                    .iter()
                    .filter(|m| m.metadata.namespace.as_deref() == Some(ns.as_str()))
                    .filter(|m| m.spec.cluster_ref.name == name)
                    .map(|m| FoundMachine {
                        name: m.metadata.name.clone().unwrap_or_default(),
                        role: role_name(m),
                        address: m.spec.address.clone(),
                        held: m.spec.hold,
                    })
                    .collect(),
                secret: c.spec.secrets_ref.name.clone(),
                namespace: ns,
                name,
            }
        })
        .collect();
    Ok(ReclaimInspection {
        clusters,
        operations: operations
            .iter()
            .map(|o| FoundOperation {
                namespace: o.metadata.namespace.clone().unwrap_or_default(),
                name: o.metadata.name.clone().unwrap_or_default(),
                phase: o
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    .unwrap_or_else(|| "Pending".into()),
            })
            .collect(),
        ichor,
        cilium_records,
        handed_back_records,
        crds,
    })
}

fn role_name(m: &TalosMachine) -> String {
    m.spec.role.as_str().to_string()
}

/// Every object of kind `K` in every namespace; none when its CRD is not
/// served (Ichor was never installed, or its CRDs are gone).
async fn list_if_served<K>(kube: &kube::Client, what: &str) -> Result<Vec<K>, ReclaimError>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    match tokio::time::timeout(
        inspect::KUBE_CALL_TIMEOUT,
        Api::<K>::all(kube.clone()).list(&ListParams::default()),
    )
    .await
    {
        Ok(Ok(list)) => Ok(list.items),
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => Ok(Vec::new()),
        Ok(Err(e)) => Err(failed(format!("reading the {what}"))(e)),
        Err(_) => Err(ReclaimError::Wait(format!(
            "reading the {what} did not answer within {}: check that the API server is reachable",
            waits::human(inspect::KUBE_CALL_TIMEOUT)
        ))),
    }
}

/// Inspects and plans; writes nothing.
pub async fn plan(kube: &kube::Client, opts: &ReclaimOptions) -> Result<ReclaimPlan, ReclaimError> {
    let found = inspect(kube).await?;
    reclaim::plan(&found, &opts.request()).map_err(ReclaimError::Refused)
}

struct Reclaim<'a> {
    kube: &'a kube::Client,
    opts: &'a ReclaimOptions,
    operator: Arc<dyn ReclaimOperator>,
    plan: ReclaimPlan,
}

impl Reclaim<'_> {
    fn say(&self, line: &str) {
        self.operator.say(line);
    }

    /// A bounded wait that reports what is pending on the operator's lines.
    async fn wait<F, Fut>(&self, why: &str, pending: F) -> Result<(), ReclaimError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Vec<String>, ReclaimError>>,
    {
        let report = |left: &[String]| self.say(&format!("waiting for {why}: {}", left.join("; ")));
        let wait = Wait {
            why,
            timeout: self.opts.timeout,
            poll_interval: self.opts.poll_interval,
            report_interval: waits::REPORT_EVERY,
            on_progress: Some(&report),
        };
        match wait_until(&wait, pending).await {
            Ok(()) => Ok(()),
            Err(WaitError::Check(e)) => Err(e),
            Err(WaitError::TimedOut { pending }) => Err(ReclaimError::Wait(format!(
                "{why} did not happen within {} (still: {}). Find out why, then run ichor reclaim again (--timeout waits longer)",
                waits::human(self.opts.timeout),
                pending.join("; ")
            ))),
        }
    }
}

/// Runs reclaim: the plan, consent, then the phases. A new phase is a
/// function below and one line here.
pub async fn reclaim(
    kube: &kube::Client,
    opts: &ReclaimOptions,
    operator: Arc<dyn ReclaimOperator>,
) -> Result<ReclaimOutcome, ReclaimError> {
    let start = Instant::now();
    let mut outcome = ReclaimOutcome::default();
    let done = |name: &str, outcome: &mut ReclaimOutcome| {
        let before: f64 = outcome.phases.iter().map(|(_, s)| s).sum();
        outcome
            .phases
            .push((name.to_string(), start.elapsed().as_secs_f64() - before));
    };
    let plan = plan(kube, opts).await?;
    let r = Reclaim {
        kube,
        opts,
        operator,
        plan,
    };
    r.say(&r.plan.text());
    if r.plan.is_empty() {
        r.say("nothing to reclaim: Ichor holds nothing in this cluster");
        outcome.plan = Some(r.plan);
        return Ok(outcome);
    }
    if !r.operator.consent(&r.plan) {
        return Err(ReclaimError::NotConfirmed);
    }
    done("inspection", &mut outcome);
    files(&r).await?;
    done("files", &mut outcome);
    hold(&r).await?;
    done("hold", &mut outcome);
    objects(&r).await?;
    done("objects", &mut outcome);
    cilium(&r).await?;
    done("cilium", &mut outcome);
    uninstall(&r).await?;
    done("uninstall", &mut outcome);
    crds(&r).await?;
    done("crds", &mut outcome);
    outcome.plan = Some(r.plan);
    Ok(outcome)
}

/// Phase `files`: each cluster's bundle (as the Secret holds it), an admin
/// talosconfig minted from it, and its objects as they were, written before
/// anything is deleted. A file already there is kept when it is the same
/// (a rerun); a different one is refused, never overwritten.
async fn files(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    for c in &r.plan.clusters {
        let dir = PathBuf::from(&c.dir);
        create_private_dir(&dir)?;
        let bundle_text = read_bundle(r.kube, c).await?;
        let bundle = SecretsBundle::parse(
            &bundle_text,
            &format!("Secret {}/{}", c.namespace, c.secret),
        )
        .map_err(|e| {
            ReclaimError::Files(format!(
                "{}; nothing was deleted",
                ichor_talos::redact::quoted_values(&chain(&e))
            ))
        })?;
        let bundle_path = dir.join(reclaim::BUNDLE_FILE);
        write_once(&bundle_path, bundle_text.as_bytes(), "the secrets bundle")?;
        let talosconfig_path = dir.join(reclaim::TALOSCONFIG_FILE);
        write_talosconfig(&talosconfig_path, &bundle, c)?;
        let objects_path = dir.join(reclaim::OBJECTS_FILE);
        if !objects_path.exists() {
            let text = objects_yaml(r.kube, c).await?;
            write_once(&objects_path, text.as_bytes(), "the objects")?;
        }
        r.say(&format!(
            "wrote the secrets bundle and talosconfig of TalosCluster {}/{} to {}/ (talosctl --talosconfig {} works from now on)",
            c.namespace,
            c.name,
            c.dir,
            talosconfig_path.display()
        ));
    }
    Ok(())
}

/// The bundle text the cluster's Secret holds.
async fn read_bundle(kube: &kube::Client, c: &ClusterReclaim) -> Result<String, ReclaimError> {
    let secrets = Api::<Secret>::namespaced(kube.clone(), &c.namespace);
    let cluster = Api::<TalosCluster>::namespaced(kube.clone(), &c.namespace)
        .get(&c.name)
        .await
        .map_err(failed(format!(
            "reading TalosCluster {}/{}",
            c.namespace, c.name
        )))?;
    let key = cluster
        .spec
        .secrets_ref
        .key
        .clone()
        .unwrap_or_else(|| "secrets.yaml".into());
    let Some(secret) = secrets.get_opt(&c.secret).await.map_err(failed(format!(
        "reading Secret {}/{}",
        c.namespace, c.secret
    )))?
    else {
        return Err(ReclaimError::Files(format!(
            "TalosCluster {}/{} names the Secret {} for its secrets bundle, but it does not exist, so there is nothing to hand to talosctl. Restore the Secret (or delete the TalosCluster yourself if you hold the bundle elsewhere), then run ichor reclaim again; nothing was deleted",
            c.namespace, c.name, c.secret
        )));
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .map(|b| b.0.clone())
        .ok_or_else(|| {
            ReclaimError::Files(format!(
                "Secret {}/{} has no key {key}, where TalosCluster {} keeps its bundle; nothing was deleted",
                c.namespace, c.secret, c.name
            ))
        })?;
    String::from_utf8(bytes).map_err(|_| {
        ReclaimError::Files(format!(
            "Secret {}/{} key {key} is not text, so it is not a secrets bundle; nothing was deleted",
            c.namespace, c.secret
        ))
    })
}

/// The talosconfig: kept when one minted from this bundle is there (its CA
/// is the bundle's OS CA), refused when another is, minted otherwise.
fn write_talosconfig(
    path: &Path,
    bundle: &SecretsBundle,
    c: &ClusterReclaim,
) -> Result<(), ReclaimError> {
    let (os_ca, _) = bundle.os_ca_pem().ok_or_else(|| {
        ReclaimError::Files(format!(
            "the bundle of TalosCluster {}/{} has no OS CA (certs.os), so no talosconfig can be made from it; nothing was deleted",
            c.namespace, c.name
        ))
    })?;
    if path.exists() {
        let same_cluster = Talosconfig::from_file(path)
            .ok()
            .and_then(|tc| {
                let (name, ctx) = tc.context(None, "").ok()?;
                let ca = ctx.credentials(name, "").ok()?.ca_pem?;
                Some(ca.trim() == os_ca.trim())
            })
            .unwrap_or(false);
        return if same_cluster {
            Ok(())
        } else {
            Err(refuse_overwrite(path, "a talosconfig"))
        };
    }
    let control_planes: Vec<String> = c
        .machines
        .iter()
        .filter(|m| m.role == "controlplane")
        .map(|m| m.address.clone())
        .collect();
    let nodes: Vec<String> = c.machines.iter().map(|m| m.address.clone()).collect();
    let tc = Talosconfig::generate(
        bundle,
        &c.name,
        &control_planes,
        &nodes,
        Role::Admin,
        DEFAULT_CERT_VALIDITY,
    )
    .map_err(talosconfig_failed(c))?;
    let text = tc.to_yaml().map_err(talosconfig_failed(c))?;
    write_once(path, text.as_bytes(), "the talosconfig")
}

fn talosconfig_failed(
    c: &ClusterReclaim,
) -> impl FnOnce(ichor_talos::talosconfig::TalosconfigError) -> ReclaimError {
    let (namespace, cluster) = (c.namespace.clone(), c.name.clone());
    move |source| ReclaimError::Talosconfig {
        namespace,
        cluster,
        source,
    }
}

fn refuse_overwrite(path: &Path, what: &str) -> ReclaimError {
    ReclaimError::Files(format!(
        "{} exists and is not {what} of this cluster; refusing to overwrite it. Choose another --output-dir or move the file away, then run ichor reclaim again; nothing was deleted",
        path.display()
    ))
}

/// Writes `bytes` to a new file with mode 0600 (Ichor's one private-file
/// writer); an existing file with the same bytes is kept, another one refused.
fn write_once(path: &Path, bytes: &[u8], what: &str) -> Result<(), ReclaimError> {
    match private_file::write_once(path, bytes) {
        Ok(_) => Ok(()),
        Err(PrivateFileError::Differs { .. }) => Err(refuse_overwrite(path, what)),
        Err(e @ PrivateFileError::Symlink { .. }) => Err(ReclaimError::Files(format!(
            "writing {what}: {e}. Remove it or choose another --output-dir, then run ichor reclaim again; nothing was deleted"
        ))),
        Err(e) => Err(ReclaimError::Files(format!(
            "writing {what} to {}: {}; check that the folder is writable. Nothing was deleted",
            path.display(),
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
        ))),
    }
}

/// The folder of one cluster's files: created 0700, refused when others may
/// write to it, tightened when others may read it.
fn create_private_dir(dir: &Path) -> Result<(), ReclaimError> {
    match private_file::prepare_dir(dir) {
        Ok(_) => Ok(()),
        Err(e @ PrivateFileError::SharedDirectory { .. }) => Err(ReclaimError::Files(format!(
            "{e}: remove their write permission (chmod go-w {}) or choose another --output-dir. Nothing was deleted",
            dir.display()
        ))),
        Err(e) => Err(ReclaimError::Files(format!(
            "creating {}: {}; choose a writable --output-dir. Nothing was deleted",
            dir.display(),
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
        ))),
    }
}

/// The TalosCluster and its TalosMachines as YAML documents, without
/// managedFields (the record of what Ichor managed; no secret in them).
async fn objects_yaml(kube: &kube::Client, c: &ClusterReclaim) -> Result<String, ReclaimError> {
    let cluster = Api::<TalosCluster>::namespaced(kube.clone(), &c.namespace)
        .get(&c.name)
        .await
        .map_err(failed(format!(
            "reading TalosCluster {}/{}",
            c.namespace, c.name
        )))?;
    let machines = Api::<TalosMachine>::namespaced(kube.clone(), &c.namespace);
    let mut docs = vec![document(&cluster)?];
    for m in &c.machines {
        if let Some(machine) = machines
            .get_opt(&m.name)
            .await
            .map_err(failed(format!("reading TalosMachine {}", m.name)))?
        {
            docs.push(document(&machine)?);
        }
    }
    Ok(docs.join("---\n"))
}

fn document<K: serde::Serialize>(obj: &K) -> Result<String, ReclaimError> {
    let mut v = serde_json::to_value(obj)
        .map_err(|e| ReclaimError::Files(format!("serialising an object: {}", chain(&e))))?;
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    serde_yaml_ng::to_string(&v)
        .map_err(|e| ReclaimError::Files(format!("serialising an object: {}", chain(&e))))
}

/// Phase `hold`: every machine held, so the controller applies nothing to a
/// node from here on; then, while a controller runs, the bounded wait until
/// it has seen every hold (its Held=True at the machine's generation).
async fn hold(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    if r.plan.clusters.iter().all(|c| c.machines.is_empty()) {
        return Ok(());
    }
    for c in &r.plan.clusters {
        let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
        for m in c.machines.iter().filter(|m| !m.held) {
            match machines
                .patch(
                    &m.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"hold": true}})),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                // A controller that does not run cannot serve its webhooks,
                // nor write to a node: without it there is nothing to hold off.
                Err(e) if !controller_running(r.kube).await? => {
                    r.say(&format!(
                        "Ichor's controller is not running, so nothing can write to a node; not holding the machines (holding TalosMachine {} failed: {})",
                        m.name,
                        chain(&e)
                    ));
                    return Ok(());
                }
                Err(e) => return Err(failed(format!("holding TalosMachine {}", m.name))(e)),
            }
        }
    }
    if !controller_running(r.kube).await? {
        r.say("held every TalosMachine; Ichor's controller is not running, so nothing can write to a node");
        return Ok(());
    }
    r.wait("the controller to see every hold", || async {
        let mut left = Vec::new();
        for c in &r.plan.clusters {
            let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
            for m in &c.machines {
                let Some(live) = machines
                    .get_opt(&m.name)
                    .await
                    .map_err(failed(format!("reading TalosMachine {}", m.name)))?
                else {
                    continue;
                };
                if !hold_seen(&live) {
                    left.push(format!("TalosMachine {} not yet Held", m.name));
                }
            }
        }
        Ok(left)
    })
    .await?;
    r.say("held every TalosMachine: the controller applies nothing to a node from now on");
    Ok(())
}

/// The controller reported Held=True for the machine's current generation.
fn hold_seen(m: &TalosMachine) -> bool {
    let generation = m.metadata.generation.unwrap_or_default();
    m.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or_default() >= generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == ichor_api::conditions::types::HELD && c.status == "True")
    })
}

/// Whether a controller of Ichor's (either path's Deployment) has a ready pod.
async fn controller_running(kube: &kube::Client) -> Result<bool, ReclaimError> {
    let selector = format!(
        "app.kubernetes.io/name in ({},{})",
        install::INSTALLER_NAME_LABEL,
        install::CHART_SELECTOR_LABEL.1
    );
    let deployments = Api::<Deployment>::all(kube.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(failed("reading Ichor's controller Deployment"))?;
    Ok(deployments.items.iter().any(|d| {
        d.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default()
            > 0
    }))
}

/// Phase `objects`: the finished TalosOperations, the TalosMachines, then
/// the TalosClusters and their bundle Secrets (on disk since the files
/// phase). None has a finalizer: nothing runs when they go.
async fn objects(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    for op in &r.plan.operations {
        let (ns, name) = op.split_once('/').unwrap_or(("", op));
        delete_named(
            &Api::<TalosOperation>::namespaced(r.kube.clone(), ns),
            name,
            "TalosOperation",
        )
        .await?;
    }
    for c in &r.plan.clusters {
        let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
        for m in &c.machines {
            delete_named(&machines, &m.name, "TalosMachine").await?;
        }
        delete_named(
            &Api::<TalosCluster>::namespaced(r.kube.clone(), &c.namespace),
            &c.name,
            "TalosCluster",
        )
        .await?;
        delete_named(
            &Api::<Secret>::namespaced(r.kube.clone(), &c.namespace),
            &c.secret,
            "Secret",
        )
        .await?;
    }
    r.wait("the TalosMachines and TalosClusters to be gone", || async {
        let mut left = Vec::new();
        for c in &r.plan.clusters {
            let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
            for m in &c.machines {
                if machines
                    .get_opt(&m.name)
                    .await
                    .map_err(failed("reading TalosMachines"))?
                    .is_some()
                {
                    left.push(format!("TalosMachine {}", m.name));
                }
            }
            if Api::<TalosCluster>::namespaced(r.kube.clone(), &c.namespace)
                .get_opt(&c.name)
                .await
                .map_err(failed("reading TalosClusters"))?
                .is_some()
            {
                left.push(format!("TalosCluster {}", c.name));
            }
        }
        Ok(left)
    })
    .await?;
    for c in &r.plan.clusters {
        r.say(&format!(
            "deleted TalosCluster {}/{}, its {} TalosMachines and Secret {}; no node was written to",
            c.namespace,
            c.name,
            c.machines.len(),
            c.secret
        ));
    }
    Ok(())
}

/// Deletes `name`; gone already, or already being deleted (409, a
/// terminating namespace), is fine (a rerun).
async fn delete_named<K>(api: &Api<K>, name: &str, kind: &str) -> Result<(), ReclaimError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(failed(format!("deleting {kind} {name}"))(e)),
    }
}

/// Phase `cilium`: Cilium handed back as a plain Helm release. Once no
/// ichor-cni Job runs, every revision's record is written to kube-system
/// with Helm's own labels only (an existing copy must be the same), the
/// fields Ichor applied are handed to helm's field manager, and then the
/// records in ichor-system are deleted — in that order, so a kill leaves a
/// state the rerun finishes.
async fn cilium(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    if !matches!(r.plan.cilium, CiliumChoice::HandBack { .. }) {
        return Ok(());
    }
    let jobs = Api::<Job>::namespaced(r.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    r.wait("the ichor-cni Job to finish", || async {
        Ok(jobs
            .list(&ListParams::default().labels("ichor.maesh.dev/cni-for"))
            .await
            .map_err(failed("reading the ichor-cni Jobs"))?
            .items
            .iter()
            .filter(|j| j.status.as_ref().and_then(|s| s.active).unwrap_or_default() > 0)
            .map(|j| {
                format!(
                    "Job {} is running",
                    j.metadata.name.clone().unwrap_or_default()
                )
            })
            .collect())
    })
    .await?;
    let ichors = SecretStorage::new(r.kube.clone(), ichor_cilium::STORAGE_NAMESPACE);
    let plain = SecretStorage::new(r.kube.clone(), HANDED_BACK_NAMESPACE);
    let history = ichors.history(ichor_cilium::RELEASE_NAME).await?;
    if let Some(pending) = history.iter().find(|s| s.release.status().is_pending()) {
        return Err(ReclaimError::Refused(vec![Refusal::new(format!(
            "Cilium's Helm release cilium became {} (revision {}) while reclaim ran: wait for that operation to finish, then run ichor reclaim again",
            pending.release.status(),
            pending.release.version
        ))]));
    }
    for stored in &history {
        let rel = &stored.release;
        match plain.create(rel).await {
            Ok(_) => {}
            Err(StorageError::AlreadyExists { .. }) => {
                let there = plain.get(&rel.name, rel.version).await?;
                if there.as_ref().map(|s| &s.release) != Some(rel) {
                    return Err(ReclaimError::Refused(vec![Refusal::new(format!(
                        "kube-system already holds revision {} of a Helm release cilium that differs from Ichor's record of it, so the two histories cannot be joined. Look at helm -n kube-system history cilium; remove the records that are not Cilium's, or rerun with --keep-cilium-record",
                        rel.version
                    ))]));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(deployed) = history
        .iter()
        .rev()
        .find(|s| s.release.status() == ichor_helm::Status::Deployed)
    {
        hand_fields_to_helm(r.kube, &deployed.release).await?;
    }
    for stored in &history {
        ichors
            .delete(&stored.release.name, stored.release.version)
            .await?;
    }
    r.say(&format!(
        "handed Cilium back: the records of Helm release cilium ({}) now live in kube-system; helm -n kube-system list shows it",
        reclaim::join_revisions(
            &history
                .iter()
                .map(|s| s.release.version)
                .collect::<Vec<_>>()
        )
    ));
    Ok(())
}

/// Every object of the release's manifest: the managedFields entries of
/// Ichor's field manager renamed to helm's, so the next `helm upgrade` (v4
/// applies server-side as `helm`) owns what it applies instead of
/// conflicting with a manager that is gone. An entry helm already has for
/// the same operation keeps helm's, and Ichor's is dropped.
async fn hand_fields_to_helm(
    kube: &kube::Client,
    release: &ichor_helm::Release,
) -> Result<(), ReclaimError> {
    let objects = ichor_helm::manifest::parse_manifest(&release.manifest).map_err(|source| {
        ReclaimError::Manifest {
            revision: release.version,
            source,
        }
    })?;
    for obj in objects {
        let (group, version) = obj.group_version();
        let gvk = GroupVersionKind::gvk(group, version, &obj.kind);
        let what = format!("{} {}", obj.kind, obj.name);
        let Ok((ar, caps)) = kube::discovery::pinned_kind(kube, &gvk).await else {
            // A kind no longer served has no object to hand over.
            continue;
        };
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => Api::namespaced_with(
                kube.clone(),
                obj.namespace.as_deref().unwrap_or(&release.namespace),
                &ar,
            ),
            kube::discovery::Scope::Cluster => Api::all_with(kube.clone(), &ar),
        };
        let Some(live) = api
            .get_opt(&obj.name)
            .await
            .map_err(failed(format!("reading {what}")))?
        else {
            continue;
        };
        let fields = live.metadata.managed_fields.clone().unwrap_or_default();
        let Some(handed) = fields_handed_to_helm(&fields) else {
            continue;
        };
        let patch = json!({"metadata": {
            "managedFields": handed,
            "resourceVersion": live.metadata.resource_version,
        }});
        api.patch(&obj.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(failed(format!("handing the fields of {what} to helm")))?;
    }
    Ok(())
}

/// `fields` with Ichor's entries renamed to helm's; `None` when Ichor has none.
fn fields_handed_to_helm(
    fields: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
) -> Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>> {
    if !fields
        .iter()
        .any(|f| f.manager.as_deref() == Some(ICHOR_FIELD_MANAGER))
    {
        return None;
    }
    let key = |f: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
        (f.operation.clone(), f.subresource.clone())
    };
    let helms: Vec<_> = fields
        .iter()
        .filter(|f| f.manager.as_deref() == Some(HELM_FIELD_MANAGER))
        .map(key)
        .collect();
    Some(
        fields
            .iter()
            .filter_map(|f| {
                if f.manager.as_deref() != Some(ICHOR_FIELD_MANAGER) {
                    return Some(f.clone());
                }
                if helms.contains(&key(f)) {
                    return None;
                }
                let mut renamed = f.clone();
                renamed.manager = Some(HELM_FIELD_MANAGER.into());
                Some(renamed)
            })
            .collect(),
    )
}

/// Phase `uninstall`: on the install-manifest path, what `ichor adopt`
/// applied is deleted — the webhooks first (nothing calls a controller that
/// is going), the controller (and the bounded wait until its pods are
/// gone), the rest, the namespace unless it keeps Cilium's records, and the
/// IchorInstallation last (a rerun after a kill still finds Ichor there). On
/// a Helm install the operator is given the command; nothing is touched.
async fn uninstall(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    match &r.plan.ichor {
        IchorChoice::Helm { command, .. } => {
            r.say(&format!(
                "Ichor is installed by Helm: not touching it. Uninstall it with: {command}"
            ));
            Ok(())
        }
        IchorChoice::Absent => {
            // A chart uninstalled with its CRDs kept leaves its
            // IchorInstallation: it goes with Ichor.
            delete_installation(r.kube).await
        }
        IchorChoice::Uninstall {
            delete_namespace, ..
        } => {
            let ns = ichor_api::SYSTEM_NAMESPACE;
            let all = install::install_objects("unused", "unused");
            let by_kind = |kind: &str| -> Vec<Value> {
                all.iter().filter(|o| o["kind"] == kind).cloned().collect()
            };
            delete_objects(r.kube, &by_kind("ValidatingWebhookConfiguration")).await?;
            delete_objects(r.kube, &by_kind("Deployment")).await?;
            let pods = Api::<Pod>::namespaced(r.kube.clone(), ns);
            let selector = format!("app.kubernetes.io/name={}", install::INSTALLER_NAME_LABEL);
            r.wait("Ichor's controller to stop", || async {
                Ok(pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(failed("reading Ichor's pods"))?
                    .items
                    .iter()
                    .map(|p| format!("pod {}", p.metadata.name.clone().unwrap_or_default()))
                    .collect())
            })
            .await?;
            let rest: Vec<Value> = all
                .iter()
                .filter(|o| {
                    !matches!(
                        o["kind"].as_str(),
                        Some(
                            "Namespace"
                                | "CustomResourceDefinition"
                                | "ValidatingWebhookConfiguration"
                                | "Deployment"
                        )
                    )
                })
                .cloned()
                .collect();
            delete_objects(r.kube, &rest).await?;
            delete_objects(r.kube, &install::cilium_policies()).await?;
            let secret: Value = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": install::WEBHOOK_CERT_SECRET, "namespace": ns}});
            delete_objects(r.kube, &[secret]).await?;
            let jobs = Api::<Job>::namespaced(r.kube.clone(), ns);
            for j in jobs
                .list(&ListParams::default().labels("ichor.maesh.dev/cni-for"))
                .await
                .map_err(failed("reading the ichor-cni Jobs"))?
                .items
            {
                delete_named(&jobs, &j.metadata.name.unwrap_or_default(), "Job").await?;
            }
            if *delete_namespace {
                delete_named(&Api::<Namespace>::all(r.kube.clone()), ns, "Namespace").await?;
            }
            // Last: it is what tells a rerun that Ichor is still installed.
            delete_installation(r.kube).await?;
            if *delete_namespace {
                r.say("uninstalled Ichor: its controller, webhooks, RBAC and IchorInstallation are deleted, and the namespace ichor-system is being deleted");
            } else {
                r.say("uninstalled Ichor: its controller, webhooks, RBAC and IchorInstallation are deleted; the namespace ichor-system stays with Cilium's records");
            }
            Ok(())
        }
    }
}

async fn delete_installation(kube: &kube::Client) -> Result<(), ReclaimError> {
    let installations = Api::<IchorInstallation>::all(kube.clone());
    let list = match installations.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(failed("reading the IchorInstallation")(e)),
    };
    for i in list {
        let ns = i.metadata.namespace.clone().unwrap_or_default();
        delete_named(
            &Api::<IchorInstallation>::namespaced(kube.clone(), &ns),
            &i.metadata.name.unwrap_or_default(),
            "IchorInstallation",
        )
        .await?;
    }
    Ok(())
}

/// Deletes objects known as data (kind resolved at run time); a kind not
/// served or an object gone is fine.
async fn delete_objects(kube: &kube::Client, objects: &[Value]) -> Result<(), ReclaimError> {
    for obj in objects {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let Ok((ar, caps)) = kube::discovery::pinned_kind(kube, &gvk).await else {
            continue;
        };
        let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(kube.clone(), ns, &ar)
            }
            _ => Api::all_with(kube.clone(), &ar),
        };
        delete_named(&api, name, kind).await?;
    }
    Ok(())
}

/// Phase `crds`: with `--delete-crds` on the install-manifest path, Ichor's
/// CRDs are deleted and the bounded wait runs until they are gone; kept
/// otherwise (on Helm, the operator is given the command).
async fn crds(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    let api = Api::<CustomResourceDefinition>::all(r.kube.clone());
    match &r.plan.crds {
        CrdChoice::Keep { crds } if !crds.is_empty() => {
            r.say(&format!("kept Ichor's CRDs: {}", crds.join(", ")));
            Ok(())
        }
        CrdChoice::Keep { .. } => Ok(()),
        CrdChoice::DeleteAfterHelm { command, .. } => {
            r.say(&format!(
                "Ichor's CRDs belong to its Helm chart: after helm uninstall, delete them with: {command}"
            ));
            Ok(())
        }
        CrdChoice::Delete { crds } => {
            for name in crds {
                delete_named(&api, name, "CustomResourceDefinition").await?;
            }
            r.wait("Ichor's CRDs to be gone", || async {
                let mut left = Vec::new();
                for name in crds {
                    if api
                        .get_opt(name)
                        .await
                        .map_err(failed("reading the CRDs"))?
                        .is_some()
                    {
                        left.push(format!("CRD {name}"));
                    }
                }
                Ok(left)
            })
            .await?;
            r.say(&format!("deleted Ichor's CRDs: {}", crds.join(", ")));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn entry(manager: &str, operation: &str) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            ..ManagedFieldsEntry::default()
        }
    }

    #[test]
    fn ichors_fields_are_renamed_to_helms_and_others_kept() {
        let fields = vec![entry("ichor", "Apply"), entry("kubectl", "Update")];
        let handed = fields_handed_to_helm(&fields).unwrap();
        assert_eq!(
            handed,
            vec![entry("helm", "Apply"), entry("kubectl", "Update")]
        );
        assert_eq!(
            fields_handed_to_helm(&handed),
            None,
            "a rerun changes nothing"
        );
        let both = vec![entry("helm", "Apply"), entry("ichor", "Apply")];
        assert_eq!(
            fields_handed_to_helm(&both).unwrap(),
            vec![entry("helm", "Apply")],
            "helm's own entry wins"
        );
    }

    #[test]
    fn a_file_is_written_once_0600_and_a_different_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.yaml");
        write_once(&path, b"one", "the secrets bundle").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        write_once(&path, b"one", "the secrets bundle").expect("the same file is kept");
        let err = write_once(&path, b"two", "the secrets bundle").unwrap_err();
        assert!(
            err.to_string().contains("refusing to overwrite it"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
    }
}
