//! Ichor's Cilium release with the stand-in chart, against a real
//! kube-apiserver + etcd, read back by the real helm v3 and v4.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_cilium::{
    ApplyOptions, CiliumOptions, ClusterSettings, Error, KubeProxyMode, Renderer, Tunnel,
    WaitOptions, effective_values, offline_chart, release_values_hash, standin_chart_dir,
    values_hash,
};
use ichor_testenv::{TestEnv, Tool, wait};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

struct HelmHome(tempfile::TempDir);

impl HelmHome {
    fn new() -> Self {
        HelmHome(tempfile::tempdir().expect("temp dir"))
    }

    fn envs(&self) -> Vec<(String, String)> {
        ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"]
            .iter()
            .map(|k| (k.to_string(), self.0.path().join(k).display().to_string()))
            .collect()
    }

    fn renderer(&self) -> Renderer {
        let mut r =
            Renderer::new(Tool::Helm4.path()).kubeconfig(TestEnv::shared().kubeconfig_path());
        for (k, v) in self.envs() {
            r = r.env(k, v);
        }
        r
    }

    fn json(&self, tool: Tool, args: &[&str]) -> Value {
        let out = std::process::Command::new(tool.path())
            .args(args)
            .args(["--output", "json", "--kubeconfig"])
            .arg(TestEnv::shared().kubeconfig_path())
            .envs(self.envs())
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("helm printed JSON")
    }
}

fn options(home: &HelmHome, storage: &str, release_ns: &str) -> CiliumOptions {
    let mut o = CiliumOptions::new(home.renderer()).chart(offline_chart(standin_chart_dir()));
    o.storage_namespace = storage.into();
    o.release_namespace = release_ns.into();
    o.apply = ApplyOptions {
        wait: false,
        ..ApplyOptions::default()
    };
    o
}

async fn mark_ready(client: &kube::Client, ns: &str) {
    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns);
    let g = ds
        .get("cilium")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap_or(1);
    let st = json!({"status": {"observedGeneration": g, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
        "updatedNumberScheduled": 2, "numberReady": 2, "numberAvailable": 2, "numberMisscheduled": 0}});
    ds.patch_status("cilium", &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    let dep = Api::<Deployment>::namespaced(client.clone(), ns);
    let d = dep.get("cilium-operator").await.unwrap();
    let r = d.spec.replicas.unwrap_or(1);
    let st = json!({"status": {"observedGeneration": d.metadata.generation.unwrap_or(1), "replicas": r,
        "updatedReplicas": r, "readyReplicas": r, "availableReplicas": r}});
    dep.patch_status(
        "cilium-operator",
        &PatchParams::default(),
        &Patch::Merge(&st),
    )
    .await
    .unwrap();
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap()
}

async fn set_node_ready(client: &kube::Client, name: &str, ready: bool) {
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
        )
    };
    let st = json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": "2026-11-29T00:00:00Z", "lastTransitionTime": "2026-11-29T00:00:00Z"}]}});
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
}

