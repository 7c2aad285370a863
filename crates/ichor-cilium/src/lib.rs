//! Ichor's Cilium: Cilium is Ichor's only CNI, owned as the Helm release
//! `cilium` in `kube-system` whose record lives in `ichor-system`.
//!
//! - [`values`]: effective values, a pure function of [`ClusterSettings`]
//!   and the kube-proxy mode, and their hash.
//! - [`pinned_chart`] / [`offline_chart`] / [`chart_from_env`]: which chart.
//! - [`apply`] (install or upgrade given values), [`apply_for_cluster`]
//!   (effective values of the settings; the controller's ichor-cni Job and the
//!   CLI share it), [`bootstrap`] (the CLI's entry: `ichor-system` namespace,
//!   apply, then a bounded wait for Cilium and every node to be Ready).

pub mod values;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use serde_json::{Map, Value};

use ichor_helm::objects::{CreateOrKeep, create_or_keep};
use ichor_helm::wait::{Wait, WaitError, wait_until};
pub use ichor_helm::{ApplyOptions, ChartRef, Release, Renderer};
pub use values::{
    ClusterSettings, KubeProxyMode, OWNED_KEYS, Tunnel, ValuesError, effective_values,
    effective_values_for_mode, node_count_rule, recorded_settings, user_values_from_yaml,
    values_hash,
};

/// The Helm release name of Ichor's Cilium.
pub const RELEASE_NAME: &str = "cilium";
/// Where Cilium's objects go.
pub const RELEASE_NAMESPACE: &str = "kube-system";
/// Where Ichor keeps Cilium's release record.
pub const STORAGE_NAMESPACE: &str = "ichor-system";
/// The pinned Cilium chart version.
pub const CHART_VERSION: &str = "1.18.5";
/// Cilium's classic Helm repository.
pub const CHART_REPO: &str = "https://helm.cilium.io";
/// Cilium's OCI chart repository.
pub const CHART_OCI: &str = "oci://quay.io/cilium/charts/cilium";
/// The agent DaemonSet and the operator Deployment the Ready wait watches.
pub const AGENT_DAEMONSET: &str = "cilium";
pub const OPERATOR_DEPLOYMENT: &str = "cilium-operator";
/// Environment variable naming another chart (a folder, a `.tgz`, an
/// `oci://` reference); `ICHOR_CILIUM_CHART_VERSION` sets its version.
pub const CHART_ENV: &str = "ICHOR_CILIUM_CHART";
pub const CHART_VERSION_ENV: &str = "ICHOR_CILIUM_CHART_VERSION";

/// The pinned chart from Cilium's Helm repository.
pub fn pinned_chart() -> ChartRef {
    ChartRef {
        reference: "cilium".into(),
        version: Some(CHART_VERSION.into()),
        repo: Some(CHART_REPO.into()),
    }
}

/// The pinned chart from Cilium's OCI repository.
pub fn pinned_oci_chart() -> ChartRef {
    ChartRef {
        reference: CHART_OCI.into(),
        version: Some(CHART_VERSION.into()),
        repo: None,
    }
}

/// A chart on disk (a folder or a `.tgz`, e.g. the stand-in or an air-gapped
/// copy of the pinned chart); needs no network.
pub fn offline_chart(path: impl AsRef<Path>) -> ChartRef {
    ChartRef::path(path)
}

/// [`CHART_ENV`] when set (with [`CHART_VERSION_ENV`]), else [`pinned_chart`].
pub fn chart_from_env() -> ChartRef {
    match std::env::var(CHART_ENV) {
        Ok(r) if !r.is_empty() => {
            if Path::new(&r).exists() {
                offline_chart(r)
            } else {
                ChartRef {
                    reference: r,
                    version: std::env::var(CHART_VERSION_ENV)
                        .ok()
                        .filter(|v| !v.is_empty()),
                    repo: None,
                }
            }
        }
        _ => pinned_chart(),
    }
}

/// Where `dist/cilium-standin` is in a checkout (tests and the lab).
pub fn standin_chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/cilium-standin")
}

