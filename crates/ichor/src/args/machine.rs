//! `ichor machine list|add|remove|replace|history|diff|rollback`: the
//! machines of a cluster come and go through TalosMachines; the controller
//! does the work on the nodes.

use clap::{Args, Subcommand, ValueEnum};

use super::{KubeArgs, OutputFormat, parse_duration};

/// `ichor machine add --help`'s examples, one command a line as typed.
const MACHINE_ADD_EXAMPLES: &str = "\
Examples:
  ichor machine add 10.5.0.7 --cluster lab --role worker --wait
  ichor machine add 10.5.0.7 10.5.0.8 --cluster lab --role worker --yes
  ichor machine add 10.5.0.9 --cluster lab --role controlplane --name cp-4 --config-patch @ntp.yaml
  ichor machine add 10.5.0.7 --cluster lab --role worker -o yaml   # the plan alone
Afterwards:
  ichor machine list --cluster lab";

/// `ichor machine remove --help`'s examples.
const MACHINE_REMOVE_EXAMPLES: &str = "\
Examples:
  ichor machine remove w-2 --yes --wait
  ichor machine remove w-2 --keep-node --yes
  ichor machine remove cp-3 --force --yes   # its node does not answer
Afterwards:
  ichor machine list --cluster lab";

/// `ichor machine replace --help`'s examples.
const MACHINE_REPLACE_EXAMPLES: &str = "\
Examples:
  ichor machine replace cp-2 --with 10.5.0.9 --yes --wait
  ichor machine replace cp-2 --with 10.5.0.9 --name cp-4 -o json   # the plan alone
Afterwards:
  ichor machine list --cluster lab";

/// `ichor machine list --help`'s examples.
const MACHINE_LIST_EXAMPLES: &str = "\
Examples:
  ichor machine list --cluster lab
  ichor machine list -n ichor-system -o json";

#[derive(Debug, Subcommand)]
pub enum MachineCommand {
    /// The machines of a cluster: role, address, membership phase, Ready,
    /// drift and hold.
    #[command(after_long_help = MACHINE_LIST_EXAMPLES)]
    List(MachineListArgs),
    /// Add nodes booted into Talos's maintenance mode to a cluster.
    ///
    /// Add first reads every address over the insecure maintenance API
    /// (nothing is written) and refuses everything at once, with nothing
    /// written, when a node is unreachable or already configured, an address
    /// is given twice or is already a machine's, a node runs a Talos version
    /// the cluster does not run, or a name is taken. Each machine is named
    /// after the hostname its node reports unless --name says otherwise.
    /// Then it prints the plan and asks for consent, and creates one
    /// released TalosMachine per node (held with --hold). The controller
    /// joins them: it renders each node's config from the cluster's secrets
    /// bundle as `ichor init` does, applies it, and waits for the node to
    /// boot, a control plane to join etcd (one at a time; workers together)
    /// and its Node to be Ready. With --wait this command follows each node
    /// until it is Ready.
    #[command(after_long_help = MACHINE_ADD_EXAMPLES)]
    Add(MachineAddArgs),
    /// Remove a machine: its node is drained, a control plane leaves etcd,
    /// the node is reset back to maintenance mode (unless --keep-node) and
    /// its Node deleted.
    ///
    /// Remove refuses, with nothing written, to take the last control plane
    /// or a control plane whose leaving would leave etcd without a healthy
    /// majority, and a machine whose node does not answer unless --force
    /// (then its etcd member is removed by id from another control plane).
    /// Then it asks for consent, writes spec.removal and deletes the
    /// TalosMachine; the controller runs the removal (the steps are in the
    /// machine's status.membership) and lets the TalosMachine go when done.
    #[command(after_long_help = MACHINE_REMOVE_EXAMPLES)]
    Remove(MachineRemoveArgs),
    /// Replace a control plane by a node in maintenance mode: the new one
    /// joins first, and the old one is removed only once etcd lists the new
    /// member as a healthy voter, so etcd never falls below a majority.
    ///
    /// The new node is read and checked as `ichor machine add` checks it;
    /// nothing is written before every check passed and you consented.
    /// Replace creates the new TalosMachine with spec.replaces naming the
    /// old one; the controller does the rest. A failure before the removal
    /// leaves the old node in place.
    #[command(after_long_help = MACHINE_REPLACE_EXAMPLES)]
    Replace(MachineReplaceArgs),
    /// The revisions of a machine: each apply Ichor made to its node, when,
    /// why, who made the spec change it carried out, and the paths it
    /// changed.
    #[command(after_long_help = MACHINE_HISTORY_EXAMPLES)]
    History(MachineHistoryArgs),
    /// The config paths two revisions of a machine differ in, values
    /// redacted as drift values are.
    ///
    /// The values come from the machine's history Secret in ichor-system;
    /// without the right to read it, diff lists the paths the machine's
    /// status keeps. --show-secrets shows values unredacted, and only to
    /// someone who may read that Secret.
    #[command(after_long_help = MACHINE_DIFF_EXAMPLES)]
    Diff(MachineDiffArgs),
    /// Write an earlier revision's inputs back: the machine's spec, and the
    /// cluster's with --include-cluster.
    ///
    /// Rollback reads the revision's inputs from the machine's history
    /// Secret in ichor-system (so it needs the right to read it), prints
    /// the fields it writes back, and asks for consent. The controller then
    /// renders, holds or applies the result as for any spec change; its
    /// apply is a new revision with reason Rollback.
    #[command(after_long_help = MACHINE_ROLLBACK_EXAMPLES)]
    Rollback(MachineRollbackArgs),
}

