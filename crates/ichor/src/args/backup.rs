//! The arguments of `ichor backup` and `ichor recover`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::{KubeArgs, OutputFormat, parse_duration};

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Ask the controller for a backup now (a TalosBackup of reason manual).
    Now(BackupNowArgs),
    /// Every TalosBackup with its cluster, reason, phase and size.
    List(BackupListArgs),
    /// One TalosBackup: where it went, its etcd snapshot and each part's hash.
    Show(BackupNameArgs),
}

#[derive(Debug, Args)]
pub struct BackupNowArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The namespace of the TalosCluster (and of the TalosBackup).
    #[arg(long, short = 'n', default_value = "ichor-system")]
    pub namespace: String,
    /// The TalosCluster to back up; it needs spec.backup.
    #[arg(long)]
    pub cluster: String,
    /// The TalosBackup's name (default: <cluster>-<UTC time>-manual).
    #[arg(long)]
    pub name: Option<String>,
    /// Wait until the backup succeeds or fails, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Print the backup as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct BackupListArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Only this namespace (default: every namespace).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only this TalosCluster's backups.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Print the backups as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct BackupNameArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The namespace of the TalosBackup.
    #[arg(long, short = 'n', default_value = "ichor-system")]
    pub namespace: String,
    /// The TalosBackup.
    pub name: String,
    /// Print the backup as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}

#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// The TalosCluster to recover; a backup of another cluster is refused.
    #[arg(long)]
    pub cluster: String,
    /// The age identity file (AGE-SECRET-KEY-..., as age-keygen writes it).
    #[arg(long, value_name = "FILE")]
    pub identity: PathBuf,
    /// Where recover writes secrets.yaml, talosconfig, objects.yaml,
    /// kubeconfig and its state file (mode 0600, the folder 0700).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The backup to restore (default: the newest complete one).
    #[arg(long, value_name = "NAME")]
    pub backup: Option<String>,
    /// The S3 bucket the backups are in.
    #[arg(long, value_name = "NAME", conflicts_with = "folder")]
    pub bucket: Option<String>,
    /// The S3 service's URL (default: AWS, from --region).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// The bucket's region.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// The folder inside the bucket the cluster's backups are under (the
    /// destination's prefix).
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Allow a plain http:// endpoint.
    #[arg(long)]
    pub allow_http: bool,
    /// A local folder of backups instead of a bucket.
    #[arg(long, value_name = "DIR")]
    pub folder: Option<PathBuf>,
    /// The control planes' Talos API addresses, the first restores etcd
    /// (default: the backup's TalosMachines of role controlplane, by name).
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub nodes: Vec<String>,
    /// The snapshot is a raw copy of etcd's member/snap/db with no sha256
    /// trailer: accept it (passes recover_skip_hash_check to Talos).
    #[arg(long)]
    pub skip_hash_check: bool,
    /// The namespace Ichor's controller runs in.
    #[arg(long, value_name = "NAMESPACE", default_value = "ichor-system")]
    pub ichor_namespace: String,
    /// How long etcd may take to run healthy after the bootstrap.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration)]
    pub etcd_timeout: std::time::Duration,
    /// How long the Kubernetes API may take to serve the restored data.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub api_timeout: std::time::Duration,
    /// How long Ichor's controller and the TalosCluster may take to be Ready.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub controller_timeout: std::time::Duration,
    /// Do not ask for consent (for scripts).
    #[arg(short, long)]
    pub yes: bool,
    /// Print the result as data.
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
}
