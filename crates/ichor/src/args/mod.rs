//! The command line, as clap types only; what each command does is in `cmd/`.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use ichor_api::{KubeProxyMode, Tunnel};

mod backup;
mod completion;
mod machine;
pub use backup::*;
pub use completion::*;
pub use machine::*;

/// Manage Talos Linux clusters from inside Kubernetes: typed machine configs,
/// drift detection, holds before any change reaches a node, and Cilium owned
/// as a Helm release.
#[derive(Debug, Parser)]
#[command(
    name = "ichor",
    // Ichor versions are written with their v (images, appVersion, adopt's check).
    version = concat!("v", env!("CARGO_PKG_VERSION")),
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More detail on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// `ichor adopt --help`'s examples, one command a line as typed.
const ADOPT_EXAMPLES: &str = "\
Examples:
  ichor adopt --cluster prod --talosconfig ./talosconfig --secrets-bundle secrets.yaml
  ichor adopt --cluster lab --recover-secrets --recover-from 10.5.0.2 --tunnel geneve --yes
  ichor adopt --cluster lab --secrets-bundle secrets.yaml -o json   # the plan alone";

/// `ichor recover --help`'s examples, one command a line as typed.
const RECOVER_EXAMPLES: &str = "\
Examples:
  export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...
  ichor recover --cluster prod --bucket backups --prefix prod --identity ./backup.key --out ./prod-recovered
  ichor recover --cluster lab --endpoint http://10.0.0.5:9000 --allow-http --bucket lab --identity key.txt --out ./lab --yes -o json
  ichor recover --cluster lab --folder /mnt/backups --backup lab-20261202010000 --identity key.txt --out ./lab
Afterwards:
  kubectl --kubeconfig ./prod-recovered/kubeconfig get talosclusters -A
  talosctl --talosconfig ./prod-recovered/talosconfig etcd status";

/// `ichor reclaim --help`'s examples, one command a line as typed.
const RECLAIM_EXAMPLES: &str = "\
Examples:
  ichor reclaim --output-dir ./lab-talos -o yaml   # the plan alone
  ichor reclaim --output-dir ./lab-talos --yes
  ichor reclaim --output-dir ./lab-talos --keep-cilium-record --delete-crds
Afterwards:
  talosctl --talosconfig ./lab-talos/lab/talosconfig version
  helm -n kube-system list";

/// `ichor init --help`'s examples, one command a line as typed.
const INIT_EXAMPLES: &str = "\
Examples:
  ichor init lab --endpoint https://10.5.0.2:6443 --control-plane 10.5.0.2 --worker 10.5.0.3
  ichor init lab --endpoint https://10.5.0.2:6443 --control-plane 10.5.0.2 -o text  # plan only
  ichor init lab --endpoint https://10.5.0.2:6443 --control-plane 10.5.0.2 --kube-proxy replaced
  ichor init lab --endpoint https://10.5.0.2:6443 --control-plane 10.5.0.2 --config-patch @ntp.yaml
  ichor init prod --endpoint https://k8s.example.com:6443 --control-plane 10.0.0.11,10.0.0.12
  ichor init prod --endpoint https://10.0.0.10:6443 --control-plane 10.0.0.11 --output-dir ./prod

Afterwards:
  talosctl --talosconfig ./prod/talosconfig health
  kubectl --kubeconfig ./prod/kubeconfig get nodes";