/// `ichor machine history --help`'s examples.
const MACHINE_HISTORY_EXAMPLES: &str = "\
Examples:
  ichor machine history lab-worker-1
  ichor machine history lab-worker-1 -o yaml
Afterwards:
  ichor machine diff lab-worker-1";

/// `ichor machine diff --help`'s examples.
const MACHINE_DIFF_EXAMPLES: &str = "\
Examples:
  ichor machine diff lab-worker-1   # the latest revision against the one before
  ichor machine diff lab-worker-1 --from 1 --to 3 -o json
  ichor machine diff lab-worker-1 --show-secrets";

/// `ichor machine rollback --help`'s examples.
const MACHINE_ROLLBACK_EXAMPLES: &str = "\
Examples:
  ichor machine rollback lab-worker-1 --to 1
  ichor machine rollback lab-worker-1 --to 1 --include-cluster --yes
Afterwards:
  ichor machine history lab-worker-1";

#[derive(Debug, Args)]
pub struct MachineHistoryArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The TalosMachine.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Print the revisions as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct MachineDiffArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The TalosMachine.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The revision compared from (default: the one before --to).
    #[arg(long, value_name = "REVISION")]
    pub from: Option<u64>,
    /// The revision compared to (default: the latest).
    #[arg(long, value_name = "REVISION")]
    pub to: Option<u64>,
    /// Show secret values unredacted (needs get on the history Secret).
    #[arg(long)]
    pub show_secrets: bool,
    /// Print the differences as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct MachineRollbackArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The TalosMachine.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The revision whose inputs are written back.
    #[arg(long, value_name = "REVISION")]
    pub to: u64,
    /// Write back the TalosCluster's fields too, listed in the plan: every
    /// machine of the cluster is rendered from them.
    #[arg(long)]
    pub include_cluster: bool,
    /// Do not ask for consent.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// Where the machines are.
#[derive(Debug, Args)]
pub struct MachinePlace {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The namespace of the TalosCluster and its TalosMachines.
    #[arg(long, short = 'n', default_value = "ichor-system")]
    pub namespace: String,
}

#[derive(Debug, Args)]
pub struct MachineListArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// Only this TalosCluster's machines.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Print the machines as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

/// The role of the nodes to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoleArg {
    Worker,
    Controlplane,
}

impl From<RoleArg> for ichor_api::MachineRole {
    fn from(r: RoleArg) -> Self {
        match r {
            RoleArg::Worker => ichor_api::MachineRole::Worker,
            RoleArg::Controlplane => ichor_api::MachineRole::Controlplane,
        }
    }
}

/// What `add` and `replace` share: how long `--wait` follows, consent.
#[derive(Debug, Args)]
pub struct MachineJoin {
    /// Talos config patches for the new machines (@FILE, YAML or JSON, as
    /// talosctl takes them), applied after Ichor's own, in order.
    #[arg(long = "config-patch", value_name = "@FILE")]
    pub config_patches: Vec<String>,
    /// Create the machines held: the controller joins none until released.
    #[arg(long)]
    pub hold: bool,
    /// Follow each new machine until its node is Ready: a progress bar per
    /// node with its membership step.
    #[arg(long, conflicts_with = "hold")]
    pub wait: bool,
    /// How long --wait follows before it gives up (the machines stay).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub wait_timeout: std::time::Duration,
    /// Do not ask for consent.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print the plan as data and write nothing.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct MachineAddArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The nodes' addresses (host or host:port of their Talos API).
    #[arg(required = true, value_name = "ADDRESS")]
    pub addresses: Vec<String>,
    /// The TalosCluster to add them to.
    #[arg(long)]
    pub cluster: String,
    /// Their role.
    #[arg(long, value_enum)]
    pub role: RoleArg,
    /// The TalosMachines' names, one per address in order (default: the
    /// hostname each node reports).
    #[arg(long = "name", value_name = "NAME")]
    pub names: Vec<String>,
    #[command(flatten)]
    pub join: MachineJoin,
}

#[derive(Debug, Args)]
pub struct MachineRemoveArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The TalosMachine to remove.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Leave the node configured and running: only the cluster forgets it.
    #[arg(long, conflicts_with = "wipe")]
    pub keep_node: bool,
    /// Reset the node back to maintenance mode (the default).
    #[arg(long)]
    pub wipe: bool,
    /// Remove the machine even though its node does not answer: its etcd
    /// member is removed by id from another control plane, its Node deleted.
    #[arg(long)]
    pub force: bool,
    /// Follow the removal until the TalosMachine is gone.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait follows before it gives up (the removal goes on).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub wait_timeout: std::time::Duration,
    /// Do not ask for consent.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct MachineReplaceArgs {
    #[command(flatten)]
    pub place: MachinePlace,
    /// The control plane's TalosMachine to replace.
    #[arg(value_name = "OLD")]
    pub old: String,
    /// The new node's address, in maintenance mode.
    #[arg(long = "with", value_name = "ADDRESS")]
    pub with: String,
    /// The new TalosMachine's name (default: the hostname its node reports).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub join: MachineJoin,
}
