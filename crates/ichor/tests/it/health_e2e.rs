//! `talosctl health` after `ichor adopt`: what Ichor did (Cilium as its
//! release, Ichor installed, the machines adopted and released) leaves a
//! cluster the real talosctl judges healthy; the lab played the nodes, the
//! control-plane static pods and the kubelets.

use std::time::Duration;

use ichor_testenv::Tool;

use crate::common::{LabHarness, run, text};

/// Covers: R9.3 (the lab's nodes answer `talosctl health` as Talos nodes
/// do, after adopt, on three control planes)
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_health_passes_after_adopt_on_three_control_planes() {
    let h = LabHarness::up(|o| {
        o.nodes = 4;
        o.control_planes = 3;
        o.components = true;
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));

    let health = tokio::process::Command::new(Tool::Talosctl.path())
        .arg("--talosconfig")
        .arg(&h.lab.talosconfig)
        .args(["health", "--server=false", "--wait-timeout", "3m"])
        .env_remove("TALOSCONFIG")
        .env("HOME", h.lab.state_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), health)
        .await
        .expect("talosctl health ends within its wait timeout")
        .expect("talosctl runs");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    for check in [
        "waiting for etcd to be healthy: OK",
        "waiting for etcd members to be control plane nodes: OK",
        "waiting for kubelet to be healthy: OK",
        "waiting for all k8s nodes to report: OK",
        "waiting for all control plane components to be ready: OK",
    ] {
        assert!(said.contains(check), "{check:?} missing:\n{said}");
    }
}
