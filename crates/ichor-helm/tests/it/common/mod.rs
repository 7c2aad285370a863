//! Shared helpers of the tests against the test control plane and real helm.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_helm::{ApplyOptions, ChartRef, Engine, ReleaseRequest, Renderer};
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// A helm home (cache, config, data) in a temporary folder.
pub struct HelmHome {
    dir: tempfile::TempDir,
}

impl HelmHome {
    pub fn new() -> Self {
        HelmHome {
            dir: tempfile::Builder::new()
                .prefix("ichor-helm-home-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    pub fn envs(&self) -> Vec<(String, String)> {
        ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"]
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    self.dir.path().join(k.to_lowercase()).display().to_string(),
                )
            })
            .collect()
    }

    /// Runs real helm with this home and the test kubeconfig; panics with
    /// helm's stderr when it fails.
    pub fn run(&self, tool: Tool, args: &[&str]) -> String {
        let (ok, out, err) = self.try_run(tool, args);
        assert!(ok, "helm {:?} {args:?} failed: {err}", tool);
        out
    }

    pub fn try_run(&self, tool: Tool, args: &[&str]) -> (bool, String, String) {
        let env = TestEnv::shared();
        let mut cmd = std::process::Command::new(tool.path());
        cmd.args(args)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path());
        for (k, v) in self.envs() {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run helm");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `helm ... -o json` parsed.
    pub fn json(&self, tool: Tool, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["--output", "json"]);
        let out = self.run(tool, &a);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("helm {a:?} printed no JSON ({e}): {out}"))
    }

    /// A renderer running helm v4 with this home and the test kubeconfig.
    pub fn renderer(&self, tool: Tool) -> Renderer {
        let mut r = Renderer::new(tool.path()).kubeconfig(TestEnv::shared().kubeconfig_path());
        for (k, v) in self.envs() {
            r = r.env(k, v);
        }
        r
    }
}

pub fn demo_chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/charts/demo")
}

pub fn request(name: &str, namespace: &str, values: Value) -> ReleaseRequest {
    ReleaseRequest {
        name: name.into(),
        namespace: namespace.into(),
        chart: ChartRef::path(demo_chart()),
        values,
    }
}

/// Options for tests: no rollout wait, short polls.
pub fn no_wait() -> ApplyOptions {
    ApplyOptions {
        wait: false,
        poll_interval: Duration::from_millis(200),
        report_interval: Duration::from_millis(500),
        ..ApplyOptions::default()
    }
}

pub async fn engine(storage_ns: &str, home: &HelmHome) -> Engine {
    Engine::new(
        TestEnv::shared().client().await,
        storage_ns,
        home.renderer(Tool::Helm4),
    )
}

/// Plays the kubelet and the DaemonSet controller: reports the DaemonSet
/// rolled out on one node at its current generation.
pub async fn mark_daemonset_ready(client: &kube::Client, ns: &str, name: &str) {
    let api = Api::<DaemonSet>::namespaced(client.clone(), ns);
    let ds = api.get(name).await.expect("the DaemonSet exists");
    let generation = ds.metadata.generation.unwrap_or(1);
    let status = json!({"status": {"observedGeneration": generation, "desiredNumberScheduled": 1,
        "currentNumberScheduled": 1, "updatedNumberScheduled": 1, "numberReady": 1,
        "numberAvailable": 1, "numberMisscheduled": 0}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch DaemonSet status");
}

/// Plays the Deployment controller and the kubelets for a Deployment.
pub async fn mark_deployment_ready(client: &kube::Client, ns: &str, name: &str) {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    let d = api.get(name).await.expect("the Deployment exists");
    let generation = d.metadata.generation.unwrap_or(1);
    let replicas = d.spec.replicas.unwrap_or(1);
    let status = json!({"status": {"observedGeneration": generation, "replicas": replicas,
        "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch Deployment status");
}

/// Polls `check` every 100 ms until it is true, at most `secs` seconds.
pub async fn eventually<F, Fut>(secs: u64, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (bound, every) = (Duration::from_secs(secs), Duration::from_millis(100));
    ichor_testenv::wait::until(what, bound, every, check)
        .await
        .unwrap();
}
