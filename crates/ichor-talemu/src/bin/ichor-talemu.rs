//! `ichor-talemu serve`: runs emulated Talos nodes until interrupted and
//! writes a talosconfig for them. For tests and the lab only.

// This binary speaks to the person who runs it on stdout/stderr; it has
// no printer module of its own (the print lint forbids printing in libraries).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ichor_talemu::{ClientCertSpec, Emulator, EmulatorOptions, NodeSpec, Pki};

#[derive(Parser)]
#[command(
    name = "ichor-talemu",
    about = "Talos node emulator (tests and lab only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve N emulated nodes until Ctrl-C.
    Serve {
        /// How many nodes.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// The Talos version the nodes report.
        #[arg(long, default_value = "v1.13.9")]
        talos_version: String,
        /// Machine config files; node i gets file i modulo their count.
        /// Without any, the nodes start in maintenance mode.
        #[arg(long = "config")]
        configs: Vec<PathBuf>,
        /// The first node's address; the next nodes get the following addresses.
        #[arg(long, default_value = "127.0.0.1")]
        first_address: Ipv4Addr,
        /// The first node's port (0: any free port for every node).
        #[arg(long, default_value_t = 0)]
        first_port: u16,
        /// Where to write `talosconfig`, `ca.crt`, `ca.key` and `endpoints.txt`;
        /// a CA found there from an earlier run is reused.
        #[arg(long)]
        state_dir: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let Cli { command } = Cli::parse();
    let Command::Serve {
        nodes,
        talos_version,
        configs,
        first_address,
        first_port,
        state_dir,
    } = command;
    let configs: Vec<Vec<u8>> = configs
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<_, _>>()?;
    let specs = node_specs(nodes, &talos_version, &configs, first_address, first_port)?;
    let pki = reuse_or_generate_ca(&state_dir)?;
    let emu = Emulator::start_with(
        specs,
        EmulatorOptions {
            pki: Some(pki),
            ..EmulatorOptions::default()
        },
    )
    .await?;
    let talosconfig = emu.talosconfig("talemu", &ClientCertSpec::admin())?;
    // It holds a key: Ichor's one private-file writer (0600, never through a link).
    ichor_talos::private_file::write(&state_dir.join("talosconfig"), talosconfig.as_bytes())?;
    std::fs::write(state_dir.join("ca.crt"), emu.ca_pem())?;
    let endpoints: Vec<String> = emu
        .nodes()
        .iter()
        .map(|n| format!("{} {} {}\n", n.hostname, n.address, n.endpoint()))
        .collect();
    std::fs::write(state_dir.join("endpoints.txt"), endpoints.concat())?;
    for n in emu.nodes() {
        println!(
            "{} address={} endpoint={}",
            n.hostname,
            n.address,
            n.endpoint()
        );
    }
    println!(
        "talosconfig: {} (emulated nodes; not a real cluster)",
        state_dir.join("talosconfig").display()
    );
    tokio::signal::ctrl_c().await?;
    emu.shutdown().await;
    Ok(())
}

/// The specs of `nodes` nodes on consecutive addresses (and ports, unless
/// any free port will do), with the configs given in turn.
fn node_specs(
    nodes: usize,
    talos_version: &str,
    configs: &[Vec<u8>],
    first_address: Ipv4Addr,
    first_port: u16,
) -> anyhow::Result<Vec<NodeSpec>> {
    let mut specs = Vec::new();
    for i in 0..nodes {
        let offset = u32::try_from(i)?;
        let address = IpAddr::V4(Ipv4Addr::from(u32::from(first_address) + offset));
        let hostname = format!("talemu-{}", i + 1);
        let spec = match configs.is_empty() {
            true => NodeSpec::maintenance(hostname),
            false => NodeSpec::new(hostname, configs[i % configs.len()].clone()),
        };
        let port = if first_port == 0 {
            0
        } else {
            first_port + u16::try_from(i)?
        };
        specs.push(
            spec.with_version(talos_version.to_string())
                .with_address(address)
                .with_port(port),
        );
    }
    Ok(specs)
}

/// The CA of an earlier run in `state_dir` (so its talosconfig stays
/// valid), or a new one whose key is written there.
fn reuse_or_generate_ca(state_dir: &std::path::Path) -> anyhow::Result<Pki> {
    std::fs::create_dir_all(state_dir)?;
    let (ca_crt, ca_key) = (state_dir.join("ca.crt"), state_dir.join("ca.key"));
    let pki = if ca_crt.is_file() && ca_key.is_file() {
        Pki::from_pem(
            &std::fs::read_to_string(&ca_crt)?,
            &std::fs::read_to_string(&ca_key)?,
        )?
    } else {
        let pki = Pki::generate()?;
        // The CA key: written as every private file of Ichor's is.
        ichor_talos::private_file::write(&ca_key, pki.ca_key_pem().as_bytes())?;
        pki
    };
    Ok(pki)
}
