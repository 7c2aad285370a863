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
#[x_kube(validation = Rule::new("self.kind == 'ichor' || !has(self.allowDowngrade)").message("spec.allowDowngrade is only for kind ichor"))]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationSpec {
    /// ichor, talos-upgrade, kubernetes-upgrade or reboot.
    pub kind: OperationKind,
    /// The cluster, and optionally which of its machines.
    pub target: OperationTarget,
    /// The version to upgrade to (not for reboot), for example v1.14.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+(-[0-9A-Za-z.-]+)?$')").message("spec.version must look like v1.14.0"))]
    pub version: Option<String>,
    /// ichor: install a version older than the running controller's. Off by
    /// default; the plan and its Event say when it was used.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_downgrade: bool,
    /// How many workers may reboot at once (control planes always go one at
    /// a time). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub concurrency: Option<u32>,
    /// talos-upgrade: the installer image to install, tag included. Default:
    /// the machine's own installer repository (so its schematic is kept) with
    /// the tag `spec.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub installer_image: Option<String>,
    /// Write the plan to status and stop: nothing is touched. The operation
    /// ends Succeeded with the reason DryRun.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// talos-upgrade and kubernetes-upgrade: run without the backup taken
    /// before the first control plane when the cluster has a backup
    /// destination. The reason is recorded in status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_backup: Option<crate::backup::SkipBackup>,
    /// When machines may start: this operation's maintenance windows,
    /// overriding the TalosCluster's `spec.maintenanceWindows`. Unset: the
    /// cluster's. An empty list: any time. A machine already started
    /// finishes even when its window closes. Dry runs ignore windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    pub maintenance_windows: Option<Vec<crate::window::MaintenanceWindow>>,
    /// Health checks: CEL expressions over the objects a reference selects,
    /// evaluated before the operation, before each batch and after each
    /// machine (besides the built-in gates: every Node Ready, etcd healthy
    /// with all members, no control-plane static pod crash-looping). A
    /// check failing past its timeout pauses the operation (phase Paused);
    /// it runs again once the check passes, or when the annotation
    /// `ichor.maesh.dev/skip-gates` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub health_checks: Vec<HealthCheck>,
    /// Quiet alerts while the operation works: an Alertmanager to create a
    /// silence in for the operation's nodes, extended while it runs and
    /// expired at its end. Unset: no silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<AlertmanagerSilence>,
}

/// Set on a TalosOperation (any value): its health gates, the built-in ones
/// included, no longer pause it; a paused operation runs on.
pub const SKIP_GATES_ANNOTATION: &str = "ichor.maesh.dev/skip-gates";

/// The Waiting condition's reason while a health gate pauses the operation.
pub const HEALTH_CHECK_FAILED: &str = "HealthCheckFailed";

/// Where an operation silences its nodes' alerts.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerSilence {
    /// The Alertmanager's base URL, for example
    /// `http://alertmanager.monitoring:9093` (its API v2 is under `/api/v2`).
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("spec.alertmanager.url must be an http:// or https:// URL"))]
    pub url: String,
    /// The alert label the silence matches the nodes on (a regular
    /// expression of their Node names). Default `node`, the label of
    /// kube-state-metrics' node alerts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub node_label: Option<String>,
    /// How long the silence lasts from each extension (`30m`, `1h`; units
    /// d, h, m, s). The operation extends it once less than half is left,
    /// so it outlives a controller that stops. Default 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+[dhms])+$')").message("spec.alertmanager.length must be a duration such as 30m or 1h"))]
    pub length: Option<String>,
}

/// The Complete condition's reason when the image could not be pulled on
/// some machine before the first cordon: nothing was cordoned or drained.
pub const PRE_PULL_FAILED: &str = "PrePullFailed";

/// One health check: the CEL expression must be true for every object the
/// target selects (and at least one object must be selected).
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Names the check in status, messages and Events.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// A CEL expression of type bool; the object selected is `object`. For
    /// example `object.status.conditions.exists(c, c.type == 'Available' &&
    /// c.status == 'True')`.
    #[schemars(length(min = 1, max = 4096))]
    pub expression: String,
    /// The objects the expression is evaluated on.
    pub target: HealthCheckTarget,
    /// How long the check may keep failing before the operation pauses
    /// (`30s`, `5m`; units d, h, m, s). Unset: it pauses at the first
    /// failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+[dhms])+$')").message("timeout must look like 30s, 5m or 1h30m"))]
    pub timeout: Option<String>,
}

