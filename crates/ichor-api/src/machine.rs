//! `TalosMachine`: one node of a TalosCluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer on every released TalosMachine: its deletion runs the
/// membership removal (drain, leave etcd, reset, Node deleted) first.
pub const MEMBERSHIP_FINALIZER: &str = "ichor.maesh.dev/membership";

/// One Talos node: which cluster it belongs to, its role and address, whether
/// Ichor may write to it (hold), and the user's config patches.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosMachine",
    doc = "One node of a TalosCluster; status carries the drift between its live and desired config, per path, with its class.",
    plural = "talosmachines",
    singular = "talosmachine",
    shortname = "tm",
    category = "ichor",
    namespaced,
    status = "TalosMachineStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.clusterRef.name"
    ),
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Hold", type_ = "boolean", json_path = ".spec.hold"),
    printcolumn(name = "Talos", type_ = "string", json_path = ".status.talosVersion"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineSpec {
    /// The TalosCluster (same namespace) this machine belongs to. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.clusterRef is immutable: a machine cannot move to another cluster; delete this TalosMachine and create a new one"))]
    pub cluster_ref: ClusterRef,
    /// controlplane or worker. Immutable: Talos cannot change a node's role in place.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.role is immutable: Talos cannot change a node's role in place; reinstall the node instead"))]
    pub role: MachineRole,
    /// The address Ichor dials the node's Talos API on: an IP address or DNS
    /// host name, optionally with :port when the Talos API is not on its
    /// default port 50000 (behind NAT or a forwarded port); an IPv6 address
    /// with a port in brackets, for example 10.5.0.2, node-1.lab:50001 or
    /// [fd00::2]:50000.
    #[schemars(length(min = 1))]
    pub address: String,
    /// While true, Ichor computes drift for this machine and writes nothing to
    /// it. Defaults to true, so nothing reaches a node until someone releases it.
    #[serde(default = "default_hold")]
    pub hold: bool,
    /// Talos config patches applied after Ichor's own paths, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub patches: Vec<MachinePatch>,
    /// How the machine leaves when this TalosMachine is deleted: its node
    /// wiped back to maintenance mode (Wipe, the default) or left running
    /// (KeepNode), and whether an unreachable node is removed anyway
    /// (force). Absent means Wipe without force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removal: Option<MachineRemoval>,
    /// On a new control plane: the name of the TalosMachine (same
    /// namespace) it replaces. The old one is removed only once etcd lists
    /// this machine's member as a healthy voter and the member count grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub replaces: Option<String>,
    /// How Ichor applies class B changes to this node: noReboot, or try
    /// (Talos reverts the change after `tryTimeout` unless Ichor confirms
    /// it once the node's health checks pass). Unset: the cluster's
    /// `applyMode`, else noReboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_mode: Option<crate::apply::ApplyMode>,
    /// How long a try-mode apply runs unconfirmed before Talos reverts it
    /// (`45s`, `2m`; 1s to 10m). Unset: the cluster's `tryTimeout`, else 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new(crate::apply::TRY_TIMEOUT_RULE).message("tryTimeout must be a duration from 1s to 10m, such as 45s, 2m or 1m30s"))]
    pub try_timeout: Option<String>,
}

/// How a machine is removed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineRemoval {
    /// Wipe (reset the node back to maintenance mode) or KeepNode (leave it
    /// configured and running).
    #[serde(default)]
    pub mode: RemovalMode,
    /// Remove a node whose Talos API does not answer: its etcd member is
    /// removed by id from another control plane and its Node deleted.
    #[serde(default)]
    pub force: bool,
}

/// Wipe or KeepNode.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum RemovalMode {
    /// A graceful Talos reset: the node leaves, is wiped and reboots into
    /// maintenance mode.
    #[default]
    Wipe,
    /// The node stays configured and running; only the cluster forgets it.
    KeepNode,
}

/// Where a machine stands in the cluster's membership.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum MembershipPhase {
    /// Its node answered in maintenance mode; its config is being applied
    /// and Ichor waits for it to boot, join etcd (a control plane) and be Ready.
    #[default]
    Joining,
    /// A member like any other.
    Member,
    /// Its removal runs (`plan`, `step`).
    Leaving,
    /// The removal finished; the TalosMachine goes away.
    Removed,
    /// Its join or removal is refused; `message` says why and what to do.
    Refused,
}

/// A machine's join or removal, as the controller records it: the plan
/// before the first step, each step's intent before it runs.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembershipStatus {
    #[serde(default)]
    pub phase: MembershipPhase,
    /// The removal's steps, in order (Cordon, Drain, ForfeitLeadership,
    /// LeaveEtcd, RemoveMember, Reset, DeleteNode), written before the first runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
    /// The step running now (its intent, written before it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The node's boot id when the current step began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// A reset was sent while the node had this boot id: never another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_sent_boot_id: Option<String>,
    /// What it waits for, why it was refused, or what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the phase or the current step began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

fn default_hold() -> bool {
    true
}

/// A reference to the TalosCluster a machine belongs to.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// Name of the TalosCluster in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The role of a Talos node: controlplane or worker.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MachineRole {
    Controlplane,
    Worker,
}

impl MachineRole {
    /// The name Talos and the spec give the role (`controlplane`, `worker`).
    pub fn as_str(self) -> &'static str {
        match self {
            MachineRole::Controlplane => "controlplane",
            MachineRole::Worker => "worker",
        }
    }
}

impl std::fmt::Display for MachineRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One Talos config patch: a strategic merge patch (YAML documents) or an
/// RFC 6902 JSON patch (a YAML list of operations), as talosctl accepts them.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePatch {
    /// A name for messages and drift reports; unique within the machine.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The patch text.
    pub inline: String,
}

/// The class of one drift entry (see docs/adr/0004-drift-classes.md):
/// A: nothing to do; B: Ichor applies it without a reboot; C: Ichor never applies it on its own.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum DriftClass {
    A,
    B,
    C,
}

/// One path where the live config and the desired config differ (or were compared).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftEntry {
    /// The config path, for example `cluster.network.cni.name` or
    /// `KubeProxyConfig.enabled`.
    pub path: String,
    /// A, B or C.
    pub class: DriftClass,
    /// The value the node runs (YAML), absent when the path is not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<String>,
    /// The value Ichor wants (YAML), absent when the path should not be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<String>,
    /// Why the entry has its class, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What Ichor observes about one machine.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineStatus {
    /// Hash of the last desired config rendered for this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// The drift between the node's live config and the desired config, per path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<DriftEntry>,
    /// The Talos version the node reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talos_version: Option<String>,
    /// The names of the inline manifests in the node's live config (names
    /// only), as last read; absent until the node's config was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_manifests: Option<Vec<String>>,
    /// Ready, Drifted, Applied and Held, among others (see ichor_api::conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Its join or removal: phase, plan, current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<MembershipStatus>,
    /// The newest revisions, oldest first: one per apply Ichor made to the
    /// node, with who and why and the changed paths (no values; the inputs
    /// are kept in the machine's history Secret, docs/adr/0022).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<crate::history::MachineRevision>,
    /// A try-mode apply in flight, or the reverted one that holds the
    /// machine (reason TryReverted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub try_apply: Option<crate::apply::TryApply>,
}
