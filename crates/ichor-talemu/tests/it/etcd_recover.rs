//! etcd's disaster recovery through the Talos API, on a real etcd and
//! kube-apiserver (a test control plane of its own per test, since each
//! loses its etcd): a snapshot, the loss of etcd's data, `EtcdRecover` and
//! `Bootstrap{recover_etcd}`, and the apiserver serving the snapshot's
//! objects again — by Ichor's client and by the real talosctl.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use prost::bytes::Bytes;

use ichor_talemu::{Emulator, EmulatorOptions, EtcdRestore, NodeSpec};
use ichor_talos_client::TalosClient;
use ichor_talos_client::etcd::ServiceStatus;
use ichor_testenv::{TestEnv, Tool};

fn at(b: u8) -> IpAddr {
    IpAddr::from([127, 0, 13, b])
}

/// A test control plane of its own, and an emulated control plane (node 0)
/// and worker (node 1) standing for its etcd, whose restore starts that
/// etcd and apiserver again.
async fn recoverable() -> (Arc<TestEnv>, Emulator) {
    let env = Arc::new(
        tokio::task::spawn_blocking(TestEnv::start)
            .await
            .unwrap()
            .expect("a test control plane"),
    );
    let emu = Emulator::start_with(
        vec![
            NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(1)),
            NodeSpec::new("worker-1", crate::common::worker_v112()).with_address(at(2)),
        ],
        EmulatorOptions {
            etcd_url: Some(env.etcd_url().to_string()),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    let starter = env.etcd_starter();
    emu.restore_etcd_with(EtcdRestore {
        etcdutl: Tool::Etcdutl.path(),
        member_args: env.etcd_member_args(),
        start: Arc::new(move |data_dir| {
            let starter = starter.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || starter.start_from(&data_dir))
                    .await
                    .map_err(|e| Box::new(e) as ichor_talemu::RestoreHookError)?
                    .map_err(|e| Box::new(e) as ichor_talemu::RestoreHookError)
            })
        }),
    });
    (env, emu)
}

/// Loses etcd's data: the control plane's servers stop, the nodes wait.
async fn lose(env: &Arc<TestEnv>, emu: &Emulator) {
    let e = Arc::clone(env);
    tokio::task::spawn_blocking(move || e.lose_etcd())
        .await
        .unwrap()
        .expect("etcd lost");
    emu.lose_etcd();
}

/// A request to the test apiserver as its admin: the body, or the error's text.
async fn api(env: &TestEnv, method: &str, path: &str, body: &str) -> Result<String, String> {
    let client = env.client().await;
    let req = tonic::codegen::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.as_bytes().to_vec())
        .unwrap();
    client.request_text(req).await.map_err(|e| format!("{e:?}"))
}

async fn create_config_map(env: &TestEnv, name: &str) -> String {
    let body =
        format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}}}}"#);
    let created = api(env, "POST", "/api/v1/namespaces/default/configmaps", &body)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&created).unwrap();
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion")
        .to_string()
}

async fn config_map_exists(env: &TestEnv, name: &str) -> bool {
    match api(
        env,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps/{name}"),
        "",
    )
    .await
    {
        Ok(_) => true,
        Err(e) if e.contains("NotFound") => false,
        Err(e) => panic!("get {name}: {e}"),
    }
}

/// The whole snapshot of node `node`'s etcd, through the client.
async fn snapshot(client: &TalosClient, node: &str) -> Vec<u8> {
    let mut stream = Box::pin(client.etcd_snapshot(node).await.unwrap());
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    bytes
}

