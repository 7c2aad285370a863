//! Condition types and reasons, and the one place conditions are built and merged.
//!
//! Time is injected (`now`), so callers and tests decide the clock. A
//! condition's `lastTransitionTime` changes only when its status changes.
//!
//! How GitOps tools read the status (kstatus for Flux and Helm 4, Argo CD's
//! health scripts) is decided once for every kind in [`gitops`]; the rules
//! of Flux's condition checker are [`flux::violations`].

pub mod flux;
pub mod gitops;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
pub mod types {
    /// The object is reconciled and healthy: True when done, Unknown while
    /// work is under way, False on a failure (every kind; see [`super::gitops`]).
    pub const READY: &str = "Ready";
    /// Work is under way (with `Ready=Unknown`); absent otherwise. kstatus
    /// reads it as InProgress.
    pub const RECONCILING: &str = "Reconciling";
    /// A failure Ichor will not get past without a change by someone (with
    /// `Ready=False`); absent otherwise. kstatus reads it as Failed.
    pub const STALLED: &str = "Stalled";
    /// TalosCluster: Ichor's Cilium release has taken over the CNI (R1.5e).
    pub const CNI_HANDOVER: &str = "CNIHandover";
    /// TalosMachine: the live config differs from the desired config.
    pub const DRIFTED: &str = "Drifted";
    /// TalosMachine: the last apply of the desired config and its read-back.
    pub const APPLIED: &str = "Applied";
    /// TalosMachine: the machine is held, so Ichor writes nothing to it.
    pub const HELD: &str = "Held";
    /// TalosOperation: the operation has finished (successfully or not).
    pub const COMPLETE: &str = "Complete";
    /// TalosOperation: machines the plan skips (True names them).
    pub const SKIPPED: &str = "Skipped";
    /// TalosOperation: the operation is waiting (etcd, a drain, a node's return).
    pub const WAITING: &str = "Waiting";
    /// TalosCluster: the newest finished backup succeeded and no two
    /// scheduled runs have passed since without one (absent without
    /// `spec.backup`; see `ichor_reconcile::cluster::backup_health`).
    pub const BACKUP_HEALTHY: &str = "BackupHealthy";
}

/// Condition reasons (CamelCase, as Kubernetes requires).
pub mod reasons {
    // Ready
    /// Everything Ichor checked is as it should be.
    pub const RECONCILED: &str = "Reconciled";
    /// The node's Talos API did not answer.
    pub const NODE_UNREACHABLE: &str = "NodeUnreachable";
    /// The secrets bundle Secret is missing or unreadable.
    pub const BUNDLE_UNAVAILABLE: &str = "BundleUnavailable";
    /// The TalosCluster a machine refers to does not exist.
    pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
    /// The desired config could not be rendered (bad patch, bad live config).
    pub const RENDER_FAILED: &str = "RenderFailed";
    /// A Kubernetes API read the reconcile needed failed (TalosMachine).
    pub const API_ERROR: &str = "ApiError";
    /// TalosCluster: no TalosMachine refers to the cluster yet.
    pub const NO_MACHINES: &str = "NoMachines";
    /// TalosCluster: some of its machines are not Ready.
    pub const MACHINES_NOT_READY: &str = "MachinesNotReady";
    /// TalosOperation, TalosBackup: created, not started yet.
    pub const PENDING: &str = "Pending";
    /// TalosOperation, TalosBackup: under way.
    pub const RUNNING: &str = "Running";
    /// TalosOperation: outside its maintenance window.
    pub const OUTSIDE_WINDOW: &str = "OutsideWindow";
    /// TalosOperation: a health gate failed; nothing new starts until it passes.
    pub const HEALTH_GATE_FAILED: &str = "HealthGateFailed";

