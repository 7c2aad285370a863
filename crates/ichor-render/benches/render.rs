//! Render + drift per machine, both config shapes, on criterion (no timing
//! assertions anywhere). Run: `cargo bench -p ichor-render --bench render`.
//! Measures, per fixture, one render, one drift comparison, and both as the
//! controller runs them per machine and reconcile (`render_machine_from`:
//! the render, the config's digest, the drift, from the mappings the read
//! of the node's config kept), for a machine whose node differs from the
//! render and for a converged one, and the read itself; leaves two rows of
//! `make bench`'s table: machines per second on one core, goal 50,000. Times are
//! the bench thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time:
//! on a shared machine the wall time also counts the waits for a core.

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Duration;

use criterion::Criterion;
use criterion::Throughput;
use criterion::measurement::{Measurement, ValueFormatter};
use ichor_testenv::bench::{Figure, criterion_dir, duration, mean_ns, record};

use ichor_api::{
    ClusterNetwork, ClusterRef, CniPreset, CniSpec, KubeProxyMode, MachinePatch, MachineRole,
    SecretsRef, TalosClusterSpec, TalosMachineSpec,
};
use ichor_render::{RenderInput, compare, render, render_machine_from};
use ichor_talos::config::ParsedConfig;

/// The allocator of the `ichor` binary, which runs the controller's renders.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The render + drift goal (docs/benchmarks.md): this many machines per second on one core.
const GOAL_PER_SECOND: f64 = 50_000.0;

/// The CPU time of the bench's thread: the figure is "on one core", and on
/// a machine shared with other work the wall time also counts the time the
/// thread waited for a core.
struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// Nanoseconds, shown in the unit that suits them.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = match typical {
            t if t < 1e3 => (1.0, "ns (cpu)"),
            t if t < 1e6 => (1e3, "µs (cpu)"),
            t if t < 1e9 => (1e6, "ms (cpu)"),
            _ => (1e9, "s (cpu)"),
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(&self, _: f64, _: &Throughput, _: &mut [f64]) -> &'static str {
        "(no throughput)"
    }
    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns (cpu)"
    }
}

fn main() {
    let mut c = Criterion::default()
        .with_measurement(ThreadCpu)
        .output_directory(&criterion_dir())
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut ids = Vec::new();
    let shared = ichor_testenv::fixtures::talos_dir();
    let own = ichor_testenv::fixtures::cni_none_dir();
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
        backup: None,
        maintenance_windows: Vec::new(),
        alertmanager: None,
        apply_mode: None,
        try_timeout: None,
        revisions_kept: None,
    };
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read fixture");
        // As the controller reads a node: the typed config and the mappings it was decoded from.
        let parsed = ParsedConfig::parse_with_origin(&text, "fixture").expect("parse");
        let live = &parsed.config;
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
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        };
        let input = RenderInput {
            machine_name: "bench",
            cluster: &cluster,
            cni_handover: true,
            machine: &machine,
            live,
            inline_cni: None,
            taken_over_inline: None,
        };
        let desired = render(&input).expect("render");
        let entries = compare(live, &desired.config).expect("drift").entries.len();
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shape = if f.to_string_lossy().contains("1.14") {
            "v1.14"
        } else {
            "v1.12"
        };
        let stem = name.trim_end_matches(".yaml");
        let id = if stem.starts_with(shape) {
            stem.to_string()
        } else {
            format!("{shape}-{stem}")
        };
        let mut group = c.benchmark_group("render-drift");
        group.bench_function(format!("render/{id}"), |b| {
            b.iter(|| render(std::hint::black_box(&input)).expect("render"))
        });
        group.bench_function(format!("drift/{id}"), |b| {
            b.iter(|| compare(live, std::hint::black_box(&desired.config)).expect("drift"))
        });
        // What the controller runs per machine and reconcile
        // (`decide_apply`): render, the digest, the drift (the YAML only for
        // an apply), from the mappings the read of the node's config kept.
        group.bench_function(format!("both/{id}"), |b| {
            b.iter(|| {
                render_machine_from(std::hint::black_box(&input), &parsed.mappings).expect("render")
            })
        });
        // A machine already converged: the node runs the desired config
        // (what Ichor applied), so the render finds no drift. Most
        // reconciles of a fleet are this one.
        let converged_text = desired.yaml().expect("yaml");
        let converged =
            ParsedConfig::parse_with_origin(&converged_text, "converged").expect("parse");
        let converged_input = RenderInput {
            live: &converged.config,
            ..input
        };
        let converged_entries = render_machine_from(&converged_input, &converged.mappings)
            .expect("render")
            .drift
            .entries
            .len();
        assert_eq!(
            converged_entries, 0,
            "{id}: a converged machine has no drift"
        );
        group.bench_function(format!("converged/{id}"), |b| {
            b.iter(|| {
                render_machine_from(std::hint::black_box(&converged_input), &converged.mappings)
                    .expect("render")
            })
        });
        // The read of the node's config itself (YAML text to typed config
        // and mappings), which every reconcile pays before the render.
        group.bench_function(format!("read/{id}"), |b| {
            b.iter(|| ParsedConfig::parse_with_origin(std::hint::black_box(&text), "fixture"))
        });
        group.finish();
        ids.push((id, entries));
    }
    c.final_summary();

    println!(
        "\n{:<36} {:>10} {:>10} {:>10} {:>12} {:>10} {:>12} {:>10} {:>8}",
        "fixture",
        "render",
        "drift",
        "both",
        "machines/s",
        "converged",
        "machines/s",
        "read",
        "entries"
    );
    // (fixture, µs) of the slowest machine with drift and the slowest converged one
    let mut slowest: Option<(String, f64)> = None;
    let mut slowest_converged: Option<(String, f64)> = None;
    for (id, entries) in &ids {
        let (Some(r), Some(d), Some(both), Some(conv), Some(read)) = (
            mean_ns("render-drift", &format!("render_{id}")),
            mean_ns("render-drift", &format!("drift_{id}")),
            mean_ns("render-drift", &format!("both_{id}")),
            mean_ns("render-drift", &format!("converged_{id}")),
            mean_ns("render-drift", &format!("read_{id}")),
        ) else {
            continue;
        };
        println!(
            "{id:<36} {:>10} {:>10} {:>10} {:>12.0} {:>10} {:>12.0} {:>10} {entries:>8}",
            duration(r),
            duration(d),
            duration(both),
            1e9 / both,
            duration(conv),
            1e9 / conv,
            duration(read),
        );
        if slowest.as_ref().is_none_or(|(_, s)| both > *s) {
            slowest = Some((id.clone(), both));
        }
        if slowest_converged.as_ref().is_none_or(|(_, s)| conv > *s) {
            slowest_converged = Some((id.clone(), conv));
        }
    }
    let figure = |what: &str, (id, ns): (String, f64)| {
        let per_second = 1e9 / ns;
        Figure::alone(
            format!(
                "render + drift per machine as the controller runs it (render, digest, drift), {what}, one core, thread CPU time (slowest fixture: {id})"
            ),
            "≥ 50,000 machines/s",
            format!("{per_second:.0} machines/s ({} each)", duration(ns)),
            Some(per_second >= GOAL_PER_SECOND),
        )
    };
    let mut figures = Vec::new();
    if let Some(s) = slowest {
        figures.push(figure(
            "a machine whose node differs from the render (the first render after a change)",
            s,
        ));
    }
    if let Some(s) = slowest_converged {
        figures.push(figure("a converged machine (the node runs the render)", s));
    }
    record("render", &figures);
}
