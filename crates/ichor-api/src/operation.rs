//! `TalosOperation`: a one-shot operation on a cluster or some of its machines.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A one-shot operation: upgrade Ichor, Talos or Kubernetes, or reboot
/// machines. The spec is immutable; create a new object for a new operation.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosOperation",
    doc = "A one-shot operation on a TalosCluster: upgrade Ichor, Talos or Kubernetes, or reboot machines.",
    plural = "talosoperations",
    singular = "talosoperation",
    shortname = "talosop",
    category = "ichor",
    namespaced,
    status = "TalosOperationStatus",
    derive = "PartialEq",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.target.clusterRef.name"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec of a TalosOperation is immutable: create a new TalosOperation instead"))]
#[x_kube(validation = Rule::new("self.kind == 'reboot' || has(self.version)").message("spec.version is required for kinds ichor, talos-upgrade and kubernetes-upgrade"))]
#[x_kube(validation = Rule::new("self.kind != 'reboot' || !has(self.version)").message("spec.version must not be set for kind reboot"))]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationSpec {
    /// ichor, talos-upgrade, kubernetes-upgrade or reboot.
    pub kind: OperationKind,
    /// The cluster, and optionally which of its machines.
    pub target: OperationTarget,
    /// The version to upgrade to (not for reboot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version: Option<String>,
}

/// What a TalosOperation does: ichor, talos-upgrade, kubernetes-upgrade or reboot.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OperationKind {
    Ichor,
    TalosUpgrade,
    KubernetesUpgrade,
    Reboot,
}

/// What an operation acts on.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationTarget {
    /// The TalosCluster (same namespace).
    pub cluster_ref: crate::machine::ClusterRef,
    /// TalosMachine names; empty means every machine of the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000), inner(length(max = 253)))]
    pub machines: Vec<String>,
}

/// Pending, Running, Succeeded or Failed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum OperationPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// Progress of an operation.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationStatus {
    /// Pending, Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OperationPhase>,
    /// What is happening or what went wrong, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the operation started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the operation succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Conditions (see ichor_api::conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
