//! The values hash on criterion (no timing assertions): the hash of the
//! effective Cilium values of a cluster, which the controller computes for
//! every cluster it reconciles to tell whether the deployed release has its
//! values. Leaves its row of `make bench`'s table.
//!
//! Run: `cargo bench -p ichor-cilium --bench values`.

use std::time::Duration;

use criterion::Criterion;
use ichor_cilium::values::{ClusterSettings, effective_values, values_hash};
use ichor_cilium::{KubeProxyMode, Tunnel};
use ichor_testenv::bench::{Figure, criterion_dir, duration, mean_ns, record};
use serde_json::json;

fn main() {
    let user = json!({
        "hubble": {"relay": {"enabled": true}, "ui": {"enabled": true}},
        "bpf": {"masquerade": true},
        "operator": {"replicas": 2, "tolerations": [{"operator": "Exists"}]},
    });
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Replaced, 50)
        .with_user_values(user.as_object().unwrap().clone());
    let values = effective_values(&settings).expect("the values are Ichor's own");
    let bytes = serde_json::to_vec(&values).unwrap().len();

    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    c.benchmark_group("values").bench_function("hash", |b| {
        b.iter(|| values_hash(std::hint::black_box(&values)))
    });
    c.final_summary();

    if let Some(ns) = mean_ns("values", "hash") {
        record(
            "values",
            &[Figure::alone(
                format!("values hash, a cluster's effective Cilium values ({bytes} bytes of JSON)"),
                "-",
                duration(ns),
                None,
            )],
        );
    }
}
