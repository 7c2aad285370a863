//! End to end in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `tools/browser.sh`), driven over WebDriver,
//! against the lab: the real kube-apiserver, emulated Talos nodes
//! (ichor-talemu), Ichor's controller in process, and `ichor ui`'s server
//! over HTTPS with a self-signed certificate.
//!
//! Screenshots of each page are written to `target/ui-screenshots/`.
//!
//! What Ichor did: the controller (in this process) computed drift, applied
//! the released machine and ran the reboot; the UI (in this process) served
//! the pages and did the actions. What the test played: the Nodes' Ready
//! status and the users' ServiceAccounts. The same browser path against the
//! UI pod the chart deploys in the lab is `crates/ichor/tests/it/ui_lab_e2e.rs`.

use std::net::TcpListener;
use std::time::Duration;

use fantoccini::Locator;
use ichor_api::conditions::types;
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_testenv::browser::{
    WAIT, browser, forged_post, page_shows, post_forms, screenshot, sign_in, start_driver,
};
use ichor_testenv::wait::{self, Seen};
use ichor_testenv::{TestEnv, fixtures};
use ichor_ui::{AppState, Cache, Listeners, Settings};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/zone: \"blue\"\n";

async fn emulator(nodes: Vec<NodeSpec>, bundle: &str) -> Emulator {
    let bundle = ichor_talos::secrets::SecretsBundle::parse(bundle, "fixture").unwrap();
    let (crt, key) = bundle.os_ca_pem().unwrap();
    Emulator::start_with(
        nodes,
        EmulatorOptions {
            pki: Some(Pki::from_pem(&crt, &key).unwrap()),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap()
}

fn controller_config(ns: &str) -> ichor_controller::Config {
    ichor_controller::Config {
        namespace: Some(ns.into()),
        system_namespace: ns.into(),
        cilium_storage_namespace: ns.into(),
        cilium_release_namespace: ns.into(),
        resync: Duration::from_secs(3),
        error_requeue: Duration::from_millis(500),
        error_requeue_max: Duration::from_secs(5),
        talos_call_timeout: Duration::from_secs(20),
        leader_election: None,
        operation_bounds: ichor_controller::operation::OperationBounds {
            etcd: Duration::from_secs(60),
            drain: Duration::from_secs(60),
            node_return: Duration::from_secs(60),
            component: Duration::from_secs(60),
            image: Duration::from_secs(60),
            poll: Duration::from_millis(200),
        },
        ..ichor_controller::Config::default()
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn serve_ui(
    env: &TestEnv,
    client: &kube::Client,
    cache: &Cache,
    settings: Settings,
) -> String {
    let port = free_port();
    let listeners = Listeners {
        https: format!("127.0.0.1:{port}").parse().unwrap(),
        tls: None,
        plaintext: None,
    };
    let config = env.kube_config().await.expect("test kubeconfig");
    let users = ichor_ui::UserClients::from_config(&config);
    let app = ichor_ui::router(AppState::new(
        client.clone(),
        users,
        cache.clone(),
        settings,
    ));
    tokio::spawn(async move {
        if let Err(e) = ichor_ui::tls::serve(app, listeners).await {
            panic!("the UI stopped: {e}");
        }
    });
    format!("https://127.0.0.1:{port}")
}

/// A second spec applied as revision 2, then "Roll back to this revision"
/// on revision 1: the controller writes revision 1's patches back from the
/// history Secret, and the apply that follows is revision 3, a rollback of 1.
async fn roll_back_from_the_history_page(
    c: &fantoccini::Client,
    machines: &Api<TalosMachine>,
    w_url: &str,
    operator_token: &str,
    ns: &str,
) {
    let env = TestEnv::shared();
    crate::common::authorized(
        env,
        operator_token,
        "update",
        "talosmachines",
        ns,
        Some("node-w"),
    )
    .await;
    let first = machines.get("node-w").await.unwrap().spec.patches;
    let green = LABELS.replace("blue", "green");
    machines
        .patch(
            "node-w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"patches": [{"name": "zone", "inline": green}]}})),
        )
        .await
        .unwrap();
    c.goto(&format!("{w_url}/history")).await.unwrap();
    page_shows(c, "id=\"revision-2\"").await;
    c.find(Locator::Id("rollback-1"))
        .await
        .expect("the operator, who may update node-w, sees the rollback of revision 1")
        .click()
        .await
        .unwrap();
    let src = page_shows(c, "id=\"revision-3\"").await;
    assert!(src.contains("<td>rollback to revision 1</td>"), "{src}");
    screenshot(c, "machine-history-rollback").await;
    let w = machines.get("node-w").await.unwrap();
    assert_eq!(w.spec.patches, first, "revision 1's patches are back");
    assert!(
        !w.annotations()
            .contains_key(ichor_api::history::ROLLBACK_ANNOTATION),
        "the request was carried out and removed"
    );
    let revisions = w.status.unwrap().revisions;
    let last = revisions.last().expect("revision 3");
    assert_eq!(
        (last.number, last.reason, last.rollback_of),
        (3, ichor_api::history::RevisionReason::Rollback, Some(1)),
        "{revisions:?}"
    );
    assert_eq!(
        last.config_hash_after, revisions[0].config_hash_after,
        "the node runs revision 1's config again"
    );
    // A request for a revision not kept is removed, with a Warning saying why.
    machines
        .patch(
            "node-w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ichor_api::history::ROLLBACK_ANNOTATION: "99"}}})),
        )
        .await
        .unwrap();
    let events =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(machines.clone().into_client(), ns);
    wait::until(
        "the refused rollback's Warning",
        WAIT,
        Duration::from_millis(200),
        || async {
            let refused = events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("RollbackRefused")
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("revision 99"))
                });
            let w = machines.get("node-w").await.unwrap();
            let removed = !w
                .annotations()
                .contains_key(ichor_api::history::ROLLBACK_ANNOTATION);
            (removed && refused.is_some()).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(machines.get("node-w").await.unwrap().spec.patches, first);
}

/// Covers: R12.2, R12.3, the UI's end-to-end test in docs/ui.md (Chromium against the lab: sign in with a ServiceAccount token, a held machine's drift, release and watch it apply, a reboot operation's progress, read-only shows no action and a POST gets 405, a user without patch talosmachines sees no release button and gets 403), R5.3 settings.readOnly, R16.8 (the history page after an apply, and a rollback from it carried out by the controller as revision 3), R16.2
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chromium_drives_the_ui_against_the_lab() {
    let (chromium, chromedriver) = browser();
    let env = TestEnv::shared();
    let lab = crate::common::users(env, "ui-e2e").await;
    let client = lab.client.clone();
    let ns = lab.ns.clone();
    // The operator may also update node-w: the history page's rollback.
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "rollback-node-w"},
         "rules": [{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"],
                    "resourceNames": ["node-w"], "verbs": ["update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "rollback-node-w"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rollback-node-w"},
         "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]}
    ]);
    Api::<Role>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(rbac[0].clone()).unwrap(),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(rbac[1].clone()).unwrap(),
        )
        .await
        .unwrap();

    // The lab's Talos side: a control plane and a worker, emulated, with
    // their Nodes Ready.
    let bundle = ichor_testenv::fixtures::talos("stability-secrets.yaml");
    let suffix = ns.rsplit('-').next().unwrap().to_owned();
    let hosts = [format!("e2e-cp-{suffix}"), format!("e2e-w-{suffix}")];
    let emu = emulator(
        vec![
            NodeSpec::new(
                hosts[0].clone(),
                fixtures::cni_none("v1.12-cni-none-controlplane.yaml"),
            )
            .with_version("v1.13.9"),
            NodeSpec::new(
                hosts[1].clone(),
                fixtures::cni_none("v1.12-cni-none-worker.yaml"),
            )
            .with_version("v1.13.9"),
        ],
        &bundle,
    )
    .await;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "bundle"}, "stringData": {"secrets.yaml": bundle}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let nodes = Api::<Node>::all(client.clone());
    for host in &hosts {
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": host}})).unwrap(),
            )
            .await
            .unwrap();
        nodes
            .patch_status(
                host,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "played by the test",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
            )
            .await
            .unwrap();
    }
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "base"},
                "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.13.0", "kubernetesVersion": "v1.28.0",
                    "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
                    "cni": {"preset": "unmanaged", "unmanaged": {"talosCNI": "none"}},
                    "secretsRef": {"name": "bundle"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for (i, (name, role, hold, patches)) in [
        ("node-cp", "controlplane", false, json!([])),
        (
            "node-w",
            "worker",
            true,
            json!([{"name": "zone", "inline": LABELS}]),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        machines
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"clusterRef": {"name": "base"}, "role": role,
                             "address": emu.endpoint(i), "hold": hold, "patches": patches}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(ichor_controller::run_with(
        client.clone(),
        controller_config(&ns),
        async move {
            let _ = rx.await;
        },
    ));

    // The UI: read-write and read-only, over HTTPS (self-signed).
    let (cache, _reflectors) = Cache::start(&client);
    crate::common::cached(&cache, &ns, 2).await;
    let base = serve_ui(env, &client, &cache, Settings::default()).await;
    let read_only = serve_ui(
        env,
        &client,
        &cache,
        Settings {
            read_only: true,
            anonymous_read: false,
        },
    )
    .await;

    let profile = tempfile::tempdir().unwrap();
    let (_driver, c) = start_driver(&chromedriver, &chromium, profile.path()).await;

    // Sign in with the operator's ServiceAccount token.
    c.goto(&format!("{base}/signin")).await.unwrap();
    screenshot(&c, "signin").await;
    sign_in(&c, &base, &lab.operator_token).await;
    screenshot(&c, "clusters").await;

    // The held worker's drift, as the controller computes it.
    let w_url = format!("{base}/machines/{ns}/node-w");
    c.goto(&w_url).await.unwrap();
    let src = page_shows(&c, "machine.nodeLabels").await;
    assert!(src.contains("class B"), "{src}");
    page_shows(&c, "What releasing the hold would do").await;
    page_shows(&c, "no-reboot").await;
    screenshot(&c, "machine-held").await;
    // The cluster page warns about the held machine and what it holds back.
    c.goto(&format!("{base}/clusters/{ns}/base")).await.unwrap();
    page_shows(&c, "Held machines: changes kept back").await;
    screenshot(&c, "cluster").await;
    c.goto(&format!("{base}/machines?held=yes")).await.unwrap();
    page_shows(&c, "node-w").await;
    screenshot(&c, "machines-held-filter").await;

    // Release the hold and watch it apply (the page stays live through htmx).
    c.goto(&w_url).await.unwrap();
    c.find(Locator::Id("release"))
        .await
        .expect("the operator sees the release button")
        .click()
        .await
        .unwrap();
    page_shows(&c, "released").await;
    page_shows(&c, "The node runs the desired config.").await;
    screenshot(&c, "machine-applied").await;
    // Its history: the release's apply as a revision, with the path it
    // changed; the only revision, so no rollback is offered.
    c.goto(&format!("{w_url}/history")).await.unwrap();
    let src = page_shows(&c, "id=\"revision-1\"").await;
    assert!(src.contains("machine.nodeLabels"), "{src}");
    assert!(!src.contains("id=\"rollback-"), "{src}");
    screenshot(&c, "machine-history").await;
    roll_back_from_the_history_page(&c, &machines, &w_url, &lab.operator_token, &ns).await;
    let w = machines.get("node-w").await.unwrap();
    assert!(!w.spec.hold);
    let applied = ichor_api::conditions::find(&w.status.unwrap().conditions, types::APPLIED)
        .cloned()
        .expect("an Applied condition");
    assert_eq!(applied.status, "True", "{applied:?}");
    assert!(
        emu.writes().iter().any(|r| r.node == hosts[1]),
        "the worker's config was written: {:?}",
        emu.writes()
    );

    // Start a reboot of the worker and watch its progress.
    c.goto(&format!("{base}/clusters/{ns}/base")).await.unwrap();
    c.find(Locator::Css("#kind option[value=reboot]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#machines option[value=node-w]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Id("start"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // A bounded wait for the redirect to the new operation's page.
    let every = Duration::from_millis(200);
    let op_path = wait::until(
        "the operation page after starting a reboot",
        WAIT,
        every,
        || async {
            let p = c.current_url().await.unwrap().path().to_owned();
            if p.contains("/operations/") {
                Seen::Done(p)
            } else {
                Seen::not_yet(p)
            }
        },
    )
    .await
    .unwrap();
    page_shows(&c, &hosts[1]).await;
    screenshot(&c, "operation-running").await;
    page_shows(&c, "Succeeded</span>").await;
    screenshot(&c, "operation-succeeded").await;
    let op_name = op_path.rsplit('/').next().unwrap();
    let op = Api::<TalosOperation>::namespaced(client.clone(), &ns)
        .get(op_name)
        .await
        .unwrap();
    let progress = &op.status.unwrap().machines;
    assert_eq!(progress.len(), 1);
    assert_eq!(progress[0].node_name.as_deref(), Some(hosts[1].as_str()));
    assert_ne!(progress[0].boot_id_before, progress[0].boot_id_after);
    c.goto(&format!("{base}/operations")).await.unwrap();
    page_shows(&c, op_name).await;
    screenshot(&c, "operations").await;

    // Read-only: no page carries an action; a POST gets 405. Its sessions
    // are its own (each server keeps them in memory): sign in there.
    sign_in(&c, &read_only, &lab.operator_token).await;
    for path in [
        "/clusters".to_string(),
        format!("/clusters/{ns}/base"),
        format!("/machines/{ns}/node-w"),
        op_path.clone(),
    ] {
        c.goto(&format!("{read_only}{path}")).await.unwrap();
        page_shows(&c, "read-only").await;
        assert_eq!(post_forms(&c).await, vec!["/signout".to_string()], "{path}");
    }
    screenshot(&c, "read-only-machine").await;
    let status = forged_post(&c, &format!("/machines/{ns}/node-w/hold")).await;
    assert_eq!(status, 405);
    assert!(!machines.get("node-w").await.unwrap().spec.hold);

    // A user without patch talosmachines: no release button, 403 on a forged POST.
    machines
        .patch(
            "node-w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": true}})),
        )
        .await
        .unwrap();
    sign_in(&c, &base, &lab.viewer_token).await;
    c.goto(&w_url).await.unwrap();
    page_shows(&c, "What releasing the hold would do").await;
    assert!(c.find(Locator::Id("release")).await.is_err());
    assert!(c.find(Locator::Id("take-hold")).await.is_err());
    screenshot(&c, "machine-viewer").await;
    let status = forged_post(&c, &format!("/machines/{ns}/node-w/release")).await;
    assert_eq!(status, 403);
    assert!(machines.get("node-w").await.unwrap().spec.hold);

    c.close().await.unwrap();
    let _ = tx.send(());
    let _ = tokio::time::timeout(WAIT, controller).await;
    emu.shutdown().await;
}
