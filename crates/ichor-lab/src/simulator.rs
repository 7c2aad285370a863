//! The node simulator: it plays the kubelets', the scheduler's and the Cilium
//! operator's parts on the test control plane, which has none of them.
//!
//! Every tick it:
//! - runs a pod per eligible node for every DaemonSet and counts them in the
//!   DaemonSet's status; Cilium's agent pod is Ready only when its rendered
//!   configuration would run on Talos ([`crate::daemonsets`],
//!   [`crate::cilium_on_talos`]);
//! - marks a Deployment ready once its pods could be scheduled: when it runs on
//!   the host network, or when the nodes are Ready (a pod network exists);
//!   until then it keeps one Pending pod for it with the scheduler's message,
//!   and an image whose tag is `broken` stays in ImagePullBackOff for ever;
//! - turns a Node Ready once a CNI agent pod on it (Cilium's, flannel's,
//!   Calico's) is Running and Ready, and back to NotReady with the kubelet's
//!   network-plugin message when none is;
//! - registers Cilium's CRDs once `cilium-operator` is ready, as the real
//!   operator does;
//! - runs a Job whose image is Ichor's (the controller's ichor-cni Job) as a
//!   local process of the same `ichor` binary against the lab, under a token
//!   of the Job's ServiceAccount — the one container the lab can run, because
//!   it is ours — and records its outcome in the Job's status. Other Jobs
//!   never run;
//! - leaves the pods of Ichor's own Deployments to [`crate::pods`], which runs
//!   them as real processes;
//! - computes PodDisruptionBudgets' status and ends evicted pods
//!   ([`crate::disruption`]), so a drain through the Eviction API meets the
//!   budgets as in a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The message a kubelet writes on a node whose CNI is missing.
pub const NO_CNI_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";
/// The message of a Ready kubelet.
pub const READY_MESSAGE: &str = "kubelet is posting ready status";
/// The image tag the simulator never pulls.
pub const BROKEN_TAG: &str = "broken";

const TICK: Duration = Duration::from_millis(300);
const MANAGER: &str = "ichor-lab-node-simulator";

/// How the lab runs Ichor's own processes (its Jobs and its Deployments' pods).
pub use crate::pods::ProcessRunner as JobRunner;

/// The image repository whose Jobs and pods the lab runs.
pub const ICHOR_IMAGE: &str = crate::pods::ICHOR_IMAGE;

/// Runs the simulator until the task is dropped or aborted; `configs`: the
/// emulated nodes' active configs, whose health the kubelets play
/// ([`crate::readiness`]).
pub fn spawn(
    client: kube::Client,
    runner: Option<JobRunner>,
    configs: Option<ichor_talemu::ActiveConfigs>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut health = crate::readiness::ConfigHealth::new(configs);
        let mut started = std::collections::HashSet::new();
        let mut ichor_pods = runner.clone().map(crate::pods::IchorPods::new);
        loop {
            let unhealthy = health.unhealthy();
            if let Err(e) = tick(&client, ichor_pods.is_some(), &unhealthy).await {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "node simulator");
            }
            if let Some(pods) = ichor_pods.as_mut()
                && let Err(e) = pods.sync(&client).await
            {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "node simulator, Ichor's pods");
            }
            if let Some(r) = &runner
                && let Err(e) = run_jobs(&client, r, &mut started).await
            {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "node simulator, jobs");
            }
            tokio::time::sleep(TICK).await;
        }
    })
}

/// Starts each new Job of Ichor's image as a local process; its exit code
/// becomes the Job's outcome.
async fn run_jobs(
    client: &kube::Client,
    runner: &JobRunner,
    started: &mut std::collections::HashSet<String>,
) -> Result<(), kube::Error> {
    for job in Api::<Job>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let uid = job.metadata.uid.clone().unwrap_or_default();
        if started.contains(&uid) || job.status.as_ref().is_some_and(|s| s.conditions.is_some()) {
            continue;
        }
        let Some(container) = ichor_job_container(&job) else {
            continue;
        };
        started.insert(uid);
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let name = job.metadata.name.clone().unwrap_or_default();
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let start = now();
        let _ = jobs
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"startTime": start, "active": 1}})),
            )
            .await;
        let runner = runner.clone();
        let client = client.clone();
        let service_account = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|p| p.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        tokio::spawn(async move {
            let (ok, message) =
                run_job_process(&client, &runner, &ns, &name, &service_account, container).await;
            let status = job_outcome_status(ok, &message, &now());
            if let Err(e) = jobs
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
            {
                tracing::warn!(error = %ichor_api::error_text::chain(&e), "node simulator: recording the outcome of Job {ns}/{name}");
            }
        });
    }
    Ok(())
}

