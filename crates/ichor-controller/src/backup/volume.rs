//! A volume destination: the one PersistentVolumeClaim Ichor's chart mounts
//! into the controller at [`ROOT`] (chart value `backup.volume.claimName`),
//! written through the same store and layout as a bucket. Pure: which
//! folder a cluster's `spec.backup.destination.volume` names, or why none.

use std::path::{Component, Path, PathBuf};

use ichor_api::backup::VolumeDestination;

/// Where the chart mounts the backup volume into the controller.
pub const ROOT: &str = "/var/lib/ichor/backups";

/// The claim mounted into this controller for volume destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupVolume {
    pub claim_name: String,
    /// Where it is mounted ([`ROOT`] in the chart; a folder in tests).
    pub root: PathBuf,
}

/// Why a volume destination cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeProblem {
    #[error(
        "the PersistentVolumeClaim {claim} (spec.backup.destination.volume.claimName) is not mounted into Ichor's controller: set the chart value backup.volume.claimName={claim} (no volume is mounted now)"
    )]
    NoneMounted { claim: String },
    #[error(
        "the PersistentVolumeClaim {claim} (spec.backup.destination.volume.claimName) is not mounted into Ichor's controller, {mounted} is: set the chart value backup.volume.claimName={claim}, or name {mounted}"
    )]
    OtherMounted { claim: String, mounted: String },
    #[error(
        "spec.backup.destination.volume.path must be a relative folder of plain names (no leading slash, no . or ..)"
    )]
    Path,
}

/// The folder of a volume destination inside the mounted claim.
pub fn folder(
    mounted: Option<&BackupVolume>,
    volume: &VolumeDestination,
) -> Result<PathBuf, VolumeProblem> {
    let relative = Path::new(&volume.path);
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(VolumeProblem::Path);
    }
    match mounted {
        None => Err(VolumeProblem::NoneMounted {
            claim: volume.claim_name.clone(),
        }),
        Some(m) if m.claim_name != volume.claim_name => Err(VolumeProblem::OtherMounted {
            claim: volume.claim_name.clone(),
            mounted: m.claim_name.clone(),
        }),
        Some(m) => Ok(m.root.join(relative)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(claim: &str, path: &str) -> VolumeDestination {
        VolumeDestination {
            claim_name: claim.into(),
            path: path.into(),
        }
    }

    /// Covers: R20.10
    #[test]
    fn a_volume_destination_is_the_mounted_claims_folder_or_says_what_to_set() {
        let mounted = BackupVolume {
            claim_name: "backups".into(),
            root: ROOT.into(),
        };
        assert_eq!(
            folder(Some(&mounted), &dest("backups", "")),
            Ok(PathBuf::from(ROOT))
        );
        assert_eq!(
            folder(Some(&mounted), &dest("backups", "prod/etcd")),
            Ok(PathBuf::from(ROOT).join("prod/etcd"))
        );
        let none = folder(None, &dest("nas", "")).unwrap_err();
        assert!(
            none.to_string()
                .contains("set the chart value backup.volume.claimName=nas"),
            "{none}"
        );
        let other = folder(Some(&mounted), &dest("nas", "")).unwrap_err();
        assert!(other.to_string().contains("backups is"), "{other}");
        for bad in ["/etc", "../x", "a/../../x", "./a"] {
            assert_eq!(
                folder(Some(&mounted), &dest("backups", bad)),
                Err(VolumeProblem::Path),
                "{bad}"
            );
        }
    }
}