/// Called while waiting with what is still not Ready, one line each.
pub type Progress = Arc<ichor_helm::wait::ProgressFn>;

/// How Ichor's Cilium release is written.
#[derive(Clone, Debug)]
pub struct CiliumOptions {
    pub chart: ChartRef,
    pub renderer: Renderer,
    pub storage_namespace: String,
    pub release_namespace: String,
    /// Options of the Helm operation. `take_ownership` is forced on for the
    /// first install (an existing Cilium becomes Ichor's); set `exclusive`
    /// where the CNI lock is held (the ichor-cni Job).
    pub apply: ApplyOptions,
    /// Re-apply even when the deployed revision already has these values and
    /// this chart version (by default that is a no-op: no new revision, no
    /// re-render, no certificate churn).
    pub force: bool,
}

impl CiliumOptions {
    /// The pinned chart, records in `ichor-system`, objects in `kube-system`.
    pub fn new(renderer: Renderer) -> Self {
        CiliumOptions {
            chart: pinned_chart(),
            renderer,
            storage_namespace: STORAGE_NAMESPACE.into(),
            release_namespace: RELEASE_NAMESPACE.into(),
            apply: ApplyOptions::default(),
            force: false,
        }
    }

    pub fn chart(mut self, chart: ChartRef) -> Self {
        self.chart = chart;
        self
    }
}

/// What [`apply`] did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The deployed revision.
    pub release: Release,
    /// [`values_hash`] of the values it was deployed with.
    pub values_hash: String,
    /// False when the deployed revision already matched and nothing was written.
    pub changed: bool,
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Values(#[from] ValuesError),
    #[error(transparent)]
    Helm(#[from] ichor_helm::Error),
    #[error(
        "creating namespace {namespace} for Cilium's release record failed; create it yourself or grant the right to create namespaces"
    )]
    Namespace {
        namespace: String,
        source: kube::Error,
    },
    #[error("reading {what} failed")]
    Read { what: String, source: kube::Error },
    #[error(
        "Cilium is not Ready within {timeout:?}; still waiting for: {pending}. Check the Cilium pods in {namespace} and the nodes' Ready condition"
    )]
    NotReady {
        timeout: Duration,
        namespace: String,
        pending: String,
    },
}

impl Error {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            // Transparent: the Helm error is not a cause of its own in the chain.
            Error::Helm(e) => e.help(),
            Error::Read { .. } => Some("check the kubeconfig and that it may read it".into()),
            _ => None,
        }
    }
}

/// The values hash of the values a release was deployed with (its `config`).
pub fn release_values_hash(release: &Release) -> String {
    values_hash(&release.config.clone().unwrap_or_default())
}

/// Installs (taking ownership of existing objects) or upgrades the release
/// `cilium` with `values`. A deployed revision that already has these values
/// and chart version, and whose DaemonSet and Deployment exist, is left as it
/// is unless [`CiliumOptions::force`].
pub async fn apply(
    client: kube::Client,
    opts: &CiliumOptions,
    values: Map<String, Value>,
) -> Result<Applied, Error> {
    let engine = ichor_helm::Engine::new(
        client.clone(),
        &opts.storage_namespace,
        opts.renderer.clone(),
    );
    let hash = values_hash(&values);
    let history = engine.history(RELEASE_NAME).await?;
    if !opts.force
        && let Some(last) = history.last()
        && last.status() == ichor_helm::Status::Deployed
        && release_values_hash(last) == hash
        && chart_version_of(&opts.chart).is_none_or(|v| last.chart_version() == Some(v.as_str()))
        && workloads_exist(&client, &opts.release_namespace).await?
    {
        tracing::info!(
            revision = last.version,
            hash,
            "Cilium is already deployed with these values"
        );
        return Ok(Applied {
            release: last.clone(),
            values_hash: hash,
            changed: false,
        });
    }
    let req = ichor_helm::ReleaseRequest {
        name: RELEASE_NAME.into(),
        namespace: opts.release_namespace.clone(),
        chart: opts.chart.clone(),
        values: Value::Object(values),
    };
    let release = if history.is_empty() {
        let mut o = opts.apply.clone();
        o.take_ownership = true;
        engine.install(&req, &o).await?
    } else {
        engine.upgrade(&req, &opts.apply).await?
    };
    Ok(Applied {
        release,
        values_hash: hash,
        changed: true,
    })
}

