//! The `ichor` command. Subcommands arrive with the issues that build them;
//! until then it answers `--help` and `--version` and nothing pretends more.

use clap::Parser;

/// Manage Talos Linux clusters from inside Kubernetes: typed machine configs,
/// drift detection, holds before any change reaches a node, and Cilium owned
/// as a Helm release.
#[derive(Debug, Parser)]
#[command(name = "ichor", version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