    // CNIHandover
    /// Ichor's Cilium release is deployed at the effective-values hash and its DaemonSet is Ready.
    pub const HANDED_OVER: &str = "HandedOver";
    /// The Cilium release is missing or at another values hash.
    pub const WAITING_FOR_RELEASE: &str = "WaitingForRelease";
    /// The release is deployed; the Cilium DaemonSet is not Ready yet.
    pub const WAITING_FOR_DAEMON_SET: &str = "WaitingForDaemonSet";
    /// The ichor-cni Job that runs the Cilium apply failed.
    pub const JOB_FAILED: &str = "JobFailed";
    /// The CNI is the user's (preset unmanaged); there is nothing to hand over.
    pub const UNMANAGED: &str = "Unmanaged";
    /// `spec.cni.cilium.values` cannot give effective values.
    pub const INVALID_VALUES: &str = "InvalidValues";
    /// The ichor-cni Job is bringing the release to the effective values.
    pub const JOB_RUNNING: &str = "JobRunning";
    /// The release has taken Cilium over; the inline Cilium entry is being
    /// removed from the control planes' configs (a class B apply by Ichor).
    pub const REMOVING_INLINE_MANIFEST: &str = "RemovingInlineManifest";

    // Drifted
    /// Live and desired config are equal on every path (or only class A differs).
    pub const NO_DRIFT: &str = "NoDrift";
    /// Only class B drift: Ichor applies it without a reboot when not held.
    pub const SAFE_DRIFT: &str = "SafeDrift";
    /// Class C drift: Ichor will not apply it on its own.
    pub const UNSAFE_DRIFT: &str = "UnsafeDrift";

    // Held
    /// spec.hold is true.
    pub const HOLD_SET: &str = "HoldSet";
    /// spec.hold is false.
    pub const RELEASED: &str = "Released";

    // Applied
    /// The desired config was applied in no-reboot mode and read back equal.
    pub const APPLIED: &str = "Applied";
    /// The node refused the apply or it failed.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The config read back after an apply differs from what was applied.
    pub const READ_BACK_MISMATCH: &str = "ReadBackMismatch";
    /// spec.hold was set back to true between the read of the machine and the apply: nothing was written.
    pub const HOLD_TAKEN_BACK: &str = "HoldTakenBack";
    /// The TalosMachine changed (or was replaced) between its read and the apply: nothing was written.
    pub const SPEC_CHANGED: &str = "SpecChanged";
    /// A try-mode apply runs on the node; Ichor confirms it once the node's
    /// health checks pass, else Talos puts the previous config back.
    pub const TRYING: &str = "Trying";
    /// A try-mode apply's health checks failed and Talos put the previous
    /// config back; the machine is held until its spec changes.
    pub const TRY_REVERTED: &str = "TryReverted";

    // Complete (TalosOperation)
    /// The operation finished successfully.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The operation failed.
    pub const FAILED: &str = "Failed";
    /// The operation kind is refused on this install (for example kind ichor on a Helm-managed Ichor).
    pub const REFUSED: &str = "Refused";
    /// kubernetes-upgrade refused at plan time: a control plane is held (version skew).
    pub const CONTROL_PLANE_HELD: &str = "ControlPlaneHeld";
    /// The operation was cancelled (deleted, or annotated ichor.maesh.dev/cancel).
    pub const CANCELLED: &str = "Cancelled";
    /// etcd was not healthy enough to take a control plane down within the bound.
    pub const ETCD_UNHEALTHY: &str = "EtcdUnhealthy";
    /// TalosOperation: the backup taken before the first control plane failed.
    /// TalosCluster (BackupHealthy): the newest finished backup failed.
    pub const BACKUP_FAILED: &str = "BackupFailed";
    /// TalosOperation: waiting for the backup taken before the first control plane.
    /// TalosCluster (BackupHealthy): no backup has finished yet.
    pub const WAITING_FOR_BACKUP: &str = "WaitingForBackup";
    /// TalosCluster (BackupHealthy): the newest finished backup succeeded
    /// and is recent enough for the schedule.
    pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";
    /// TalosCluster (BackupHealthy): two scheduled runs have passed without
    /// a succeeded backup.
    pub const BACKUP_OVERDUE: &str = "BackupOverdue";
    /// TalosCluster (BackupHealthy): the volume destination's claim is not
    /// mounted into the controller (the message says what to set).
    pub const VOLUME_NOT_MOUNTED: &str = "VolumeNotMounted";
    /// A drain did not finish within its bound (a PodDisruptionBudget blocked it).
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    /// A node came back from its upgrade on its old version (the fallback boot slot).
    pub const BOOTED_OLD_VERSION: &str = "BootedOldVersion";
    /// A node did not come back (new boot id, target version, Node Ready) within the bound.
    pub const RETURN_TIMEOUT: &str = "ReturnTimeout";
    /// A Talos API call of a step failed.
    pub const STEP_FAILED: &str = "StepFailed";
    /// This Ichor does not run this kind yet (the plan is written, nothing is touched).
    pub const KIND_NOT_SUPPORTED: &str = "KindNotSupported";
    /// spec.dryRun: the plan is written and nothing is touched.
    pub const DRY_RUN: &str = "DryRun";
    /// kubernetes-upgrade refused at plan time: the version path is not the same minor or the next one.
    pub const UNSUPPORTED_VERSION_PATH: &str = "UnsupportedVersionPath";
    /// kubernetes-upgrade refused at plan time: objects of an API removed on the path still exist.
    pub const REMOVED_API_IN_USE: &str = "RemovedAPIInUse";
    /// A kubernetes-upgrade refused at plan time: the Talos of a machine it
    /// would reach does not run the target Kubernetes version.
    pub const UNSUPPORTED_BY_TALOS: &str = "UnsupportedByTalos";
    /// A kubernetes-upgrade refused at plan time: a machine's config still
    /// gives a flag, admission plugin or feature gate the path removes.
    pub const REMOVED_SETTING_IN_USE: &str = "RemovedSettingInUse";
    /// A node did not run a component's new image within the bound.
    pub const COMPONENT_TIMEOUT: &str = "ComponentTimeout";