/// `ichor secrets recover --help`'s example, one command a line as typed.
const SECRETS_RECOVER_EXAMPLE: &str = "\
Example:
  talosctl -n 10.5.0.2 get machineconfig -o jsonpath='{.spec}' > cp.yaml
  ichor secrets recover --from-config cp.yaml -o secrets.yaml";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bring an existing, running Talos cluster under Ichor's management,
    /// without rebuilding it.
    ///
    /// Adopt reads every node through the Talos API and the cluster through
    /// Kubernetes (nothing is written), prints its plan and asks for consent.
    /// Then, in order: on a cluster with no CNI it installs Ichor's Cilium and
    /// waits until the nodes are Ready; it installs Ichor unless Ichor is there
    /// (a Helm install is never touched); it applies Ichor's Cilium policies when
    /// the cluster runs Cilium; it writes the secrets bundle Secret, the
    /// TalosCluster and one held TalosMachine per node; it waits for the CNI
    /// hand-over; and it releases the holds machine by machine. Adopt never
    /// writes to a node. Every step can be rerun: after a failure or an
    /// interruption, run the same command again and it finishes the job.
    #[command(after_long_help = ADOPT_EXAMPLES)]
    Adopt(AdoptArgs),
    /// Create a Talos cluster from nodes booted into Talos's maintenance mode,
    /// managed by Ichor from its first minute.
    ///
    /// Init first reads every node over the insecure maintenance API (nothing
    /// is written): each must be in maintenance mode, reachable, named once,
    /// and run Talos v1.12 or later; every problem is reported at once. The
    /// plan shows each node's certificate fingerprint, to compare with its
    /// console (or give with --cert-fingerprint), and init sends each config
    /// only to that certificate. It
    /// renders each node's config with the controller's own render (so the
    /// controller finds no drift), with Ichor's pinned Cilium as an inline
    /// manifest on the control planes, prints its plan and asks for consent.
    /// Then, in order: it writes the secrets bundle and talosconfig (0600) to
    /// the output directory; applies each config over the insecure API;
    /// bootstraps etcd on the first control plane; fetches the kubeconfig
    /// through the Talos API and waits for the Kubernetes API; installs
    /// Ichor; waits for its webhooks (30 minutes at most); and writes the
    /// bundle Secret, the TalosCluster and the TalosMachines. Ichor's
    /// controller then takes the inline Cilium over as its Helm release.
    /// Every step can be rerun: after a failure or an interruption, run the
    /// same command again with the same --output-dir and it finishes the job,
    /// applying nothing to a node twice.
    #[command(after_long_help = INIT_EXAMPLES)]
    Init(InitArgs),
    /// Run Ichor's controller: it reconciles TalosClusters, TalosMachines and
    /// TalosOperations, the CNI hand-over and the IchorInstallation. In a cluster this is the
    /// controller Deployment's command; outside one it runs against --kubeconfig.
    Controller(ControllerArgs),
    /// Show what Ichor manages: each TalosCluster, its CNI, hand-over and
    /// machines with their holds and drift.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Work with the Talos secrets bundle of a cluster.
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Ichor's Cilium: install it on a cluster that has no pod network yet.
    #[command(subcommand)]
    Cni(CniCommand),
    /// Upgrade a cluster's machines through a TalosOperation (the controller
    /// does the work; this command never touches a node).
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
    /// Reboot machines through a TalosOperation: control planes one at a time
    /// with etcd checked, each drained first and uncordoned after; held
    /// machines are skipped. This command never touches a node.
    Reboot(RebootArgs),
    /// Install Ichor `--to` in the cluster from this binary's install
    /// manifest: what the installer Job of a TalosOperation of kind ichor
    /// runs (installer installs only; a Helm install is upgraded with helm).
    Install(InstallArgs),
    /// TalosOperations: list them, show one's plan and progress, cancel one.
    #[command(subcommand)]
    Operation(OperationCommand),
    /// Encrypted backups of a cluster (etcd snapshot, secrets bundle, Ichor's
    /// objects), taken by the controller into the cluster's spec.backup
    /// destination: take one now, list them, show one.
    #[command(subcommand)]
    Backup(BackupCommand),
    /// Rebuild a cluster's etcd from a backup, from a laptop with only the
    /// bucket's credentials and an age identity.
    ///
    /// Recover lists the cluster's complete backups (those with a manifest)
    /// and takes the newest, or --backup NAME; decrypts its manifest with
    /// --identity (a wrong identity is refused) and refuses a backup of
    /// another cluster; checks the bundle, the objects and the whole etcd
    /// snapshot against the manifest's sha256 and the snapshot's own trailer.
    /// Then it reads every control plane (the backup's TalosMachines of role
    /// controlplane, by name, or --nodes) and refuses when etcd runs on any
    /// of them or one cannot be reached. Nothing is written before all that
    /// passed and you consented.
    ///
    /// Then, each phase recorded in --out/recover-state.json so a rerun
    /// continues where a run stopped: it writes secrets.yaml, an admin
    /// talosconfig and objects.yaml (0600) into --out; streams the snapshot,
    /// decrypted on the fly, to the first control plane (EtcdRecover) and
    /// sends Bootstrap{recover_etcd} there once (again only if the node
    /// rebooted before etcd started); waits for etcd, for the Kubernetes API
    /// to serve the snapshot's revision (writing --out/kubeconfig), and for
    /// Ichor's controller and the TalosCluster to be Ready.
    ///
    /// The bucket's credentials come from AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY. No secret is printed: digests only.
    #[command(after_help = RECOVER_EXAMPLES)]
    Recover(RecoverArgs),
    /// Take Ichor out of this cluster, the way out without lock-in: no node
    /// is written to, and talosctl and helm take over.
    ///
    /// Reclaim reads what Ichor holds (nothing is written), prints its plan and
    /// asks for consent. Then, in order: it writes each TalosCluster's secrets
    /// bundle and an admin talosconfig made from it to --output-dir (mode
    /// 0600; a different file already there is never overwritten); it holds
    /// every TalosMachine so the controller applies nothing more, then deletes
    /// the TalosMachines, the TalosClusters (none has a finalizer, so nothing
    /// runs on a node) and their bundle Secrets; it hands Cilium back as a
    /// plain Helm release whose records live in kube-system, so `helm -n
    /// kube-system` lists and upgrades it (unless --keep-cilium-record); and it
    /// uninstalls Ichor if `ichor adopt` installed it. A Helm-installed Ichor is
    /// not touched: reclaim prints the `helm uninstall` command to run.
    /// Ichor's CRDs are kept unless --delete-crds. Every step can be rerun:
    /// after an interruption, run the same command again and it finishes.
    #[command(after_long_help = RECLAIM_EXAMPLES)]
    Reclaim(ReclaimArgs),
    /// Serve Ichor's web UI: clusters, machines with their drift and holds,
    /// and operations, over HTTPS. Sign-in takes a Kubernetes bearer token
    /// (checked by TokenReview); each action is checked by a
    /// SubjectAccessReview for the signed-in user.
    Ui(UiArgs),
    /// The machines of a cluster: list them, add nodes from maintenance
    /// mode, remove one, replace a control plane. The controller does the
    /// work on the nodes.
    #[command(subcommand)]
    Machine(MachineCommand),
    /// A completion script for bash, zsh, fish or PowerShell, on stdout.
    Completion(CompletionArgs),
    /// Write a man page per command into a folder (what `make release`
    /// ships beside the binary).
    ManPages(ManPagesArgs),
}

