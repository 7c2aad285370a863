//! Ichor's Kubernetes API: group `ichor.maesh.dev`, version `v1alpha1`.
//!
//! - [`TalosCluster`] — one Talos cluster: endpoint, versions, network, CNI.
//! - [`TalosMachine`] — one node of a cluster: role, address, hold, patches;
//!   its status carries the drift per path with its class.
//! - [`IchorInstallation`] — the singleton that says how Ichor itself is installed.
//! - [`TalosOperation`] — a one-shot operation (upgrade, reboot) on a cluster.
//! - [`TalosBackup`] — one encrypted backup of a cluster, off the cluster
//!   ([`backup`] also holds the TalosCluster's `spec.backup`).
//!
//! Condition types and reasons are constants in [`conditions`], and conditions
//! are built and merged there only. [`crds`] lists every CRD and renders the
//! YAML that `distgen` writes to `dist/crds/`. [`validation`] holds the
//! admission checks (the same rules as the CEL, with messages for people).
//!
//! This crate talks to no server.
//!
//! Decisions a reader may question:
//! - `TalosMachine.spec.hold` defaults to **true**: a machine created without
//!   saying otherwise is never written to until someone releases it.
//! - `spec.cni.tunnel` defaults to `vxlan` (the API default of R1.4a) and is
//!   immutable by CEL (`self == oldSelf`); because the default is always
//!   filled in, "once set" is "from creation".
//! - `spec.cni.cilium.values` is free-form, but the Ichor-owned top-level keys
//!   are declared in the schema (as int-or-string, the only loose type CEL can
//!   read) so one CEL rule refuses them; a boolean `kubeProxyReplacement` is
//!   refused by that type instead, with the apiserver's type message.
//!   [`validation`] says the same for the webhook, naming the keys found.
//! - `IchorInstallation` is namespaced (in `ichor-system`, like everything
//!   else) and a singleton by CEL on `metadata.name` (`ichor`).
//! - A `TalosOperation`'s spec is immutable: an operation is a record of one
//!   request; a new request is a new object.

// kube's derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = "string"` inside them as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod apply;
pub mod backup;
pub mod cilium;
pub mod cluster;
pub mod cni;
pub mod conditions;
pub mod crds;
pub mod endpoint;
pub mod error_text;
pub mod history;
pub mod installation;
pub mod machine;
pub mod operation;
mod schema;
pub mod selector;
pub mod validation;
pub mod window;

pub use backup::{
    BackupDestination, BackupPartStatus, BackupPhase, BackupReason, BackupRetention,
    BackupSchedule, BackupSpec, EtcdSnapshotStatus, S3Destination, SecretKeyRef, SkipBackup,
    TalosBackup, TalosBackupSpec, TalosBackupStatus, VolumeDestination,
};
pub use cluster::{
    CiliumReleaseStatus, CiliumSpec, ClusterNetwork, CniJobFailures, CniPreset, CniSpec, CniStatus,
    DetectedCni, KubeProxyMode, SecretsRef, TalosCNI, TalosCluster, TalosClusterSpec,
    TalosClusterStatus, Tunnel, UnmanagedCni,
};
pub use installation::{
    DeploymentSpec, IchorInstallation, IchorInstallationSpec, IchorInstallationStatus, Manager,
    SINGLETON_NAME as INSTALLATION_NAME,
};
pub use machine::{
    ClusterRef, DriftClass, DriftEntry, MachinePatch, MachineRemoval, MachineRole, MembershipPhase,
    MembershipStatus, RemovalMode, TalosMachine, TalosMachineSpec, TalosMachineStatus,
};
pub use operation::{
    ComponentPhase, ComponentProgress, KubernetesComponent, MachineProgress, MachineStep,
    OperationKind, OperationPhase, OperationTarget, PlanEntry, PlannedAction, TalosOperation,
    TalosOperationSpec, TalosOperationStatus, UnknownOperationKind,
};

/// Annotation set on a TalosCluster that `ichor init` created.
pub const INITIALIZED_ANNOTATION: &str = "ichor.maesh.dev/initialized";

/// The API group of every Ichor resource.
pub const GROUP: &str = "ichor.maesh.dev";
/// The API version of this crate's types.
pub const VERSION: &str = "v1alpha1";
/// The namespace Ichor runs in and keeps its objects in.
pub const SYSTEM_NAMESPACE: &str = "ichor-system";
/// Annotation set on a TalosCluster that `ichor adopt` created.
pub const ADOPTED_ANNOTATION: &str = "ichor.maesh.dev/adopted";
/// On a TalosOperation: `spec.installerImage` may name a registry outside
/// [`TRUSTED_INSTALLER_REGISTRIES`]. Guarded by an admission policy: only a
/// user allowed the `any-installer-image` verb on talosoperations may set it.
pub const ANY_INSTALLER_IMAGE_ANNOTATION: &str = "ichor.maesh.dev/any-installer-image";
/// Where a talos-upgrade's `spec.installerImage` may come from without
/// [`ANY_INSTALLER_IMAGE_ANNOTATION`]: Sidero Labs' own registries. (With no
/// `spec.installerImage`, each machine's own installer repository is used.)
pub const TRUSTED_INSTALLER_REGISTRIES: [&str; 2] = ["ghcr.io/siderolabs/", "factory.talos.dev/"];
/// Set (any value) on a TalosOperation to stop it before its next step.
pub const CANCEL_ANNOTATION: &str = "ichor.maesh.dev/cancel";
/// On a TalosCluster: `spec.cni.cilium.values` may set images, host paths,
/// extra containers and ServiceAccounts (refused without it). Guarded by an
/// admission policy: only a user allowed the `privileged-values` verb on
/// talosclusters may set or change it.
pub const PRIVILEGED_VALUES_ANNOTATION: &str = "ichor.maesh.dev/privileged-cilium-values";
/// Annotation on a TalosCluster naming the Talos inline manifest that carried
/// Cilium before Ichor took it over (written by adopt on a takeover); the
/// render removes that entry at the hand-over, with Ichor's own.
pub const TAKEN_OVER_INLINE_MANIFEST_ANNOTATION: &str =
    "ichor.maesh.dev/taken-over-inline-manifest";
