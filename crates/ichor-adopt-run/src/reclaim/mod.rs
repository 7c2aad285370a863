//! `ichor reclaim` end to end: the inspection → the plan (`ichor_adopt::reclaim`)
//! → consent → the phases. Each phase is one function here, named as its
//! entry of [`ReclaimOutcome::phases`], and idempotent (deletes accept what
//! is gone, files already written are kept when they are the same, records
//! already copied are compared), so a rerun after a kill finishes the job.
//!
//! No phase writes to a node: there is no Talos client here at all. What
//! talosctl needs (the bundle, a talosconfig) is written to disk first,
//! before anything is deleted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_adopt::plan::IchorPresence;
use ichor_adopt::reclaim::{
    self, FoundCluster, FoundMachine, FoundOperation, FoundRecord, ReclaimInspection, ReclaimPlan,
    ReclaimRequest,
};
use ichor_adopt::{Refusal, waits};
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use ichor_helm::SecretStorage;
use ichor_helm::storage::StorageError;
use ichor_helm::wait::{Wait, WaitError, wait_until};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

use crate::inspect::{self, InspectError};

mod cilium;
mod files;
mod objects;
mod uninstall;

use cilium::cilium;
use files::files;
use objects::{hold, objects};
use uninstall::{crds, uninstall};

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
    Ok(ReclaimInspection {
        clusters: found_clusters(&clusters, &machines),
        operations: operations.iter().map(found_operation).collect(),
        ichor,
        cilium_records,
        handed_back_records,
        crds,
    })
}

/// Each TalosCluster with the TalosMachines of its namespace that name it.
fn found_clusters(clusters: &[TalosCluster], machines: &[TalosMachine]) -> Vec<FoundCluster> {
    clusters
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
        .collect()
}

/// A TalosOperation and its phase (`Pending` before the controller set one).
fn found_operation(o: &TalosOperation) -> FoundOperation {
    FoundOperation {
        namespace: o.metadata.namespace.clone().unwrap_or_default(),
        name: o.metadata.name.clone().unwrap_or_default(),
        phase: o
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "Pending".into()),
    }
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

#[cfg(test)]
mod tests {
    use super::cilium::fields_handed_to_helm;
    use super::files::write_once;
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
