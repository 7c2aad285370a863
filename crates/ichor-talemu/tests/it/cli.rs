//! The `ichor-talemu serve` command: it writes a talosconfig that the real
//! talosctl uses as is (endpoints = control planes, nodes = every node).

use std::time::Duration;

use ichor_testenv::Tool;

/// `serve --nodes 2` with a control-plane and a worker config, then
/// `talosctl --talosconfig <written> version` reaches both nodes.
#[tokio::test(flavor = "multi_thread")]
async fn serve_writes_a_talosconfig_talosctl_uses() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cp = crate::common::fixtures_dir().join("stability-v1.12/base-controlplane.yaml");
    let worker = crate::common::fixtures_dir().join("stability-v1.12/base-worker.yaml");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor-talemu"))
        .args(["serve", "--nodes", "2", "--first-address", "127.0.0.61"])
        .arg("--config")
        .arg(&cp)
        .arg("--config")
        .arg(&worker)
        .arg("--state-dir")
        .arg(&state)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let talosconfig = state.join("talosconfig");
    let endpoints = state.join("endpoints.txt");
    let mut ready = false;
    for _ in 0..300 {
        if talosconfig.is_file() && endpoints.is_file() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "ichor-talemu wrote no talosconfig within 30s");
    let text = std::fs::read_to_string(&talosconfig).unwrap();
    assert!(text.contains("127.0.0.61:"), "{text}");
    assert!(
        !text.contains("127.0.0.62:"),
        "a worker is no endpoint: {text}"
    );

    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(Tool::Talosctl.path())
            .arg("--talosconfig")
            .arg(&talosconfig)
            .arg("version")
            .env_remove("TALOSCONFIG")
            .env("HOME", dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("NODE:        127.0.0.61"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("NODE:        127.0.0.62"),
        "{stdout}\n{stderr}"
    );
    child.kill().await.unwrap();
}

/// A second run with the same state dir reuses the CA: the first talosconfig still works.
#[tokio::test(flavor = "multi_thread")]
async fn serve_reuses_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cp = crate::common::fixtures_dir().join("stability-v1.12/base-controlplane.yaml");
    let run = |port: &'static str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor-talemu"))
            .args([
                "serve",
                "--first-address",
                "127.0.0.63",
                "--first-port",
                port,
            ])
            .arg("--config")
            .arg(&cp)
            .arg("--state-dir")
            .arg(&state)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let wait_for = |path: std::path::PathBuf| async move {
        for _ in 0..300 {
            if path.is_file() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} not written within 30s", path.display());
    };
    let mut first = run("0");
    wait_for(state.join("endpoints.txt")).await;
    let ca = std::fs::read_to_string(state.join("ca.crt")).unwrap();
    first.kill().await.unwrap();
    std::fs::remove_file(state.join("endpoints.txt")).unwrap();
    let mut second = run("0");
    wait_for(state.join("endpoints.txt")).await;
    assert_eq!(std::fs::read_to_string(state.join("ca.crt")).unwrap(), ca);
    second.kill().await.unwrap();
}
