//! Health gates end to end: a real kube-apiserver + etcd of its own (a Node
//! NotReady in the shared one would pause every other test's operation),
//! Ichor's CRDs, one `ichor-talemu` worker and the controller in process.
//! A CEL check on a Deployment not yet available pauses a reboot before
//! anything is touched, naming the check, the object and the value; the
//! Deployment turning available lets it run. A Node going NotReady pauses
//! the next operation through the built-in gate; the skip annotation, then
//! the Node Ready again, let it go on.

use std::time::Duration;

use crate::common::*;
use ichor_api::conditions::{self, types};
use ichor_api::operation::{
    HEALTH_CHECK_FAILED, OperationPhase, SKIP_GATES_ANNOTATION, TalosOperation,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_controller::operation::OperationBounds;
use ichor_talemu::{NodeSpec, WriteAction};
use ichor_testenv::TestEnv;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn reboot(ns: &str, name: &str, health_checks: Value) -> TalosOperation {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "base"}},
            "healthChecks": health_checks}
    }))
    .unwrap()
}

async fn phase_is(ops: &Api<TalosOperation>, name: &str, phase: OperationPhase) -> TalosOperation {
    wait_for(
        &format!("TalosOperation {name} to be {phase:?}"),
        || async {
            ops.get(name)
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.phase == Some(phase))
        },
    )
    .await;
    ops.get(name).await.unwrap()
}

