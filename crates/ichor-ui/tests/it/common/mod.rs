//! A namespace on the real test API server with a cluster, two machines (one
//! held with drift), and four users: an operator (may patch machines and
//! create and patch operations), a viewer (may only read), nobody (no RBAC)
//! and the UI's own client (admin here unless a test builds the chart's
//! read-only identity; the chart's Role is tested elsewhere).

#![allow(dead_code)]

use std::time::Duration;

use ichor_api::{TalosCluster, TalosMachine};
use ichor_testenv::TestEnv;
use ichor_testenv::wait::{self, Seen};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The lab objects of one test.
pub struct Lab {
    pub client: kube::Client,
    pub ns: String,
    pub operator_token: String,
    pub viewer_token: String,
    /// A ServiceAccount of the namespace with no RBAC at all (any pod's token).
    pub nobody_token: String,
}

/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(100);

pub async fn install_crds(client: &kube::Client) {
    ichor_testenv::install::crds(client, ichor_api::crds::all())
        .await
        .unwrap();
}

async fn create<K>(api: &Api<K>, obj: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create object")
}

/// A token of ServiceAccount `ns/name` from the TokenRequest API.
pub async fn token(client: &kube::Client, ns: &str, name: &str) -> String {
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    create(&sas, json!({"metadata": {"name": name}})).await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    sas.create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token request")
        .status
        .expect("token")
        .token
        .expect("a token in the TokenRequest's status")
}

/// Gives ServiceAccount `ns/sa` the `rules` in its namespace (Role and RoleBinding named `sa`).
pub async fn grant(client: &kube::Client, ns: &str, sa: &str, rules: serde_json::Value) {
    let roles = Api::<Role>::namespaced(client.clone(), ns);
    create(&roles, json!({"metadata": {"name": sa}, "rules": rules})).await;
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), ns);
    create(
        &bindings,
        json!({
            "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
        }),
    )
    .await;
}

/// A held worker's drift: one class B path, one class A, and a secret path
/// whose value reached status unredacted (the UI must show a digest).
pub fn held_drift() -> serde_json::Value {
    json!([
        {"path": "machine.nodeLabels.zone", "class": "B", "live": "a", "desired": "b",
         "reason": "node labels, annotations and taints are applied without a reboot"},
        {"path": "KubeProxyConfig.enabled", "class": "A", "desired": "true"},
        {"path": "machine.network.interfaces[wg0].wireguard.privateKey", "class": "B",
         "live": "SECRETMARKER-old", "desired": "SECRETMARKER-new", "reason": "network"}
    ])
}

/// A fresh namespace with the operator and the viewer, and no Ichor object.
pub async fn users(env: &TestEnv, prefix: &str) -> Lab {
    let client = env.client().await;
    install_crds(&client).await;
    let ns = env.namespace(prefix).await;
    let operator_token = token(&client, &ns, "operator").await;
    grant(
        &client,
        &ns,
        "operator",
        json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosclusters"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosoperations"], "verbs": ["get", "list", "watch", "create", "patch"]}
        ]),
    )
    .await;
    let viewer_token = token(&client, &ns, "viewer").await;
    grant(
        &client,
        &ns,
        "viewer",
        json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["*"], "verbs": ["get", "list", "watch"]}
        ]),
    )
    .await;
    let nobody_token = token(&client, &ns, "nobody").await;
    Lab {
        client,
        ns,
        operator_token,
        viewer_token,
        nobody_token,
    }
}

/// Gives ServiceAccount `ns/sa` the `rules` in every namespace (a
/// ClusterRole and ClusterRoleBinding named after it), and optionally a
/// built-in ClusterRole beside it.
pub async fn grant_cluster_wide(
    client: &kube::Client,
    ns: &str,
    sa: &str,
    rules: serde_json::Value,
    builtin: Option<&str>,
) {
    let name = format!("{ns}-{sa}");
    let roles = Api::<ClusterRole>::all(client.clone());
    create(&roles, json!({"metadata": {"name": name}, "rules": rules})).await;
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let subjects = json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}]);
    create(
        &bindings,
        json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects
        }),
    )
    .await;
    if let Some(role) = builtin {
        create(
            &bindings,
            json!({
                "metadata": {"name": format!("{name}-{}", role.replace(':', "-"))},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": subjects
            }),
        )
        .await;
    }
}

/// Waits until the API server's authorizer lets `token`'s user `verb`
/// `resource` of Ichor's group in `ns` (`name`: that object only; RBAC
/// reaches the authorizer's cache a moment after it is written).
pub async fn authorized(
    env: &TestEnv,
    token: &str,
    verb: &str,
    resource: &str,
    ns: &str,
    name: Option<&str>,
) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let config = env.kube_config().await.expect("test kubeconfig");
    let client = ichor_ui::UserClients::from_config(&config)
        .client(token)
        .expect("a client with the token");
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(ichor_api::GROUP.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: Some(ns.into()),
                name: name.map(Into::into),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api = Api::<SelfSubjectAccessReview>::all(client);
    let what = format!("{verb} {resource} in {ns} to be allowed for the token's user");
    wait::until(what, Duration::from_secs(30), POLL, || async {
        api.create(&PostParams::default(), &review)
            .await
            .is_ok_and(|r| r.status.is_some_and(|s| s.allowed))
    })
    .await
    .unwrap();
}

/// [`users`], plus the cluster `lab` and its machines cp-1 and w-1 (held, with drift).
pub async fn lab(env: &TestEnv, prefix: &str) -> Lab {
    let lab = users(env, prefix).await;
    let (client, ns) = (&lab.client, &lab.ns);
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), ns);
    create(
        &clusters,
        json!({
            "metadata": {"name": "lab"},
            "spec": {"endpoint": "https://10.5.0.2:6443", "talosVersion": "v1.13.0",
                     "kubernetesVersion": "v1.34.1", "secretsRef": {"name": "bundle"}}
        }),
    )
    .await;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), ns);
    for (name, role, hold) in [("cp-1", "controlplane", false), ("w-1", "worker", true)] {
        create(
            &machines,
            json!({
                "metadata": {"name": name},
                "spec": {"clusterRef": {"name": "lab"}, "role": role, "address": "10.5.0.9", "hold": hold}
            }),
        )
        .await;
    }
    machines
        .patch_status(
            "w-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"drift": held_drift(), "configHash": "h"}})),
        )
        .await
        .expect("status of w-1");
    lab
}

/// Waits until the cache holds `n` machines of `ns`.
pub async fn cached(cache: &ichor_ui::Cache, ns: &str, machines: usize) {
    let what = format!("the UI's cache to see the {machines} machines of {ns}");
    wait::until(what, Duration::from_secs(60), POLL, || async {
        let here = cache
            .inventory()
            .machines
            .iter()
            .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
            .count();
        if here >= machines {
            Seen::Done(())
        } else {
            Seen::not_yet(format!("{here} machines"))
        }
    })
    .await
    .unwrap();
}