/// `ichor ui`.
#[derive(Debug, Args)]
pub struct UiArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The HTTPS address (ichorUI.port).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    pub listen: std::net::SocketAddr,
    /// The certificate (PEM) served, read again when it changes (mount the
    /// UI's kubernetes.io/tls Secret). Without it, a self-signed certificate
    /// is made at start.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) that issued the certificate, served after it
    /// (ichorUI.tls.caConfigMap/caSecret/caKey).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Also serve plain HTTP here (ichorUI.plaintextPort). Deprecated.
    #[arg(long, value_name = "ADDR")]
    pub plaintext_listen: Option<std::net::SocketAddr>,
    /// Write nothing (settings.readOnly): no action is offered or accepted.
    #[arg(long)]
    pub read_only: bool,
    /// The local lab only: let requests without a session read (never act).
    /// Refused unless every address listened on is loopback.
    #[arg(long)]
    pub lab_anonymous_read: bool,
}

#[derive(Debug, Subcommand)]
pub enum UpgradeCommand {
    /// Upgrade Talos: control planes first, one at a time, then workers, the
    /// node running Ichor last. Prints the plan the controller wrote.
    Talos(UpgradeTalosArgs),
    /// Upgrade Kubernetes. Refused while a control plane is held (version
    /// skew). This Ichor writes the plan but does not run it yet.
    Kubernetes(UpgradeVersionArgs),
    /// Upgrade Ichor itself. Refused on a Helm install, with the helm
    /// upgrade command to run instead.
    Ichor(UpgradeVersionArgs),
}

#[derive(Debug, Args)]
pub struct UpgradeVersionArgs {
    #[command(flatten)]
    pub common: OperationCommon,
    /// The version to upgrade to.
    #[arg(long, value_name = "VERSION")]
    pub to: String,
    /// Only these TalosMachines (default: every machine of the cluster).
    #[arg(long = "machine", value_name = "NAME")]
    pub machines: Vec<String>,
}

