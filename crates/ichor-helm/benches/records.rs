//! Release records at the real Cilium release's size, on criterion (it
//! prints figures and judges nothing): the real Cilium chart from the tools
//! cache (`tools/testbin.sh`) rendered by real helm v4 as Ichor renders it,
//! stored as 100 revisions on the test control plane; encoding and decoding
//! one record, and reading the history and the deployed revision through
//! Ichor, against `helm history` and `helm get manifest` (v3 and v4) on the
//! same records. Leaves the rows of `make bench`'s table. Run it with
//!
//! ```text
//! cargo bench -p ichor-helm --bench records
//! ```

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use criterion::Criterion;
use ichor_helm::record::{decode_release, encode_release};
use ichor_helm::{ChartRef, SecretStorage, Status};
use ichor_testenv::bench::{Figure, criterion_dir, duration, mean_ns, record};
use ichor_testenv::{TestEnv, Tool};
use serde_json::json;

const REVISIONS: u32 = 100;
/// The record-read goal (docs/benchmarks.md): at least this many times faster than helm.
const GOAL_RATIO: f64 = 5.0;
/// Runs of each helm command; their mean is the peer's figure (each run is
/// a process reading and decoding all 100 records).
const HELM_RUNS: u32 = 3;

/// The real Cilium release as Ichor renders it: the pinned chart, values
/// like the ones Ichor sets (kube-proxy replacement through KubePrism).
async fn cilium_release(home: &HelmHome) -> ichor_helm::Release {
    let chart = ichor_testenv::tools::require_cilium_chart();
    let mut rel = home
        .renderer(Tool::Helm4)
        .render(
            "cilium",
            "kube-system",
            &ChartRef::path(chart),
            &json!({
                "ipam": {"mode": "kubernetes"},
                "kubeProxyReplacement": true,
                "k8sServiceHost": "localhost",
                "k8sServicePort": 7445,
                "securityContext": {"capabilities": {
                    "ciliumAgent": ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"],
                    "cleanCiliumState": ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"]
                }},
                "cgroup": {"autoMount": {"enabled": false}, "hostRoot": "/sys/fs/cgroup"}
            }),
        )
        .await
        .expect("real helm renders the real Cilium chart");
    rel.name = "cilium".into();
    rel.namespace = "kube-system".into();
    rel
}

/// The mean wall time of `HELM_RUNS` runs of `f`.
fn mean_of_runs(mut f: impl FnMut()) -> f64 {
    f(); // warm the page cache and helm's own caches
    let start = Instant::now();
    for _ in 0..HELM_RUNS {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(HELM_RUNS)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let env = TestEnv::shared();
    let home = HelmHome::new();
    let base = rt.block_on(cilium_release(&home));
    let manifest_len = base.manifest.len();
    let json_len = serde_json::to_vec(&base).unwrap().len();
    let encoded = encode_release(&base).unwrap();
    println!(
        "record: the real Cilium {} release, manifest {} KiB, JSON {} KiB, stored base64(gzip) {} KiB",
        ichor_testenv::tools::cilium_version(),
        manifest_len / 1024,
        json_len / 1024,
        encoded.len() / 1024
    );

    let releases: Vec<_> = (1..=REVISIONS)
        .map(|v| {
            let mut r = base.clone();
            r.version = v;
            let s = if v == REVISIONS {
                Status::Deployed
            } else {
                Status::Superseded
            };
            r.set_status(s, "bench");
            r
        })
        .collect();
    let ns = rt.block_on(env.namespace("bench"));
    let storage = SecretStorage::new(rt.block_on(env.client()), &ns);
    for r in &releases {
        rt.block_on(storage.create(r)).unwrap();
    }

    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut g = c.benchmark_group("records");
    g.bench_function("encode", |b| {
        b.iter(|| encode_release(std::hint::black_box(&releases[0])).unwrap())
    });
    g.bench_function("decode", |b| {
        b.iter(|| decode_release(std::hint::black_box(encoded.as_bytes()), "bench").unwrap())
    });
    g.bench_function("history-100", |b| {
        b.iter(|| {
            let h = rt.block_on(storage.history("cilium")).unwrap();
            assert_eq!(h.len(), REVISIONS as usize);
            h
        })
    });
    // The history as it was read before the protobuf list: the
    // JSON list through kube's typed API, then the same decode.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(rt.block_on(env.client()), &ns);
    let selector =
        kube::api::ListParams::default().labels(&ichor_helm::storage::release_selector("cilium"));
    g.bench_function("history-100-json", |b| {
        b.iter(|| {
            let list = rt.block_on(secrets.list(&selector)).unwrap();
            let mut h: Vec<_> = list
                .items
                .iter()
                .map(|s| ichor_helm::record::from_secret(s).unwrap())
                .collect();
            h.sort_by_key(|r| r.version);
            assert_eq!(h.len(), REVISIONS as usize);
            h
        })
    });
    g.bench_function("deployed-100", |b| {
        b.iter(|| {
            let d = rt.block_on(storage.deployed("cilium")).unwrap().unwrap();
            assert_eq!(d.manifest.len(), manifest_len);
            d
        })
    });
    g.finish();
    c.final_summary();

    let size = format!(
        "{REVISIONS} revisions of the real Cilium release ({} KiB manifest, {} KiB record)",
        manifest_len / 1024,
        json_len / 1024
    );
    let mut figures = Vec::new();
    if let (Some(enc), Some(dec)) = (mean_ns("records", "encode"), mean_ns("records", "decode")) {
        figures.push(Figure::alone(
            format!(
                "record encode, one Cilium-size record ({} KiB)",
                json_len / 1024
            ),
            "-",
            duration(enc),
            None,
        ));
        figures.push(Figure::alone(
            format!(
                "record decode, one Cilium-size record ({} KiB)",
                json_len / 1024
            ),
            "-",
            duration(dec),
            None,
        ));
    }
    if let Some(json) = mean_ns("records", "history-100-json") {
        figures.push(Figure::alone(
            format!("history through the JSON list (before the protobuf list), {size}"),
            "-",
            duration(json),
            None,
        ));
    }
    for (id, what, command, args) in [
        (
            "history-100",
            "history",
            "history",
            vec![
                "history",
                "cilium",
                "--namespace",
                &ns,
                "--max",
                "1000",
                "--output",
                "json",
            ],
        ),
        (
            "deployed-100",
            "deployed manifest",
            "get manifest",
            vec!["get", "manifest", "cilium", "--namespace", &ns],
        ),
    ] {
        let Some(ours) = mean_ns("records", id) else {
            continue;
        };
        for tool in [Tool::Helm3, Tool::Helm4] {
            let theirs = mean_of_runs(|| {
                let out = home.run(tool, &args);
                assert!(!out.is_empty());
            });
            figures.push(Figure::against_peer(
                format!("{what}, {size}"),
                ours,
                theirs,
                &format!("helm {} {command}", tool.version()),
                GOAL_RATIO,
            ));
        }
    }
    record("records", &figures);
}
