//! `EtcdSnapshot` end to end on a real etcd (the test control plane's, as in
//! the lab): the real `talosctl etcd snapshot` against the emulator writes a
//! snapshot `etcdutl` reads, Ichor's client streams the same kind of
//! snapshot (Talos's messages of at most 1024 bytes, the bbolt db, then its
//! sha256), and the nodes and roles Talos refuses are refused.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;

use ichor_talemu::{ClientCertSpec, Emulator, EmulatorOptions, NodeSpec};
use ichor_talos_client::ClientOptions;
use ichor_testenv::{TestEnv, Tool};

fn at(b: u8) -> IpAddr {
    IpAddr::from([127, 0, 12, b])
}

/// The test control plane's etcd (started once per test binary).
async fn lab_etcd() -> String {
    tokio::task::spawn_blocking(|| TestEnv::shared().etcd_url().to_string())
        .await
        .unwrap()
}

/// A control plane (node 0) and a worker (node 1) standing for `etcd`.
async fn cluster(etcd: Option<String>) -> Emulator {
    Emulator::start_with(
        vec![
            NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(1)),
            NodeSpec::new("worker-1", crate::common::worker_v112()).with_address(at(2)),
        ],
        EmulatorOptions {
            etcd_url: etcd,
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap()
}

/// What one run of a tool printed.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={}\n--- stdout\n{}\n--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

async fn run(mut cmd: tokio::process::Command) -> Run {
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the tool answered within 60s")
        .expect("the tool runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `talosctl etcd snapshot FILE` on `node` through node 0's endpoint, with
/// a talosconfig whose certificate carries `roles`.
async fn talosctl_snapshot(
    emu: &Emulator,
    dir: &Path,
    roles: &[&str],
    node: IpAddr,
    file: &Path,
) -> Run {
    let config = dir.join(format!("talosconfig-{}", roles.join("-").replace(':', "_")));
    let spec = ClientCertSpec::with_roles(roles.iter().copied());
    std::fs::write(&config, emu.talosconfig("talemu", &spec).unwrap()).unwrap();
    let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
    cmd.arg("--talosconfig")
        .arg(&config)
        .args(["-n", &node.to_string(), "-e", &emu.endpoint(0)])
        .args(["etcd", "snapshot"])
        .arg(file)
        .env_remove("TALOSCONFIG")
        .env("HOME", dir);
    run(cmd).await
}

/// `etcdctl put KEY VALUE` on the etcd at `url`; the revision it wrote.
async fn put(url: &str, key: &str, value: &str) -> i64 {
    let mut cmd = tokio::process::Command::new(Tool::Etcdctl.path());
    cmd.arg(format!("--endpoints={url}"))
        .args(["put", key, value, "-w", "json"]);
    let r = run(cmd).await;
    assert!(r.ok, "etcdctl put: {r}");
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&r.stdout).unwrap();
    v["header"]["revision"].as_i64().expect("a revision")
}

/// `etcdutl snapshot status -w json FILE`: (revision, totalSize).
async fn status(file: &Path) -> (i64, u64) {
    let mut cmd = tokio::process::Command::new(Tool::Etcdutl.path());
    cmd.args(["snapshot", "status", "-w", "json"]).arg(file);
    let r = run(cmd).await;
    assert!(r.ok, "etcdutl snapshot status: {r}");
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&r.stdout).unwrap();
    (
        v["revision"].as_i64().expect("a revision"),
        v["totalSize"].as_u64().expect("a totalSize"),
    )
}

/// The sha256 of `bytes` in hex, by coreutils' `sha256sum`.
fn sha256_hex(bytes: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "sha256sum: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The snapshot etcd streams: a bbolt db (pages of 512 bytes) and the
/// db's sha256.
fn assert_snapshot_shape(bytes: &[u8]) {
    assert!(bytes.len() > 32, "{} bytes", bytes.len());
    assert_eq!(bytes.len() % 512, 32, "{} bytes", bytes.len());
    let (db, trailer) = bytes.split_at(bytes.len() - 32);
    let trailer: String = trailer.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(sha256_hex(db), trailer, "the trailer is the db's sha256");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The real `talosctl etcd snapshot` against an emulated control plane
/// writes a real snapshot of the lab's etcd (`etcdutl` reads it, at a
/// revision no older than a write made before); Ichor's client streams the
/// same kind of snapshot in Talos's messages, which `etcdutl snapshot
/// restore` takes (it checks the trailer), and `EtcdStatus` names the
/// member.
/// Covers: R20.1
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_and_the_client_take_real_snapshots_of_the_lab_etcd() {
    let url = lab_etcd().await;
    let emu = cluster(Some(url.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let written = put(&url, "/ichor-talemu/snapshot", "before").await;

    let file = dir.path().join("talosctl.snapshot");
    let r = talosctl_snapshot(&emu, dir.path(), &["os:admin"], at(1), &file).await;
    assert!(r.ok, "{r}");
    assert!(r.stdout.contains("etcd snapshot saved"), "{r}");
    let by_talosctl = std::fs::read(&file).unwrap();
    assert_snapshot_shape(&by_talosctl);
    let (revision, total) = status(&file).await;
    assert!(revision >= written, "revision {revision} < {written}");
    assert_eq!(total, by_talosctl.len() as u64 - 32);

    let client = emu.admin_client(0).unwrap();
    let node = at(1).to_string();
    let mut stream = Box::pin(client.etcd_snapshot(&node).await.unwrap());
    let mut by_client = Vec::new();
    let mut messages = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(
            (1..=1024).contains(&chunk.len()),
            "a message of {} bytes",
            chunk.len()
        );
        by_client.extend_from_slice(&chunk);
        messages += 1;
    }
    assert_snapshot_shape(&by_client);
    assert!(messages >= by_client.len() / 1024, "{messages} messages");
    let file = write(dir.path(), "client.snapshot", &by_client);
    let (client_revision, client_total) = status(&file).await;
    assert!(
        client_revision >= revision,
        "{client_revision} < {revision}"
    );
    assert_eq!(client_total, by_client.len() as u64 - 32);
    // The API server keeps writing to the same etcd: the database only
    // grows (no defragmentation here), and only by those few writes.
    assert!(
        by_client.len() >= by_talosctl.len() && by_client.len() - by_talosctl.len() < 4 << 20,
        "talosctl: {} bytes, the client: {} bytes",
        by_talosctl.len(),
        by_client.len()
    );
    let restored = dir.path().join("restored");
    let mut cmd = tokio::process::Command::new(Tool::Etcdutl.path());
    cmd.args(["snapshot", "restore"])
        .arg(&file)
        .arg(format!("--data-dir={}", restored.display()));
    let r = run(cmd).await;
    assert!(
        r.ok,
        "etcdutl snapshot restore (it checks the trailer): {r}"
    );

    let status = client.etcd_status(&node).await.unwrap();
    assert_ne!(status.member_id, 0);
    assert!(!status.protocol_version.is_empty());
}

/// A worker has no etcd (Unimplemented, Talos's words); a reader may not
/// take a snapshot (PermissionDenied), an `os:etcd:backup` certificate may;
/// without an etcd behind the emulator the call is Unavailable; a node in
/// maintenance mode serves no etcd call.
/// Covers: R20.1
#[tokio::test(flavor = "multi_thread")]
async fn workers_readers_and_a_missing_etcd_are_refused() {
    let url = lab_etcd().await;
    let emu = cluster(Some(url)).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.snapshot");

    let r = talosctl_snapshot(&emu, dir.path(), &["os:admin"], at(2), &file).await;
    assert!(!r.ok, "{r}");
    assert!(
        r.stderr
            .contains("etcd snapshot is only available on control plane nodes"),
        "{r}"
    );
    assert!(!file.exists());
    let admin = emu.admin_client(0).unwrap();
    let worker = at(2).to_string();
    let e = admin.etcd_snapshot(&worker).await.err().expect("refused");
    assert_eq!(e.code(), Some(tonic::Code::Unimplemented), "{e}");
    assert_eq!(e.node(), Some(worker.as_str()));
    let e = admin.etcd_status(&worker).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::Unimplemented), "{e}");

    let r = talosctl_snapshot(&emu, dir.path(), &["os:reader"], at(1), &file).await;
    assert!(!r.ok, "{r}");
    assert!(r.stderr.contains("PermissionDenied"), "{r}");
    let cp = at(1).to_string();
    let reader = emu
        .client(
            0,
            &ClientCertSpec::with_roles(["os:reader"]),
            ClientOptions::default(),
        )
        .unwrap();
    let e = reader.etcd_snapshot(&cp).await.err().expect("refused");
    assert!(e.is_permission_denied(), "{e}");

    let backup = emu
        .client(
            0,
            &ClientCertSpec::with_roles(["os:etcd:backup"]),
            ClientOptions::default(),
        )
        .unwrap();
    let stream = backup.etcd_snapshot(&cp).await.unwrap();
    let chunks: Vec<_> = stream.collect().await;
    let bytes: Vec<u8> = chunks
        .into_iter()
        .flat_map(|c| c.unwrap().to_vec())
        .collect();
    assert_snapshot_shape(&bytes);
    let r = talosctl_snapshot(&emu, dir.path(), &["os:etcd:backup"], at(1), &file).await;
    assert!(r.ok, "{r}");

    let no_etcd = cluster(None).await;
    let e = no_etcd
        .admin_client(0)
        .unwrap()
        .etcd_snapshot("")
        .await
        .err()
        .expect("no etcd");
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    assert!(e.to_string().contains("etcd is not running"), "{e}");

    let maintenance = Emulator::start_with(
        vec![NodeSpec::maintenance("cp-m").with_address(at(3))],
        EmulatorOptions {
            etcd_url: Some(lab_etcd().await),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    let insecure = ichor_talos_client::TalosClient::maintenance(
        &maintenance.endpoint(0),
        ClientOptions::default(),
    )
    .unwrap();
    let e = insecure.etcd_snapshot("").await.err().expect("refused");
    assert!(e.is_permission_denied(), "{e}");
}
