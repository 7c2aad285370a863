//! The controller at scale, each part in its own process: the test control
//! plane (ichor-testenv's kube-apiserver + etcd), the Talos nodes (one
//! `ichor-talemu serve` process emulating every node, one loopback address
//! and port each) and the controller (the release `ichor controller`
//! binary, with a client certificate of its own so the API server's audit
//! log tells its requests apart). For each size N TalosMachines over C
//! clusters (default 1,000/10 and 5,000/50):
//!
//! - the time from the controller's start until every machine's status
//!   shows its drift (Ready, observedGeneration current), and until every
//!   cluster shows all its machines Ready;
//! - then 60 s of steady state with nothing changing: the controller's CPU
//!   seconds (`/proc/<pid>/stat`) and API requests (audit log);
//! - one cluster-wide change (the Kubernetes version of a TalosCluster with
//!   N/C machines) until each of its machines shows the new drift;
//! - the controller's own peak RSS (`VmHWM`), and the emulator's.
//!
//! A whole-system measurement, so a plain `harness = false` binary that
//! prints a table (criterion's statistics need many short iterations).
//! It asserts nothing about time.
//!
//! ```text
//! cargo build --release -p ichor --bin ichor -p ichor-talemu --bin ichor-talemu
//! cargo bench -p ichor-controller --bench convergence
//! ```
//!
//! `ICHOR_BENCH_SIZES=1000/10,5000/50` (machines/clusters, comma-separated),
//! `ICHOR_BENCH_STEADY_SECS=60`, `ICHOR_BIN` and `ICHOR_TALEMU_BIN` (default
//! `target/release/…`).

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;

/// The controller's user name in the audit log (its client certificate's CN).
const CONTROLLER_USER: &str = "ichor-bench-controller";
/// How long a size may take to converge before the bench gives up on it.
const BOUND: Duration = Duration::from_secs(1800);

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

fn release_binary(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/release/{name}"))
    })
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name is in parentheses and may hold spaces: count from after it.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    (tick(11).unwrap_or(0.0) + tick(12).unwrap_or(0.0)) / ticks_per_second
}

fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

/// The controller's requests so far, by verb and resource.
fn controller_requests(env: &TestEnv) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for e in env.audit_events() {
        if e.user.username != CONTROLLER_USER {
            continue;
        }
        let resource = e
            .object_ref
            .as_ref()
            .and_then(|o| o.get("resource"))
            .and_then(|r| r.as_str())
            .unwrap_or("-")
            .to_owned();
        let sub = e
            .object_ref
            .as_ref()
            .and_then(|o| o.get("subresource"))
            .and_then(|r| r.as_str())
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        *by.entry(format!("{} {resource}{sub}", e.verb)).or_insert(0) += 1;
    }
    by
}

fn difference(after: &BTreeMap<String, usize>, before: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| format!("{k}: {d}"))
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

fn total(m: &BTreeMap<String, usize>) -> usize {
    m.values().sum()
}

