//! The DaemonSet controller's and the kubelets' parts for DaemonSets, and the
//! nodes' Ready condition that follows from them.
//!
//! - One pod per eligible node for every DaemonSet: the node's labels match
//!   the pod's `nodeSelector` and required node affinity, and the pod
//!   tolerates every `NoSchedule`/`NoExecute` taint of the node (with the
//!   tolerations the DaemonSet controller adds to every daemon pod). A pod
//!   whose DaemonSet changed (new generation) is replaced; a pod whose
//!   DaemonSet or node is gone is deleted (no garbage collector runs here).
//! - A pod is Running and Ready unless it cannot be: an image tagged
//!   `broken` never pulls, a pod off the host network waits for the node's
//!   pod network, and Cilium's agent is judged by [`crate::cilium_on_talos`].
//! - The DaemonSet's status counts those pods.
//! - A node is Ready exactly when a CNI agent pod on it (Cilium's, flannel's,
//!   Calico's) is Running and Ready; until then it keeps the kubelet's
//!   network-plugin message and the `not-ready` taint. A node whose active
//!   config the lab plays as unhealthy ([`crate::readiness`]) is NotReady
//!   whatever its CNI pod does, as a kubelet a bad change broke would be.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, PodSpec, Taint, Toleration};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::cilium_on_talos::{self, TalosNode};

/// The DaemonSets whose Ready pod gives a node its pod network.
pub const NETWORK_DAEMONSETS: &[(&str, &str)] = &[
    ("kube-system", "cilium"),
    ("kube-system", "kube-flannel"),
    ("calico-system", "calico-node"),
];
/// Cilium's agent DaemonSet, judged by [`cilium_on_talos`].
const CILIUM: (&str, &str) = ("kube-system", "cilium");
/// The label that ties a simulated pod to its DaemonSet (by uid).
pub const DAEMONSET_UID_LABEL: &str = "ichor.maesh.dev/daemonset-uid";
/// The annotation holding the DaemonSet generation a pod was made from.
const GENERATION_ANNOTATION: &str = "ichor.maesh.dev/daemonset-generation";
/// The annotation on a lab Node naming its KubePrism port (absent: off).
pub const KUBE_PRISM_ANNOTATION: &str = "ichor.maesh.dev/lab-kubeprism-port";
/// The taint a NotReady node carries.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// Set on a lab Node (any value) by a test: its kubelet has stopped
/// posting status. The simulator then reports the node's Ready condition
/// Unknown, as the node lifecycle controller does for a silent kubelet,
/// until the annotation is removed.
pub const KUBELET_STOPPED_ANNOTATION: &str = "ichor.maesh.dev/lab-kubelet-stopped";

/// The tolerations the DaemonSet controller adds to every daemon pod
/// (`AddOrUpdateDaemonPodTolerations`), plus `network-unavailable` for pods
/// on the host network.
pub fn daemon_tolerations(pod: &PodSpec) -> Vec<Toleration> {
    let mut out = pod.tolerations.clone().unwrap_or_default();
    let mut add = |key: &str, effect: &str| {
        out.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Toleration::default()
        })
    };
    add("node.kubernetes.io/not-ready", "NoExecute");
    add("node.kubernetes.io/unreachable", "NoExecute");
    add("node.kubernetes.io/disk-pressure", "NoSchedule");
    add("node.kubernetes.io/memory-pressure", "NoSchedule");
    add("node.kubernetes.io/pid-pressure", "NoSchedule");
    add("node.kubernetes.io/unschedulable", "NoSchedule");
    if pod.host_network == Some(true) {
        add("node.kubernetes.io/network-unavailable", "NoSchedule");
    }
    out
}

/// Whether `toleration` tolerates `taint` (Kubernetes' `ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = toleration.effect.as_deref()
        && !e.is_empty()
        && e != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    let exists = toleration.operator.as_deref() == Some("Exists");
    if key.is_empty() {
        return exists;
    }
    if key != taint.key {
        return false;
    }
    exists
        || toleration.value.as_deref().unwrap_or_default()
            == taint.value.as_deref().unwrap_or_default()
}