/// The Job's first container when its image is Ichor's (the only one the
/// lab can run).
fn ichor_job_container(job: &Job) -> Option<Container> {
    let container = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .cloned()?;
    container
        .image
        .as_deref()
        .is_some_and(crate::pods::is_ichor_image)
        .then_some(container)
}

/// Runs the Job's container as the local `ichor` binary under a token of
/// its ServiceAccount (its output goes to a log file in the state
/// directory). Returns whether it succeeded, and its last line on stderr
/// (or why it could not run).
async fn run_job_process(
    client: &kube::Client,
    runner: &JobRunner,
    ns: &str,
    name: &str,
    service_account: &str,
    container: Container,
) -> (bool, String) {
    let log = runner.state_dir.join(format!("job-{name}.log"));
    let kubeconfig = runner.state_dir.join(format!("job-{name}.kubeconfig"));
    let token =
        crate::pods::token_kubeconfig(client, runner, ns, service_account, &kubeconfig).await;
    let output = match token {
        Err(e) => Err(std::io::Error::other(ichor_api::error_text::chain(&e))),
        Ok(()) => {
            tokio::process::Command::new(&runner.ichor)
                .args(container.args.unwrap_or_default())
                .env("KUBECONFIG", &kubeconfig)
                .env("ICHOR_HELM", &runner.helm)
                .env("ICHOR_CILIUM_CHART", &runner.cilium_chart)
                .envs(runner.ichor_log.iter().map(|f| ("ICHOR_LOG", f)))
                .output()
                .await
        }
    };
    match output {
        Ok(o) => {
            let _ = std::fs::write(&log, [o.stdout.as_slice(), o.stderr.as_slice()].concat());
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .to_string(),
            )
        }
        Err(e) => (false, e.to_string()),
    }
}

/// The Job status patch the Job controller would write for the outcome.
fn job_outcome_status(ok: bool, message: &str, end: &str) -> Value {
    if ok {
        json!({"status": {"active": 0, "succeeded": 1, "completionTime": end, "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastProbeTime": end, "lastTransitionTime": end},
            {"type": "Complete", "status": "True", "lastProbeTime": end, "lastTransitionTime": end}]}})
    } else {
        json!({"status": {"active": 0, "failed": 1, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": message, "lastProbeTime": end, "lastTransitionTime": end},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": message, "lastProbeTime": end, "lastTransitionTime": end}]}})
    }
}

/// One pass over the cluster; `run_ichor`: Ichor's Deployments are left to
/// [`crate::pods`] once their pods can be scheduled; `unhealthy`: the nodes
/// whose active config the lab plays as unhealthy.
pub async fn tick(
    client: &kube::Client,
    run_ichor: bool,
    unhealthy: &std::collections::HashSet<String>,
) -> Result<(), kube::Error> {
    let lp = ListParams::default();
    let nodes = Api::<Node>::all(client.clone()).list(&lp).await?.items;
    let n = nodes.len() as i32;
    let nodes_ready = crate::daemonsets::tick(client, &nodes, unhealthy).await?;

    let mut operator_ready = false;
    for d in Api::<Deployment>::all(client.clone())
        .list(&lp)
        .await?
        .items
    {
        let ready = simulate_deployment(client, &d, nodes_ready, n, run_ichor).await?;
        if d.metadata.namespace.as_deref() == Some("kube-system")
            && d.metadata.name.as_deref() == Some("cilium-operator")
        {
            operator_ready = ready;
        }
    }
    if operator_ready {
        register_cilium_crds(client).await?;
    }
    crate::disruption::tick(client, &now()).await?;
    Ok(())
}

