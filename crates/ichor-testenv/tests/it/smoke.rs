//! Smoke tests that prove the test control plane is real: a real kube-apiserver
//! with etcd, the real helm v3 and v4, and the real talosctl.

use std::process::Command;
use std::time::Duration;

use ichor_testenv::wait::{self, Seen};
use ichor_testenv::{TestEnv, Tool, install};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// How long the control plane may take to act on a request (bounded waits).
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_crd_becomes_established_and_serves_its_kind() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.smoke.ichor.test"},
        "spec": {
            "group": "smoke.ichor.test",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}}}}}}]
        }
    }))
    .unwrap();
    // Established, and its kind lists.
    install::crds(&client, [crd]).await.unwrap();

    // The apiserver validates against the schema: size 0 is below the minimum.
    let ns = env.namespace("crd").await;
    let gvk = kube::api::GroupVersionKind::gvk("smoke.ichor.test", "v1", "Widget");
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(client, &ns, &ar);
    let bad: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "smoke.ichor.test/v1", "kind": "Widget",
        "metadata": {"name": "w"}, "spec": {"size": 0}
    }))
    .unwrap();
    let err = widgets
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.size"),
        "unexpected error: {err}"
    );
    let good: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "smoke.ichor.test/v1", "kind": "Widget",
        "metadata": {"name": "w"}, "spec": {"size": 3}
    }))
    .unwrap();
    widgets.create(&PostParams::default(), &good).await.unwrap();
}

/// The message a kubelet writes on a node whose CNI is missing.
const NO_CNI_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

#[tokio::test]
async fn a_node_carries_the_kubelets_not_ready_message_for_a_missing_cni() {
    let env = TestEnv::shared();
    let nodes: Api<Node> = Api::all(env.client().await);
    let name = format!("smoke-node-{:06x}", rand_suffix());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "message": NO_CNI_MESSAGE,
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let read = nodes.get(&name).await.unwrap();
    let ready = read
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .unwrap()
            .contains("cni plugin not initialized")
    );
    assert_eq!(
        read.spec.unwrap().pod_cidr.as_deref(),
        Some("10.244.0.0/24")
    );
}

#[tokio::test]
async fn server_side_apply_owns_fields_per_manager() {
    let env = TestEnv::shared();
    let ns = env.namespace("ssa").await;
    let deployments: Api<Deployment> = Api::namespaced(env.client().await, &ns);
    let manifest = |replicas: i32| {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}}}
        })
    };
    let ssa = PatchParams::apply("ichor-smoke");
    deployments
        .patch("web", &ssa, &Patch::Apply(manifest(2)))
        .await
        .unwrap();
    // Another manager claiming the same field conflicts unless it forces.
    let other = PatchParams::apply("someone-else");
    let err = deployments
        .patch("web", &other, &Patch::Apply(manifest(5)))
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("conflict"), "{err}");
    let applied = deployments
        .patch("web", &ssa, &Patch::Apply(manifest(3)))
        .await
        .unwrap();
    assert_eq!(applied.spec.replicas, Some(3));
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"ichor-smoke".to_string()),
        "{managers:?}"
    );
}

#[tokio::test]
async fn a_validating_webhook_on_loopback_rejects_a_create_with_its_message() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;

    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("webhook").await;

    let cert = env.ca().issue_server("smoke-webhook", &["127.0.0.1"]);
    let port = serve_webhook(&cert.cert_pem, &cert.key_pem).await;

    let ca_b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(env.ca().cert_pem())
    };
    let name = format!("smoke-{ns}");
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "deny-forbidden.smoke.ichor.test",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"), "caBundle": ca_b64},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10
        }]
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let cm = |n: &str| -> ConfigMap {
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}}),
        )
        .unwrap()
    };
    // The configuration takes effect asynchronously: wait until the webhook answers.
    let every = Duration::from_millis(300);
    wait::until("the webhook to refuse", WAIT, every, || async {
        match cms.create(&PostParams::default(), &cm("forbidden")).await {
            Err(e)
                if e.to_string()
                    .contains("forbidden names are refused by the smoke webhook") =>
            {
                Seen::Done(())
            }
            Err(e) => Seen::not_yet(e),
            Ok(_) => {
                cms.delete("forbidden", &Default::default()).await.unwrap();
                Seen::not_yet("created (webhook not active yet)")
            }
        }
    })
    .await
    .unwrap();
    cms.create(&PostParams::default(), &cm("allowed"))
        .await
        .unwrap();
}

