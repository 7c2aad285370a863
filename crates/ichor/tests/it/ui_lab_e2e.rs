//! The web UI as a user installs it, end to end on the lab: F1's `helm
//! install` of the packaged chart (`dist/chart`) with `ichorUI.enabled=true`
//! and the UI's certificate in a Secret, then `ichor adopt --cni-unmanaged`.
//!
//! What Ichor did: the chart's UI Deployment runs as the real `ichor ui`
//! (the `ichor-ui` image's entrypoint is the `ichor` binary) under the
//! chart's `ichor-ui` ServiceAccount; it serves HTTPS with the certificate
//! the chart mounts from the Secret, checks sign-in tokens by TokenReview,
//! keeps sessions in its memory, shows each user what RBAC lets them read
//! and checks each action by a SubjectAccessReview, then makes it with the
//! user's own token; the chart's controller, also a
//! lab pod under its own ServiceAccount, computes the held machine's drift
//! and applies it once released.
//!
//! What the lab played: the kubelet (the pods are local processes; the
//! Secret volumes are written to files the process reads as it would the
//! mount; the readiness probe is asked over HTTPS without verifying, as a
//! kubelet does), the pod network (the test reaches the UI through its
//! Service's Endpoints, as a client in the cluster would), and the Talos
//! nodes (ichor-talemu). The test plays the user: a ServiceAccount token
//! pasted into the sign-in page of a real headless Chromium.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{LabHarness, NS, text};
use fantoccini::Locator;
use ichor_api::TalosMachine;
use ichor_api::conditions::types;
use ichor_lab::LabCni;
use ichor_lab::pods::{NETWORK_SOCKET, ServiceForward};
use ichor_testenv::browser::{WAIT, browser, page_shows, screenshot, sign_in, start_driver};
use ichor_testenv::{TestCa, Tool};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The name the UI's certificate is issued for: its Service's.
const UI_HOST: &str = "ichor-ui.ichor-system.svc";
const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/zone: \"blue\"\n";

async fn create<K>(api: &Api<K>, obj: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).expect("an object");
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create: {e}"),
    }
}

/// The UI's certificate, issued by a CA of the test's for the Service's
/// names, in the Secret the chart mounts (`ichorUI.tls.certSecret`), and the
/// CA in `ichorUI.tls.caSecret`. Returns the CA and the served certificate.
async fn certificate_secrets(client: &kube::Client) -> (TestCa, CertificateDer<'static>) {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": NS}}),
    )
    .await;
    let ca = TestCa::new("ichor-ui test CA");
    let issued = ca.issue_server(
        UI_HOST,
        &[
            "ichor-ui",
            "ichor-ui.ichor-system",
            UI_HOST,
            "ichor-ui.ichor-system.svc.cluster.local",
        ],
    );
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    create(
        &secrets,
        json!({"metadata": {"name": "ichor-ui-tls"}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem}}),
    )
    .await;
    create(
        &secrets,
        json!({"metadata": {"name": "ichor-ui-ca"}, "stringData": {"ca.crt": ca.cert_pem()}}),
    )
    .await;
    let der =
        CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).expect("a PEM certificate");
    (ca, der)
}

/// A TLS client that trusts only `ca`.
fn trusting(ca: &TestCa) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One answer: the status, the headers (lowercased names) and the body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// One HTTPS request to the UI through its Service, verified against `ca`
/// under the Service's name; the served certificate comes back too.
async fn https(
    forward: &ServiceForward,
    ca: &TestCa,
    request: &str,
) -> (Answer, CertificateDer<'static>) {
    https_with(forward, &trusting(ca), request).await
}

/// The same with any TLS client (a self-signed UI: one that verifies nothing).
async fn https_with(
    forward: &ServiceForward,
    connector: &tokio_rustls::TlsConnector,
    request: &str,
) -> (Answer, CertificateDer<'static>) {
    let tcp = tokio::net::TcpStream::connect(forward.addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from(UI_HOST).unwrap(), tcp)
        .await
        .expect("a TLS handshake that verifies the UI's certificate for its Service's name");
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        Answer {
            status,
            head: head.to_ascii_lowercase(),
            body: body.to_string(),
        },
        served.into_owned(),
    )
}

fn get(path: &str, cookie: Option<&str>) -> String {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: {UI_HOST}\r\n{cookie}Connection: close\r\n\r\n")
}