/// Bootstrap on a cluster with no CNI (every node NotReady with the
/// network-plugin message): creates `ichor-system`, installs the stand-in as
/// release `cilium` in `kube-system` with its record in `ichor-system`, reports
/// what it waits for, and ends when the DaemonSet, the operator and every
/// node are Ready. The values in `cilium-config` and in the record are the
/// effective values; real helm v3 and v4 read the record.
/// Covers: R1.5b, R1.5e, R4.4b, R4.4d, R3.1
#[tokio::test]
async fn bootstrap_installs_the_standin_and_waits_until_ready() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let nodes = ["node-a", "node-b"];
    for n in nodes {
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node(n))
            .await
            .unwrap();
        set_node_ready(&client, n, false).await;
    }
    let home = HelmHome::new();
    let opts = options(&home, "ichor-system", "kube-system");
    let settings = ClusterSettings::new(Tunnel::Geneve, KubeProxyMode::Replaced, 2)
        .with_user_values(
            json!({"hubble": {"relay": {"enabled": true}}})
                .as_object()
                .unwrap()
                .clone(),
        );
    let reports: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let sink = reports.clone();
    let wait = WaitOptions {
        timeout: Duration::from_secs(180),
        report_interval: Duration::from_millis(300),
        poll_interval: Duration::from_millis(100),
        on_progress: Some(Arc::new(move |l: &[String]| {
            sink.lock().unwrap().push(l.to_vec())
        })),
    };
    let (c, o, s, w) = (client.clone(), opts.clone(), settings.clone(), wait.clone());
    let task = tokio::spawn(async move { ichor_cilium::bootstrap(c, &o, &s, &w).await });

    // Wait until the bootstrap has reported what it waits for, then play the
    // kubelets: Cilium's pods come up and the nodes become Ready.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while reports.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "bootstrap reported nothing"
        );
        assert!(
            !task.is_finished(),
            "bootstrap ended early: {:?}",
            task.await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = reports.lock().unwrap()[0].join("\n");
    assert!(
        first.contains("DaemonSet kube-system/cilium: no status reported yet"),
        "{first}"
    );
    assert!(
        first.contains("Deployment kube-system/cilium-operator"),
        "{first}"
    );
    assert!(
        first.contains("Node node-a: NotReady (") && first.contains("cni plugin not initialized"),
        "{first}"
    );
    mark_ready(&client, "kube-system").await;
    for n in nodes {
        set_node_ready(&client, n, true).await;
    }
    let applied = task.await.unwrap().unwrap();
    assert_eq!(applied.release.version, 1);
    assert!(applied.changed);

    Api::<Namespace>::all(client.clone())
        .get("ichor-system")
        .await
        .unwrap();
    let effective = effective_values(&settings).unwrap();
    assert_eq!(applied.values_hash, values_hash(&effective));
    assert_eq!(
        release_values_hash(&applied.release),
        values_hash(&effective)
    );

    // The stand-in's cilium-config carries the values the chart was rendered with.
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get("cilium-config")
        .await
        .unwrap();
    let data = cm.data.unwrap();
    let rendered: Value = serde_json::from_str(&data["values.json"]).unwrap();
    for (k, v) in &effective {
        assert_eq!(&rendered[k], v, "value {k} in cilium-config");
    }
    assert_eq!(data["tunnel-protocol"], "geneve");
    assert_eq!(data["kube-proxy-replacement"], "true");
    assert_eq!(data["k8s-service-port"], "7445");
    assert_eq!(data["ipam"], "kubernetes");

    for tool in [Tool::Helm3, Tool::Helm4] {
        let list = home.json(tool, &["list", "--namespace", "ichor-system"]);
        let row = &list[0];
        assert_eq!(row["name"], "cilium", "{tool:?}");
        assert_eq!(row["namespace"], "kube-system", "{tool:?}");
        assert_eq!(row["status"], "deployed", "{tool:?}");
        assert_eq!(row["chart"], "cilium-1.18.5-standin.1", "{tool:?}");
        let values = home.json(
            tool,
            &["get", "values", "cilium", "--namespace", "ichor-system"],
        );
        assert_eq!(values, Value::Object(effective.clone()), "{tool:?}");
    }

    // The controller's hand-over check sees the desired hash and a Ready DaemonSet.
    let check =
        ichor_cilium::check_handover(client.clone(), "ichor-system", "kube-system", &settings)
            .await
            .unwrap();
    assert!(check.complete(), "{check:?}");
    let other = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Replaced, 2);
    let check = ichor_cilium::check_handover(client.clone(), "ichor-system", "kube-system", &other)
        .await
        .unwrap();
    assert!(
        !check.at_desired_hash() && check.daemonset.is_ok(),
        "{check:?}"
    );

    // A rerun finds the release at the same values: no new revision.
    let again = ichor_cilium::bootstrap(client.clone(), &opts, &settings, &wait)
        .await
        .unwrap();
    assert!(!again.changed);
    assert_eq!(again.release.version, 1);
}