fn upload(bytes: Vec<u8>) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
        .chunks(64 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

async fn etcd_service(client: &TalosClient, node: &str) -> ServiceStatus {
    client
        .etcd_service(node)
        .await
        .unwrap()
        .expect("a control plane runs etcd")
}

/// Polls the etcd service of `node` until `done` holds (at most 3 minutes:
/// the apiserver's start on a loaded machine).
async fn wait_etcd(client: &TalosClient, node: &str, done: impl Fn(&ServiceStatus) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let service = etcd_service(client, node).await;
        if done(&service) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "etcd never got there: {service:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A snapshot taken through the Talos API brings a lost etcd back: after
/// the loss every call that needs etcd fails and the service waits; the
/// upload and `Bootstrap{recover_etcd}` are answered at once, etcd then
/// runs healthy on the restored data, and the apiserver serves what the
/// snapshot held (the ConfigMap made before it) and not what came after.
/// A second Bootstrap is refused (`AlreadyExists`): the node got two calls.
/// Covers: R20.14
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_etcd_comes_back_from_a_snapshot_through_the_talos_api() {
    let (env, emu) = recoverable().await;
    let client = emu.admin_client(0).unwrap();
    let cp = at(1).to_string();
    create_config_map(&env, "before-snapshot").await;
    let taken = snapshot(&client, &cp).await;
    let mut after_rv = create_config_map(&env, "after-snapshot").await;
    // Writes after the snapshot, more than the restarted apiserver makes:
    // the last one's revision stays ahead of the restored etcd's.
    for i in 0..40 {
        after_rv = create_config_map(&env, &format!("after-snapshot-{i}")).await;
    }

    lose(&env, &emu).await;
    let waiting = etcd_service(&client, &cp).await;
    assert!(waiting.is_awaiting_bootstrap(), "{waiting:?}");
    assert_eq!(waiting.last_event, "Running pre state");
    assert!(client.etcd_status(&cp).await.is_err());
    assert!(client.etcd_snapshot(&cp).await.is_err());

    client.etcd_recover(&cp, upload(taken)).await.unwrap();
    assert!(emu.etcd_snapshot_path(0).is_file());
    client.bootstrap_recover(&cp, false).await.unwrap();
    wait_etcd(&client, &cp, ServiceStatus::is_running_and_healthy).await;
    assert!(
        !emu.etcd_snapshot_path(0).exists(),
        "Talos deletes it once restored"
    );
    let status = client.etcd_status(&cp).await.unwrap();
    assert!(status.errors.is_empty(), "{status:?}");
    // The real etcd's figures, not modelled ones.
    assert_eq!(
        status.protocol_version,
        Tool::Etcd.version().trim_start_matches('v'),
        "{status:?}"
    );
    assert!(status.db_size > 0 && status.raft_index > 0, "{status:?}");

    assert!(config_map_exists(&env, "before-snapshot").await);
    assert!(!config_map_exists(&env, "after-snapshot").await);

    // Talos restores without bumping revisions: what a client saw after
    // the snapshot is now "in the future" of the restored etcd.
    let list = api(&env, "GET", "/api/v1/namespaces/default/configmaps", "")
        .await
        .unwrap();
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&list).unwrap();
    let restored_rv: u64 = v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let watch = api(
        &env,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={after_rv}&timeoutSeconds=3"
        ),
        "",
    )
    .await;
    let at_old = api(
        &env,
        "GET",
        &format!(
            "/api/v1/namespaces/default/configmaps?resourceVersion={after_rv}&resourceVersionMatch=NotOlderThan"
        ),
        "",
    )
    .await;
    // Neither answer is an error: no "resource version too old" (410
    // Gone) makes a client relist. The watch from the newer revision waits
    // for revisions the restored etcd reaches with other writes, and the
    // list answers the restored objects: a client that held the newer
    // revision is never told its view is gone.
    let watch = watch.expect("a watch from a revision ahead of the restored etcd");
    assert!(
        !watch.contains("\"ERROR\"") && !watch.contains("410"),
        "{watch}"
    );
    assert!(!watch.contains("after-snapshot"), "{watch}");
    let at_old = at_old.expect("a list at a revision ahead of the restored etcd");
    assert!(at_old.contains("before-snapshot"), "{at_old}");
    assert!(!at_old.contains("after-snapshot"), "{at_old}");
    let after: u64 = after_rv.parse().unwrap();
    assert!(
        restored_rv < after,
        "revisions went back: the restored list is at {restored_rv}, a client saw {after}"
    );

    let e = client.bootstrap_recover(&cp, false).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::AlreadyExists), "{e}");
    assert!(
        !client.bootstrap(&cp).await.unwrap(),
        "AlreadyExists: bootstrapped before"
    );
    assert_eq!(emu.bootstrap_calls(0), 3);
    assert_eq!(emu.bootstrap_calls(1), 0);
}