fn post(path: &str, cookie: Option<&str>, body: &str) -> String {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: {UI_HOST}\r\nOrigin: https://{UI_HOST}\r\n{cookie}\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An operator's ServiceAccount in ichor-system with a token: it may
/// release and take holds and start operations, nothing more.
async fn operator_token(client: &kube::Client) -> String {
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), NS);
    create(&sas, json!({"metadata": {"name": "operator"}})).await;
    create(
        &Api::<Role>::namespaced(client.clone(), NS),
        json!({"metadata": {"name": "operator"}, "rules": [
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosclusters"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosoperations"], "verbs": ["get", "list", "watch", "create", "patch"]}
        ]}),
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), NS),
        json!({"metadata": {"name": "operator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": NS}]}),
    )
    .await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    sas.create_token_request("operator", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("a token in the TokenRequest's status")
}

/// A ServiceAccount token of ichor-system with no RBAC at all: what any
/// pod's token is.
async fn nobody_token(client: &kube::Client) -> String {
    let sas = Api::<ServiceAccount>::namespaced(client.clone(), NS);
    create(&sas, json!({"metadata": {"name": "nobody"}})).await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    sas.create_token_request("nobody", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("a token in the TokenRequest's status")
}

/// Signs in through the UI's Service with `token`: the Cookie header of
/// the session the UI pod started (the cookie carries its id, not the token).
async fn session(
    forward: &ServiceForward,
    connector: &tokio_rustls::TlsConnector,
    token: &str,
) -> String {
    let (signed, _) = https_with(
        forward,
        connector,
        &post("/signin", None, &format!("token={token}")),
    )
    .await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    let set_cookie = signed
        .head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("a session cookie")
        .to_string();
    for flag in ["httponly", "secure", "samesite=strict", "path=/"] {
        assert!(set_cookie.contains(flag), "{set_cookie}");
    }
    assert!(!set_cookie.contains(token), "the token is in the cookie");
    // The head is lowercased; the id is lowercase hex.
    let id = set_cookie
        .strip_prefix("__host-ichor_session=")
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("not a __Host- session cookie: {set_cookie}"));
    format!("__Host-ichor_session={id}")
}

/// The users that made the `verb`s of Ichor's `resource` in the audit log
/// (the objects themselves, not their status).
fn authors(h: &LabHarness, verb: &str, resource: &str) -> Vec<(String, String)> {
    h.lab
        .env
        .audit_events()
        .into_iter()
        .filter(|e| e.verb == verb)
        .filter_map(|e| {
            let o = e.object_ref?;
            (o["resource"] == resource && o.get("subresource").is_none()).then(|| {
                (
                    o["name"].as_str().unwrap_or_default().to_string(),
                    e.user.username,
                )
            })
        })
        .collect()
}

/// Whether the UI's ServiceAccount may `verb` `resource` of Ichor's group (a SubjectAccessReview).
async fn ui_may(client: &kube::Client, verb: &str, resource: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{NS}:ichor-ui")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{NS}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(ichor_api::GROUP.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: Some(NS.into()),
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

/// Waits until the UI Deployment has a Ready pod of template generation
/// `generation` and its Service's Endpoints name only pods of it.
async fn ui_ready(h: &LabHarness, generation: i64) {
    let client = h.client().await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let endpoints = Api::<Endpoints>::namespaced(client, NS);
    let pod_prefix = format!("ichor-ui-g{generation}-");
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            let d = deployments.get("ichor-ui").await.unwrap();
            let status = d.status.unwrap_or_default();
            let serving: Vec<String> = endpoints
                .get_opt("ichor-ui")
                .await
                .unwrap()
                .into_iter()
                .flat_map(|e| e.subsets.unwrap_or_default())
                .flat_map(|s| s.addresses.unwrap_or_default())
                .filter_map(|a| a.target_ref.and_then(|t| t.name))
                .collect();
            if status.ready_replicas == Some(1)
                && status.observed_generation == Some(generation)
                && !serving.is_empty()
                && serving.iter().all(|n| n.starts_with(&pod_prefix))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "the UI pod of generation {generation} never became Ready and the Service's only endpoint\n{}",
        h.logs()
    );
}

/// A forward to the UI Service's `https` port, through the lab's network.
async fn ui_forward(h: &LabHarness, client: &kube::Client) -> ServiceForward {
    ServiceForward::start(
        client.clone(),
        &h.lab.state_dir().join(NETWORK_SOCKET),
        NS,
        "ichor-ui",
        "https",
    )
    .await
    .unwrap()
}