/// The objects a health check reads: one by name, or every object a label
/// selector selects (in `namespace`, or cluster-wide when unset).
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.name) && has(self.labelSelector))").message("a health check target has a name or a labelSelector, not both"))]
pub struct HealthCheckTarget {
    /// For example `apps/v1`, `v1`.
    #[schemars(length(min = 1, max = 253))]
    pub api_version: String,
    /// For example `Deployment`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// The namespace of a namespaced kind. Unset: cluster-scoped, or every
    /// namespace for a selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// One object by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
    /// Every object with these labels, written as `kubectl -l` takes them
    /// (`app=web,tier!=cache`). Neither name nor selector: every object of
    /// the kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub label_selector: Option<String>,
}

/// Why the operation is paused: the gate that failed.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthGateStatus {
    /// The check's name, or the built-in gate's (`nodes-ready`,
    /// `etcd-healthy`, `static-pods`).
    pub check: String,
    /// The object that failed (`Deployment web/api`, `Node n1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// What was found: the expression's value, or the failing field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// When the check started failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

impl OperationKind {
    /// The name used in the spec (`talos-upgrade`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::Ichor => "ichor",
            OperationKind::TalosUpgrade => "talos-upgrade",
            OperationKind::KubernetesUpgrade => "kubernetes-upgrade",
            OperationKind::Reboot => "reboot",
        }
    }

    /// Every kind, in the order the spec's documentation gives them.
    pub const ALL: [OperationKind; 4] = [
        OperationKind::Ichor,
        OperationKind::TalosUpgrade,
        OperationKind::KubernetesUpgrade,
        OperationKind::Reboot,
    ];
}

impl std::str::FromStr for OperationKind {
    type Err = UnknownOperationKind;

    /// The kind the spec's name means (`talos-upgrade`, …).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        OperationKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| UnknownOperationKind(name.to_owned()))
    }
}

/// A name that is no operation kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an operation kind (ichor, talos-upgrade, kubernetes-upgrade or reboot)")]
pub struct UnknownOperationKind(pub String);

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

/// Pending, Running, Waiting, Paused, Succeeded or Failed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum OperationPhase {
    #[default]
    Pending,
    Running,
    /// Outside its maintenance window: no new machine starts until the
    /// next window (`status.nextWindow`).
    Waiting,
    /// A health gate failed: no new machine starts until it passes or the
    /// operation is annotated `ichor.maesh.dev/skip-gates`
    /// (`status.healthGate` says which).
    Paused,
    Succeeded,
    Failed,
}

/// Progress of an operation.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationStatus {
    /// Pending, Running, Waiting, Paused, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<OperationPhase>,
    /// While Waiting: when the next maintenance window opens (none when no
    /// window opens again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<Time>,
    /// The health gate failing now (Paused, or failing within its
    /// timeout); cleared when it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_gate: Option<HealthGateStatus>,
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
    /// The plan, written before anything is touched: every targeted machine
    /// in the order it is acted on, and what is skipped and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub plan: Vec<PlanEntry>,
    /// Per machine, in plan order: where it is, and what was seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub machines: Vec<MachineProgress>,
    /// kubernetes-upgrade: the component steps in the order they run
    /// (kube-apiserver on each control plane, then kube-controller-manager,
    /// kube-scheduler, kube-proxy, then the kubelets node by node, then the
    /// bootstrap-manifests sync on one control plane), written with the
    /// plan, before anything is touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    pub components: Vec<ComponentProgress>,
    /// The TalosBackup taken before the first control plane, or why none was
    /// (`skipped: <reason>`, `no backup destination`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// talos-upgrade through more than one release (Talos cannot install
    /// the target over some machine's version): the version the machines
    /// move to now, one of the plan's hops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_hop: Option<String>,
    /// talos-upgrade: the installer image pulled on every planned machine
    /// before the first cordon (of each hop), per machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub pre_pull: Vec<PrePullProgress>,
    /// How long the operation ran, from its start to its end (`83.412s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The Alertmanager silence of the operation's nodes (its ID), while
    /// `spec.alertmanager` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silence: Option<SilenceStatus>,
}

/// Where one machine's pre-pull is.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum PrePullPhase {
    #[default]
    Pending,
    Pulled,
    /// Not pulled ahead: the machine runs a Talos older than 1.13, whose
    /// legacy upgrade pulls the installer itself.
    Skipped,
    Failed,
}

/// One machine's pre-pull.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrePullProgress {
    /// The TalosMachine.
    pub machine: String,
    /// The image pulled.
    pub image: String,
    pub phase: PrePullPhase,
    /// How long the pull took (`1.204s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Why it failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The operation's Alertmanager silence.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SilenceStatus {
    /// The silence's ID in the Alertmanager.
    pub id: String,
    /// When it ends unless extended again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<Time>,
    /// Expired: the operation ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
}