/// Whether a pod of this template runs on `node` (nodeSelector, required
/// node affinity on labels, taints).
pub fn eligible(pod: &PodSpec, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(sel) = &pod.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(req) = required {
        let term_matches = |t: &k8s_openapi::api::core::v1::NodeSelectorTerm| {
            t.match_expressions.iter().flatten().all(|e| {
                let got = labels.get(&e.key);
                let values = e.values.clone().unwrap_or_default();
                match e.operator.as_str() {
                    "In" => got.is_some_and(|g| values.contains(g)),
                    "NotIn" => got.is_none_or(|g| !values.contains(g)),
                    "Exists" => got.is_some(),
                    "DoesNotExist" => got.is_none(),
                    _ => true,
                }
            })
        };
        if !req.node_selector_terms.iter().any(term_matches) {
            return false;
        }
    }
    let tolerations = daemon_tolerations(pod);
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// The name of `daemonset`'s pod on `node`.
pub fn pod_name(daemonset: &str, node: &str) -> String {
    format!("{daemonset}-{node}")
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// What the kubelet would report for a daemon pod that is not Cilium's agent.
fn plain_pod_status(pod: &PodSpec, node: &Node, now: &str) -> Value {
    let broken = pod.containers.iter().find(|c| {
        c.image
            .as_deref()
            .is_some_and(|i| i.rsplit(':').next() == Some(crate::simulator::BROKEN_TAG))
    });
    if let Some(c) = broken {
        return json!({"phase": "Pending", "reason": null, "message": null,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                 "message": format!("containers with unready status: [{}]", c.name), "lastTransitionTime": now}],
            "containerStatuses": [{"name": c.name, "image": "", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]});
    }
    if pod.host_network != Some(true) && !node_ready(node) {
        return json!({"phase": "Pending", "reason": null, "message": null,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                 "message": crate::simulator::NO_CNI_MESSAGE, "lastTransitionTime": now}],
            "containerStatuses": null});
    }
    // A kubelet reports each running container's state too (`talosctl
    // health` counts a pod whose containers report none as finished).
    let containers: Vec<Value> = pod
        .containers
        .iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}}})
        })
        .collect();
    json!({"phase": "Running", "reason": null, "message": null,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": containers})
}

fn pod_is_ready(status: &Value) -> bool {
    status["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The parts of a pod status the simulator compares before writing.
fn status_key(status: &Value) -> (Value, Value, Value, bool) {
    (
        status["phase"].clone(),
        status["reason"].clone(),
        status["message"].clone(),
        pod_is_ready(status),
    )
}

/// What Talos says about `node` for Cilium: kube-proxy runs when its
/// DaemonSet exists (as Ichor itself detects it); KubePrism from the lab's
/// annotation.
fn talos_node(node: &Node, kube_proxy: bool) -> TalosNode {
    TalosNode {
        kube_proxy,
        kube_prism_port: node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(KUBE_PRISM_ANNOTATION))
            .and_then(|p| p.parse().ok()),
    }
}

/// One pass: daemon pods, DaemonSet status, and each node's Ready condition.
/// `unhealthy`: the nodes whose active config the lab plays as unhealthy.
/// Returns whether some node's pod network is up.
pub async fn tick(
    client: &kube::Client,
    nodes: &[Node],
    unhealthy: &HashSet<String>,
) -> Result<bool, kube::Error> {
    let lp = ListParams::default();
    let daemonsets = Api::<DaemonSet>::all(client.clone()).list(&lp).await?.items;
    let kube_proxy = daemonsets.iter().any(|d| {
        d.metadata.namespace.as_deref() == Some("kube-system")
            && d.metadata.name.as_deref() == Some("kube-proxy")
    });
    let all_pods: Api<Pod> = Api::all(client.clone());
    let existing = all_pods
        .list(&ListParams::default().labels(DAEMONSET_UID_LABEL))
        .await?
        .items;
    let mut network_ready_nodes: HashSet<String> = HashSet::new();
    let mut live_uids = HashSet::new();
    let stamp = now();

    let pass = DaemonSetPass {
        client,
        nodes,
        existing: &existing,
        kube_proxy,
        stamp: &stamp,
    };
    for ds in &daemonsets {
        live_uids.insert(ds.metadata.uid.clone().unwrap_or_default());
        sync_daemonset(&pass, ds, &mut network_ready_nodes).await?;
    }
    delete_orphaned_pods(client, &existing, &live_uids).await;

    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let kubelet = Kubelet {
            network_ready: network_ready_nodes.contains(&name),
            stopped: node
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(KUBELET_STOPPED_ANNOTATION)),
            config_healthy: !unhealthy.contains(&name),
        };
        set_node_ready(client, node, kubelet.ready_condition()).await?;
    }
    Ok(!network_ready_nodes.is_empty())
}