/// [`apply`] with the effective values of `settings`. The controller's
/// ichor-cni Job and the CLI both go through here.
pub async fn apply_for_cluster(
    client: kube::Client,
    opts: &CiliumOptions,
    settings: &ClusterSettings,
) -> Result<Applied, Error> {
    let values = effective_values(settings)?;
    apply(client, opts, values).await
}

/// The version of the chart `chart` names: its `--version`, or for a chart
/// folder the `version` in its Chart.yaml; `None` when it cannot be told
/// without helm (an archive, a reference without a version).
pub fn chart_version_of(chart: &ChartRef) -> Option<String> {
    if let Some(v) = &chart.version {
        return Some(v.clone());
    }
    let text = std::fs::read_to_string(Path::new(&chart.reference).join("Chart.yaml")).ok()?;
    let meta: Value = serde_yaml_ng::from_str(&text).ok()?;
    meta.get("version")
        .and_then(Value::as_str)
        .map(str::to_string)
}

async fn workloads_exist(client: &kube::Client, ns: &str) -> Result<bool, Error> {
    let read = |what: String| move |source| Error::Read { what, source };
    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get_opt(AGENT_DAEMONSET)
        .await
        .map_err(read(format!("DaemonSet {ns}/{AGENT_DAEMONSET}")))?;
    let dep = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(OPERATOR_DEPLOYMENT)
        .await
        .map_err(read(format!("Deployment {ns}/{OPERATOR_DEPLOYMENT}")))?;
    Ok(ds.is_some() && dep.is_some())
}

/// The hand-over signal (R1.5e): the release `cilium` is deployed at the
/// effective-values hash and the DaemonSet is Ready. One type with the
/// decision that reads it (`ichor_reconcile::cluster`).
pub use ichor_reconcile::cluster::{HandoverCheck, Waiting};

/// Reads what [`HandoverCheck`] needs. Read-only; needs no helm binary.
pub async fn check_handover(
    client: kube::Client,
    storage_namespace: &str,
    release_namespace: &str,
    settings: &ClusterSettings,
) -> Result<HandoverCheck, Error> {
    let desired_hash = values_hash(&effective_values(settings)?);
    let deployed = ichor_helm::SecretStorage::new(client.clone(), storage_namespace)
        .deployed(RELEASE_NAME)
        .await
        .map_err(ichor_helm::Error::from)?
        .map(|r| (r.version, release_values_hash(&r)));
    let ds = Api::<DaemonSet>::namespaced(client, release_namespace)
        .get_opt(AGENT_DAEMONSET)
        .await
        .map_err(|source| Error::Read {
            what: format!("DaemonSet {release_namespace}/{AGENT_DAEMONSET}"),
            source,
        })?;
    let daemonset = match ds {
        None => Err(Waiting::from("not found")),
        Some(d) => ichor_helm::manifest::rollout_status(
            "DaemonSet",
            &serde_json::to_value(&d).unwrap_or_default(),
        )
        .map_err(|pending| Waiting(pending.to_string())),
    };
    Ok(HandoverCheck {
        release: RELEASE_NAME.to_string(),
        agent_daemonset: AGENT_DAEMONSET.to_string(),
        desired_hash,
        deployed,
        daemonset,
    })
}

/// The `node_count` of [`ClusterSettings`] as [`node_count_rule`] counts it,
/// from the Nodes alone (the CLI knows no TalosMachines).
pub async fn node_count(client: &kube::Client) -> Result<u32, Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&Default::default())
        .await
        .map_err(|source| Error::Read {
            what: "the nodes".into(),
            source,
        })?;
    Ok(node_count_rule(nodes.items.len(), 0))
}

/// The newest deployed revision of Ichor's Cilium release, read from the
/// storage namespace (no helm needed); `None` when there is none.
pub async fn deployed_release(
    client: kube::Client,
    storage_namespace: &str,
) -> Result<Option<Release>, Error> {
    Ok(ichor_helm::SecretStorage::new(client, storage_namespace)
        .deployed(RELEASE_NAME)
        .await
        .map_err(ichor_helm::Error::from)?)
}

