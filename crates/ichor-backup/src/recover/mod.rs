//! `ichor recover`'s decisions, without I/O: which control planes to read
//! and which one restores, whether the readings allow a restore, and, from
//! the state file and what the recovery node shows, the next step of the
//! etcd restore. [`run`] drives those steps over a [`Nodes`] (the Talos API,
//! or a fake in tests) and records each phase through a callback.
//!
//! Talos answers `Bootstrap{recover_etcd}` before the restore runs and keeps
//! the intent in memory only. So recover records the node's boot id with
//! each `Bootstrap` it sends, sends one only while etcd waits and none was
//! sent at the boot id the node shows, and never sends one once etcd runs.

pub mod run;

use serde::{Deserialize, Serialize};

pub use run::{Nodes, run_etcd};

/// The state file's format.
pub const STATE_FORMAT: u32 = 1;

/// The phases recover records, in order. A rerun starts after the last one
/// recorded.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Consent given; nothing written but the state file.
    #[default]
    Planned,
    /// The bundle, talosconfig and objects are in the output folder.
    Files,
    /// The snapshot was uploaded to the recovery node (`EtcdRecover`).
    Uploaded,
    /// `Bootstrap{recover_etcd}` was sent to the recovery node.
    Bootstrapped,
    /// etcd runs and is healthy on the recovery node.
    EtcdRunning,
    /// The Kubernetes API serves objects at the snapshot's revision or later.
    ApiServing,
    /// Ichor's controller is available and its TalosClusters are Ready.
    Reconciled,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Planned,
        Phase::Files,
        Phase::Uploaded,
        Phase::Bootstrapped,
        Phase::EtcdRunning,
        Phase::ApiServing,
        Phase::Reconciled,
    ];

    /// The phase's name, as the state file and `ICHOR_RECOVER_KILL_AFTER` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Planned => "planned",
            Phase::Files => "files",
            Phase::Uploaded => "uploaded",
            Phase::Bootstrapped => "bootstrapped",
            Phase::EtcdRunning => "etcd-running",
            Phase::ApiServing => "api-serving",
            Phase::Reconciled => "reconciled",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What recover remembers between runs, beside the files it wrote. No
/// secret: names, addresses, digests and boot ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub format: u32,
    pub cluster: String,
    pub backup: String,
    /// The control plane that restores etcd: always the same one.
    pub node: String,
    /// The snapshot's database sha256 (the manifest's), to tell a rerun
    /// with another backup.
    pub snapshot_sha256: String,
    pub phase: Phase,
    /// The boot id the node showed when the snapshot was last uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded_at_boot: Option<String>,
    /// The boot ids at which a `Bootstrap` was sent, in order.
    #[serde(default)]
    pub bootstraps: Vec<String>,
}

impl State {
    pub fn new(cluster: &str, backup: &str, node: &str, snapshot_sha256: &str) -> Self {
        State {
            format: STATE_FORMAT,
            cluster: cluster.to_string(),
            backup: backup.to_string(),
            node: node.to_string(),
            snapshot_sha256: snapshot_sha256.to_string(),
            phase: Phase::Planned,
            uploaded_at_boot: None,
            bootstraps: Vec::new(),
        }
    }

    /// Moves to `phase` unless a later one is recorded already.
    pub fn reach(&mut self, phase: Phase) {
        self.phase = self.phase.max(phase);
    }

    /// Whether a `Bootstrap` was ever sent: from then on, etcd running is
    /// the restore's own.
    pub fn bootstrapped(&self) -> bool {
        !self.bootstraps.is_empty()
    }
}

/// Why a state file found in the output folder is not this run's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateMismatch {
    #[error(
        "the state file records a recovery of cluster {cluster} from backup {backup}; this run restores cluster {wanted_cluster} from backup {wanted_backup}"
    )]
    Other {
        cluster: String,
        backup: String,
        wanted_cluster: String,
        wanted_backup: String,
    },
    #[error(
        "the state file records control plane {recorded} as the one that restores etcd; this run would use {wanted}"
    )]
    Node { recorded: String, wanted: String },
    #[error("the state file has format {found}; this Ichor reads format {STATE_FORMAT}")]
    Format { found: u32 },
}