/// A Kubernetes component that Talos runs from the machine config.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
pub enum KubernetesComponent {
    #[serde(rename = "kube-apiserver")]
    ApiServer,
    #[serde(rename = "kube-controller-manager")]
    ControllerManager,
    #[serde(rename = "kube-scheduler")]
    Scheduler,
    #[serde(rename = "kube-proxy")]
    KubeProxy,
    #[serde(rename = "kubelet")]
    Kubelet,
    /// The last step, on one control plane: the objects of the bootstrap
    /// manifests Talos renders for the new version, brought up to date in
    /// the cluster (never pruned, never one a Helm release owns).
    #[serde(rename = "bootstrap-manifests")]
    BootstrapManifests,
}

impl KubernetesComponent {
    /// The name in status and messages (`kube-apiserver`, …, `kubelet`).
    pub fn as_str(self) -> &'static str {
        match self {
            KubernetesComponent::ApiServer => "kube-apiserver",
            KubernetesComponent::ControllerManager => "kube-controller-manager",
            KubernetesComponent::Scheduler => "kube-scheduler",
            KubernetesComponent::KubeProxy => "kube-proxy",
            KubernetesComponent::Kubelet => "kubelet",
            KubernetesComponent::BootstrapManifests => "bootstrap-manifests",
        }
    }
}

/// Where one component step of a kubernetes-upgrade is.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ComponentPhase {
    #[default]
    Pending,
    /// The machine-config change is being written (recorded before the write).
    Applying,
    /// Written; waiting for the node to run the new image.
    Waiting,
    Succeeded,
    Failed,
}

/// One component step of a kubernetes-upgrade: one component on one machine.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentProgress {
    /// kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
    /// kubelet or bootstrap-manifests.
    pub component: KubernetesComponent,
    /// The TalosMachine.
    pub machine: String,
    pub phase: ComponentPhase,
    /// The image before the step (read from the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_before: Option<String>,
    /// The image the step writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The last thing said about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One machine in the plan.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    /// The TalosMachine.
    pub machine: String,
    /// controlplane or worker.
    pub role: crate::machine::MachineRole,
    /// Batches run in order; the machines of one batch together (only
    /// workers share a batch, up to spec.concurrency).
    pub batch: u32,
    /// upgrade, reboot or skip.
    pub action: PlannedAction,
    /// Why it is skipped or placed where it is ("held", "runs Ichor's controller").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the plan does to a machine.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PlannedAction {
    Upgrade,
    Reboot,
    Skip,
}

/// Where a machine is in the operation. A step is recorded before it runs,
/// so after a restart the controller knows what may have happened.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum MachineStep {
    #[default]
    Pending,
    /// Control plane: waiting for etcd to be healthy without this member.
    CheckingEtcd,
    /// Pulling the installer image into the node's system containerd.
    Pulling,
    /// Writing the installer to the other boot slot.
    Upgrading,
    /// Cordoning the Node and evicting its pods.
    Draining,
    /// Forfeiting etcd leadership (control plane) and rebooting.
    Rebooting,
    /// Waiting for a new boot id, the target version and a Ready Node.
    WaitingForReturn,
    Uncordoning,
    Succeeded,
    Failed,
    Skipped,
}

impl MachineStep {
    /// Succeeded, Failed or Skipped.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            MachineStep::Succeeded | MachineStep::Failed | MachineStep::Skipped
        )
    }
}

/// Progress of one machine.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineProgress {
    /// The TalosMachine.
    pub machine: String,
    /// The step it is in.
    pub step: MachineStep,
    /// Its Kubernetes Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// When work on it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the current step started (its bound counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_start_time: Option<Time>,
    /// When it succeeded, failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_after: Option<String>,
    /// The installer image written (talos-upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// talos-upgrade, written with the plan: the versions this machine
    /// passes through, in order, the last the target; more than one when
    /// Talos cannot install the target over the version it runs (each hop
    /// the newest patch of a release Talos requires on the way).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20), inner(length(max = 64)))]
    pub hops: Vec<String>,
    /// How long the machine took, every hop together (`41.007s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The last thing said about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod kind_names {
    use super::*;

    /// The names the UI and the CLI parse are the spec's own: each kind's
    /// name reads back to it, as serde writes it.
    #[test]
    fn every_kind_reads_back_from_its_spec_name() {
        for kind in OperationKind::ALL {
            assert_eq!(kind.as_str().parse::<OperationKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert!("Reboot".parse::<OperationKind>().is_err());
    }
}