/// A kubeconfig for the controller: the admin's, with a client certificate
/// of its own (group system:masters).
fn controller_kubeconfig(env: &TestEnv, dir: &Path) -> PathBuf {
    let cert = env.ca().issue_client(CONTROLLER_USER, &["system:masters"]);
    std::fs::write(dir.join("controller.crt"), &cert.cert_pem).unwrap();
    std::fs::write(dir.join("controller.key"), &cert.key_pem).unwrap();
    let admin = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let mut doc: serde_json::Value = serde_yaml_ng::from_str(&admin).unwrap();
    doc["users"][0]["user"] = json!({
        "client-certificate": dir.join("controller.crt"),
        "client-key": dir.join("controller.key"),
    });
    let path = dir.join("controller.kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    path
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ichor-talemu serve` with `n` worker nodes whose CA is the bundle's
/// OS CA; returns the process and each node's endpoint.
async fn start_emulator(n: usize, bundle_text: &str, dir: &Path) -> (Child, Vec<String>) {
    let bundle = ichor_talos::secrets::SecretsBundle::parse(bundle_text, "fixture").unwrap();
    let (crt, key) = bundle.os_ca_pem().unwrap();
    let state = dir.join("talemu");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("ca.crt"), crt).unwrap();
    std::fs::write(state.join("ca.key"), key).unwrap();
    let endpoints_file = state.join("endpoints.txt");
    let _ = std::fs::remove_file(&endpoints_file);
    let bin = release_binary("ICHOR_TALEMU_BIN", "ichor-talemu");
    let child = ichor_testenv::command_dying_with_parent(&bin)
        .args([
            "serve",
            "--nodes",
            &n.to_string(),
            "--talos-version",
            "v1.12.1",
        ])
        .arg("--config")
        .arg(ichor_testenv::fixtures::cni_none_dir().join("v1.12-cni-none-worker.yaml"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("talemu.log")).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let child = Child(child);
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&endpoints_file) {
            let endpoints: Vec<String> = text
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
                .collect();
            if endpoints.len() == n {
                return (child, endpoints);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the emulator did not start {n} nodes; see {}",
            dir.join("talemu.log").display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn converged(m: &TalosMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.observed_generation == m.metadata.generation
            && !s.drift.is_empty()
            && conditions::is_true(&s.conditions, types::READY)
    })
}

/// Waits until `pred` holds for `want` machines of the store; returns the
/// time from `since`.
async fn wait_for(
    store: &Store<TalosMachine>,
    want: usize,
    since: Instant,
    what: &str,
    pred: impl Fn(&TalosMachine) -> bool,
) -> Duration {
    loop {
        let done = store.state().iter().filter(|m| pred(m)).count();
        if done >= want {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < BOUND,
            "{what}: {done} of {want} within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One row of the table.
struct Row {
    machines: usize,
    clusters: usize,
    converge: Duration,
    converge_load: String,
    clusters_ready: Duration,
    converge_cpu: f64,
    converge_requests: usize,
    steady_secs: u64,
    steady_cpu: f64,
    steady_requests: String,
    steady_request_count: usize,
    steady_load: String,
    quiet_secs: u64,
    quiet_cpu: f64,
    quiet_requests: usize,
    change_machines: usize,
    change: Duration,
    change_requests: usize,
    change_load: String,
    controller_hwm_mib: u64,
    emulator_hwm_mib: u64,
}

async fn measure(env: &TestEnv, machines_n: usize, clusters_n: usize, steady: Duration) -> Row {
    let client = env.client().await;
    let ns = env.namespace("scale").await;
    let dir = tempfile::tempdir().unwrap();
    let bundle_text = ichor_testenv::fixtures::talos("stability-secrets.yaml");
    let (emulator, endpoints) = start_emulator(machines_n, &bundle_text, dir.path()).await;

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
        clusters.create(&PostParams::default(), &obj).await.unwrap();
    }
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    futures::stream::iter(endpoints.iter().enumerate())
        .map(|(i, endpoint)| {
            let machines = machines.clone();
            let m: TalosMachine = serde_json::from_value(json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                "metadata": {"name": format!("m-{i}"), "namespace": ns},
                "spec": {"clusterRef": {"name": format!("c-{}", i % clusters_n)}, "role": "worker",
                    "address": endpoint, "hold": true,
                    "patches": [{"name": "labels", "inline": "machine:\n  nodeLabels:\n    bench: \"yes\"\n"}]}
            }))
            .unwrap();
            async move { machines.create(&PostParams::default(), &m).await.unwrap() }
        })
        .buffer_unordered(16)
        .for_each(|_| async {})
        .await;

    // The bench's own view: one watch, read locally (no polling lists).
    let (store, writer) = reflector::store();
    let watch = tokio::spawn(
        watcher(machines.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|_| async {}),
    );
    store.wait_until_ready().await.unwrap();

    let ticks = ticks_per_second();
    let kubeconfig = controller_kubeconfig(env, dir.path());
    let bin = release_binary("ICHOR_BIN", "ichor");
    let requests_before = controller_requests(env);
    let started = Instant::now();
    let controller = ichor_testenv::command_dying_with_parent(&bin)
        .args(["controller", "--no-leader-election", "--namespace", &ns])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("controller.log")).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let controller = Child(controller);
    let pid = controller.0.id();

    let converge = wait_for(&store, machines_n, started, "converged", converged).await;
    let converge_load = load_average();
    // The clusters aggregate their machines' Ready a moment later; the
    // steady state starts once every cluster shows all its machines Ready.
    loop {
        let ready = clusters
            .list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|c| {
                c.status.as_ref().is_some_and(|s| {
                    s.observed_generation == c.metadata.generation
                        && conditions::is_true(&s.conditions, types::READY)
                })
            })
            .count();
        if ready == clusters_n {
            break;
        }
        assert!(
            started.elapsed() < BOUND,
            "clusters Ready: {ready} of {clusters_n}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let clusters_ready = started.elapsed();
    let converge_cpu = cpu_seconds(pid, ticks);
    let after_converge = controller_requests(env);
    let converge_requests = total(&after_converge) - total(&requests_before);

    // Steady state: nothing changes.
    let cpu0 = cpu_seconds(pid, ticks);
    let before = controller_requests(env);
    // The first seconds may still hold the last clusters' settling writes:
    // the rest of the window is counted on its own too.
    let settle = Duration::from_secs(10).min(steady / 2);
    tokio::time::sleep(settle).await;
    let settled = controller_requests(env);
    let settled_cpu = cpu_seconds(pid, ticks);
    tokio::time::sleep(steady - settle).await;
    let steady_cpu = cpu_seconds(pid, ticks) - cpu0;
    let quiet_cpu = cpu_seconds(pid, ticks) - settled_cpu;
    let after = controller_requests(env);
    let quiet_requests = total(&after) - total(&settled);
    let quiet_secs = (steady - settle).as_secs();
    let steady_load = load_average();

    // One cluster-wide change: c-0's Kubernetes version.
    let members: Vec<String> = (0..machines_n)
        .filter(|i| i % clusters_n == 0)
        .map(|i| format!("m-{i}"))
        .collect();
    let changed_at = Instant::now();
    clusters
        .patch(
            "c-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.29.0"}})),
        )
        .await
        .unwrap();
    let change = wait_for(&store, members.len(), changed_at, "new drift", |m| {
        members
            .iter()
            .any(|n| m.metadata.name.as_deref() == Some(n))
            && m.status.as_ref().is_some_and(|s| {
                s.drift
                    .iter()
                    .any(|e| e.desired.as_deref().is_some_and(|d| d.contains("v1.29.0")))
            })
    })
    .await;
    let change_load = load_average();
    let after_change = controller_requests(env);

    let controller_hwm_mib = status_kib(pid, "VmHWM:") / 1024;
    let emulator_hwm_mib = status_kib(emulator.0.id(), "VmHWM:") / 1024;
    drop(controller);
    drop(emulator);
    watch.abort();
    Row {
        machines: machines_n,
        clusters: clusters_n,
        converge,
        converge_load,
        clusters_ready,
        converge_cpu,
        converge_requests,
        steady_secs: steady.as_secs(),
        steady_cpu,
        steady_request_count: total(&after) - total(&before),
        steady_requests: difference(&after, &before),
        steady_load,
        quiet_secs,
        quiet_cpu,
        quiet_requests,
        change_machines: members.len(),
        change,
        change_requests: total(&after_change) - total(&after),
        change_load,
        controller_hwm_mib,
        emulator_hwm_mib,
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    for (var, name) in [("ICHOR_BIN", "ichor"), ("ICHOR_TALEMU_BIN", "ichor-talemu")] {
        let bin = release_binary(var, name);
        assert!(
            bin.is_file(),
            "{} is missing: run `cargo build --release -p ichor --bin ichor -p ichor-talemu --bin ichor-talemu` first (or set {var})",
            bin.display()
        );
    }
    let sizes: Vec<(usize, usize)> = env_or("ICHOR_BENCH_SIZES", "1000/10,5000/50")
        .split(',')
        .filter_map(|s| {
            let (m, c) = s.trim().split_once('/')?;
            Some((m.parse().ok()?, c.parse::<usize>().ok()?.max(1)))
        })
        .collect();
    let steady = Duration::from_secs(env_or("ICHOR_BENCH_STEADY_SECS", "60").parse().unwrap());
    let env = TestEnv::shared();
    let client = env.client().await;
    ichor_testenv::install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let mut rows = Vec::new();
    for (m, c) in sizes {
        let row = measure(env, m, c, steady).await;
        println!(
            "{m}/{c}: converged in {:.1} s (load {}), clusters Ready at {:.1} s; steady {} s: {:.2} CPU s, requests: {} (load {}); change on {} machines: {:.1} s",
            row.converge.as_secs_f64(),
            row.converge_load,
            row.clusters_ready.as_secs_f64(),
            row.steady_secs,
            row.steady_cpu,
            row.steady_requests,
            row.steady_load,
            row.change_machines,
            row.change.as_secs_f64()
        );
        rows.push(row);
    }
    println!();
    println!(
        "| machines / clusters | converge | machines/s | clusters Ready | controller CPU to converge | requests to converge | steady CPU | steady requests | of which after the first 10 s | change (machines) | change requests | controller peak RSS | emulator peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} / {} | {:.1} s (load {}) | {:.0} | {:.1} s | {:.1} s | {} | {:.2} s in {} s (load {}) | {} | {} requests, {:.2} CPU s in {} s | {:.1} s ({}) (load {}) | {} | {} MiB | {} MiB |",
            r.machines,
            r.clusters,
            r.converge.as_secs_f64(),
            r.converge_load,
            r.machines as f64 / r.converge.as_secs_f64(),
            r.clusters_ready.as_secs_f64(),
            r.converge_cpu,
            r.converge_requests,
            r.steady_cpu,
            r.steady_secs,
            r.steady_load,
            r.steady_request_count,
            r.quiet_requests,
            r.quiet_cpu,
            r.quiet_secs,
            r.change.as_secs_f64(),
            r.change_machines,
            r.change_load,
            r.change_requests,
            r.controller_hwm_mib,
            r.emulator_hwm_mib
        );
    }
}
