//! The machines page for 1,000 machines, rendered on the server: the view
//! (search, filters, counts) and the HTML. Goal: under 50 ms (docs/benchmarks.md).

// Benches print their figures (the workspace's print lint allows benches).
#![allow(clippy::print_stdout)]

use std::sync::Arc;

use criterion::Criterion;
use ichor_api::{
    ClusterRef, DriftClass, DriftEntry, MachineRole, TalosMachine, TalosMachineSpec,
    TalosMachineStatus,
};
use ichor_ui::html::{self, Viewer};
use ichor_ui::view::{self, Inventory, MachineQuery};

fn machine(i: usize) -> Arc<TalosMachine> {
    let mut m = TalosMachine::new(
        &format!("node-{i:04}"),
        TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: format!("cluster-{}", i % 10),
            },
            role: if i % 10 < 3 {
                MachineRole::Controlplane
            } else {
                MachineRole::Worker
            },
            address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
            hold: i.is_multiple_of(4),
            patches: vec![],
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        },
    );
    m.metadata.namespace = Some("fleet".into());
    let drift = (0..i % 4)
        .map(|k| DriftEntry {
            path: format!("machine.nodeLabels.label-{k}"),
            class: [DriftClass::A, DriftClass::B, DriftClass::C][k % 3],
            live: Some(format!("old-{k}")),
            desired: Some(format!("new-{k}")),
            reason: Some("node labels are applied without a reboot".into()),
        })
        .collect();
    m.status = Some(TalosMachineStatus {
        config_hash: Some(format!("{i:064x}")),
        drift,
        talos_version: Some("v1.13.0".into()),
        ..TalosMachineStatus::default()
    });
    Arc::new(m)
}

fn bench(c: &mut Criterion) {
    let inv = Inventory {
        machines: (0..1000).map(machine).collect(),
        ..Inventory::default()
    };
    let viewer = Viewer {
        user: Some("system:serviceaccount:ichor-system:admin".into()),
        read_only: false,
        reads_nothing: false,
    };
    let mut group = c.benchmark_group("ui");
    group.bench_function("machines_page_1000", |b| {
        b.iter(|| {
            let page = view::machines_page(&inv, MachineQuery::default());
            html::machines(&page, &viewer).into_string()
        })
    });
    group.bench_function("machines_page_1000_filtered", |b| {
        b.iter(|| {
            let query = MachineQuery {
                q: "node-0".into(),
                drifted: "yes".into(),
                ..MachineQuery::default()
            };
            let page = view::machines_page(&inv, query);
            html::machines(&page, &viewer).into_string()
        })
    });
    group.finish();
}

/// The machines-page goal (docs/benchmarks.md).
const GOAL_NS: f64 = 50e6;

/// Prints the figures and records them for the table (docs/benchmarks.md).
fn report() {
    use ichor_testenv::bench::{Figure, duration, mean_ns, record};
    let mut figures = Vec::new();
    for (id, what) in [
        (
            "machines_page_1000",
            "machines page, 1,000 machines, no filter",
        ),
        (
            "machines_page_1000_filtered",
            "machines page, 1,000 machines, search + drifted filter",
        ),
    ] {
        if let Some(ns) = mean_ns("ui", id) {
            println!("{what:<56} {}", duration(ns));
            figures.push(Figure::alone(
                format!("{what}: view + HTML on the server"),
                "< 50 ms",
                duration(ns),
                Some(ns < GOAL_NS),
            ));
        }
    }
    record("ui", &figures);
}

fn main() {
    let mut c = Criterion::default()
        .output_directory(&ichor_testenv::bench::criterion_dir())
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
    report();
}