/// Where the operation goes and what is printed.
#[derive(Debug, Args)]
pub struct OperationCommon {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The namespace of the TalosCluster (and of the TalosOperation).
    #[arg(long, short = 'n', default_value = "ichor-system")]
    pub namespace: String,
    /// The TalosCluster.
    #[arg(long)]
    pub cluster: String,
    /// The TalosOperation's name (default: generated from the kind).
    #[arg(long)]
    pub name: Option<String>,
    /// How many workers at once (control planes always go one at a time).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub concurrency: Option<u32>,
    /// Print the operation as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
    /// Only plan: the controller writes the plan to status and touches nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Follow the operation until it ends: a progress bar per machine, with
    /// its node and step.
    #[arg(long, conflicts_with = "dry_run")]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct UpgradeTalosArgs {
    #[command(flatten)]
    pub common: OperationCommon,
    /// The Talos version to upgrade to (vX.Y.Z).
    #[arg(long, value_name = "VERSION")]
    pub to: String,
    /// Only these TalosMachines (default: every machine of the cluster).
    #[arg(long = "machine", value_name = "NAME")]
    pub machines: Vec<String>,
    /// The installer image (default: each machine's own installer at the new tag).
    #[arg(long, value_name = "IMAGE")]
    pub installer_image: Option<String>,
}

#[derive(Debug, Args)]
pub struct RebootArgs {
    #[command(flatten)]
    pub common: OperationCommon,
    /// The TalosMachines to reboot.
    #[arg(required = true, value_name = "MACHINE")]
    pub machines: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum OperationCommand {
    /// Every TalosOperation with its kind, phase and message.
    List(OperationListArgs),
    /// One TalosOperation: its plan and each machine's progress.
    Status(OperationNameArgs),
    /// Stop a TalosOperation before its next step (annotation
    /// ichor.maesh.dev/cancel); a machine past its reboot finishes coming back.
    Cancel(OperationNameArgs),
}

#[derive(Debug, Args)]
pub struct OperationListArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Only this namespace (default: every namespace).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Print the operations as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct OperationNameArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The namespace of the TalosOperation.
    #[arg(long, short = 'n', default_value = "ichor-system")]
    pub namespace: String,
    /// The TalosOperation.
    pub name: String,
    /// Print the operation as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct AdoptArgs {
    /// The name of the TalosCluster to create (and of its objects).
    #[arg(long)]
    pub cluster: String,
    #[command(flatten)]
    pub talos: TalosArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The cluster's secrets bundle (`talosctl gen secrets` format).
    #[arg(long, value_name = "FILE", conflicts_with = "recover_secrets")]
    pub secrets_bundle: Option<PathBuf>,
    /// Recover the bundle from a control-plane node's machine config instead.
    #[arg(long, requires = "recover_from")]
    pub recover_secrets: bool,
    /// The control-plane node to recover the bundle from.
    #[arg(long, value_name = "ADDR")]
    pub recover_from: Option<String>,
    /// Leave the cluster's CNI to you (preset unmanaged). Refused on a cluster
    /// with no CNI, where no pod could run.
    #[arg(long)]
    pub cni_unmanaged: bool,
    /// Cilium's tunnel protocol (default vxlan). Immutable once adopted.
    #[arg(long, value_parser = tunnel_parser())]
    pub tunnel: Option<Tunnel>,
    /// Cilium chart values merged over Ichor's (YAML); Ichor-owned keys are refused.
    #[arg(long, value_name = "FILE")]
    pub cilium_values: Option<PathBuf>,
    /// Make a missing Ichor an error instead of installing it.
    #[arg(long)]
    pub require_ichor: bool,
    /// How long to wait for Ichor's webhooks after installing it.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration)]
    pub wait_timeout: std::time::Duration,
    /// How long to wait for Cilium and every node to be Ready after
    /// installing Cilium.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub cilium_wait_timeout: std::time::Duration,
    /// The controller image to install, for a registry mirror
    /// (default: ghcr.io/maeshinshin/ichor-controller at this ichor's version).
    #[arg(long, value_name = "IMAGE")]
    pub controller_image: Option<String>,
    /// Do not ask for consent (for scripts).
    #[arg(short, long)]
    pub yes: bool,
    /// Print the plan as data and stop (nothing is written).
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
    #[command(flatten)]
    pub helm: HelmArgs,
}