/// The bounded Ready wait of [`bootstrap`].
#[derive(Clone)]
pub struct WaitOptions {
    /// Give up after this long (10 minutes by default).
    pub timeout: Duration,
    /// Report what is still not Ready at once, then this often (30 s by default).
    pub report_interval: Duration,
    /// Read the status this often.
    pub poll_interval: Duration,
    /// Receives the reports (they also go to tracing at INFO).
    pub on_progress: Option<Progress>,
}

impl Default for WaitOptions {
    fn default() -> Self {
        WaitOptions {
            timeout: Duration::from_secs(600),
            report_interval: Duration::from_secs(30),
            poll_interval: Duration::from_secs(2),
            on_progress: None,
        }
    }
}

impl std::fmt::Debug for WaitOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitOptions")
            .field("timeout", &self.timeout)
            .field("report_interval", &self.report_interval)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}

/// The Cilium step of R1.5b: creates the storage namespace if absent, applies the
/// effective values of `settings`, then waits (bounded) for DaemonSet
/// `cilium` and Deployment `cilium-operator` to be Ready and every node to
/// be Ready, reporting what it still waits for. The record is `deployed`
/// once the objects are applied; the wait's timeout does not change it (a
/// rerun finds the release and only waits again).
pub async fn bootstrap(
    client: kube::Client,
    opts: &CiliumOptions,
    settings: &ClusterSettings,
    wait: &WaitOptions,
) -> Result<Applied, Error> {
    let values = effective_values(settings)?;
    ensure_namespace(&client, &opts.storage_namespace).await?;
    let mut o = opts.clone();
    o.apply.wait = false;
    let applied = apply(client.clone(), &o, values).await?;
    wait_ready(&client, &opts.release_namespace, wait).await?;
    Ok(applied)
}

/// Creates `namespace` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, namespace: &str) -> Result<(), Error> {
    let api = Api::<Namespace>::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match create_or_keep(&api, &PostParams::default(), &ns).await {
        Ok(CreateOrKeep::Created(_)) => {
            tracing::info!(namespace, "created namespace");
            Ok(())
        }
        Ok(CreateOrKeep::Kept) => Ok(()),
        Err(source) => Err(Error::Namespace {
            namespace: namespace.into(),
            source,
        }),
    }
}

/// Waits, bounded, until Cilium's DaemonSet and operator are Ready and every
/// node is Ready.
pub async fn wait_ready(
    client: &kube::Client,
    namespace: &str,
    wait: &WaitOptions,
) -> Result<(), Error> {
    let bound = Wait {
        why: "Cilium",
        timeout: wait.timeout,
        poll_interval: wait.poll_interval,
        report_interval: wait.report_interval,
        on_progress: wait.on_progress.as_deref(),
    };
    match wait_until(&bound, || not_ready(client, namespace)).await {
        Ok(()) => {
            tracing::info!(namespace, "Cilium and every node are Ready");
            Ok(())
        }
        Err(WaitError::Check(e)) => Err(e),
        Err(WaitError::TimedOut { pending }) => Err(Error::NotReady {
            timeout: wait.timeout,
            namespace: namespace.into(),
            pending: pending.join("; "),
        }),
    }
}

/// The label selector of Cilium's agent pods.
pub const AGENT_POD_SELECTOR: &str = "k8s-app=cilium";

/// One line for an agent pod that is not Ready, with the reason and message
/// its status gives (the pod's own, else its first waiting container's).
pub fn agent_pod_not_ready(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        return None;
    }
    let waiting = status
        .init_container_statuses
        .iter()
        .chain(status.container_statuses.iter())
        .flatten()
        .find_map(|c| c.state.as_ref().and_then(|s| s.waiting.clone()));
    let reason = status
        .reason
        .clone()
        .or_else(|| waiting.as_ref().and_then(|w| w.reason.clone()))
        .or_else(|| status.phase.clone())
        .unwrap_or_else(|| "not Ready".into());
    let message = status
        .message
        .clone()
        .or_else(|| waiting.and_then(|w| w.message));
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "no node".into());
    Some(format!(
        "Pod {}/{} on {node}: {reason}{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        message.map(|m| format!(": {m}")).unwrap_or_default()
    ))
}