/// Whether a recorded state belongs to this run (same cluster, backup and
/// recovery node); a rerun must finish the same restore.
pub fn same_run(recorded: &State, wanted: &State) -> Result<(), StateMismatch> {
    if recorded.format != STATE_FORMAT {
        return Err(StateMismatch::Format {
            found: recorded.format,
        });
    }
    if recorded.cluster != wanted.cluster
        || recorded.backup != wanted.backup
        || recorded.snapshot_sha256 != wanted.snapshot_sha256
    {
        return Err(StateMismatch::Other {
            cluster: recorded.cluster.clone(),
            backup: recorded.backup.clone(),
            wanted_cluster: wanted.cluster.clone(),
            wanted_backup: wanted.backup.clone(),
        });
    }
    if recorded.node != wanted.node {
        return Err(StateMismatch::Node {
            recorded: recorded.node.clone(),
            wanted: wanted.node.clone(),
        });
    }
    Ok(())
}

/// etcd on one node, as its Talos API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Etcd {
    /// `EtcdStatus` answers: etcd runs; healthy when it reports no error and
    /// is no learner.
    Running { healthy: bool },
    /// The node answers, `EtcdStatus` does not: etcd waits (for a
    /// bootstrap, or for its restore to finish).
    Waiting,
}

/// One control plane read before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub node: String,
    pub seen: Result<Etcd, Unreachable>,
}

/// A node that did not answer, and why (the client's words; no secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// Why recover refuses to start; nothing has been written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "etcd runs on control plane {node}: restoring beside it would start a second etcd cluster and split the data"
    )]
    EtcdRuns { node: String },
    #[error("control plane {node} cannot be reached with the backup's credentials")]
    Unreachable {
        node: String,
        #[source]
        source: Unreachable,
    },
    #[error("the backup lists no control plane (TalosMachine of role controlplane)")]
    NoControlPlane,
}

/// The refusals the readings of every control plane give (empty: go on).
pub fn preflight(readings: &[Reading]) -> Vec<Refusal> {
    if readings.is_empty() {
        return vec![Refusal::NoControlPlane];
    }
    readings
        .iter()
        .filter_map(|r| match &r.seen {
            Ok(Etcd::Running { .. }) => Some(Refusal::EtcdRuns {
                node: r.node.clone(),
            }),
            Ok(Etcd::Waiting) => None,
            Err(e) => Some(Refusal::Unreachable {
                node: r.node.clone(),
                source: e.clone(),
            }),
        })
        .collect()
}

/// The recovery node at one look: its boot id and etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub boot_id: String,
    pub etcd: Etcd,
}

/// What to do next on the recovery node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Upload the snapshot (`EtcdRecover`), then record it at this boot id.
    Upload,
    /// Send `Bootstrap{recover_etcd}`, then record this boot id.
    Bootstrap,
    /// Look again later: the restore runs, or etcd is not healthy yet.
    Wait(&'static str),
    /// etcd runs and is healthy: the restore is done.
    Done,
    /// etcd runs, and this recovery never bootstrapped it: not ours.
    Refuse,
}

/// The next step, from the state and what the node shows.
pub fn etcd_step(state: &State, seen: &Seen) -> Step {
    match seen.etcd {
        Etcd::Running { .. } if !state.bootstrapped() => Step::Refuse,
        Etcd::Running { healthy: true } => Step::Done,
        Etcd::Running { healthy: false } => Step::Wait("etcd runs but is not healthy yet"),
        Etcd::Waiting if state.bootstraps.contains(&seen.boot_id) => {
            Step::Wait("the restore runs: etcd waits for it")
        }
        Etcd::Waiting if state.uploaded_at_boot.as_deref() != Some(seen.boot_id.as_str()) => {
            // Never uploaded, or the node rebooted since: the intent and
            // perhaps the upload are gone.
            Step::Upload
        }
        Etcd::Waiting => Step::Bootstrap,
    }
}

/// A control plane of the backup's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlane {
    /// The TalosMachine's name.
    pub machine: String,
    /// Its Talos API address.
    pub address: String,
}

/// The control planes among the backup's objects (its documents, parsed):
/// the TalosMachines of `cluster` with role controlplane, ordered by name.
pub fn control_planes(objects: &[serde_json::Value], cluster: &str) -> Vec<ControlPlane> {
    let mut out: Vec<ControlPlane> = objects
        .iter()
        .filter(|v| v["kind"] == "TalosMachine")
        .filter(|v| v["spec"]["role"] == "controlplane")
        .filter(|v| v["spec"]["clusterRef"]["name"] == cluster)
        .filter_map(|v| {
            Some(ControlPlane {
                machine: v["metadata"]["name"].as_str()?.to_string(),
                address: v["spec"]["address"].as_str()?.to_string(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.machine.cmp(&b.machine));
    out
}

#[cfg(test)]
mod tests;
