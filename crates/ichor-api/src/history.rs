//! Config history: the revisions of a machine, one per apply Ichor made to
//! its node, and the annotation that names who made the spec change an apply
//! carries out (docs/adr/0022-config-history.md).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Set by Ichor's admission webhook on every change to a TalosCluster's or
/// TalosMachine's spec: the user the API server authenticated for that
/// request, and when. A value written by hand is overwritten (or put back),
/// so it names the writer of the spec as it stands.
pub const CHANGED_BY_ANNOTATION: &str = "ichor.maesh.dev/changed-by";

/// The path Ichor's controller serves the changed-by mutating webhook on
/// (the install manifest and the chart call it there).
pub const CHANGED_BY_WEBHOOK_PATH: &str = "/mutate-ichor-maesh-dev-v1alpha1-changed-by";

/// Asks the controller to roll a TalosMachine back: the value is the number
/// of the revision whose inputs (the machine's spec, kept in the history
/// Secret that only the controller reads) are written back. The controller
/// writes that spec, removes the annotation, and the change then takes the
/// usual hold-and-apply path as a new revision with reason `Rollback`.
/// Setting it needs `update` (or `patch`) on the machine: whoever may change
/// the spec may ask for an earlier one.
pub const ROLLBACK_ANNOTATION: &str = "ichor.maesh.dev/rollback-to";

/// The revision number a [`ROLLBACK_ANNOTATION`] value asks for; None when
/// it is not a positive decimal number.
pub fn rollback_target(value: &str) -> Option<u64> {
    value.trim().parse().ok().filter(|n| *n > 0)
}

/// On a machine's history Secret (in Ichor's namespace): the machine it
/// belongs to, `namespace/name` (a name may be longer than a label value).
pub const HISTORY_OF_ANNOTATION: &str = "ichor.maesh.dev/history-of";

/// The finalizer on a TalosMachine outside Ichor's namespace whose history
/// Secret exists: an owner reference cannot cross namespaces, so the
/// controller deletes the Secret before it lets the machine go (`ichor
/// reclaim` does both when no controller runs).
pub const HISTORY_FINALIZER: &str = "ichor.maesh.dev/history";

/// The value of [`CHANGED_BY_ANNOTATION`] (JSON in the annotation).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedBy {
    /// The username from the admission request's `userInfo`, as the API
    /// server authenticated it (for example
    /// `system:serviceaccount:team-a:deployer` or `alice@example.com`).
    pub user: String,
    /// When the API server admitted the change (RFC 3339, UTC).
    pub at: String,
}

/// Why Ichor applied a config to a node.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum RevisionReason {
    /// Class B drift on a released machine: the spec changed, or the node did.
    Drift,
    /// A step of a TalosOperation (named in the revision's `operation`).
    Operation,
    /// A node joined from maintenance mode.
    Join,
    /// `ichor machine rollback`: an earlier revision's inputs written back.
    Rollback,
}

/// How Talos was asked to apply the config.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum RevisionApplyMode {
    NoReboot,
    Reboot,
    Staged,
    /// Talos's `TRY`: reverted by the node after its timeout unless confirmed.
    Try,
    /// Over the maintenance API, to an unconfigured node.
    Maintenance,
}

/// What became of a revision.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum RevisionOutcome {
    /// The node took the config (and, for a try-mode apply, it was confirmed).
    Applied,
    /// A try-mode apply waiting for its health checks.
    Trying,
    /// A try-mode apply whose checks failed: Talos put the previous config back.
    RevertedByTry,
}

/// One apply Ichor made to a node. The inputs and the rendered config of each
/// revision are kept apart, in a Secret of the machine's own, never in status.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRevision {
    /// 1 for the first apply Ichor recorded for this machine, then one more
    /// for each apply (a rollback is a new, higher revision).
    pub number: u64,
    /// When the apply was sent.
    pub time: Time,
    /// The hash of the config the node ran before, when Ichor knew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash_before: Option<String>,
    /// The hash of the config applied.
    pub config_hash_after: String,
    pub apply_mode: RevisionApplyMode,
    pub reason: RevisionReason,
    /// The TalosOperation whose step made the apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// For a rollback, the revision whose inputs were written back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<u64>,
    /// The TalosMachine's generation the config was rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_generation: Option<i64>,
    /// The TalosCluster's generation the config was rendered from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_generation: Option<i64>,
    /// Who made the spec change this apply carries out: the newer of the
    /// machine's and the cluster's [`CHANGED_BY_ANNOTATION`]. Absent for an
    /// apply no spec change asked for (a node that drifted on its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_by: Option<ChangedBy>,
    /// The config paths the apply changed. Paths only: values stay in the
    /// revision Secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_paths: Vec<String>,
    pub outcome: RevisionOutcome,
}