/// What is not Ready yet, one line each (empty when all is Ready).
pub async fn not_ready(client: &kube::Client, namespace: &str) -> Result<Vec<String>, Error> {
    let read = |what: &str| {
        let what = what.to_string();
        move |source| Error::Read { what, source }
    };
    let mut pending = Vec::new();
    let ds = Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt(AGENT_DAEMONSET)
        .await
        .map_err(read("Cilium's DaemonSet"))?;
    let ds_line = match ds {
        None => Some("not found".to_string()),
        Some(d) => ichor_helm::manifest::rollout_status(
            "DaemonSet",
            &serde_json::to_value(&d).unwrap_or_default(),
        )
        .err()
        .map(|pending| pending.to_string()),
    };
    if let Some(why) = ds_line {
        pending.push(format!("DaemonSet {namespace}/{AGENT_DAEMONSET}: {why}"));
        // Why the agents are not Ready, as their pods say.
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(AGENT_POD_SELECTOR))
            .await
            .map_err(read("Cilium's agent pods"))?;
        pending.extend(pods.items.iter().filter_map(agent_pod_not_ready));
    }
    let dep = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(OPERATOR_DEPLOYMENT)
        .await
        .map_err(read("Cilium's operator Deployment"))?;
    let dep_line = match dep {
        None => Some("not found".to_string()),
        Some(d) => ichor_helm::manifest::rollout_status(
            "Deployment",
            &serde_json::to_value(&d).unwrap_or_default(),
        )
        .err()
        .map(|pending| pending.to_string()),
    };
    if let Some(why) = dep_line {
        pending.push(format!(
            "Deployment {namespace}/{OPERATOR_DEPLOYMENT}: {why}"
        ));
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .map_err(read("the nodes"))?;
    if nodes.items.is_empty() {
        pending.push("no node has registered yet".into());
    }
    for n in &nodes.items {
        let name = n.metadata.name.clone().unwrap_or_default();
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        match ready {
            Some(c) if c.status == "True" => {}
            Some(c) => pending.push(format!(
                "Node {name}: NotReady ({})",
                c.message
                    .clone()
                    .or_else(|| c.reason.clone())
                    .unwrap_or_else(|| "no message".into())
            )),
            None => pending.push(format!("Node {name}: no Ready condition yet")),
        }
    }
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_version_of_a_folder_comes_from_chart_yaml() {
        assert_eq!(
            chart_version_of(&pinned_chart()).as_deref(),
            Some(CHART_VERSION)
        );
        assert_eq!(
            chart_version_of(&offline_chart(standin_chart_dir())).as_deref(),
            Some("1.18.5-standin.1")
        );
        assert_eq!(
            chart_version_of(&offline_chart("/nonexistent/cilium.tgz")),
            None
        );
    }

    #[test]
    fn a_pod_that_is_not_ready_says_why() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cilium-n1", "namespace": "kube-system"},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
                "initContainerStatuses": [{"name": "mount-cgroup", "image": "", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "no cgroup"}}}]}
        }))
        .unwrap();
        assert_eq!(
            agent_pod_not_ready(&pod).as_deref(),
            Some("Pod kube-system/cilium-n1 on n1: CrashLoopBackOff: no cgroup")
        );
        let mut ready = pod.clone();
        ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        assert_eq!(agent_pod_not_ready(&ready), None);
    }

    #[test]
    fn pinned_chart_is_1_18() {
        assert!(CHART_VERSION.starts_with("1.18."));
        let c = pinned_chart();
        assert_eq!(c.version.as_deref(), Some(CHART_VERSION));
        assert_eq!(c.repo.as_deref(), Some(CHART_REPO));
        assert_eq!(pinned_oci_chart().reference, CHART_OCI);
        assert!(standin_chart_dir().join("Chart.yaml").is_file());
    }
}