/// The pod log of the UI pod of template generation `generation`.
fn ui_log(h: &LabHarness, generation: i64) -> String {
    let path = h
        .lab
        .state_dir()
        .join(format!("pod-{NS}-ichor-ui-g{generation}-0.log"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Covers: R12.1, F1 (the chart and install manifest deploy the UI with
/// TLS; F1's helm install with the UI enabled works; the Chromium
/// end-to-end test on the lab: sign-in, a held machine's drift, release,
/// applied), R5.3 (ichorUI.port, ichorUI.tls.*, settings.readOnly), R4.1,
/// R18.3 (a token without RBAC sees no machine; the release is made with
/// the operator's own token, as the audit log shows; the UI's
/// ServiceAccount holds no write verb)
///
/// F1 with the UI: `helm install` (helm v4) of the packaged chart with
/// `ichorUI.enabled=true` and the certificate Secret, then `ichor adopt
/// --cni-unmanaged`. The UI pod is Ready by its HTTPS probe; through its
/// Service it serves the Secret's certificate (verified for
/// `ichor-ui.ichor-system.svc` against the test's CA) and no self-signed
/// warning is logged; the Secret rotated, the same pod serves the new
/// certificate without a restart; a ServiceAccount token signs in (a
/// `__Host-` session cookie holding a session id, HttpOnly, Secure,
/// SameSite=Strict) and the clusters page lists the adopted cluster; a
/// ServiceAccount token with no RBAC signs in and sees no machine; the
/// UI's ServiceAccount may not patch or create Ichor's objects.
/// In Chromium, the operator sees a held worker's drift (class B), releases
/// the hold, and the page shows the chart's controller applying it (the
/// node's config written, Applied True); the API server's audit log names
/// the operator as the author of the patch, and the UI's ServiceAccount as
/// the author of no write. `helm upgrade --set settings.readOnly=true`: the
/// new UI pod knows no session of the old one, answers 405 to a POST and
/// the hold stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_helm_install_with_the_ui_serves_tls_and_chromium_releases_a_hold() {
    let (chromium, chromedriver) = browser();
    let h = LabHarness::up(|o| o.cni = LabCni::Cilium).await;
    let client = h.client().await;
    let (ca, cert) = certificate_secrets(&client).await;

    let chart = ichor_testenv::tools::repo_root().join("dist/chart");
    let chart = chart.to_str().unwrap();
    let ui_values = [
        "--set",
        "ichorUI.enabled=true",
        "--set",
        "ichorUI.tls.certSecret=ichor-ui-tls",
        "--set",
        "ichorUI.tls.caSecret=ichor-ui-ca",
    ];
    let mut install = vec![
        "install",
        "ichor",
        chart,
        "--namespace",
        NS,
        "--create-namespace",
    ];
    install.extend(ui_values);
    let out = h.helm(Tool::Helm4, &install);
    assert!(out.status.success(), "helm install: {}", text(&out));
    let out = h.adopt(&["--cni-unmanaged"]).output().unwrap();
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());

    // The UI pod: Ready by its HTTPS probe, the certificate from the Secret.
    ui_ready(&h, 1).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get("ichor-ui")
        .await
        .unwrap();
    let pod = deployment.spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("ichor-ui"));
    assert!(
        pod.containers[0]
            .image
            .as_deref()
            .unwrap()
            .starts_with("ghcr.io/maeshinshin/ichor-ui:")
    );
    let forward = ui_forward(&h, &client).await;
    let (health, served) = https(&forward, &ca, &get("/healthz", None)).await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(
        served, cert,
        "the UI serves another certificate than the Secret's"
    );
    assert!(
        health.head.contains("strict-transport-security"),
        "{}",
        health.head
    );
    assert!(
        !ui_log(&h, 1).contains("self-signed"),
        "the UI made a certificate although the chart mounted one:\n{}",
        ui_log(&h, 1)
    );

    // The Secret rotated (as cert-manager would): the same pod serves the
    // new certificate, with no restart (the lab's kubelet swaps the
    // projected files; the UI reloads them).
    let rotated = ca.issue_server(UI_HOST, &[UI_HOST]);
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch(
            "ichor-ui-tls",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"stringData": {"tls.crt": rotated.cert_pem, "tls.key": rotated.key_pem}}),
            ),
        )
        .await
        .unwrap();
    let rotated_der = CertificateDer::from_pem_slice(rotated.cert_pem.as_bytes()).unwrap();
    let served_rotated = tokio::time::timeout(WAIT, async {
        loop {
            if https(&forward, &ca, &get("/healthz", None)).await.1 == rotated_der {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        served_rotated.is_ok(),
        "the rotated certificate was never served\n{}",
        ui_log(&h, 1)
    );
    let ui_pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .get("ichor-ui-g1-0")
        .await
        .unwrap();
    let container = &ui_pod.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(container.restart_count, 0, "the UI restarted to rotate");
    assert!(container.ready);

    // Sign-in with a ServiceAccount token: a server-side session whose id
    // is the cookie (flags checked in `session`), then a page.
    let token = operator_token(&client).await;
    let (anonymous, _) = https(&forward, &ca, &get("/clusters", None)).await;
    assert_eq!(
        anonymous.status, 303,
        "no anonymous access off the lab's loopback"
    );
    let verified = trusting(&ca);
    let cookie = session(&forward, &verified, &token).await;
    let (clusters, _) = https(&forward, &ca, &get("/clusters", Some(&cookie))).await;
    assert_eq!(clusters.status, 200);
    assert!(
        clusters.body.contains("<h1>Clusters</h1>"),
        "{}",
        clusters.body
    );
    assert!(clusters.body.contains("lab"), "{}", clusters.body);

    // A worker held with a change: the chart's controller computes its drift.
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    let worker = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| m.spec.role == ichor_api::MachineRole::Worker)
        .expect("adopt registered a worker");
    let worker_name = worker.metadata.name.clone().unwrap();
    machines
        .patch(
            &worker_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": true,
                "patches": [{"name": "zone", "inline": LABELS}]}})),
        )
        .await
        .unwrap();
    let writes_before = h.lab.emulator.writes().len();

    // Any pod's ServiceAccount token (no RBAC) signs in and sees no machine.
    let nobody = session(&forward, &verified, &nobody_token(&client).await).await;
    let (page, _) = https(&forward, &ca, &get("/machines", Some(&nobody))).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("You may read nothing here"),
        "{}",
        page.body
    );
    assert!(!page.body.contains(&worker_name), "{}", page.body);
    let (page, _) = https(
        &forward,
        &ca,
        &get(&format!("/machines/{NS}/{worker_name}"), Some(&nobody)),
    )
    .await;
    assert_eq!(page.status, 404, "{}", page.body);
    // The chart's UI ServiceAccount holds no write verb.
    for (verb, resource) in [
        ("patch", "talosmachines"),
        ("create", "talosoperations"),
        ("patch", "talosoperations"),
    ] {
        assert!(
            !ui_may(&client, verb, resource).await,
            "the UI's ServiceAccount may {verb} {resource}"
        );
    }
    assert!(ui_may(&client, "list", "talosmachines").await);

    // Chromium against the UI pod, through its Service.
    let base = format!("https://127.0.0.1:{}", forward.addr.port());
    let profile = tempfile::tempdir().unwrap();
    let (_driver, c) = start_driver(&chromedriver, &chromium, profile.path()).await;
    sign_in(&c, &base, &token).await;
    screenshot(&c, "lab-clusters").await;
    let machine_url = format!("{base}/machines/{NS}/{worker_name}");
    c.goto(&machine_url).await.unwrap();
    let src = page_shows(&c, "machine.nodeLabels").await;
    assert!(src.contains("class B"), "{src}");
    page_shows(&c, "What releasing the hold would do").await;
    screenshot(&c, "lab-machine-held").await;
    c.find(Locator::Id("release"))
        .await
        .expect("the operator sees the release button")
        .click()
        .await
        .unwrap();
    page_shows(&c, "The node runs the desired config.").await;
    screenshot(&c, "lab-machine-applied").await;
    let w = machines.get(&worker_name).await.unwrap();
    assert!(!w.spec.hold, "released by the UI");
    let applied = ichor_api::conditions::find(&w.status.unwrap().conditions, types::APPLIED)
        .cloned()
        .expect("an Applied condition");
    assert_eq!(applied.status, "True", "{applied:?}");
    assert!(
        h.lab.emulator.writes().len() > writes_before,
        "the worker's config was written by the chart's controller"
    );
    // The apply is the worker's first revision, naming the operator whose
    // release the chart's controller carried out (its webhook stamped them).
    c.goto(&format!("{machine_url}/history")).await.unwrap();
    let history = page_shows(&c, "id=\"revision-1\"").await;
    let operator = format!("system:serviceaccount:{NS}:operator");
    assert!(history.contains(&operator), "{history}");
    screenshot(&c, "lab-machine-history").await;
    c.close().await.unwrap();
    // The release was made with the operator's own token: the API server's
    // audit log names the operator, and the UI's ServiceAccount wrote nothing.
    let patches = authors(&h, "patch", "talosmachines");
    assert!(
        patches
            .iter()
            .any(|(name, user)| *name == worker_name && *user == operator),
        "no patch of {worker_name} by {operator}: {patches:?}"
    );
    let ui_user = format!("system:serviceaccount:{NS}:ichor-ui");
    for verb in ["patch", "update", "create"] {
        for resource in ["talosmachines", "talosoperations"] {
            let by_ui: Vec<_> = authors(&h, verb, resource)
                .into_iter()
                .filter(|(_, user)| *user == ui_user)
                .collect();
            assert!(by_ui.is_empty(), "the UI's ServiceAccount wrote: {by_ui:?}");
        }
    }

    // settings.readOnly: the new pod refuses every write with 405.
    machines
        .patch(
            &worker_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": true}})),
        )
        .await
        .unwrap();
    let mut upgrade = vec![
        "upgrade",
        "ichor",
        chart,
        "--namespace",
        NS,
        "--set",
        "settings.readOnly=true",
    ];
    upgrade.extend(ui_values);
    let out = h.helm(Tool::Helm4, &upgrade);
    assert!(out.status.success(), "helm upgrade: {}", text(&out));
    ui_ready(&h, 2).await;
    // A new pod: sessions live in the pod's memory, so the old one is gone.
    let (gone, _) = https(&forward, &ca, &get("/clusters", Some(&cookie))).await;
    assert_eq!(gone.status, 303, "a session outlived its pod");
    let cookie = session(&forward, &verified, &token).await;
    let release = format!("/machines/{NS}/{worker_name}/release");
    let (refused, _) = https(&forward, &ca, &post(&release, Some(&cookie), "")).await;
    assert_eq!(refused.status, 405, "{}", refused.body);
    assert!(
        refused.head.contains("allow: get, head"),
        "{}",
        refused.head
    );
    assert!(
        machines.get(&worker_name).await.unwrap().spec.hold,
        "the read-only UI changed the hold"
    );
    let (page, _) = https(
        &forward,
        &ca,
        &get(&format!("/machines/{NS}/{worker_name}"), Some(&cookie)),
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("id=\"release\""), "{}", page.body);
}

