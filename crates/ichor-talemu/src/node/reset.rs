//! A node's Reset as Talos checks and runs it: what the request may wipe
//! (system volumes by label, the whole system disk, user disks), and the
//! wipe itself — STATE holds the config and the node's identity, EPHEMERAL
//! (`/var`) etcd's data and the pulled images. A node whose STATE was
//! wiped boots into maintenance mode with a new identity.

use std::time::{Duration, Instant};

use tonic::Status;

use ichor_talos_client::proto::machine;
use ichor_talos_client::proto::machine::reset_request::WipeMode;

use super::Node;

/// What a Reset wipes, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wipe {
    /// The system volumes wiped, by label (the whole system disk: all of them).
    pub volumes: Vec<String>,
    /// The user disks wiped, by device path.
    pub user_disks: Vec<String>,
}

impl Wipe {
    /// Whether the node's config and identity go.
    pub fn state(&self) -> bool {
        self.volumes.iter().any(|v| v == "STATE")
    }

    /// Whether etcd's data and the pulled images go.
    pub fn ephemeral(&self) -> bool {
        self.volumes.iter().any(|v| v == "EPHEMERAL" || v == "ETCD")
    }
}

/// The request checked as Talos checks it (its messages, answered as
/// `Unknown`): user disks must exist, not be the system disk, and not come
/// with SYSTEM_DISK; labels must name located volumes and not come with
/// USER_DISKS; no label (outside USER_DISKS) wipes the whole system disk.
/// `located`: the labels of the system disk's volumes; `disks`: every
/// disk's path, the system disk first.
pub(crate) fn check_reset(
    req: &machine::ResetRequest,
    located: &[&str],
    disks: &[String],
) -> Result<Wipe, Status> {
    let mode = WipeMode::try_from(req.mode).unwrap_or(WipeMode::All);
    if !req.user_disks_to_wipe.is_empty() {
        if mode == WipeMode::SystemDisk {
            return Err(Status::unknown(
                "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support UserDisksToWipe parameter",
            ));
        }
        for device in &req.user_disks_to_wipe {
            if !disks.contains(device) {
                return Err(Status::unknown(format!(
                    "reset user disk failed: device {device} wasn't found"
                )));
            }
            if disks.first() == Some(device) {
                return Err(Status::unknown(format!(
                    "reset user disk failed: device {device} is the system disk"
                )));
            }
        }
    }
    let mut volumes = Vec::new();
    if !req.system_partitions_to_wipe.is_empty() {
        if mode == WipeMode::UserDisks {
            return Err(Status::unknown(
                "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter",
            ));
        }
        for spec in &req.system_partitions_to_wipe {
            if !located.contains(&spec.label.as_str()) {
                return Err(Status::unknown(format!(
                    "failed to get volume status with label {:?}: resource VolumeStatuses.block.talos.dev(runtime/{}@undefined) doesn't exist",
                    spec.label, spec.label
                )));
            }
            if spec.wipe {
                volumes.push(spec.label.clone());
            }
        }
    } else if mode != WipeMode::UserDisks {
        volumes = located.iter().map(|l| (*l).to_string()).collect();
    }
    Ok(Wipe {
        volumes,
        user_disks: req.user_disks_to_wipe.clone(),
    })
}

impl Node {
    /// The labels of the node's system disk's volumes.
    pub fn located_volumes(&self) -> Vec<&'static str> {
        self.spec
            .disks
            .first()
            .map(|d| {
                crate::host::system_volumes(&d.dev_path, d.size)
                    .into_iter()
                    .map(|v| v.0)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The reset's stop and wipe: the node goes down (resetting), then
    /// loses what the wiped volumes held.
    pub fn wipe(&self, wipe: &Wipe) {
        let mut st = self.lock();
        st.stage = 7;
        st.down_until = Some(Instant::now() + Duration::from_secs(86_400 * 365));
        st.journal.talos(format!(
            "reset: wiping system volumes [{}]",
            wipe.volumes.join(", ")
        ));
        if wipe.ephemeral() {
            st.etcd_data = false;
            st.pulled.clear();
        }
        if wipe.state() {
            st.active = None;
            st.persistent = None;
            st.mtls = None;
            st.installed = None;
            st.rebooting_after_apply = false;
            if let Some(h) = st.rollback.take() {
                h.abort();
            }
            st.identity = crate::discovery::node_id(&super::new_uuid());
        }
        self.refresh(&mut st);
    }

    /// A reset that does not reboot powers the node off: it stays down.
    pub fn power_off(&self) {
        let mut st = self.lock();
        st.stage = 6;
        st.journal.talos("reset: powering off");
        self.refresh(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCATED: &[&str] = &["EFI", "META", "STATE", "EPHEMERAL"];

    fn request(labels: &[&str], mode: WipeMode, user: &[&str]) -> machine::ResetRequest {
        machine::ResetRequest {
            graceful: true,
            reboot: true,
            system_partitions_to_wipe: labels
                .iter()
                .map(|l| machine::ResetPartitionSpec {
                    label: (*l).to_string(),
                    wipe: true,
                })
                .collect(),
            user_disks_to_wipe: user.iter().map(|d| (*d).to_string()).collect(),
            mode: mode as i32,
        }
    }

    fn disks() -> Vec<String> {
        vec!["/dev/vda".to_string(), "/dev/vdb".to_string()]
    }

    #[test]
    fn labels_wipe_those_volumes_and_none_the_whole_system_disk() {
        let w = check_reset(
            &request(&["STATE", "EPHEMERAL"], WipeMode::All, &[]),
            LOCATED,
            &disks(),
        )
        .unwrap();
        assert_eq!(w.volumes, ["STATE", "EPHEMERAL"]);
        assert!(w.state() && w.ephemeral());
        let w = check_reset(&request(&[], WipeMode::All, &[]), LOCATED, &disks()).unwrap();
        assert_eq!(w.volumes, LOCATED);
        let w = check_reset(
            &request(&[], WipeMode::UserDisks, &["/dev/vdb"]),
            LOCATED,
            &disks(),
        )
        .unwrap();
        assert!(w.volumes.is_empty());
        assert_eq!(w.user_disks, ["/dev/vdb"]);
    }

    #[test]
    fn talos_refuses_what_it_cannot_locate_or_mix() {
        let said = |r: machine::ResetRequest| {
            check_reset(&r, LOCATED, &disks())
                .unwrap_err()
                .message()
                .to_string()
        };
        assert!(said(request(&["ETCD"], WipeMode::All, &[])).contains("label \"ETCD\""));
        assert!(said(request(&["STATE"], WipeMode::UserDisks, &[])).contains("USER_DISKS"));
        assert!(said(request(&[], WipeMode::SystemDisk, &["/dev/vdb"])).contains("SYSTEM_DISK"));
        assert!(said(request(&[], WipeMode::All, &["/dev/vda"])).contains("system disk"));
        assert!(said(request(&[], WipeMode::All, &["/dev/sdz"])).contains("wasn't found"));
    }
}