/// Talos keeps a request to recover only in memory: a reboot between the
/// answer and the restore loses it (etcd keeps waiting). A snapshot without
/// its sha256 trailer (a raw copy of etcd's db) fails the restore unless
/// `recover_skip_hash_check` is set — the reason in the etcd service's
/// events, etcd waiting — and restores with it.
/// Covers: R20.14
#[tokio::test(flavor = "multi_thread")]
async fn a_reboot_loses_the_request_and_a_raw_db_needs_the_hash_check_skipped() {
    let (env, emu) = recoverable().await;
    let client = emu.admin_client(0).unwrap();
    let cp = at(1).to_string();
    create_config_map(&env, "in-the-db").await;
    let mut raw = snapshot(&client, &cp).await;
    raw.truncate(raw.len() - 32);
    lose(&env, &emu).await;

    client.etcd_recover(&cp, upload(raw.clone())).await.unwrap();
    let gate = emu.hold_etcd_restore(0);
    client.bootstrap_recover(&cp, true).await.unwrap();
    gate.reached().await;
    client.reboot(&cp).await.unwrap();
    gate.open();
    // Back from the reboot, etcd still waits: the request is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(s)) = client.etcd_service(&cp).await
            && s.is_awaiting_bootstrap()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the node never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(etcd_service(&client, &cp).await.is_awaiting_bootstrap());
    assert!(client.etcd_status(&cp).await.is_err());

    client.bootstrap_recover(&cp, false).await.unwrap();
    wait_etcd(&client, &cp, |s| {
        s.events
            .iter()
            .any(|e| e.state == "Failed" && e.message.contains("hash"))
    })
    .await;
    let waiting = etcd_service(&client, &cp).await;
    assert!(waiting.is_awaiting_bootstrap(), "{waiting:?}");

    client.bootstrap_recover(&cp, true).await.unwrap();
    wait_etcd(&client, &cp, ServiceStatus::is_running_and_healthy).await;
    assert!(config_map_exists(&env, "in-the-db").await);
    assert_eq!(emu.bootstrap_calls(0), 3);
}

/// The real talosctl recovers the same way: `talosctl bootstrap
/// --recover-from FILE` (a `talosctl etcd snapshot` file) uploads it and
/// bootstraps; Ichor's client then sees etcd running and healthy.
/// Covers: R20.14
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_bootstrap_recover_from_restores_the_lab_etcd() {
    let (env, emu) = recoverable().await;
    let dir = tempfile::tempdir().unwrap();
    let talosctl = crate::common::talosctl::Talosctl::admin(&emu, dir.path());
    let cp = at(1).to_string();
    create_config_map(&env, "kept").await;
    let file = dir.path().join("db.snapshot");
    let r = talosctl
        .on(&cp, &["etcd", "snapshot", &file.display().to_string()])
        .await;
    assert!(r.ok, "{r}");
    create_config_map(&env, "dropped").await;
    lose(&env, &emu).await;

    let r = talosctl
        .on(
            &cp,
            &["bootstrap", "--recover-from", &file.display().to_string()],
        )
        .await;
    assert!(r.ok, "{r}");
    let client = emu.admin_client(0).unwrap();
    wait_etcd(&client, &cp, ServiceStatus::is_running_and_healthy).await;
    assert!(config_map_exists(&env, "kept").await);
    assert!(!config_map_exists(&env, "dropped").await);
    let r = talosctl.on(&cp, &["service", "etcd"]).await;
    assert!(r.ok && r.stdout.contains("Running"), "{r}");
}