/// The values installed equal the values derived from the same settings
/// later (the controller's view), so the hash matches and a second apply
/// writes nothing; a changed setting upgrades (v1 superseded, v2 deployed).
/// Covers: R1.4d, R1.5e, R5.1
#[tokio::test]
async fn apply_for_cluster_is_idempotent_and_upgrades_on_change() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let store = env.namespace("ichor").await;
    let ns = env.namespace("kube").await;
    let home = HelmHome::new();
    let opts = options(&home, &store, &ns);
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 1);

    let first = ichor_cilium::apply_for_cluster(client.clone(), &opts, &settings)
        .await
        .unwrap();
    assert!(first.changed);
    // The controller derives the values again from the written cluster.
    let controller_view = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 1);
    assert_eq!(
        first.values_hash,
        values_hash(&effective_values(&controller_view).unwrap())
    );
    let again = ichor_cilium::apply_for_cluster(client.clone(), &opts, &controller_view)
        .await
        .unwrap();
    assert!(!again.changed, "same values must not write a revision");
    assert_eq!(again.release.version, 1);
    let dep = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("cilium-operator")
        .await
        .unwrap();
    assert_eq!(dep.spec.replicas, Some(1), "one node, one operator");

    let geneve = ClusterSettings::new(Tunnel::Geneve, KubeProxyMode::Enabled, 1);
    let up = ichor_cilium::apply_for_cluster(client.clone(), &opts, &geneve)
        .await
        .unwrap();
    assert!(up.changed);
    assert_eq!(up.release.version, 2);
    assert_ne!(up.values_hash, first.values_hash);
    for tool in [Tool::Helm3, Tool::Helm4] {
        let history = home.json(tool, &["history", "cilium", "--namespace", &store]);
        let st: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(st, vec!["superseded", "deployed"], "{tool:?}");
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("cilium-config")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["tunnel-protocol"], "geneve");
}

/// An existing Cilium DaemonSet that no Helm release owns is taken over by
/// the first apply (take ownership), not recreated.
/// Covers: R2.0
#[tokio::test]
async fn first_apply_takes_over_an_existing_cilium_daemonset() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let store = env.namespace("ichor").await;
    let ns = env.namespace("kube").await;
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium"},
        "spec": {"selector": {"matchLabels": {"k8s-app": "cilium"}}, "template": {
            "metadata": {"labels": {"k8s-app": "cilium"}},
            "spec": {"containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.18.0"}]}}}
    }))
    .unwrap();
    let before = Api::<DaemonSet>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    let home = HelmHome::new();
    let opts = options(&home, &store, &ns);
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 3);
    ichor_cilium::apply_for_cluster(client.clone(), &opts, &settings)
        .await
        .unwrap();
    let after = Api::<DaemonSet>::namespaced(client.clone(), &ns)
        .get("cilium")
        .await
        .unwrap();
    assert_eq!(after.metadata.uid, before.metadata.uid);
    let ann = after.metadata.annotations.unwrap();
    assert_eq!(ann["meta.helm.sh/release-name"], "cilium");
    assert_eq!(ann["meta.helm.sh/release-namespace"], ns.as_str());
}

/// A user value that sets an Ichor-owned key is refused by name, before
/// anything is written.
/// Covers: R1.4c
#[tokio::test]
async fn owned_user_value_is_refused_and_nothing_is_written() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let store = format!("never-{}", std::process::id());
    let ns = env.namespace("kube").await;
    let home = HelmHome::new();
    let opts = options(&home, &store, &ns);
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 3).with_user_values(
        json!({"ipam": {"mode": "cluster-pool"}})
            .as_object()
            .unwrap()
            .clone(),
    );
    let err = ichor_cilium::bootstrap(client.clone(), &opts, &settings, &WaitOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Values(_)), "{err}");
    assert!(err.to_string().contains("ipam.mode"), "{err}");
    assert!(
        Api::<Namespace>::all(client.clone())
            .get_opt(&store)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ConfigMap>::namespaced(client, &ns)
            .get_opt("cilium-config")
            .await
            .unwrap()
            .is_none()
    );
}

