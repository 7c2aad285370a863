//! Shared helpers of the controller's tests on real peers: the test control
//! plane (real kube-apiserver + etcd) with Ichor's CRDs, `ichor-talemu`
//! nodes signed by the bundle's OS CA, and a controller run per test,
//! restricted to the test's namespace.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Bound of every wait in these tests (a loaded 2-core machine is slow; the
/// bound only turns a hang into a failure, nothing is timed).
pub const WAIT: Duration = Duration::from_secs(120);

/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(200);

/// The secrets bundle fixture.
pub fn bundle_text() -> String {
    ichor_testenv::fixtures::talos("stability-secrets.yaml")
}

/// Applies Ichor's CRDs (from `ichor_api::crds`) and waits until they are served.
pub async fn crds(client: &kube::Client) {
    ichor_testenv::install::crds(client, ichor_api::crds::all())
        .await
        .unwrap();
}

/// Polls `f` until it is true; panics with `what` after [`WAIT`].
pub async fn wait_for<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    ichor_testenv::wait::until(what, WAIT, POLL, f)
        .await
        .unwrap();
}

/// The bundle Secret `bundle` in `ns`.
pub async fn bundle_secret(client: &kube::Client, ns: &str) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bundle", "namespace": ns},
        "stringData": {"secrets.yaml": bundle_text()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

/// Emulated nodes whose certificates are signed by the bundle's OS CA (as real nodes' are).
pub async fn emulator(nodes: Vec<NodeSpec>) -> Emulator {
    let bundle = ichor_talos::secrets::SecretsBundle::parse(&bundle_text(), "fixture").unwrap();
    let (crt, key) = bundle.os_ca_pem().unwrap();
    let pki = Pki::from_pem(&crt, &key).unwrap();
    Emulator::start_with(
        nodes,
        EmulatorOptions {
            pki: Some(pki),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap()
}

/// A controller config watching `ns` only, with everything of Ichor's in `ns` too.
pub fn config(ns: &str, release_ns: &str) -> ichor_controller::Config {
    ichor_controller::Config {
        namespace: Some(ns.into()),
        system_namespace: ns.into(),
        cilium_storage_namespace: ns.into(),
        cilium_release_namespace: release_ns.into(),
        resync: Duration::from_secs(5),
        error_requeue: Duration::from_millis(500),
        error_requeue_max: Duration::from_secs(5),
        talos_call_timeout: Duration::from_secs(20),
        leader_election: None,
        ..ichor_controller::Config::default()
    }
}

/// A running controller; dropping it stops it.
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<ichor_controller::Result<()>>>,
}

impl Running {
    pub async fn stop(mut self) -> ichor_controller::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let task = self.task.take().unwrap();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("the controller stops")
            .expect("join")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Starts the controller with `config`.
pub fn start(client: kube::Client, config: ichor_controller::Config) -> Running {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(ichor_controller::run_with(client, config, async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task: Some(task),
    }
}

/// The shared test control plane's client.
pub async fn client() -> kube::Client {
    TestEnv::shared().client().await
}

/// Seeds Ichor's Cilium release for `cluster` the way the CLI does
/// (ichor-cilium with the stand-in chart, real helm v4 for the render),
/// records in `storage`, objects in `release`, for `node_count` nodes.
pub async fn seed_cilium(
    client: &kube::Client,
    cluster: &ichor_api::TalosCluster,
    node_count: u32,
    storage: &str,
    release: &str,
) {
    use ichor_cilium::{
        ApplyOptions, CiliumOptions, ClusterSettings, Renderer, offline_chart, standin_chart_dir,
    };
    let env = TestEnv::shared();
    let home = tempfile::tempdir().unwrap();
    let mut renderer =
        Renderer::new(ichor_testenv::Tool::Helm4.path()).kubeconfig(env.kubeconfig_path());
    for k in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        renderer = renderer.env(k, home.path().join(k).display().to_string());
    }
    let mut opts = CiliumOptions::new(renderer).chart(offline_chart(standin_chart_dir()));
    opts.storage_namespace = storage.into();
    opts.release_namespace = release.into();
    opts.apply = ApplyOptions {
        wait: false,
        ..ApplyOptions::default()
    };
    let settings = ClusterSettings::from_cluster(cluster, node_count).unwrap();
    ichor_cilium::apply_for_cluster(client.clone(), &opts, &settings)
        .await
        .unwrap();
}

/// Plays the kubelets: DaemonSet `cilium` in `ns` reports every pod Ready.
pub async fn mark_daemonset_ready(client: &kube::Client, ns: &str) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::{Patch, PatchParams};
    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns);
    let g = ds
        .get("cilium")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap_or(1);
    let st = json!({"status": {"observedGeneration": g, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
        "updatedNumberScheduled": 3, "numberReady": 3, "numberAvailable": 3, "numberMisscheduled": 0}});
    ds.patch_status("cilium", &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
}

/// The order of R1.5b–e up to the hand-over: Nodes `nodes` registered, the
/// TalosCluster `cluster` created, Ichor's Cilium release seeded (records in
/// `ns`, objects in `release`), the controller started, the DaemonSet played
/// Ready, and CNIHandover=True seen. Returns the running controller.
pub async fn handed_over(
    client: &kube::Client,
    ns: &str,
    release: &str,
    cluster: &ichor_api::TalosCluster,
    nodes: &[String],
) -> Running {
    use ichor_api::conditions::{self, types};
    use k8s_openapi::api::core::v1::Node;
    let node_api = Api::<Node>::all(client.clone());
    for n in nodes {
        let node: Node = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
        .unwrap();
        node_api
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let clusters = Api::<ichor_api::TalosCluster>::namespaced(client.clone(), ns);
    let written = clusters
        .create(&PostParams::default(), cluster)
        .await
        .unwrap();
    let name = written.metadata.name.clone().unwrap_or_default();
    seed_cilium(client, &written, nodes.len() as u32, ns, release).await;
    let running = start(client.clone(), config(ns, release));
    mark_daemonset_ready(client, release).await;
    wait_for("CNIHandover=True", || async {
        clusters.get(&name).await.is_ok_and(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER))
        })
    })
    .await;
    running
}