#[derive(Debug, Args)]
pub struct ReclaimArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Where each TalosCluster's files go: DIR/CLUSTER/secrets.yaml,
    /// DIR/CLUSTER/talosconfig and DIR/CLUSTER/ichor-objects.yaml (mode 0600).
    #[arg(long, value_name = "DIR")]
    pub output_dir: PathBuf,
    /// Leave Cilium's Helm records in ichor-system, where Ichor kept them
    /// (manage it with helm -n ichor-system; the namespace stays).
    #[arg(long)]
    pub keep_cilium_record: bool,
    /// Also delete Ichor's CRDs (kept by default, as helm uninstall keeps
    /// them). On a Helm install, reclaim prints the command instead.
    #[arg(long)]
    pub delete_crds: bool,
    /// How long each wait may take (the controller seeing the holds, its
    /// pods stopping, the CRDs going).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
    /// Do not ask for consent (for scripts).
    #[arg(short, long)]
    pub yes: bool,
    /// Print the plan as data and stop (nothing is written).
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The cluster's name (of the TalosCluster, the kubeconfig's cluster and
    /// the talosconfig's context).
    pub name: String,
    /// The Kubernetes API endpoint the nodes and clients use:
    /// https://HOST:6443, HOST a control plane's address or a load balancer.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// A control-plane node's address (repeat, or comma-separate); the
    /// first one bootstraps etcd.
    #[arg(
        long = "control-plane",
        value_name = "IP",
        value_delimiter = ',',
        required = true
    )]
    pub control_planes: Vec<String>,
    /// A worker node's address (repeat, or comma-separate).
    #[arg(long = "worker", value_name = "IP", value_delimiter = ',')]
    pub workers: Vec<String>,
    /// The Talos version the configs are written for (v1.12 and v1.13 write
    /// one v1alpha1 document, v1.14 the multi-document shape; default: the
    /// lowest version the nodes run).
    #[arg(long, value_name = "VERSION")]
    pub talos_version: Option<String>,
    /// The Kubernetes version (default: the newest the Talos version supports).
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: Option<String>,
    /// Cilium's tunnel protocol. Immutable once the cluster exists.
    #[arg(long, value_parser = tunnel_parser(), default_value = "vxlan")]
    pub tunnel: Tunnel,
    /// Run kube-proxy, or let Cilium replace it.
    #[arg(long, value_parser = kube_proxy_parser(), default_value = "enabled")]
    pub kube_proxy: KubeProxyMode,
    /// A Talos config patch applied to every node, as talosctl takes it:
    /// @FILE (repeat for more; applied in order).
    #[arg(long = "config-patch", value_name = "@FILE")]
    pub config_patches: Vec<String>,
    /// Use this secrets bundle (`talosctl gen secrets` format) instead of a
    /// new one. Init never takes a bundle it did not write from the output
    /// directory unless it is named here.
    #[arg(long, value_name = "FILE")]
    pub with_secrets: Option<PathBuf>,
    /// The certificate fingerprint a node's maintenance API must present, as
    /// its console shows it (repeat for more nodes): another certificate
    /// refuses the node, nothing sent (as talosctl --cert-fingerprint).
    #[arg(long = "cert-fingerprint", value_name = "ADDRESS=FINGERPRINT")]
    pub cert_fingerprints: Vec<String>,
    /// Where the secrets bundle, talosconfig and kubeconfig are written (0600),
    /// and found again by a rerun. Made 0700; one other users may write to is
    /// refused.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub output_dir: PathBuf,
    /// How long to wait for Ichor's webhooks after installing it.
    #[arg(long, value_name = "DURATION", default_value = "30m", value_parser = parse_duration)]
    pub wait_timeout: std::time::Duration,
    /// The controller image to install, for a registry mirror
    /// (default: ghcr.io/maeshinshin/ichor-controller at this ichor's version).
    #[arg(long, value_name = "IMAGE")]
    pub controller_image: Option<String>,
    /// Do not ask for consent (for scripts).
    #[arg(short, long)]
    pub yes: bool,
    /// Print the plan (as text, or as data) and stop: nothing is written.
    #[arg(short, long, value_enum)]
    pub output: Option<PlanFormat>,
    #[command(flatten)]
    pub helm: HelmArgs,
}