/// What every DaemonSet of one pass sees.
struct DaemonSetPass<'a> {
    client: &'a kube::Client,
    nodes: &'a [Node],
    /// Every simulated daemon pod, listed at the start of the pass.
    existing: &'a [Pod],
    /// Whether kube-proxy's DaemonSet exists (Cilium's agent depends on it).
    kube_proxy: bool,
    stamp: &'a str,
}

/// The pod counts a DaemonSet's status reports.
#[derive(Default, Clone, Copy)]
struct DaemonPodCounts {
    desired: i32,
    current: i32,
    ready: i32,
    updated: i32,
}

/// One DaemonSet: its pod on every eligible node (made, replaced, deleted,
/// its status written) and then its own status. Nodes where a network
/// DaemonSet's pod is Ready go into `network_ready_nodes`.
async fn sync_daemonset(
    pass: &DaemonSetPass<'_>,
    ds: &DaemonSet,
    network_ready_nodes: &mut HashSet<String>,
) -> Result<(), kube::Error> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let generation = ds.metadata.generation.unwrap_or(1);
    let template = ds.spec.template.spec.clone().unwrap_or_default();
    let is_cilium = (ns.as_str(), name.as_str()) == CILIUM;
    let is_network = NETWORK_DAEMONSETS.contains(&(ns.as_str(), name.as_str()));
    let config = if is_cilium {
        Api::<ConfigMap>::namespaced(pass.client.clone(), &ns)
            .get_opt("cilium-config")
            .await?
            .map(|c| c.data.unwrap_or_default())
    } else {
        None
    };
    let ds_json = serde_json::to_value(ds).unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(pass.client.clone(), &ns);
    let mut counts = DaemonPodCounts::default();

    for node in pass.nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let pname = pod_name(&name, &node_name);
        let mine = pass.existing.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(ns.as_str())
                && p.metadata.name.as_deref() == Some(pname.as_str())
        });
        if !eligible(&template, node) {
            if mine.is_some() {
                let _ = pods
                    .delete(&pname, &DeleteParams::default().grace_period(0))
                    .await;
            }
            continue;
        }
        counts.desired += 1;
        // A pod being deleted, a pod of an older generation: a kubelet
        // ends it at once (grace period 0), the controller makes a new one
        // on the next pass.
        if mine.is_some_and(|p| is_stale_daemon_pod(p, generation, &uid)) {
            let _ = pods
                .delete(&pname, &DeleteParams::default().grace_period(0))
                .await;
            continue;
        }
        let status = if is_cilium {
            let verdict = cilium_on_talos::judge_agent(
                &ds_json,
                config.as_ref(),
                &talos_node(node, pass.kube_proxy),
            );
            cilium_on_talos::agent_pod_status(&verdict, pass.stamp)
        } else {
            plain_pod_status(&template, node, pass.stamp)
        };
        match mine {
            // Its status is written on the next tick.
            None => create_daemon_pod(&pods, ds, &template, &node_name).await,
            Some(p) => {
                counts.current += 1;
                counts.updated += 1;
                write_pod_status_if_changed(&pods, p, &pname, &status).await?;
                if pod_is_ready(&status) {
                    counts.ready += 1;
                    if is_network {
                        network_ready_nodes.insert(node_name.clone());
                    }
                }
            }
        }
    }
    write_daemonset_status(pass.client, ds, &counts).await
}

/// A daemon pod being deleted, or made from another generation or another
/// DaemonSet of the same name.
fn is_stale_daemon_pod(pod: &Pod, generation: i64, uid: &str) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(GENERATION_ANNOTATION))
            != Some(&generation.to_string())
        || pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DAEMONSET_UID_LABEL))
            .map(String::as_str)
            != Some(uid)
}

/// Creates `ds`'s pod on `node_name` (a failure is logged; the next pass
/// tries again).
async fn create_daemon_pod(pods: &Api<Pod>, ds: &DaemonSet, template: &PodSpec, node_name: &str) {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let generation = ds.metadata.generation.unwrap_or(1);
    let pname = pod_name(&name, node_name);
    let mut labels = ds
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(DAEMONSET_UID_LABEL.into(), uid.clone());
    let mut pod_spec = serde_json::to_value(template).unwrap_or_default();
    pod_spec["nodeName"] = json!(node_name);
    pod_spec["tolerations"] =
        serde_json::to_value(daemon_tolerations(template)).unwrap_or_default();
    let pod: Result<Pod, _> = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pname, "namespace": ns, "labels": labels,
            "annotations": {"ichor.maesh.dev/simulated": "true",
                GENERATION_ANNOTATION: generation.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": name, "uid": uid, "controller": true}]},
        "spec": pod_spec,
    }));
    if let Ok(pod) = pod
        && let Err(e) = pods.create(&PostParams::default(), &pod).await
    {
        tracing::debug!(error = %ichor_api::error_text::chain(&e), "node simulator: creating pod {ns}/{pname}");
    }
}

