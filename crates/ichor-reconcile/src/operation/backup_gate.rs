//! The backup an operation takes before it touches a control plane: when
//! the cluster has a backup destination, talos-upgrade and
//! kubernetes-upgrade first take a TalosBackup, and start their first step
//! only once it succeeded. A failed backup fails the operation with no
//! node touched. Pure: the I/O code reads the backup's phase and carries
//! out what [`gate`] says.

use ichor_api::operation::{ComponentPhase, MachineStep, OperationKind, TalosOperationStatus};

/// `status.backup` when the operation runs without a backup on request.
pub const SKIPPED_PREFIX: &str = "skipped: ";
/// `status.backup` when the cluster has no backup destination.
pub const NO_DESTINATION: &str = "none: the TalosCluster has no spec.backup";

/// The operation's backup, as its TalosBackup's phase says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupSeen {
    /// The TalosBackup named in `status.backup` does not exist (yet).
    Missing,
    Waiting,
    Succeeded,
    Failed,
}

/// What the operation does about its backup now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Go on with the steps (the backup succeeded, was skipped, is not
    /// needed, or the steps have begun already).
    Proceed,
    /// Record `status.backup` as this, then go on.
    Record(String),
    /// Create the TalosBackup `name` (reason operation), record it, and wait.
    Create { name: String },
    /// Wait for the TalosBackup named in `status.backup`.
    Wait { name: String },
    /// Fail the operation: its backup failed (or vanished before it ran).
    Fail { message: String },
}

/// Whether any step of the operation has begun: then the backup was
/// decided on already, and a later change of it (retention, say) no longer
/// matters.
fn steps_begun(status: &TalosOperationStatus) -> bool {
    status
        .machines
        .iter()
        .any(|m| !matches!(m.step, MachineStep::Pending | MachineStep::Skipped))
        || status
            .components
            .iter()
            .any(|c| c.phase != ComponentPhase::Pending)
}

/// Whether the gate is passed whatever the backup's state: the kind takes
/// none, a step has begun, or `status.backup` records a skip or no
/// destination. The I/O code reads nothing for the gate then.
pub fn passed(kind: OperationKind, status: &TalosOperationStatus) -> bool {
    !matches!(
        kind,
        OperationKind::TalosUpgrade | OperationKind::KubernetesUpgrade
    ) || steps_begun(status)
        || status
            .backup
            .as_deref()
            .is_some_and(|s| s.starts_with(SKIPPED_PREFIX) || s == NO_DESTINATION)
}

/// The gate for an operation of `kind` with `status`, on a cluster that
/// has a backup destination or not, with `skip` (`spec.skipBackup.reason`),
/// given what is known of the backup it named. `backup_name` is the name a
/// new backup gets.
pub fn gate(
    kind: OperationKind,
    status: &TalosOperationStatus,
    has_destination: bool,
    skip: Option<&str>,
    seen: Option<BackupSeen>,
    backup_name: impl FnOnce() -> String,
) -> Gate {
    if passed(kind, status) {
        return Gate::Proceed;
    }
    match status.backup.as_deref() {
        None => match (skip, has_destination) {
            (Some(reason), _) => Gate::Record(format!("{SKIPPED_PREFIX}{reason}")),
            (None, false) => Gate::Record(NO_DESTINATION.to_string()),
            (None, true) => Gate::Create {
                name: backup_name(),
            },
        },
        Some(name) => match seen {
            Some(BackupSeen::Succeeded) => Gate::Proceed,
            Some(BackupSeen::Failed) => Gate::Fail {
                message: format!(
                    "the backup taken before the first control plane, TalosBackup {name}, failed (see its message); no node was touched. Fix the backup, or set spec.skipBackup with a reason in a new TalosOperation"
                ),
            },
            Some(BackupSeen::Missing) => Gate::Fail {
                message: format!(
                    "TalosBackup {name}, the backup this operation waits for, is gone; no node was touched. Create a new TalosOperation"
                ),
            },
            Some(BackupSeen::Waiting) | None => Gate::Wait {
                name: name.to_string(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::operation::MachineProgress;

    fn status(backup: Option<&str>) -> TalosOperationStatus {
        TalosOperationStatus {
            backup: backup.map(str::to_string),
            machines: vec![MachineProgress {
                machine: "cp-1".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn name() -> String {
        "lab-20261202020000-before-up".into()
    }

    /// Covers: R13.3
    #[test]
    fn a_control_plane_upgrade_takes_its_backup_first() {
        use OperationKind::*;
        for kind in [TalosUpgrade, KubernetesUpgrade] {
            assert_eq!(
                gate(kind, &status(None), true, None, None, name),
                Gate::Create { name: name() }
            );
            let named = status(Some(&name()));
            assert_eq!(
                gate(kind, &named, true, None, Some(BackupSeen::Waiting), name),
                Gate::Wait { name: name() }
            );
            assert_eq!(
                gate(kind, &named, true, None, Some(BackupSeen::Succeeded), name),
                Gate::Proceed
            );
            let failed = gate(kind, &named, true, None, Some(BackupSeen::Failed), name);
            assert!(
                matches!(&failed, Gate::Fail { message } if message.contains("no node was touched")),
                "{failed:?}"
            );
            assert!(matches!(
                gate(kind, &named, true, None, Some(BackupSeen::Missing), name),
                Gate::Fail { .. }
            ));
        }
        // Reboots and Ichor's own upgrade touch no etcd data.
        for kind in [Reboot, Ichor] {
            assert_eq!(
                gate(kind, &status(None), true, None, None, name),
                Gate::Proceed
            );
        }
    }

    /// Covers: R13.3
    #[test]
    fn a_skip_is_recorded_with_its_reason_and_no_destination_is_said() {
        let kind = OperationKind::TalosUpgrade;
        assert_eq!(
            gate(
                kind,
                &status(None),
                true,
                Some("tested on staging"),
                None,
                name
            ),
            Gate::Record("skipped: tested on staging".into())
        );
        assert_eq!(
            gate(
                kind,
                &status(Some("skipped: tested on staging")),
                true,
                None,
                None,
                name
            ),
            Gate::Proceed
        );
        assert_eq!(
            gate(kind, &status(None), false, None, None, name),
            Gate::Record(NO_DESTINATION.into())
        );
        assert_eq!(
            gate(kind, &status(Some(NO_DESTINATION)), false, None, None, name),
            Gate::Proceed
        );
    }

    /// Once a machine has started, a backup that later goes (retention) is
    /// no reason to stop.
    /// Covers: R13.3
    #[test]
    fn the_gate_is_passed_once_steps_have_begun() {
        let mut s = status(Some(&name()));
        s.machines[0].step = MachineStep::Draining;
        assert_eq!(
            gate(
                OperationKind::TalosUpgrade,
                &s,
                true,
                None,
                Some(BackupSeen::Missing),
                name
            ),
            Gate::Proceed
        );
    }
}