    // Skipped (TalosOperation)
    /// Some machines are skipped; the message names them and why.
    pub const MACHINES_SKIPPED: &str = "MachinesSkipped";
    /// No machine is skipped.
    pub const NONE_SKIPPED: &str = "NoneSkipped";

    // Waiting (TalosOperation)
    /// An etcd member is not started, is a learner, or quorum would be lost.
    pub const WAITING_FOR_ETCD: &str = "WaitingForEtcd";
    /// Evictions are refused (PodDisruptionBudget); retrying until the bound.
    pub const WAITING_FOR_DRAIN: &str = "WaitingForDrain";
    /// Waiting for a node to run a component's new image (kubernetes-upgrade).
    pub const WAITING_FOR_COMPONENT: &str = "WaitingForComponent";
    /// Waiting for a rebooted node to return.
    pub const WAITING_FOR_RETURN: &str = "WaitingForReturn";
    /// Not waiting.
    pub const NOT_WAITING: &str = "NotWaiting";
}

/// The status of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    /// `"True"`, `"False"` or `"Unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Builds a condition. `now` becomes its `lastTransitionTime` unless
/// [`set`] keeps an older one.
pub fn new(
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// Puts `condition` into `conditions`, replacing one of the same type. The
/// existing `lastTransitionTime` is kept when the status did not change.
/// Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time.clone();
            }
            if *existing == condition {
                return false;
            }
            *existing = condition;
            true
        }
        None => {
            conditions.push(condition);
            true
        }
    }
}

/// The condition of that type, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of that type exists and is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Whether the render drops a TalosCluster's inline Cilium entry: its
/// Cilium release holds, so `CNIHandover` is True or on its way there past
/// the release step ([`reasons::REMOVING_INLINE_MANIFEST`]).
pub fn inline_cni_dropped(conditions: &[Condition]) -> bool {
    find(conditions, types::CNI_HANDOVER)
        .is_some_and(|c| c.status == "True" || c.reason == reasons::REMOVING_INLINE_MANIFEST)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    #[test]
    fn transition_time_is_kept_while_status_stays() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            new(
                types::READY,
                Status::False,
                reasons::NODE_UNREACHABLE,
                "a",
                Some(1),
                t(10)
            )
        ));
        assert!(set(
            &mut cs,
            new(
                types::READY,
                Status::False,
                reasons::RENDER_FAILED,
                "b",
                Some(2),
                t(20)
            )
        ));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, t(10));
        assert_eq!(cs[0].reason, reasons::RENDER_FAILED);
        assert!(!set(
            &mut cs,
            new(
                types::READY,
                Status::False,
                reasons::RENDER_FAILED,
                "b",
                Some(2),
                t(30)
            )
        ));
        assert!(set(
            &mut cs,
            new(
                types::READY,
                Status::True,
                reasons::RECONCILED,
                "",
                Some(2),
                t(40)
            )
        ));
        assert_eq!(cs[0].last_transition_time, t(40));
        assert!(is_true(&cs, types::READY));
        assert!(!is_true(&cs, types::CNI_HANDOVER));
    }
}