/// The Ready wait is bounded and says what it still waits for.
/// Covers: R3.1
#[tokio::test]
async fn ready_wait_gives_up_and_names_what_is_left() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let store = env.namespace("ichor").await;
    let ns = env.namespace("kube").await;
    let home = HelmHome::new();
    let opts = options(&home, &store, &ns);
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 3);
    let wait = WaitOptions {
        timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(100),
        ..WaitOptions::default()
    };
    let err = ichor_cilium::bootstrap(client, &opts, &settings, &wait)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NotReady { .. }), "{msg}");
    assert!(
        msg.contains(&format!("DaemonSet {ns}/cilium: no status reported yet")),
        "{msg}"
    );
    assert!(msg.contains("not Ready within 1s"), "{msg}");
}

/// R1.4d: the TalosCluster is built in memory first and Cilium is
/// installed with the effective values of that object; once the object is
/// written (through the real API server, CRD and all) and read back, the
/// controller derives the same values, so it finds the release at its hash.
/// Covers: R1.4d, R1.5e, R4.4c, R5.1
#[tokio::test]
async fn values_installed_equal_the_values_derived_from_the_written_cluster() {
    let env = TestEnv::shared();
    let client = env.client().await;
    ichor_testenv::install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let store = env.namespace("ichor").await;
    let ns = env.namespace("kube").await;
    let in_memory: ichor_api::TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "adopted", "namespace": store, "annotations": {"ichor.maesh.dev/adopted": "true"}},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"},
            "cni": {"preset": "cilium", "tunnel": "geneve", "kubeProxy": "replaced",
                "cilium": {"values": {"hubble": {"relay": {"enabled": true}}}}}}
    }))
    .unwrap();
    let settings = ClusterSettings::from_cluster(&in_memory, 3).unwrap();
    let home = HelmHome::new();
    let applied =
        ichor_cilium::apply_for_cluster(client.clone(), &options(&home, &store, &ns), &settings)
            .await
            .unwrap();

    // Adopt after a bootstrap reads tunnel and kube-proxy back from the record.
    let recorded = ichor_cilium::deployed_release(client.clone(), &store)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ichor_cilium::recorded_settings(recorded.config.as_ref().unwrap()),
        (Some(Tunnel::Geneve), Some(KubeProxyMode::Replaced))
    );

    // Write the same object (the CRDs are served: installed above).
    let api = Api::<ichor_api::TalosCluster>::namespaced(client.clone(), &store);
    let written = api
        .create(&PostParams::default(), &in_memory)
        .await
        .unwrap();
    let read_back = api
        .get(&written.metadata.name.clone().unwrap())
        .await
        .unwrap();
    let derived = ClusterSettings::from_cluster(&read_back, 3).unwrap();
    assert_eq!(
        effective_values(&derived).unwrap(),
        effective_values(&settings).unwrap()
    );
    let check = ichor_cilium::check_handover(client.clone(), &store, &ns, &derived)
        .await
        .unwrap();
    assert!(check.at_desired_hash(), "{check:?}");
    assert_eq!(
        check.deployed,
        Some((applied.release.version, applied.values_hash.clone()))
    );
    // Not Ready yet (no kubelet): hand-over waits for the DaemonSet.
    assert!(!check.complete());
    mark_ready(&client, &ns).await;
    let check = ichor_cilium::check_handover(client.clone(), &store, &ns, &derived)
        .await
        .unwrap();
    assert!(check.complete(), "{check:?}");
}

