//! The UI's ServiceAccount as the chart grants it, judged by the real API
//! server: the chart rendered by real helm, its UI RBAC applied to the test
//! control plane, and SubjectAccessReviews asked for the ServiceAccount.

use std::process::Command;
use std::time::Duration;

use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};

const UI_USER: &str = "system:serviceaccount:ichor-system:ichor-ui";

fn render(read_only: bool) -> Vec<serde_json::Value> {
    let home = tempfile::tempdir().unwrap();
    let chart = ichor_testenv::tools::repo_root().join("dist/chart");
    let out = Command::new(Tool::Helm4.path())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .args(["template", "ichor"])
        .arg(&chart)
        .args(["--namespace", "ichor-system", "--kube-version"])
        .arg(Tool::KubeApiserver.version())
        .args(["--set", "ichorUI.enabled=true", "--set"])
        .arg(format!("settings.readOnly={read_only}"))
        .args(["--show-only", "templates/ui.yaml"])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).ok())
        .filter(|d| d.get("kind").is_some())
        .collect()
}

async fn apply(client: &kube::Client, docs: &[serde_json::Value]) {
    let roles = Api::<ClusterRole>::all(client.clone());
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    for d in docs {
        let name = d["metadata"]["name"].as_str().unwrap();
        match d["kind"].as_str().unwrap() {
            "ClusterRole" => {
                let _ = roles.delete(name, &DeleteParams::default()).await;
                roles
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(d.clone()).unwrap(),
                    )
                    .await
                    .unwrap();
            }
            "ClusterRoleBinding" => {
                let _ = bindings.delete(name, &DeleteParams::default()).await;
                bindings
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(d.clone()).unwrap(),
                    )
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

async fn may(client: &kube::Client, verb: &str, group: &str, resource: &str) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(UI_USER.into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:ichor-system".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: (group == ichor_api::GROUP).then(|| "anywhere".into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

/// Waits for the authorizer's cache to see the applied RBAC (bounded).
async fn settles(client: &kube::Client, verb: &str, resource: &str, want: bool) {
    let what = format!("{verb} {resource} to become {want}");
    let (bound, every) = (Duration::from_secs(30), Duration::from_millis(100));
    ichor_testenv::wait::until(what, bound, every, || async {
        may(client, verb, ichor_api::GROUP, resource).await == want
    })
    .await
    .unwrap();
}

async fn assert_read_only(client: &kube::Client) {
    // The re-created role reaches the authorizer's cache a moment later.
    settles(client, "list", "talosmachines", true).await;
    for resource in [
        "talosclusters",
        "talosmachines",
        "talosoperations",
        "ichorinstallations",
    ] {
        for verb in ["get", "list", "watch"] {
            assert!(
                may(client, verb, ichor_api::GROUP, resource).await,
                "{verb} {resource}"
            );
        }
        for verb in ["create", "update", "patch", "delete", "deletecollection"] {
            assert!(
                !may(client, verb, ichor_api::GROUP, resource).await,
                "read-only: {verb} {resource} must be refused"
            );
        }
    }
    // Sign-in and the per-action checks (system:auth-delegator).
    assert!(may(client, "create", "authentication.k8s.io", "tokenreviews").await);
    assert!(
        may(
            client,
            "create",
            "authorization.k8s.io",
            "subjectaccessreviews"
        )
        .await
    );
    assert!(!may(client, "get", "", "secrets").await);
}

/// `dist/install-ui.yaml` as generated (the installer path's UI).
fn installer_manifest() -> Vec<serde_json::Value> {
    let path = ichor_testenv::tools::repo_root().join("dist/install-ui.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    text.split("\n---")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).ok())
        .filter(|d| d.get("kind").is_some())
        .collect()
}

/// Covers: R12.3, R18.3 (the UI's ServiceAccount gets get/list/watch and TokenReview/SubjectAccessReview only, read-write or read-only: the UI writes with the signed-in user's token), R5.3 settings.readOnly
#[tokio::test]
async fn the_ui_service_account_holds_no_write_verb() {
    let env = TestEnv::shared();
    let client = env.client().await;
    // The chart, read-only and read-write.
    for read_only in [true, false] {
        apply(&client, &render(read_only)).await;
        assert_read_only(&client).await;
    }
    // The installer path's manifest (dist/install-ui.yaml), and its read-only form.
    apply(&client, &installer_manifest()).await;
    assert_read_only(&client).await;
    apply(
        &client,
        &ichor_adopt::install::ui_objects("v0.1.0", "x", true),
    )
    .await;
    assert_read_only(&client).await;
}