/// `kubectl apply --server-side -f FILE`: every document of the file.
async fn apply_file(client: &kube::Client, path: &std::path::Path) {
    use kube::api::{DynamicObject, GroupVersionKind};
    use serde::Deserialize as _;
    let text = std::fs::read_to_string(path).unwrap();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let Ok(obj) = serde_json::Value::deserialize(doc) else {
            continue;
        };
        if obj.is_null() {
            continue;
        }
        let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                obj["apiVersion"].as_str().unwrap().to_string(),
            ),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, obj["kind"].as_str().unwrap());
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
            Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        api.patch(
            &name,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", gvk.kind));
    }
}

/// Covers: R12.1 (the install manifest deploys the UI with TLS), R5.3
/// (HTTPS on ichorUI.port; self-signed without a certificate, with a warning)
///
/// The installer path: `ichor adopt --cni-unmanaged` installs Ichor, then
/// the user applies `dist/install-ui.yaml` (server-side, as `kubectl apply
/// --server-side`). The UI pod runs as `ichor ui` under the manifest's
/// ServiceAccount, is Ready by its HTTPS probe, logs that its certificate
/// is self-signed, serves HTTPS through its Service (a client that trusts
/// nothing: the certificate is one the pod made) and takes a
/// ServiceAccount token's sign-in; plain HTTP on its port gets no page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn install_ui_yaml_deploys_the_ui_over_https_with_a_self_signed_certificate() {
    let h = LabHarness::up(|o| o.cni = LabCni::Cilium).await;
    let client = h.client().await;
    let out = h.adopt(&["--cni-unmanaged"]).output().unwrap();
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());
    apply_file(
        &client,
        &ichor_testenv::tools::repo_root().join("dist/install-ui.yaml"),
    )
    .await;
    ui_ready(&h, 1).await;
    let pod = Api::<Deployment>::namespaced(client.clone(), NS)
        .get("ichor-ui")
        .await
        .unwrap()
        .spec
        .template
        .spec
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("ichor-ui"));
    let log = ui_log(&h, 1);
    assert!(
        log.contains("self-signed certificate made now; browsers will warn"),
        "{log}"
    );

    let forward = ui_forward(&h, &client).await;
    let any = ichor_lab::pods::unverified_tls();
    let (health, _) = https_with(&forward, &any, &get("/healthz", None)).await;
    assert_eq!(health.status, 200, "{}", health.body);
    let token = operator_token(&client).await;
    let cookie = session(&forward, &any, &token).await;
    let (clusters, _) = https_with(&forward, &any, &get("/clusters", Some(&cookie))).await;
    assert_eq!(clusters.status, 200);
    assert!(
        clusters.body.contains("ichor-system/lab"),
        "{}",
        clusters.body
    );

    // No plain HTTP: the port speaks TLS only.
    let mut tcp = tokio::net::TcpStream::connect(forward.addr).await.unwrap();
    tcp.write_all(get("/clusters", None).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tcp.read_to_end(&mut raw).await;
    assert!(
        !String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 200"),
        "the UI answered plain HTTP on its HTTPS port"
    );
}

