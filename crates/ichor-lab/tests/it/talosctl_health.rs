//! The real `talosctl health --server=false` against a lab of three control
//! planes and a worker: every check it runs (etcd, apid, memory, disks,
//! diagnostics, the kubelets, the boot sequence, then through the kubeconfig
//! a control plane hands out: the Nodes, the static pods, the control-plane
//! components, kube-proxy) is answered by the emulated nodes and the lab's
//! API server. With one control plane's etcd member held down, the same
//! command fails naming it, which proves the test can fail.

use std::time::Duration;

use ichor_lab::{Lab, LabOptions};
use ichor_testenv::Tool;

async fn health(lab: &Lab, timeout: &str) -> (bool, String) {
    let out = tokio::process::Command::new(Tool::Talosctl.path())
        .arg("--talosconfig")
        .arg(&lab.talosconfig)
        .args(["health", "--server=false", "--wait-timeout", timeout])
        .env_remove("TALOSCONFIG")
        .env("HOME", lab.state_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("talosctl health ends within its wait timeout")
        .expect("talosctl runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_health_passes_on_a_lab_of_three_control_planes() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(dir.path());
    options.nodes = 4;
    options.control_planes = 3;
    options.components = true;
    let lab = Lab::up(options).await.unwrap();

    let (ok, said) = health(&lab, "3m").await;
    assert!(ok, "{said}");
    for check in [
        "waiting for etcd to be healthy: OK",
        "waiting for etcd members to be control plane nodes: OK",
        "waiting for all nodes disk sizes: OK",
        "waiting for kubelet to be healthy: OK",
        "waiting for all k8s nodes to report: OK",
        "waiting for all control plane static pods to be running: OK",
        "waiting for all control plane components to be ready: OK",
    ] {
        assert!(said.contains(check), "{check:?} missing:\n{said}");
    }

    lab.emulator.set_etcd_unhealthy(1, true);
    let (ok, said) = health(&lab, "20s").await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("service \"etcd\" not in expected state"),
        "{said}"
    );
}
