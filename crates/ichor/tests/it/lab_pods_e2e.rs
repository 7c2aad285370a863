//! The lab's kubelet for Ichor's own pods (ichor-lab `pods`), end to end
//! with the real `ichor` binary: a pod whose process exits is restarted with
//! the kubelet's back-off and shows CrashLoopBackOff meanwhile; a pod runs
//! with exactly its ServiceAccount's rights.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::common::{CONTROLLER_IMAGE, LabHarness, NS};

/// A namespace, a ServiceAccount with no rights, and a Deployment of Ichor's
/// image running `args` as that ServiceAccount.
async fn deploy(h: &LabHarness, name: &str, args: &[&str]) {
    let client = h.client().await;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).unwrap();
    let _ = Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": NS}}))
            .unwrap();
    Api::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let d: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"serviceAccountName": name, "containers": [{"name": "c", "image": CONTROLLER_IMAGE,
                    "args": args, "ports": [{"name": "metrics", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}}}]}}}
    }))
    .unwrap();
    Api::namespaced(client, NS)
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
}

/// Polls (bounded) the Deployment's pod until `done` says yes.
async fn wait_pod(h: &LabHarness, app: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let pods: Api<Pod> = Api::namespaced(h.client().await, NS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = pods
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap();
        if let Some(p) = list.items.iter().find(|p| done(p)) {
            return p.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {:?}\n{}",
            list.items.iter().map(|p| &p.status).collect::<Vec<_>>(),
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn container_status(p: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()
        .cloned()
}

/// A process that exits (an unknown flag) is restarted: CrashLoopBackOff
/// while it waits out the back-off, then a second run.
#[tokio::test(flavor = "multi_thread")]
async fn an_exiting_pod_is_restarted_with_back_off() {
    let h = LabHarness::up(|o| o.cni = ichor_lab::LabCni::Flannel).await;
    deploy(&h, "exits", &["controller", "--no-such-flag"]).await;
    let waiting = wait_pod(&h, "exits", "no CrashLoopBackOff", |p| {
        container_status(p).is_some_and(|c| {
            c.restart_count >= 1
                && c.state
                    .and_then(|s| s.waiting)
                    .and_then(|w| w.reason)
                    .as_deref()
                    == Some("CrashLoopBackOff")
        })
    })
    .await;
    assert!(!container_status(&waiting).unwrap().ready);
    wait_pod(&h, "exits", "no second restart", |p| {
        container_status(p).is_some_and(|c| c.restart_count >= 2)
    })
    .await;
}

/// The pod's process has its ServiceAccount's rights and no more: run as a
/// ServiceAccount without a binding, the controller's requests reach the
/// API server as that ServiceAccount and are refused (403), which the audit
/// log shows.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_runs_with_its_service_accounts_rights_only() {
    let h = LabHarness::up(|o| o.cni = ichor_lab::LabCni::Flannel).await;
    deploy(
        &h,
        "no-rights",
        &[
            "controller",
            "--no-leader-election",
            "--http-addr",
            "0.0.0.0:8080",
        ],
    )
    .await;
    let user = format!("system:serviceaccount:{NS}:no-rights");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let refused = h
            .lab
            .env
            .audit_events()
            .into_iter()
            .filter(|e| e.user.username == user)
            .any(|e| e.response_status.as_ref().is_some_and(|s| s["code"] == 403));
        if refused {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request of {user} was refused\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