/// Covers: the UI's pages, docs/ui.md (the cluster page: the Cilium release's status
/// read from its record), R6.1
///
/// F3's path with the UI: on a cluster with no CNI, `ichor cni bootstrap`
/// installs Ichor's Cilium (its Helm record in ichor-system), `helm install`
/// with `ichorUI.enabled=true`, `ichor adopt`. The chart's controller (a lab
/// pod under its ServiceAccount) writes `status.cni.release` from the
/// newest record; the chart's UI pod shows it on the cluster page, through
/// its Service (self-signed here: no certificate Secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_page_shows_ichors_cilium_release_from_its_record() {
    let h = LabHarness::up(|o| o.cni = LabCni::None).await;
    let client = h.client().await;
    let mut bootstrap = h.ichor();
    bootstrap
        .args([
            "cni",
            "bootstrap",
            "--kube-proxy",
            "enabled",
            "--wait-timeout",
            "3m",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig)
        .arg("--helm")
        .arg(Tool::Helm4.path())
        .arg("--cilium-chart")
        .arg(h.cilium_chart());
    let out = bootstrap.output().unwrap();
    assert!(out.status.success(), "ichor cni bootstrap: {}", text(&out));
    let chart = ichor_testenv::tools::repo_root().join("dist/chart");
    let out = h.helm(
        Tool::Helm4,
        &[
            "install",
            "ichor",
            chart.to_str().unwrap(),
            "--namespace",
            NS,
            "--create-namespace",
            "--set",
            "ichorUI.enabled=true",
        ],
    );
    assert!(out.status.success(), "helm install: {}", text(&out));
    let out = h.adopt(&[]).output().unwrap();
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());

    // The chart's controller reads the record into the cluster's status.
    let clusters = Api::<ichor_api::TalosCluster>::namespaced(client.clone(), NS);
    let release = tokio::time::timeout(WAIT, async {
        loop {
            let release = clusters
                .get("lab")
                .await
                .unwrap()
                .status
                .and_then(|s| s.cni)
                .and_then(|c| c.release);
            if let Some(r) = release {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no status.cni.release written\n{}", h.logs()));
    assert_eq!(release.name, "cilium");
    assert_eq!(release.storage_namespace, NS);
    assert_eq!((release.revision, release.status.as_str()), (1, "deployed"));
    assert_eq!(
        release.chart_version.as_deref(),
        Some(ichor_cilium::CHART_VERSION)
    );

    ui_ready(&h, 1).await;
    let forward = ui_forward(&h, &client).await;
    let any = ichor_lab::pods::unverified_tls();
    let token = operator_token(&client).await;
    let cookie = session(&forward, &any, &token).await;
    let (page, _) = https_with(
        &forward,
        &any,
        &get(&format!("/clusters/{NS}/lab"), Some(&cookie)),
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let line = format!(
        "cilium revision 1: deployed, chart {}",
        ichor_cilium::CHART_VERSION
    );
    assert!(page.body.contains(&line), "{}", page.body);
    assert!(
        page.body.contains("record in ichor-system"),
        "{}",
        page.body
    );
}
