//! The node simulator: it plays the kubelets', the scheduler's and the Cilium
//! operator's parts on the test control plane, which has none of them.
//!
//! Every tick it:
//! - marks every DaemonSet ready on every node (DaemonSet pods tolerate the
//!   not-ready taint and Cilium's run on the host network);
//! - marks a Deployment ready once its pods could be scheduled: when it runs on
//!   the host network, or when the nodes are Ready (a pod network exists);
//!   until then it keeps one Pending pod for it with the scheduler's message,
//!   and an image whose tag is `broken` stays in ImagePullBackOff for ever;
//! - turns every Node Ready once a CNI's DaemonSet (`kube-system/cilium`,
//!   flannel's, Calico's) is ready, and back to NotReady with the kubelet's
//!   network-plugin message when none is;
//! - registers Cilium's CRDs once `cilium-operator` is ready, as the real
//!   operator does.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The message a kubelet writes on a node whose CNI is missing.
pub const NO_CNI_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";
/// The message of a Ready kubelet.
pub const READY_MESSAGE: &str = "kubelet is posting ready status";
/// The image tag the simulator never pulls.
pub const BROKEN_TAG: &str = "broken";

/// The DaemonSets whose readiness gives the lab's nodes a pod network.
const NETWORK_DAEMONSETS: &[(&str, &str)] = &[
    ("kube-system", "cilium"),
    ("kube-system", "kube-flannel"),
    ("calico-system", "calico-node"),
];

const TICK: Duration = Duration::from_millis(300);
const MANAGER: &str = "ichor-lab-node-simulator";

/// Runs the simulator until the task is dropped or aborted.
pub fn spawn(client: kube::Client) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Err(e) = tick(&client).await {
                tracing::debug!("node simulator: {e}");
            }
            tokio::time::sleep(TICK).await;
        }
    })
}

/// One pass over the cluster.
pub async fn tick(client: &kube::Client) -> Result<(), kube::Error> {
    let lp = ListParams::default();
    let nodes = Api::<Node>::all(client.clone()).list(&lp).await?.items;
    let n = nodes.len() as i32;
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    let mut network_ready = false;
    for ds in daemonsets.list(&lp).await?.items {
        let (ns, name) = (
            ds.metadata.namespace.clone().unwrap_or_default(),
            ds.metadata.name.clone().unwrap_or_default(),
        );
        let generation = ds.metadata.generation.unwrap_or(1);
        let status = ds.status.clone().unwrap_or_default();
        let ready = status.number_ready == n
            && status.observed_generation == Some(generation)
            && status.desired_number_scheduled == n;
        if NETWORK_DAEMONSETS.contains(&(ns.as_str(), name.as_str())) {
            network_ready = n > 0;
        }
        if !ready {
            Api::<DaemonSet>::namespaced(client.clone(), &ns)
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "currentNumberScheduled": n, "desiredNumberScheduled": n, "numberReady": n,
                        "numberAvailable": n, "updatedNumberScheduled": n, "numberMisscheduled": 0,
                        "observedGeneration": generation}})),
                )
                .await?;
        }
    }
    let network = network_ready;
    set_nodes_ready(client, &nodes, network).await?;
    let nodes_ready = network;

    let mut operator_ready = false;
    for d in Api::<Deployment>::all(client.clone())
        .list(&lp)
        .await?
        .items
    {
        let ready = simulate_deployment(client, &d, nodes_ready, n).await?;
        if d.metadata.namespace.as_deref() == Some("kube-system")
            && d.metadata.name.as_deref() == Some("cilium-operator")
        {
            operator_ready = ready;
        }
    }
    if operator_ready {
        register_cilium_crds(client).await?;
    }
    Ok(())
}

async fn set_nodes_ready(
    client: &kube::Client,
    nodes: &[Node],
    ready: bool,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        let current = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status == "True");
        if current == Some(ready) {
            continue;
        }
        let now = now();
        let (status, reason, message) = if ready {
            ("True", "KubeletReady", READY_MESSAGE)
        } else {
            ("False", "KubeletNotReady", NO_CNI_MESSAGE)
        };
        api.patch_status(
            node.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
        )
        .await?;
    }
    Ok(())
}

/// Marks the Deployment ready when its pods could run; otherwise keeps one
/// simulated pod that says why not. Returns whether it is ready.
async fn simulate_deployment(
    client: &kube::Client,
    d: &Deployment,
    nodes_ready: bool,
    nodes: i32,
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

    // The pod the scheduler and kubelet would show, for the waits' diagnostics.
    let pod_name = format!("{name}-simulated");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod_status = if !schedulable {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": format!("0/{nodes} nodes are available: {nodes} node(s) had untolerated taint {{node.kubernetes.io/not-ready: }}. preemption: 0/{nodes} nodes are available: {nodes} Preemption is not helpful for scheduling.")}]})
    } else if let Some(container) = &broken {
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": container, "image": "", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]})
    } else {
        json!({"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]})
    };
    if pods.get_opt(&pod_name).await?.is_none() {
        let labels: BTreeMap<String, String> = spec
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
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e),
        }
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
        Api::<Deployment>::namespaced(client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                    "updatedReplicas": replicas, "observedGeneration": generation,
                    "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "lastUpdateTime": now(), "lastTransitionTime": now()}]}})),
            )
            .await?;
    }
    Ok(ready)
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
