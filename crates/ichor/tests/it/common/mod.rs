//! What the end-to-end tests of the `ichor` binary share: a lab, and the real
//! binaries run against it. No test starts a controller of its own: the lab
//! runs the one `ichor adopt` or `helm install` put in `ichor-system`, under
//! its ServiceAccount's token.

#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::process::{Command, Output, Stdio};

use ichor_lab::{Lab, LabOptions};
use ichor_testenv::Tool;

pub const NS: &str = "ichor-system";
/// Ichor's controller image of this version: the lab runs its pods and its
/// ichor-cni Jobs as the local `ichor` binary.
pub const CONTROLLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller:v0.1.0";

/// A lab with two nodes (shaped by the test), and what runs against it.
pub struct LabHarness {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
}

impl LabHarness {
    pub async fn up(shape: impl FnOnce(&mut LabOptions)) -> LabHarness {
        let dir = tempfile::tempdir().unwrap();
        let mut options = LabOptions::new(dir.path().join("lab"));
        options.nodes = 2;
        // The lab runs Ichor's pods and ichor-cni Jobs with this binary.
        options.ichor_bin = Some(env!("CARGO_BIN_EXE_ichor").into());
        shape(&mut options);
        let lab = Lab::up(options).await.expect("the lab starts");
        LabHarness { lab, dir }
    }

    /// The real `ichor`, with no terminal.
    pub fn ichor(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
        cmd.env("NO_COLOR", "1").stdin(Stdio::null());
        cmd
    }

    /// The Cilium chart the lab gives Ichor: the real chart from the tools
    /// cache, or the stand-in where the tools cache lacks it.
    pub fn cilium_chart(&self) -> &Path {
        self.lab.options.cilium_chart.path()
    }

    /// `ichor adopt --yes` against the lab with the lab's Cilium chart.
    pub fn adopt(&self, extra: &[&str]) -> Command {
        self.adopt_with(&self.lab.talosconfig, &self.lab.kubeconfig, extra)
    }

    /// The same with another talosconfig or kubeconfig (bad-input cases).
    pub fn adopt_with(&self, talosconfig: &Path, kubeconfig: &Path, extra: &[&str]) -> Command {
        let mut cmd = self.ichor();
        cmd.args(["adopt", "--cluster", "lab", "--yes", "--talosconfig"])
            .arg(talosconfig)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--secrets-bundle")
            .arg(&self.lab.bundle)
            .arg("--helm")
            .arg(Tool::Helm4.path())
            .arg("--cilium-chart")
            .arg(self.cilium_chart())
            .args(extra);
        cmd
    }

    /// The real helm against the lab, with homes of its own.
    pub fn helm(&self, tool: Tool, args: &[&str]) -> Output {
        let home = self.dir.path().join(format!("helm-home-{tool:?}"));
        Command::new(tool.path())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.lab.kubeconfig)
            .output()
            .expect("run helm")
    }

    pub async fn client(&self) -> kube::Client {
        self.lab.client().await
    }

    /// The logs the lab's processes wrote (the controller's, the Jobs'), for
    /// a failing assertion's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(self.lab.state_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                out.push_str(&format!("--- {}\n", path.display()));
                out.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
            }
        }
        out
    }
}

/// A command's stdout and stderr together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command to its end.
pub fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run the command")
}

/// A TalosCluster spec that only Ichor's webhook refuses: `ipam.mode` is an
/// Ichor-owned Cilium value below the top level, which the CRD's CEL rules
/// do not see.
pub fn webhook_only_refused_cluster(name: &str) -> ichor_api::TalosCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"endpoint": "https://127.0.0.1:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "lab-talos-secrets"},
            "cni": {"preset": "cilium", "kubeProxy": "enabled",
                "cilium": {"values": {"ipam": {"mode": "cluster-pool"}}}}}
    }))
    .expect("a TalosCluster")
}

/// The API server refuses the webhook-only spec by calling Ichor's webhook
/// through its Service (the configuration names a Service, no URL), and
/// nothing is stored.
pub async fn assert_the_webhook_refuses_through_its_service(h: &LabHarness) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::Api;
    let client = h.client().await;
    let configuration = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(ichor_adopt::install::WEBHOOK_CONFIGURATION)
        .await
        .expect("Ichor's ValidatingWebhookConfiguration");
    for w in configuration.webhooks.unwrap_or_default() {
        let service = w.client_config.service.expect("called through a Service");
        assert_eq!(service.name, ichor_adopt::install::WEBHOOK_SERVICE);
        assert!(w.client_config.url.is_none());
        assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
        assert!(w.client_config.ca_bundle.is_some());
    }
    let clusters: Api<ichor_api::TalosCluster> = Api::namespaced(client, NS);
    let name = "only-the-webhook-refuses-this";
    let err = clusters
        .create(&Default::default(), &webhook_only_refused_cluster(name))
        .await
        .expect_err("the webhook refuses a nested Ichor-owned Cilium value");
    let kube::Error::Api(status) = err else {
        panic!("not an answer of the API server: {err}")
    };
    assert!(
        status
            .message
            .contains("admission webhook \"taloscluster.ichor.maesh.dev\" denied the request"),
        "{status:?}\n{}",
        h.logs()
    );
    assert!(
        status
            .message
            .contains("spec.cni.cilium.values sets ipam.mode"),
        "{status:?}"
    );
    assert!(
        clusters.get_opt(name).await.unwrap().is_none(),
        "nothing stored"
    );
}