/// Hardware case E5 through ichor-cilium: the install dies after its pending
/// record is written; the rerun holding the CNI lock (exclusive) repairs the
/// record and finishes as an upgrade, objects intact.
/// Covers: R1.7c, R5.6
#[tokio::test]
async fn rerun_after_a_killed_install_repairs_and_upgrades() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let store = env.namespace("ichor").await;
    let ns = env.namespace("kube").await;
    let home = HelmHome::new();
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 3);
    let mut waiting = options(&home, &store, &ns);
    waiting.apply.wait = true;
    let (c, o, s) = (client.clone(), waiting.clone(), settings.clone());
    let task = tokio::spawn(async move { ichor_cilium::apply_for_cluster(c, &o, &s).await });
    let dss = Api::<DaemonSet>::namespaced(client.clone(), &ns);
    let (bound, every) = (Duration::from_secs(60), Duration::from_millis(100));
    wait::until("install to apply the DaemonSet", bound, every, || async {
        dss.get_opt("cilium").await.unwrap().is_some()
    })
    .await
    .unwrap();
    task.abort();
    let _ = task.await;
    let uid = dss.get("cilium").await.unwrap().metadata.uid;
    let v1 = home.json(Tool::Helm4, &["status", "cilium", "--namespace", &store]);
    assert_eq!(v1["info"]["status"], "pending-install");

    let plain = options(&home, &store, &ns);
    let err = ichor_cilium::apply_for_cluster(client.clone(), &plain, &settings)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("another operation is in progress since"),
        "{err}"
    );

    let mut exclusive = options(&home, &store, &ns);
    exclusive.apply.exclusive = true;
    let done = ichor_cilium::apply_for_cluster(client.clone(), &exclusive, &settings)
        .await
        .unwrap();
    assert_eq!(done.release.version, 2);
    assert_eq!(dss.get("cilium").await.unwrap().metadata.uid, uid);
    for tool in [Tool::Helm3, Tool::Helm4] {
        let history = home.json(tool, &["history", "cilium", "--namespace", &store]);
        let st: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(st, vec!["superseded", "deployed"], "{tool:?}");
    }
}

/// The stand-in chart says what it is, passes `helm lint` (v3 and v4), has
/// no hooks, renders the object names and kinds Ichor relies on, and renders
/// the same output twice for the same values.
#[tokio::test]
async fn standin_chart_is_small_honest_and_deterministic() {
    let dir = standin_chart_dir();
    let chart_yaml = std::fs::read_to_string(dir.join("Chart.yaml")).unwrap();
    assert!(chart_yaml.contains("name: cilium") && chart_yaml.contains("STAND-IN"));
    assert!(
        std::fs::read_to_string(dir.join("README.md"))
            .unwrap()
            .contains("This is not Cilium")
    );
    let home = HelmHome::new();
    for tool in [Tool::Helm3, Tool::Helm4] {
        let out = std::process::Command::new(tool.path())
            .args(["lint", "--strict"])
            .arg(&dir)
            .envs(home.envs())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool:?} lint: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let values = Value::Object(
        effective_values(&ClusterSettings::new(
            Tunnel::Vxlan,
            KubeProxyMode::Enabled,
            1,
        ))
        .unwrap(),
    );
    let chart = offline_chart(&dir);
    let r = home.renderer();
    let a = r
        .render("cilium", "kube-system", &chart, &values)
        .await
        .unwrap();
    let b = r
        .render("cilium", "kube-system", &chart, &values)
        .await
        .unwrap();
    assert_eq!(a.manifest, b.manifest);
    assert!(a.hooks.is_empty());
    let objects: Vec<(String, String, Option<String>)> =
        ichor_helm::manifest::parse_manifest(&a.manifest)
            .unwrap()
            .into_iter()
            .map(|o| (o.kind, o.name, o.namespace))
            .collect();
    let ks = Some("kube-system".to_string());
    assert_eq!(
        objects,
        vec![
            ("ServiceAccount".into(), "cilium".into(), ks.clone()),
            (
                "ServiceAccount".into(),
                "cilium-operator".into(),
                ks.clone()
            ),
            ("ConfigMap".into(), "cilium-config".into(), ks.clone()),
            ("DaemonSet".into(), "cilium".into(), ks.clone()),
            ("Deployment".into(), "cilium-operator".into(), ks.clone()),
        ]
    );
}