/// Marks the Deployment ready when its pods could run; otherwise keeps one
/// simulated pod that says why not. Returns whether it is ready.
async fn simulate_deployment(
    client: &kube::Client,
    d: &Deployment,
    nodes_ready: bool,
    nodes: i32,
    run_ichor: bool,
) -> Result<bool, kube::Error> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let spec = d.spec.clone();
    let pod_spec = spec.template.spec.clone().unwrap_or_default();
    let host_network = pod_spec.host_network.unwrap_or(false);
    let broken = pod_spec
        .containers
        .iter()
        .find(|c| {
            c.image
                .as_deref()
                .is_some_and(|i| i.rsplit(':').next() == Some(BROKEN_TAG))
        })
        .map(|c| c.name.clone());
    let schedulable = (host_network || nodes_ready) && nodes > 0;
    let replicas = spec.replicas.unwrap_or(1);
    let generation = d.metadata.generation.unwrap_or(1);
    let ready = schedulable && broken.is_none();
    if ready && run_ichor && crate::pods::runs_deployment(d) {
        // Its pods are real processes: their readiness is the Deployment's.
        let status = d.status.clone().unwrap_or_default();
        return Ok(status.ready_replicas == Some(replicas));
    }

    // The pod the scheduler and kubelet would show, for the waits' diagnostics.
    let pod_name = format!("{name}-simulated");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod_status = simulated_pod_status(schedulable, broken.as_deref(), nodes);
    if pods.get_opt(&pod_name).await?.is_none() {
        create_simulated_pod(&pods, d, &pod_name, pod_spec).await?;
    }
    let _ = pods
        .patch_status(
            &pod_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": pod_status})),
        )
        .await;

    let status = d.status.clone().unwrap_or_default();
    let is_ready =
        status.ready_replicas == Some(replicas) && status.observed_generation == Some(generation);
    if ready && !is_ready {
        mark_deployment_ready(client, &ns, &name, replicas, generation).await?;
    }
    Ok(ready)
}

/// The status the scheduler and kubelet would give the Deployment's pod:
/// unschedulable on `nodes` NotReady nodes, pulling a broken image for
/// ever, or running.
fn simulated_pod_status(schedulable: bool, broken: Option<&str>, nodes: i32) -> Value {
    if !schedulable {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": format!("0/{nodes} nodes are available: {nodes} node(s) had untolerated taint {{node.kubernetes.io/not-ready: }}. preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling.")}]})
    } else if let Some(container) = broken {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": container, "image": "", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]})
    } else {
        json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]})
    }
}

/// Creates the Deployment's simulated pod from its template (one made
/// meanwhile is left alone).
async fn create_simulated_pod(
    pods: &Api<Pod>,
    d: &Deployment,
    pod_name: &str,
    pod_spec: PodSpec,
) -> Result<(), kube::Error> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = d
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
            "annotations": {"ichor.maesh.dev/simulated": "true"}},
        "spec": pod_spec,
    }))
    .expect("pod from template");
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes the status of a Deployment whose `replicas` pods are all Ready.
async fn mark_deployment_ready(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i32,
    generation: i64,
) -> Result<(), kube::Error> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                "updatedReplicas": replicas, "observedGeneration": generation,
                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                    "lastUpdateTime": now(), "lastTransitionTime": now()}]}})),
        )
        .await?;
    Ok(())
}

async fn register_cilium_crds(client: &kube::Client) -> Result<(), kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (plural, kind) in [
        ("ciliumnodes", "CiliumNode"),
        ("ciliumnetworkpolicies", "CiliumNetworkPolicy"),
    ] {
        let name = format!("{plural}.cilium.io");
        if api.get_opt(&name).await?.is_some() {
            continue;
        }
        let scope = if kind == "CiliumNode" {
            "Cluster"
        } else {
            "Namespaced"
        };
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "annotations": {"ichor.maesh.dev/simulated": "registered by the lab's node simulator, as Cilium's operator would"}},
            "spec": {"group": "cilium.io", "scope": scope,
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v2", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .expect("CRD");
        let pp = PatchParams::apply(MANAGER).force();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await?;
    }
    Ok(())
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