/// From the API server's audit log: Ichor's controller works as its
/// ServiceAccount — every TalosMachine status write (the controller is their
/// only writer) comes from `system:serviceaccount:ichor-system:ichor-controller`,
/// and there is at least one — and nothing with the admin's certificate ever
/// took the controller's Lease (no test-started admin controller).
pub async fn assert_the_controller_acts_as_its_service_account(h: &LabHarness) {
    let controller = format!(
        "system:serviceaccount:{NS}:{}",
        ichor_adopt::install::CONTROLLER
    );
    // Bounded: the controller reports on the machines soon after they exist.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(90);
    let events = loop {
        let events = h.lab.env.audit_events();
        let reported = events.iter().any(|e| {
            matches!(e.verb.as_str(), "update" | "patch")
                && e.object_ref.as_ref().is_some_and(|o| {
                    o["resource"] == "talosmachines" && o["subresource"] == "status"
                })
        });
        if reported || tokio::time::Instant::now() >= deadline {
            break events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let resource = |e: &ichor_testenv::AuditEvent, r: &str, sub: Option<&str>| {
        e.object_ref
            .as_ref()
            .is_some_and(|o| o["resource"] == r && o["subresource"].as_str() == sub)
    };
    let writes =
        |e: &ichor_testenv::AuditEvent| matches!(e.verb.as_str(), "create" | "update" | "patch");
    let status_writes: Vec<_> = events
        .iter()
        .filter(|e| writes(e) && resource(e, "talosmachines", Some("status")))
        .collect();
    assert!(
        !status_writes.is_empty(),
        "the controller wrote no TalosMachine status ({} audit events)",
        events.len()
    );
    for e in &status_writes {
        assert_eq!(e.user.username, controller, "{e:?}");
    }
    for e in events
        .iter()
        .filter(|e| writes(e) && resource(e, "leases", None))
        .filter(|e| e.object_ref.as_ref().is_some_and(|o| o["namespace"] == NS))
    {
        assert_eq!(
            e.user.username, controller,
            "a Lease of Ichor's taken by {e:?}"
        );
    }
}

/// A Ready pod of `app` on `node`, created by the test (the lab's kubelet
/// does not run it): something for a drain to evict.
pub async fn ready_pod(client: &kube::Client, ns: &str, name: &str, app: &str, node: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
}

/// The chart's metrics Service (templates/monitoring.yaml), as a test
/// creates it for the controller `ichor adopt` installed.
pub const METRICS_SERVICE: &str = "ichor-controller-metrics";

/// [`METRICS_SERVICE`] created in [`NS`] (as the chart's: the controller's
/// pod, port `metrics`) and forwarded to a local address.
pub async fn metrics_forward(
    h: &LabHarness,
    client: &kube::Client,
) -> ichor_lab::pods::ServiceForward {
    let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": METRICS_SERVICE, "namespace": NS},
        "spec": {
            "selector": {"app.kubernetes.io/name": "ichor-controller"},
            "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics"}]
        }
    }))
    .expect("a Service");
    kube::Api::namespaced(client.clone(), NS)
        .create(&kube::api::PostParams::default(), &service)
        .await
        .unwrap_or_else(|e| panic!("creating Service {NS}/{METRICS_SERVICE}: {e}"));
    ichor_lab::pods::ServiceForward::start(
        client.clone(),
        &h.lab.state_dir().join(ichor_lab::pods::NETWORK_SOCKET),
        NS,
        METRICS_SERVICE,
        "metrics",
    )
    .await
    .unwrap()
}

/// GET `path` from `addr` (HTTP/1.0: the body is what follows the headers).
async fn try_http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: ichor\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out))
}

/// The controller's `/metrics` through a forward made by
/// [`metrics_forward`], once the Service has an endpoint (the lab's
/// endpoints follow the Service on a later pass), bounded by a minute.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let last = match try_http_get(addr, "/metrics").await {
            Ok(body) if body.contains("# TYPE ichor_") => return body,
            Ok(body) => format!("not the controller's metrics: {body}"),
            Err(e) => e.to_string(),
        };
        assert!(
            std::time::Instant::now() < deadline,
            "no metrics from {addr} within a minute: {last}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
