//! adopt's inspection of 50 nodes, on criterion (it prints figures and
//! judges nothing): 50 emulated Talos nodes (`ichor-talemu`, in this
//! process, each on its own loopback address, one control plane and 49
//! workers from the v1.12 fixtures in `testdata/talos`) and the test control plane with
//! the 50 Nodes. Each iteration is what one `ichor adopt` run reads before
//! it plans: a new Talos client (TLS handshake included) through the first
//! node's endpoint, every node's version, hostname and machine config (the
//! other nodes reached through it, as `talosctl -n` does), and the
//! Kubernetes side (Nodes, DaemonSets, CRDs, Helm records, Ichor's
//! presence). Leaves the row of `make bench`'s table, goal under 3 s. Run:
//!
//! ```text
//! cargo bench -p ichor-adopt-run --bench inspection
//! ```

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::Criterion;
use ichor_talemu::{ClientCertSpec, Emulator, NodeSpec};
use ichor_talos_client::ClientOptions;
use ichor_testenv::TestEnv;
use ichor_testenv::bench::{Figure, criterion_dir, duration, mean_ns, record};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

const NODES: usize = 50;
/// The inspection goal (docs/benchmarks.md): adopt's inspection of 50 nodes in under this.
const GOAL: Duration = Duration::from_secs(3);

fn fixture(rel: &str) -> Vec<u8> {
    ichor_testenv::fixtures::talos_bytes(rel)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let env = TestEnv::shared();
    let cp = fixture("stability-v1.12/base-controlplane.yaml");
    let worker = fixture("stability-v1.12/base-worker.yaml");
    let specs: Vec<NodeSpec> = (0..NODES)
        .map(|i| {
            let address = IpAddr::V4(Ipv4Addr::new(127, 0, 3, u8::try_from(i + 1).unwrap()));
            let (name, config) = if i == 0 {
                ("cp-1".to_string(), cp.clone())
            } else {
                (format!("w-{i}"), worker.clone())
            };
            NodeSpec::new(name, config).with_address(address)
        })
        .collect();
    let emu = rt
        .block_on(Emulator::start(specs))
        .expect("the emulator starts");
    let addresses: Vec<String> = emu.nodes().iter().map(|n| n.address.to_string()).collect();
    rt.block_on(async {
        let nodes: Api<Node> = Api::all(env.client().await);
        for n in emu.nodes() {
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": n.hostname},
            }))
            .expect("a Node");
            match nodes.create(&PostParams::default(), &node).await {
                Ok(_) => {}
                // a Node left by an earlier run of this bench
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("creating Node {}: {e}", n.hostname),
            }
        }
    });

    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    c.bench_function("adopt-inspection-50", |b| {
        b.iter(|| {
            rt.block_on(async {
                let talos = emu
                    .client(0, &ClientCertSpec::admin(), ClientOptions::default())
                    .expect("a Talos client");
                let kube = env.client().await;
                let (inspection, _) = ichor_adopt_run::inspect::inspect(&talos, &addresses, &kube)
                    .await
                    .expect("the inspection");
                assert_eq!(inspection.talos.len(), NODES);
                inspection
            })
        })
    });
    c.final_summary();

    if let Some(ns) = mean_ns("adopt-inspection-50", "") {
        println!("adopt's inspection of {NODES} nodes: {}", duration(ns));
        record(
            "inspection",
            &[Figure::alone(
                format!(
                    "adopt's inspection of {NODES} nodes (emulated, in process; Talos and Kubernetes sides, a new client)"
                ),
                "< 3 s",
                duration(ns),
                Some(ns < GOAL.as_nanos() as f64),
            )],
        );
    }
    rt.block_on(emu.shutdown());
}
