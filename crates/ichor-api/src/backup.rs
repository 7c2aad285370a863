//! Backups: where a TalosCluster's backups go and when (`spec.backup`), and
//! `TalosBackup`, one backup of one cluster.
//!
//! The cluster holds only age *recipients* (public keys): whoever takes over
//! the cluster cannot read its backups. There is no unencrypted mode.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::machine::ClusterRef;

/// `spec.backup` of a TalosCluster: where backups go, to whom they are
/// encrypted, when they are taken and how long they are kept.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Where each backup is written.
    pub destination: BackupDestination,
    /// age X25519 recipients (public keys, `age1…`) every backup is
    /// encrypted to. Keep the identities off the cluster: `ichor recover`
    /// needs one of them.
    #[schemars(length(min = 1, max = 16), inner(length(max = 128)))]
    #[x_kube(validation = Rule::new("self.all(r, r.matches('^age1[02-9ac-hj-np-z]{58}$'))").message("spec.backup.recipients must be age X25519 recipients (age1 followed by 58 characters), as age-keygen prints them"))]
    pub recipients: Vec<String>,
    /// When scheduled backups are taken. Without it, backups are taken only
    /// before control-plane operations and on request (`ichor backup now`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<BackupSchedule>,
    /// Which succeeded backups are kept. Without it, all are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<BackupRetention>,
}

/// Exactly one of `s3` or `volume`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.s3) != has(self.volume)").message("spec.backup.destination must set exactly one of s3 or volume"))]
pub struct BackupDestination {
    /// An S3-compatible bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Destination>,
    /// A PersistentVolumeClaim in Ichor's namespace, for a cluster without
    /// object storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeDestination>,
}

/// An S3-compatible bucket. Objects go under `<prefix>/<cluster>/<backup>/`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Destination {
    /// The endpoint URL, for example https://s3.eu-central-1.amazonaws.com or
    /// https://minio.example:9000.
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// A key prefix inside the bucket (no leading or trailing slash).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub prefix: String,
    /// The region to sign for; most S3-compatible servers take any.
    #[serde(default = "default_region")]
    #[schemars(length(max = 64))]
    pub region: String,
    /// A Secret in Ichor's namespace with the keys `accessKeyId` and
    /// `secretAccessKey`.
    pub credentials_secret_ref: SecretKeyRef,
    /// Allow an `http://` endpoint (a lab or a bucket on the same host).
    /// The objects are encrypted either way; the credentials are not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_http: bool,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

/// A Secret by name (in Ichor's namespace).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A PersistentVolumeClaim and a folder in it.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeDestination {
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
    /// A folder inside the volume (no leading slash).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub path: String,
}

/// A cron schedule in a time zone.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSchedule {
    /// Five fields: minute, hour, day of month, month, day of week (for
    /// example `30 2 * * *`).
    #[schemars(length(min = 9, max = 128))]
    pub cron: String,
    /// An IANA time zone (for example Europe/Berlin). Default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time_zone: Option<String>,
}

/// Which succeeded backups are kept: a backup beyond the newest `keepLast`
/// or older than `maxAge` is deleted, except that the newest succeeded
/// backup is never deleted for its age.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRetention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub keep_last: Option<u32>,
    /// A duration in days, hours and minutes, for example `30d` or `36h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub max_age: Option<String>,
}

/// One backup of one TalosCluster: taken by the schedule, before an
/// operation, or on request. The spec is immutable.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosBackup",
    doc = "One encrypted backup of a TalosCluster: its etcd snapshot, secrets bundle and Ichor's objects, off the cluster.",
    plural = "talosbackups",
    singular = "talosbackup",
    shortname = "tb",
    category = "ichor",
    namespaced,
    status = "TalosBackupStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.clusterRef.name"
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.size"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec of a TalosBackup is immutable: create a new TalosBackup instead"))]
#[serde(rename_all = "camelCase")]
pub struct TalosBackupSpec {
    /// The TalosCluster (same namespace) to back up.
    pub cluster_ref: ClusterRef,
    /// Why it is taken: schedule, operation or manual.
    #[serde(default)]
    pub reason: BackupReason,
    /// For reason operation: the TalosOperation it was taken for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub operation: Option<String>,
}

/// Why a backup is taken.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BackupReason {
    Schedule,
    Operation,
    #[default]
    Manual,
}

impl BackupReason {
    /// The name used in the spec and in the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            BackupReason::Schedule => "schedule",
            BackupReason::Operation => "operation",
            BackupReason::Manual => "manual",
        }
    }
}

/// Pending, Running, Succeeded or Failed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum BackupPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// What a backup holds and where it went. No secret value: hashes, sizes
/// and object keys only.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TalosBackupStatus {
    #[serde(default)]
    pub phase: BackupPhase,
    /// Why it failed, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The etcd snapshot inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSnapshotStatus>,
    /// The bytes written to the destination, all parts together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Each part: its name, object key, plaintext size and sha256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<BackupPartStatus>,
    /// The folder that holds the parts (bucket or volume, then key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The snapshot's own sha256 trailer matched what was streamed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verified: bool,
    /// Ready, with Reconciling while it is taken and Stalled once it
    /// failed (see ichor_api::conditions::gitops).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The etcd snapshot of a backup.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSnapshotStatus {
    /// The etcd revision the snapshot was read at (from the member's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The control plane it was read from.
    pub member: String,
    /// The database's size in bytes (without the trailer).
    pub db_size: i64,
    /// The sha256 of the database, as etcd's trailer gives it (hex).
    pub sha256: String,
}

/// One part of a backup.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPartStatus {
    /// `etcd-snapshot`, `bundle` or `objects` (the manifest, written last,
    /// is beside them).
    pub name: String,
    pub key: String,
    /// Plaintext bytes.
    pub size: i64,
    /// The plaintext's sha256 (hex).
    pub sha256: String,
}

/// `spec.skipBackup` of a TalosOperation: run without the backup that
/// control-plane operations take first, and say why (recorded in status).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkipBackup {
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backup_reason_names_are_the_specs() {
        for r in [
            BackupReason::Schedule,
            BackupReason::Operation,
            BackupReason::Manual,
        ] {
            let json = serde_json::to_value(r).unwrap();
            assert_eq!(json, serde_json::Value::String(r.as_str().into()));
        }
    }
}