async fn node_ready(nodes: &Api<Node>, host: &str, ready: &str) {
    nodes
        .patch_status(
            host,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": [{
                "type": "Ready", "status": ready, "reason": "KubeletNotReady",
                "message": "played by the test",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
}

fn reboots(emu: &ichor_talemu::Emulator) -> usize {
    emu.writes()
        .iter()
        .filter(|w| matches!(w.action, WriteAction::Reboot { .. }))
        .count()
}

/// What the test runs on.
struct Gates {
    _env: TestEnv,
    ns: String,
    emu: ichor_talemu::Emulator,
    nodes: Api<Node>,
    deployments: Api<Deployment>,
    ops: Api<TalosOperation>,
    running: Running,
}

/// The TalosCluster `base`, with no windows.
async fn create_cluster(client: &kube::Client, ns: &str) {
    Api::<TalosCluster>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
                "metadata": {"name": "base", "namespace": ns},
                "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.13.0",
                    "kubernetesVersion": "v1.36.0", "cni": {"preset": "cilium", "kubeProxy": "enabled"},
                    "secretsRef": {"name": "bundle"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// The Deployment `api`. No controller-manager runs here: it stays without
/// status until the test writes one.
async fn api_deployment(client: &kube::Client, ns: &str) -> Api<Deployment> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "api", "namespace": ns},
                "spec": {"selector": {"matchLabels": {"app": "api"}},
                    "template": {"metadata": {"labels": {"app": "api"}},
                        "spec": {"containers": [{"name": "api", "image": "registry.local/api:1"}]}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    deployments
}

/// Its own control plane with the cluster, the worker w-1 (emulated, its
/// Node Ready), a Deployment `api` with no status, and the controller.
async fn setup() -> Gates {
    let env = TestEnv::start().expect("test control plane");
    let client = env.client().await;
    let ns = env.namespace("op-gates").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    create_cluster(&client, &ns).await;
    let host = "w-1".to_string();
    let emu = emulator(vec![
        NodeSpec::new(
            host.clone(),
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml"),
        )
        .with_version("v1.13.9"),
    ])
    .await;
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": host}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    node_ready(&nodes, &host, "True").await;
    Api::<TalosMachine>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                "metadata": {"name": "w-1", "namespace": ns},
                "spec": {"clusterRef": {"name": "base"}, "role": "worker",
                    "address": emu.endpoint(0), "hold": false}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let deployments = api_deployment(&client, &ns).await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = OperationBounds {
        etcd: Duration::from_secs(60),
        drain: Duration::from_secs(60),
        node_return: Duration::from_secs(60),
        poll: Duration::from_millis(100),
        component: Duration::from_secs(60),
        image: Duration::from_secs(60),
    };
    let running = start(client.clone(), config);
    Gates {
        ops: Api::<TalosOperation>::namespaced(client.clone(), &ns),
        _env: env,
        ns,
        emu,
        nodes,
        deployments,
        running,
    }
}

/// A check on a Deployment not yet available pauses the operation before
/// anything is touched; the Deployment becoming available lets it run.
async fn a_failing_check_pauses_until_it_passes(g: &Gates) {
    let (ns, ops, emu, deployments) = (&g.ns, &g.ops, &g.emu, &g.deployments);
    // A check on a Deployment not yet available: Paused before anything.
    let available = json!([{
        "name": "api-available",
        "expression": "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns, "name": "api"}
    }]);
    ops.create(&PostParams::default(), &reboot(ns, "gated", available))
        .await
        .unwrap();
    let op = phase_is(ops, "gated", OperationPhase::Paused).await;
    let st = op.status.unwrap();
    let gate = st.health_gate.clone().expect("status.healthGate");
    assert_eq!(gate.check, "api-available");
    assert_eq!(
        gate.object.as_deref(),
        Some(format!("Deployment {ns}/api").as_str())
    );
    assert!(
        gate.value
            .as_deref()
            .is_some_and(|v| v.starts_with("error:")),
        "the value that failed: {:?}",
        gate.value
    );
    let message = st.message.unwrap_or_default();
    assert!(
        message.contains("api-available") && message.contains(&format!("Deployment {ns}/api")),
        "{message}"
    );
    let waiting = conditions::find(&st.conditions, types::WAITING).expect("Waiting condition");
    assert_eq!(
        (waiting.status.as_str(), waiting.reason.as_str()),
        ("True", HEALTH_CHECK_FAILED)
    );
    assert!(
        emu.writes().is_empty(),
        "nothing is touched while paused: {:?}",
        emu.writes()
    );

    // The Deployment becomes available: the operation goes on and succeeds.
    deployments
        .patch_status(
            "api",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": [{
                "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "lastUpdateTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let op = phase_is(ops, "gated", OperationPhase::Succeeded).await;
    assert_eq!(op.status.unwrap().health_gate, None);
    assert_eq!(reboots(emu), 1);
}

/// A Node going NotReady pauses the next operation (built-in gate); Ready
/// again, it runs on.
async fn a_node_not_ready_pauses_until_ready(g: &Gates) {
    let (ns, ops, emu, nodes) = (&g.ns, &g.ops, &g.emu, &g.nodes);
    let host = "w-1";
    // The Node goes NotReady: the built-in gate pauses the next operation.
    node_ready(nodes, host, "False").await;
    ops.create(&PostParams::default(), &reboot(ns, "nodes", json!([])))
        .await
        .unwrap();
    let op = phase_is(ops, "nodes", OperationPhase::Paused).await;
    let gate = op.status.unwrap().health_gate.expect("status.healthGate");
    assert_eq!(gate.check, "nodes-ready");
    assert_eq!(gate.object.as_deref(), Some("Node w-1"));
    assert_eq!(gate.value.as_deref(), Some("Ready=False (KubeletNotReady)"));
    assert_eq!(reboots(emu), 1, "no machine started while paused");

    // Ready again: it runs on by itself.
    node_ready(nodes, host, "True").await;
    let op = phase_is(ops, "nodes", OperationPhase::Succeeded).await;
    assert_eq!(op.status.unwrap().health_gate, None);
    assert_eq!(reboots(emu), 2);
}

/// A check that keeps failing, skipped by a person: the operation goes on.
async fn the_skip_annotation_lets_it_go_on(g: &Gates) {
    let (ns, ops, emu) = (&g.ns, &g.ops, &g.emu);
    let never = json!([{
        "name": "never", "expression": "object.metadata.name == 'other'",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns, "name": "api"}
    }]);
    ops.create(&PostParams::default(), &reboot(ns, "skipped", never))
        .await
        .unwrap();
    let op = phase_is(ops, "skipped", OperationPhase::Paused).await;
    assert_eq!(
        op.status.unwrap().health_gate.unwrap().value.as_deref(),
        Some("false")
    );
    ops.patch(
        "skipped",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {SKIP_GATES_ANNOTATION: "yes"}}})),
    )
    .await
    .unwrap();
    phase_is(ops, "skipped", OperationPhase::Succeeded).await;
    assert_eq!(reboots(emu), 3);
}

/// Covers: R15.5, R15.6
#[tokio::test]
async fn a_failing_check_or_a_node_not_ready_pauses_the_operation_until_it_passes() {
    let g = setup().await;
    a_failing_check_pauses_until_it_passes(&g).await;
    a_node_not_ready_pauses_until_ready(&g).await;
    the_skip_annotation_lets_it_go_on(&g).await;
    g.running.stop().await.unwrap();
}
