//! Bench: a 100-node concurrent sweep (Version + Get machineconfig) with
//! Ichor's client against the emulator, through one control-plane endpoint
//! (routing with `node` metadata) and through each node's own endpoint.
//! Prints figures; asserts nothing about time.
//!
//! Run: `cargo bench -p ichor-talemu --bench sweep`

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ichor_talemu::{Emulator, NodeSpec};
use ichor_talos_client::{ClientOptions, TalosClient};

const NODES: usize = 100;
const ROUNDS: usize = 5;

fn fixture(rel: &str) -> Vec<u8> {
    ichor_testenv::fixtures::talos_bytes(rel)
}

async fn sweep(client: &TalosClient, nodes: &[String]) -> Duration {
    let start = Instant::now();
    let results = client
        .on_nodes(nodes, |c, node| async move {
            let v = c.version(&node).await?;
            let cfg = c.machine_config(&node).await?;
            Ok::<_, ichor_talos_client::Error>((v.tag, cfg.len()))
        })
        .await;
    for (node, r) in &results {
        if let Err(e) = r {
            panic!("{node}: {e}");
        }
    }
    start.elapsed()
}

fn report(label: &str, times: &[Duration]) {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mean = sorted.iter().sum::<Duration>() / u32::try_from(sorted.len()).unwrap_or(1);
    println!(
        "{label}: {NODES} nodes x (Version + Get machineconfig), {} rounds: min {:?}, mean {:?}, max {:?} ({:.0} node-sweeps/s at the mean)",
        sorted.len(),
        sorted[0],
        mean,
        sorted[sorted.len() - 1],
        NODES as f64 / mean.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let cp = fixture("stability-v1.12/base-controlplane.yaml");
    let worker = fixture("stability-v1.12/base-worker.yaml");
    let mut specs = Vec::new();
    for i in 0..NODES {
        let address = IpAddr::V4(Ipv4Addr::new(127, 0, 2, u8::try_from(i + 1).unwrap()));
        let (name, cfg) = if i == 0 {
            ("cp-1".to_string(), cp.clone())
        } else {
            (format!("w-{i}"), worker.clone())
        };
        specs.push(NodeSpec::new(name, cfg).with_address(address));
    }
    let emu = Emulator::start(specs).await.expect("emulator");
    let addresses: Vec<String> = emu.nodes().iter().map(|n| n.address.to_string()).collect();
    for concurrency in [1, 16, 64] {
        let options = ClientOptions {
            concurrency,
            ..ClientOptions::default()
        };
        let client = emu
            .client(0, &ichor_talemu::ClientCertSpec::admin(), options)
            .expect("client");
        sweep(&client, &addresses).await; // warm-up (connection)
        let mut times = Vec::new();
        for _ in 0..ROUNDS {
            times.push(sweep(&client, &addresses).await);
        }
        report(
            &format!("through one control-plane endpoint, concurrency {concurrency}"),
            &times,
        );
    }
    // One client per node endpoint (a connection each), 16 at a time.
    let clients: Vec<TalosClient> = (0..NODES)
        .map(|i| emu.admin_client(i).expect("client"))
        .collect();
    let mut times = Vec::new();
    for _ in 0..=ROUNDS {
        let start = Instant::now();
        let results = futures::future::join_all(clients.iter().map(|c| async move {
            c.version("").await?;
            c.machine_config("").await
        }))
        .await;
        assert!(results.iter().all(Result::is_ok));
        times.push(start.elapsed());
    }
    report(
        "a client per node endpoint, all at once (first round includes TLS handshakes)",
        &times,
    );
    emu.shutdown().await;
}
