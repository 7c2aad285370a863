//! Status writes do not fan out (the controller-at-scale goal,
//! docs/benchmarks.md): one machine's status change changes its cluster's
//! status, and neither reconciles the others into API reads. The controller
//! runs with a client certificate of its own, so the API server's audit log
//! tells its requests apart.

use crate::common::*;
use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talemu::NodeSpec;
use ichor_testenv::{AuditEvent, TestEnv};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const USER: &str = "ichor-fan-out-controller";

/// A client for the controller: the test admin's kubeconfig with a client
/// certificate of its own (group system:masters).
async fn controller_client(env: &TestEnv, dir: &std::path::Path) -> kube::Client {
    let cert = env.ca().issue_client(USER, &["system:masters"]);
    std::fs::write(dir.join("c.crt"), &cert.cert_pem).unwrap();
    std::fs::write(dir.join("c.key"), &cert.key_pem).unwrap();
    let admin = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let mut doc: serde_json::Value = serde_yaml_ng::from_str(&admin).unwrap();
    doc["users"][0]["user"] = json!({
        "client-certificate": dir.join("c.crt"),
        "client-key": dir.join("c.key"),
    });
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// `verb resource name` of the controller's requests in `ns`.
fn requests(events: &[AuditEvent], ns: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.user.username == USER)
        .filter_map(|e| {
            let o = e.object_ref.as_ref()?;
            let field = |k: &str| o.get(k).and_then(|v| v.as_str()).unwrap_or("");
            (field("namespace") == ns).then(|| {
                format!(
                    "{} {}{} {}",
                    e.verb,
                    field("resource"),
                    match field("subresource") {
                        "" => String::new(),
                        s => format!("/{s}"),
                    },
                    field("name")
                )
            })
        })
        .collect()
}

fn cluster_ready(c: &TalosCluster) -> Option<(String, String)> {
    c.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .map(|c| (c.status.clone(), c.message.clone()))
}

fn ready(m: &TalosMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.observed_generation == m.metadata.generation
            && conditions::is_true(&s.conditions, types::READY)
    })
}

/// Three machines of one cluster converge. Then one of them fails (its
/// address changes to a port nothing listens on) and comes back: its Ready
/// changes twice, its cluster's status twice. Between the first change and
/// the cluster showing the machine Ready again, the controller neither
/// lists the machines, nor reads the cluster, nor touches the two other
/// machines: each reconcile reads the other kind from a watch store, and a
/// cluster status change that alters nothing a machine renders from
/// reconciles no machine.
/// The three machines' first reconciles, which run at once, read the bundle
/// Secret once between them.
/// Covers: the controller-at-scale goal (docs/benchmarks.md): no fan-out of status writes
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_machine_status_change_does_not_reconcile_the_others() {
    let env = TestEnv::shared();
    let client = client().await;
    let ns = env.namespace("fan-out").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let worker = ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml");
    let emu = emulator(
        (0..3)
            .map(|i| NodeSpec::new(format!("w-{i}"), worker.clone()).with_version("v1.12.1"))
            .collect(),
    )
    .await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let c: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "unmanaged"}, "secretsRef": {"name": "bundle"}}
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &c).await.unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for i in 0..3 {
        let m: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": format!("m-{i}"), "namespace": ns},
            "spec": {"clusterRef": {"name": "base"}, "role": "worker",
                "address": emu.endpoint(i), "hold": true}
        }))
        .unwrap();
        machines.create(&PostParams::default(), &m).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let controller_client = controller_client(env, dir.path()).await;
    let running = start(
        controller_client,
        ichor_controller::Config {
            // No resync inside the test: every reconcile comes from an event.
            resync: std::time::Duration::from_secs(3600),
            error_requeue: std::time::Duration::from_secs(3600),
            ..config(&ns, &ns)
        },
    );
    let all_ready = || async {
        clusters
            .get("base")
            .await
            .ok()
            .and_then(|c| cluster_ready(&c))
            .is_some_and(|(s, m)| s == "True" && m.contains("all 3"))
    };
    wait_for(
        "the three machines and their cluster to be Ready",
        || async {
            let mut all = true;
            for i in 0..3 {
                all &= machines
                    .get_opt(&format!("m-{i}"))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|m| ready(&m));
            }
            all && all_ready().await
        },
    )
    .await;
    let mark = env.audit_events().len();
    // The three first reconciles ran at once: one of them read the bundle.
    let bundle_reads = requests(&env.audit_events()[..mark], &ns)
        .into_iter()
        .filter(|r| r == "get secrets bundle")
        .count();
    assert_eq!(bundle_reads, 1, "the bundle Secret is read once");

    let set_address = |address: String| {
        let machines = machines.clone();
        async move {
            machines
                .patch(
                    "m-0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"address": address}})),
                )
                .await
                .unwrap();
        }
    };
    set_address("127.0.0.1:1".into()).await;
    wait_for("the cluster to show m-0 not Ready", || async {
        clusters
            .get("base")
            .await
            .ok()
            .and_then(|c| cluster_ready(&c))
            .is_some_and(|(s, m)| s == "False" && m.contains("m-0"))
    })
    .await;
    set_address(emu.endpoint(0)).await;
    wait_for("the cluster to be Ready again", all_ready).await;

    let seen = requests(&env.audit_events()[mark..], &ns);
    running.stop().await.unwrap();
    assert!(
        seen.iter()
            .any(|r| r.starts_with("patch talosmachines/status m-0")),
        "m-0's status was written: {seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|r| r.starts_with("patch talosclusters/status base")),
        "the cluster's status was written: {seen:#?}"
    );
    let fanned: Vec<&String> = seen
        .iter()
        .filter(|r| {
            r.contains(" m-1")
                || r.contains(" m-2")
                || r.starts_with("list talosmachines")
                || r.starts_with("get talosclusters")
        })
        .collect();
    assert!(
        fanned.is_empty(),
        "requests that only a fan-out makes: {fanned:#?}"
    );
}
