//! Controller convergence at scale: N TalosMachines over C clusters (default
//! 1,000 over 10), each on its own `ichor-talemu` node, on the test control
//! plane. Measures the wall time from the controller's start until every
//! machine's status shows its drift (Ready, observedGeneration current), and
//! the process's peak RSS before and after (the emulator runs in the same
//! process, so the difference bounds the controller's share).
//!
//! `cargo bench -p ichor-controller --bench convergence`
//! (`ICHOR_BENCH_MACHINES`, `ICHOR_BENCH_CLUSTERS` to change the size).
//! A measurement, not a test: it asserts nothing about time.

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn fixture(rel: &str) -> String {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let machines_n = env_usize("ICHOR_BENCH_MACHINES", 1000);
    let clusters_n = env_usize("ICHOR_BENCH_CLUSTERS", 10).max(1);
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("bench").await;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in ichor_api::crds::all() {
        let _ = crds.create(&PostParams::default(), &crd).await;
    }
    let bundle_text = fixture("../../../shared/fixtures/talos/stability-secrets.yaml");
    let worker = fixture("../ichor-render/tests/fixtures/v1.12-cni-none-worker.yaml");
    let bundle = ichor_talos::secrets::SecretsBundle::parse(&bundle_text, "fixture").unwrap();
    let (crt, key) = bundle.os_ca_pem().unwrap();
    let nodes = (0..machines_n)
        .map(|i| NodeSpec::new(format!("n-{i}"), worker.clone()).with_version("v1.12.1"))
        .collect();
    let emu = Emulator::start_with(
        nodes,
        EmulatorOptions {
            pki: Some(Pki::from_pem(&crt, &key).unwrap()),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bundle", "namespace": ns}, "stringData": {"secrets.yaml": bundle_text}}))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    for c in 0..clusters_n {
        let obj: TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": format!("c-{c}"), "namespace": ns},
            "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
                "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
                "cni": {"preset": "cilium"}, "secretsRef": {"name": "bundle"}}
        }))
        .unwrap();
        loop {
            match clusters.create(&PostParams::default(), &obj).await {
                Ok(_) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for i in 0..machines_n {
        let m: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": format!("m-{i}"), "namespace": ns},
            "spec": {"clusterRef": {"name": format!("c-{}", i % clusters_n)}, "role": "worker",
                "address": emu.endpoint(i), "hold": true,
                "patches": [{"name": "labels", "inline": "machine:\n  nodeLabels:\n    bench: \"yes\"\n"}]}
        }))
        .unwrap();
        machines.create(&PostParams::default(), &m).await.unwrap();
    }
    let rss_before = peak_rss_kib();

    let config = ichor_controller::Config {
        namespace: Some(ns.clone()),
        system_namespace: ns.clone(),
        cilium_storage_namespace: ns.clone(),
        cilium_release_namespace: ns.clone(),
        leader_election: None,
        ..ichor_controller::Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(ichor_controller::run_with(
        client.clone(),
        config,
        async move {
            let _ = rx.await;
        },
    ));
    let bound = Duration::from_secs(1800);
    let converged = loop {
        let list = machines.list(&ListParams::default()).await.unwrap();
        let done = list
            .items
            .iter()
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.observed_generation == m.metadata.generation
                        && !s.drift.is_empty()
                        && conditions::is_true(&s.conditions, types::READY)
                })
            })
            .count();
        if done == machines_n {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "not converged within {bound:?}: {done} of {machines_n}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let rss_after = peak_rss_kib();
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    assert!(emu.writes().is_empty(), "held machines were written");
    println!(
        "convergence: {machines_n} TalosMachines over {clusters_n} clusters in {:.1} s ({:.1} machines/s); peak RSS {} MiB before the controller, {} MiB after (emulator included)",
        converged.as_secs_f64(),
        machines_n as f64 / converged.as_secs_f64(),
        rss_before / 1024,
        rss_after / 1024
    );
}