/// Writes `status` to the pod unless the parts the simulator compares are
/// already so.
async fn write_pod_status_if_changed(
    pods: &Api<Pod>,
    pod: &Pod,
    pname: &str,
    status: &Value,
) -> Result<(), kube::Error> {
    let live = pod
        .status
        .as_ref()
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .unwrap_or_default();
    if status_key(&live) != status_key(status) {
        pods.patch_status(
            pname,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    }
    Ok(())
}

/// Writes the DaemonSet's status when the counts (or observed generation)
/// differ from what it says.
async fn write_daemonset_status(
    client: &kube::Client,
    ds: &DaemonSet,
    counts: &DaemonPodCounts,
) -> Result<(), kube::Error> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let generation = ds.metadata.generation.unwrap_or(1);
    let DaemonPodCounts {
        desired,
        current,
        ready,
        updated,
    } = *counts;
    let want = json!({
        "currentNumberScheduled": current, "desiredNumberScheduled": desired,
        "numberReady": ready, "numberAvailable": ready,
        "numberUnavailable": desired - ready, "updatedNumberScheduled": updated,
        "numberMisscheduled": 0, "observedGeneration": generation});
    let live = serde_json::to_value(ds.status.clone().unwrap_or_default()).unwrap_or_default();
    let same = want
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| live.get(k).unwrap_or(&json!(0)) == v);
    if !same {
        Api::<DaemonSet>::namespaced(client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": want })),
            )
            .await?;
    }
    Ok(())
}

/// Deletes the pods of DaemonSets that are gone (no garbage collector runs
/// in the lab).
async fn delete_orphaned_pods(
    client: &kube::Client,
    existing: &[Pod],
    live_uids: &HashSet<String>,
) {
    for p in existing {
        let owner = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DAEMONSET_UID_LABEL));
        if owner.is_some_and(|u| !live_uids.contains(u)) {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                .delete(
                    p.metadata.name.as_deref().unwrap_or_default(),
                    &DeleteParams::default().grace_period(0),
                )
                .await;
        }
    }
}

/// What a node's kubelet goes by for its Ready condition.
#[derive(Debug, Clone, Copy)]
struct Kubelet {
    /// A CNI agent pod on the node is Running and Ready.
    network_ready: bool,
    /// A test stopped the kubelet ([`KUBELET_STOPPED_ANNOTATION`]).
    stopped: bool,
    /// The node's active config is healthy ([`crate::readiness`]).
    config_healthy: bool,
}