/// Serves `/validate` over rustls on a free loopback port: refuses objects named
/// "forbidden", allows the rest.
async fn serve_webhook(cert_pem: &str, key_pem: &str) -> u16 {
    use axum::{Json, Router, routing::post};
    use axum_server::tls_rustls::RustlsConfig;

    async fn validate(Json(review): Json<serde_json::Value>) -> Json<serde_json::Value> {
        let uid = review["request"]["uid"].clone();
        let name = review["request"]["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let allowed = name != "forbidden";
        Json(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": uid, "allowed": allowed,
                "status": {"code": 403, "message": "forbidden names are refused by the smoke webhook"}}
        }))
    }

    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = RustlsConfig::from_pem(cert_pem.as_bytes().to_vec(), key_pem.as_bytes().to_vec())
        .await
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().route("/validate", post(validate));
    tokio::spawn(async move {
        axum_server::from_tcp_rustls(listener, tls)
            .unwrap()
            .serve(app.into_make_service())
            .await
            .unwrap();
    });
    port
}

/// A helm with its own cache, config and data folders, pointed at the test
/// control plane.
fn helm(tool: Tool, home: &std::path::Path, env: &TestEnv) -> Command {
    let mut cmd = Command::new(tool.path());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", env.kubeconfig_path());
    cmd
}

fn run(mut cmd: Command) -> String {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn helm_installs_a_local_chart(tool: Tool) {
    let env = TestEnv::shared();
    let ns = env.namespace("helm").await;
    let home = tempfile::tempdir().unwrap();
    let chart = home.path().join("chart");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: smoke\nversion: 0.1.0\nappVersion: v0.1.0\n",
    )
    .unwrap();
    std::fs::write(chart.join("values.yaml"), "greeting: hello\n").unwrap();
    std::fs::write(
        chart.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\ndata:\n  greeting: {{ .Values.greeting | quote }}\n",
    )
    .unwrap();

    let mut install = helm(tool, home.path(), env);
    install.args([
        "install",
        "smoke",
        chart.to_str().unwrap(),
        "--namespace",
        &ns,
        "--set",
        "greeting=hi",
    ]);
    run(install);

    let mut list = helm(tool, home.path(), env);
    list.args(["list", "--namespace", &ns, "-o", "json"]);
    let releases: serde_json::Value = serde_json::from_str(&run(list)).unwrap();
    assert_eq!(releases[0]["name"], "smoke", "{releases}");
    assert_eq!(releases[0]["status"], "deployed", "{releases}");

    let cms: Api<ConfigMap> = Api::namespaced(env.client().await, &ns);
    let cm = cms.get("smoke-greeting").await.unwrap();
    assert_eq!(cm.data.unwrap()["greeting"], "hi");
}

#[tokio::test]
async fn helm_v3_installs_a_local_chart_and_lists_it() {
    helm_installs_a_local_chart(Tool::Helm3).await;
}

#[tokio::test]
async fn helm_v4_installs_a_local_chart_and_lists_it() {
    helm_installs_a_local_chart(Tool::Helm4).await;
}

#[test]
fn talosctl_reports_its_client_version() {
    let mut cmd = Command::new(Tool::Talosctl.path());
    cmd.args(["version", "--client"]);
    let out = run(cmd);
    let tag = Tool::Talosctl.version();
    assert!(out.contains("Client:"), "{out}");
    assert!(out.contains(&tag), "talosctl should report {tag}: {out}");
}

#[test]
fn kube_apiserver_reports_the_pinned_version() {
    let mut cmd = Command::new(Tool::KubeApiserver.path());
    cmd.arg("--version");
    let out = run(cmd);
    assert_eq!(
        out.trim(),
        format!("Kubernetes {}", Tool::KubeApiserver.version())
    );
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        & 0xff_ffff
}