/// How `ichor init -o` prints the plan.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlanFormat {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Args, Clone)]
pub struct TalosArgs {
    /// The talosconfig (default: $TALOSCONFIG, then ~/.talos/config).
    #[arg(long, value_name = "FILE")]
    pub talosconfig: Option<PathBuf>,
    /// The talosconfig context (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The nodes to adopt (default: the context's nodes).
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub nodes: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Who deployed Ichor: the installer (ichor adopt / init) or helm (the chart
    /// sets this; the controller then creates the IchorInstallation once).
    #[arg(long, value_parser = ["installer", "helm"], default_value = "installer")]
    pub deployed_by: String,
    /// Watch only this namespace (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<std::net::SocketAddr>,
    /// Serve the admission webhooks here (needs --webhook-cert-secret).
    #[arg(long, value_name = "ADDR", requires = "webhook_cert_secret")]
    pub webhook_addr: Option<std::net::SocketAddr>,
    /// The kubernetes.io/tls Secret in ichor-system holding the webhook's certificate.
    #[arg(long, value_name = "NAME")]
    pub webhook_cert_secret: Option<String>,
    /// The image the ichor-cni Job runs when Ichor's Cilium release is off
    /// a TalosCluster's effective values (usually this controller's own image;
    /// without it no Job is started).
    #[arg(long, value_name = "IMAGE")]
    pub cni_job_image: Option<String>,
    /// Act as the only replica (no Lease).
    #[arg(long)]
    pub no_leader_election: bool,
    /// How often every object is looked at again (drift appears on nodes
    /// without any Kubernetes event).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub resync: std::time::Duration,
    /// How long an operation's drain retries evictions a PodDisruptionBudget
    /// refuses before the step fails (the node is uncordoned, not rebooted).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub drain_timeout: std::time::Duration,
    /// How long an operation waits, before a control plane's reboot, for
    /// etcd to be healthy (every member started, none a learner, quorum
    /// without this one) before the operation fails naming the member.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub etcd_timeout: std::time::Duration,
    /// How long one Talos call that pulls or installs an upgrade's installer
    /// image may take before the machine's step fails (the other Talos calls
    /// are bounded at 30 s).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub image_timeout: std::time::Duration,
    /// The PersistentVolumeClaim mounted at /var/lib/ichor/backups for
    /// TalosClusters whose spec.backup.destination.volume names it (the
    /// chart sets this from backup.volume.claimName).
    #[arg(long, value_name = "NAME")]
    pub backup_volume_claim: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The managed state of every TalosCluster (or one).
    Status(ClusterStatusArgs),
}

#[derive(Debug, Args)]
pub struct ClusterStatusArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Only this TalosCluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Print the status as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Recover the secrets bundle (the file `talosctl gen secrets` writes) from
    /// a control-plane machine config.
    ///
    /// A control-plane config holds every CA and key of the cluster; a worker's
    /// holds none, so a worker config is refused. The bundle is written with
    /// mode 0600; keep it as you keep the talosconfig.
    #[command(after_long_help = SECRETS_RECOVER_EXAMPLE)]
    Recover(SecretsRecoverArgs),
}

