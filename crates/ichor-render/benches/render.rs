//! Render + drift per machine, both config shapes (a bench binary; no timing
//! assertions anywhere). Run: `cargo bench -p ichor-render --bench render`.
//! Prints, per fixture, the mean time of one render, one drift comparison,
//! and both (what the controller does per machine and reconcile).

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::time::{Duration, Instant};

use ichor_api::{
    ClusterNetwork, ClusterRef, CniPreset, CniSpec, KubeProxyMode, MachinePatch, MachineRole,
    SecretsRef, TalosClusterSpec, TalosMachineSpec,
};
use ichor_render::{RenderInput, compare, render};
use ichor_talos::config::MachineConfig;

fn time<F: FnMut()>(mut f: F) -> Duration {
    for _ in 0..10 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(300) {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn main() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/talos");
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let files = [
        shared.join("stability-v1.12/base-controlplane.yaml"),
        shared.join("stability-v1.12/base-worker.yaml"),
        shared.join("stability-v1.14/base-controlplane.yaml"),
        shared.join("stability-v1.14/base-worker.yaml"),
        own.join("v1.12-cni-none-controlplane.yaml"),
        own.join("v1.14-cni-none-controlplane.yaml"),
    ];
    let cluster = TalosClusterSpec {
        endpoint: "https://base:6443".into(),
        talos_version: "v1.12.0".into(),
        kubernetes_version: "v1.28.0".into(),
        network: ClusterNetwork::default(),
        cni: CniSpec {
            preset: CniPreset::Cilium,
            kube_proxy: KubeProxyMode::Enabled,
            ..Default::default()
        },
        secrets_ref: SecretsRef {
            name: "bundle".into(),
            key: None,
        },
    };
    println!(
        "{:<42} {:>12} {:>12} {:>12} {:>8}",
        "fixture", "render", "drift", "both", "entries"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read fixture");
        let live = MachineConfig::parse(&text).expect("parse");
        let role = if f.to_string_lossy().contains("worker") {
            MachineRole::Worker
        } else {
            MachineRole::Controlplane
        };
        let machine = TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: "base".into(),
            },
            role,
            address: "10.0.0.2".into(),
            hold: true,
            patches: vec![MachinePatch {
                name: "labels".into(),
                inline: "machine:\n  nodeLabels:\n    zone: a\n".into(),
            }],
        };
        let input = RenderInput {
            machine_name: "bench",
            cluster: &cluster,
            cni_handover: true,
            machine: &machine,
            live: &live,
            inline_cni: None,
            taken_over_inline: None,
        };
        let desired = render(&input).expect("render");
        let entries = compare(&live, &desired.config)
            .expect("drift")
            .entries
            .len();
        let r = time(|| {
            std::hint::black_box(render(std::hint::black_box(&input)).expect("render"));
        });
        let d = time(|| {
            std::hint::black_box(compare(&live, &desired.config).expect("drift"));
        });
        let both = time(|| {
            let out = render(&input).expect("render");
            std::hint::black_box(compare(&live, &out.config).expect("drift"));
        });
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shape = if f.to_string_lossy().contains("1.14") {
            "v1.14"
        } else {
            "v1.12"
        };
        println!(
            "{:<42} {r:>12?} {d:>12?} {both:>12?} {entries:>8}",
            format!("{shape} {name}")
        );
    }
}