/// A Ready condition: status, reason, message.
type ReadyCondition = (&'static str, &'static str, &'static str);

impl Kubelet {
    /// The Ready condition the node reports: Unknown for a stopped kubelet,
    /// NotReady for an unhealthy config (ahead of a missing network, which
    /// the bad config would mask), NotReady for no pod network, else Ready.
    fn ready_condition(self) -> ReadyCondition {
        if self.stopped {
            (
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            )
        } else if !self.config_healthy {
            (
                "False",
                "KubeletNotReady",
                crate::readiness::UNHEALTHY_MESSAGE,
            )
        } else if self.network_ready {
            ("True", "KubeletReady", crate::simulator::READY_MESSAGE)
        } else {
            ("False", "KubeletNotReady", crate::simulator::NO_CNI_MESSAGE)
        }
    }
}

/// Sets a node's Ready condition (and the `not-ready` taint, as the node
/// lifecycle controller does) when it differs from `condition`.
async fn set_node_ready(
    client: &kube::Client,
    node: &Node,
    condition: ReadyCondition,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let (status, reason, message) = condition;
    let ready = status == "True";
    let current = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.as_str(), c.message.as_deref()));
    // Whether the config is to blame too: a node NotReady for its network
    // that turns NotReady for its config says so.
    let unhealthy = |m: Option<&str>| m == Some(crate::readiness::UNHEALTHY_MESSAGE);
    let unchanged =
        current.is_some_and(|(s, m)| s == status && unhealthy(m) == unhealthy(Some(message)));
    if !unchanged {
        let now = now();
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
        )
        .await?;
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tainted = taints.iter().any(|t| t.key == NOT_READY_TAINT);
    if tainted == ready {
        let mut next: Vec<Taint> = taints
            .into_iter()
            .filter(|t| t.key != NOT_READY_TAINT)
            .collect();
        if !ready {
            next.push(Taint {
                key: NOT_READY_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            });
        }
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": next}})),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R16.3b
    #[test]
    fn an_unhealthy_config_keeps_a_node_not_ready_whatever_its_network() {
        let k = |network_ready, stopped, config_healthy| {
            Kubelet {
                network_ready,
                stopped,
                config_healthy,
            }
            .ready_condition()
        };
        assert_eq!(k(true, false, true).0, "True");
        assert_eq!(
            k(true, false, false),
            (
                "False",
                "KubeletNotReady",
                crate::readiness::UNHEALTHY_MESSAGE
            )
        );
        assert_eq!(
            k(false, false, false).2,
            crate::readiness::UNHEALTHY_MESSAGE
        );
        assert_eq!(k(false, false, true).2, crate::simulator::NO_CNI_MESSAGE);
        assert_eq!(k(true, true, false).0, "Unknown");
    }

    fn node(labels: &[(&str, &str)], taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    fn spec(v: Value) -> PodSpec {
        let mut v = v;
        v["containers"] = json!([{"name": "c"}]);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn not_ready_taint_needs_a_toleration() {
        let n = node(
            &[],
            json!([{"key": NOT_READY_TAINT, "effect": "NoSchedule"}]),
        );
        assert!(
            !eligible(&spec(json!({})), &n),
            "the controller adds only NoExecute for not-ready"
        );
        assert!(eligible(
            &spec(json!({"tolerations": [{"operator": "Exists"}]})),
            &n
        ));
        assert!(eligible(
            &spec(json!({"tolerations": [{"key": NOT_READY_TAINT, "operator": "Exists"}]})),
            &n
        ));
        assert!(!eligible(
            &spec(
                json!({"tolerations": [{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute"}]})
            ),
            &n
        ));
        let unschedulable = node(
            &[],
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
        );
        assert!(
            eligible(&spec(json!({})), &unschedulable),
            "a default toleration"
        );
        let prefer = node(&[], json!([{"key": "x", "effect": "PreferNoSchedule"}]));
        assert!(eligible(&spec(json!({})), &prefer));
        let valued = node(
            &[],
            json!([{"key": "k", "value": "v", "effect": "NoExecute"}]),
        );
        assert!(eligible(
            &spec(json!({"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]})),
            &valued
        ));
        assert!(!eligible(
            &spec(json!({"tolerations": [{"key": "k", "operator": "Equal", "value": "w"}]})),
            &valued
        ));
    }

    #[test]
    fn node_selector_and_affinity_choose_nodes() {
        let cp = node(&[("node-role.kubernetes.io/control-plane", "")], json!([]));
        let worker = node(&[("node-role.kubernetes.io/worker", "")], json!([]));
        let sel = spec(json!({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}));
        assert!(eligible(&sel, &cp) && !eligible(&sel, &worker));
        let aff = spec(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "node-role.kubernetes.io/worker", "operator": "DoesNotExist"}]}]}}}}),
        );
        assert!(eligible(&aff, &cp) && !eligible(&aff, &worker));
        let envoy = spec(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "cilium.io/no-schedule", "operator": "NotIn", "values": ["true"]}]}]}}}}),
        );
        assert!(eligible(&envoy, &cp));
        let excluded = node(&[("cilium.io/no-schedule", "true")], json!([]));
        assert!(!eligible(&envoy, &excluded));
    }

    #[test]
    fn host_network_pods_tolerate_network_unavailable() {
        let n = node(
            &[],
            json!([{"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]),
        );
        assert!(eligible(&spec(json!({"hostNetwork": true})), &n));
        assert!(!eligible(&spec(json!({})), &n));
    }

    #[test]
    fn plain_pods_wait_for_the_network_or_an_image() {
        let n = node(&[], json!([]));
        let off_host = plain_pod_status(&spec(json!({})), &n, "t");
        assert!(!pod_is_ready(&off_host));
        assert_eq!(
            off_host["conditions"][1]["message"],
            crate::simulator::NO_CNI_MESSAGE
        );
        assert!(pod_is_ready(&plain_pod_status(
            &spec(json!({"hostNetwork": true})),
            &n,
            "t"
        )));
        let mut broken = spec(json!({"hostNetwork": true}));
        broken.containers[0].image = Some("x:broken".into());
        let s = plain_pod_status(&broken, &n, "t");
        assert!(!pod_is_ready(&s));
        assert_eq!(
            s["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ImagePullBackOff"
        );
    }
}