#[derive(Debug, Args)]
pub struct SecretsRecoverArgs {
    /// A control-plane machine config (either shape: v1.12/v1.13 or v1.14).
    #[arg(long, value_name = "FILE")]
    pub from_config: PathBuf,
    /// Where to write the bundle. Refuses to overwrite an existing file unless --force.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Overwrite the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Subcommand)]
pub enum CniCommand {
    /// Install Ichor's pinned Cilium on a cluster with no pod network, as Ichor's
    /// own Helm release (`cilium` in kube-system, its record in ichor-system),
    /// then wait until Cilium and every node are Ready.
    ///
    /// Use it before `helm install` of Ichor's chart on a cluster with no CNI:
    /// the chart's pods need a pod network. `ichor adopt` does the same step
    /// itself on a cluster with no CNI.
    ///
    /// Requirement: KubePrism must be enabled on port 7445 on every node (Talos's
    /// default): Cilium reaches the API server through localhost:7445. This
    /// command has no Talos credential to check it; `ichor adopt` checks it later.
    Bootstrap(CniBootstrapArgs),
    /// Ichor's Cilium release as a Helm operation.
    #[command(subcommand)]
    Helm(CniHelmCommand),
}

#[derive(Debug, Subcommand)]
pub enum CniHelmCommand {
    /// Install or upgrade Ichor's Cilium release to the effective values of a
    /// TalosCluster. This is the command of the controller's ichor-cni Job,
    /// which holds the CNI lock: a pending record left by an interrupted
    /// operation is repaired, then the operation goes on.
    Apply(CniHelmApplyArgs),
}

#[derive(Debug, Args)]
pub struct CniHelmApplyArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The TalosCluster whose Cilium values to apply.
    #[arg(long)]
    pub cluster: String,
    /// The TalosCluster's namespace.
    #[arg(long, default_value = "ichor-system")]
    pub namespace: String,
    #[command(flatten)]
    pub helm: HelmArgs,
}

#[derive(Debug, Args)]
pub struct CniBootstrapArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Whether Talos runs kube-proxy (`enabled`) or Cilium replaces it
    /// (`replaced`). Required: this command cannot read the Talos config.
    #[arg(long, value_parser = kube_proxy_parser())]
    pub kube_proxy: KubeProxyMode,
    /// Cilium's tunnel protocol.
    #[arg(long, value_parser = tunnel_parser(), default_value_t = Tunnel::default())]
    pub tunnel: Tunnel,
    /// Cilium chart values merged over Ichor's (YAML). Keys Ichor owns
    /// (k8sServiceHost, k8sServicePort, kubeProxyReplacement, tunnelProtocol, …) are refused.
    #[arg(long, value_name = "FILE")]
    pub cilium_values: Option<PathBuf>,
    #[command(flatten)]
    pub helm: HelmArgs,
    /// How long to wait for Cilium and the nodes to be Ready.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub wait_timeout: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The Ichor version to install (vX.Y.Z): the controller image's tag.
    #[arg(long, value_name = "VERSION")]
    pub to: String,
}

#[derive(Debug, Args, Clone)]
pub struct KubeArgs {
    /// The kubeconfig of the cluster (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args, Clone)]
pub struct HelmArgs {
    /// The `helm` binary Ichor renders charts with (v3.17+ or v4).
    #[arg(long, value_name = "PATH", env = "ICHOR_HELM", default_value = "helm")]
    pub helm: PathBuf,
    /// The Cilium chart: a local folder or archive, or an oci:// reference
    /// (default: Ichor's pinned Cilium chart).
    #[arg(long, value_name = "REF", env = "ICHOR_CILIUM_CHART")]
    pub cilium_chart: Option<String>,
}

/// `--tunnel`: the names of [`Tunnel`], listed in `--help` and completions.
fn tunnel_parser() -> impl TypedValueParser<Value = Tunnel> {
    PossibleValuesParser::new(Tunnel::ALL.map(Tunnel::as_str)).try_map(|s| s.parse::<Tunnel>())
}

/// `--kube-proxy`: the names of [`KubeProxyMode`].
fn kube_proxy_parser() -> impl TypedValueParser<Value = KubeProxyMode> {
    PossibleValuesParser::new(KubeProxyMode::ALL.map(KubeProxyMode::as_str))
        .try_map(|s| s.parse::<KubeProxyMode>())
}

/// `90s`, `10m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 90s, 10m or 1h"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?} is not a duration such as 90s, 10m or 1h")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("10m").unwrap().as_secs(), 600);
        assert_eq!(parse_duration("45").unwrap().as_secs(), 45);
        assert!(parse_duration("ten").is_err());
    }

    /// Covers: R4.4b
    #[test]
    fn cni_bootstrap_help_states_the_kubeprism_requirement() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("cni")
            .unwrap()
            .find_subcommand_mut("bootstrap")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("KubePrism must be enabled on port 7445"),
            "{help}"
        );
        assert!(help.contains("--kube-proxy"));
    }
}
