//! A node's reboots and upgrades: images pulled into its containerd
//! stores, an installer written to the other boot slot, the reboot that
//! boots it, and the boot id that tells a reboot happened.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_talos::version::Version;
use tonic::Status;

use ichor_talos_client::proto::machine;

use super::writes::WriteAction;
use super::{Node, Running, new_uuid};

/// Where Linux keeps the boot id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The Talos version an installer image installs: its tag (`…/installer:v1.14.0`,
/// a digest after the tag allowed). The emulator has no registry to ask, so an
/// image without a version tag is refused.
pub(crate) fn installer_version(image: &str) -> Result<String, Status> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let tag = last.rsplit_once(':').map(|(_, t)| t);
    match tag {
        Some(t) if Version::parse(t).is_ok() => Ok(t.to_string()),
        _ => Err(Status::invalid_argument(format!(
            "installer image {image:?} has no version tag (vMAJOR.MINOR.PATCH) the emulator can install"
        ))),
    }
}

impl Node {
    /// `ImageService.Pull`: the image lands in the given containerd store.
    pub fn pull_image(&self, driver: i32, namespace: i32, image: &str) -> Result<String, Status> {
        if image.trim().is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        {
            let mut st = self.lock();
            st.pulled.insert((driver, namespace, image.to_string()));
            st.journal.talos(format!("image pulled: {image}"));
        }
        self.record(WriteAction::ImagePull {
            image: image.to_string(),
        });
        Ok(image.to_string())
    }

    /// `LifecycleService.Upgrade`: writes the installer's version to the other
    /// boot slot, nothing else (no etcd check, no drain, no reboot). The
    /// installer must already be in that containerd store.
    pub fn lifecycle_upgrade(
        &self,
        driver: i32,
        namespace: i32,
        image: &str,
    ) -> Result<Vec<String>, Status> {
        if self.version() < (1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.LifecycleService",
            ));
        }
        if image.trim().is_empty() {
            return Err(Status::invalid_argument("installer image is required"));
        }
        let target = installer_version(image)?;
        let mut st = self.lock();
        if st.active.is_none() {
            return Err(Status::failed_precondition("Talos is not installed"));
        }
        if !st.pulled.contains(&(driver, namespace, image.to_string())) {
            return Err(Status::failed_precondition(format!(
                "installer image {image:?} not found in containerd store"
            )));
        }
        st.installed = Some(target.clone());
        st.journal.talos(format!(
            "upgrade: installed Talos {target} from {image} to the inactive boot slot; it boots at the next reboot"
        ));
        drop(st);
        self.record(WriteAction::Upgrade {
            image: image.to_string(),
            legacy: false,
        });
        Ok(vec![
            format!("running installer {image}"),
            format!("installed Talos {target} to the inactive boot slot"),
        ])
    }

    /// The deprecated `MachineService.Upgrade`: Talos pulls the installer,
    /// checks etcd on a control plane (unless `force` or `preserve`), writes
    /// the other slot and reboots. `etcd_check` is the cluster's refusal, if any.
    pub fn legacy_upgrade(
        self: &Arc<Self>,
        req: &machine::UpgradeRequest,
        etcd_check: Option<String>,
    ) -> Result<machine::Upgrade, Status> {
        if req.image.trim().is_empty() {
            return Err(Status::invalid_argument("installer image is required"));
        }
        let target = installer_version(&req.image)?;
        if !req.force
            && !req.preserve
            && let Some(reason) = etcd_check
        {
            return Err(Status::failed_precondition(reason));
        }
        {
            let mut st = self.lock();
            st.journal.talos(format!(
                "upgrade request received: installing Talos {target} from {} to the inactive boot slot, then rebooting",
                req.image
            ));
            st.installed = Some(target);
        }
        self.record(WriteAction::Upgrade {
            image: req.image.clone(),
            legacy: true,
        });
        let actor_id = new_uuid();
        self.start_reboot(actor_id.clone());
        Ok(machine::Upgrade {
            metadata: None,
            ack: "Upgrade request received".to_string(),
            actor_id,
        })
    }

    /// `MachineService.Read` of the one file the emulator serves: the boot id,
    /// which is how talosctl tells that a reboot happened.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, Status> {
        if path == BOOT_ID_PATH {
            Ok(format!("{}\n", self.lock().boot_id).into_bytes())
        } else {
            Err(Status::not_found(format!(
                "open {path}: no such file or directory"
            )))
        }
    }

    /// Reboot: returns the actor id; the node is down for the outage, then
    /// comes back with a new boot id and its persistent config active.
    pub fn reboot(self: &Arc<Self>) -> machine::Reboot {
        let actor_id = new_uuid();
        self.start_reboot(actor_id.clone());
        machine::Reboot {
            metadata: None,
            actor_id,
        }
    }

    pub(crate) fn start_reboot(self: &Arc<Self>, actor_id: String) {
        self.record(WriteAction::Reboot {
            actor_id: actor_id.clone(),
        });
        let outage = self.reboot_outage;
        {
            let mut st = self.lock();
            st.journal.talos(format!("rebooting (actor id {actor_id})"));
            st.stage = 5;
            st.down_until = Some(Instant::now() + outage);
            self.refresh(&mut st);
        }
        let node = Arc::clone(self);
        tokio::spawn(node.boot_after(outage));
    }

    /// The node boots once `outage` has passed (and a test's gate opened):
    /// a new boot id, the persistent config active (none: maintenance
    /// mode), an upgrade's slot booted unless it falls back.
    pub(crate) async fn boot_after(self: Arc<Self>, outage: Duration) {
        let node = self;
        tokio::time::sleep(outage).await;
        let gate = {
            let mut st = node.lock();
            if st.reboot_gate.is_some() {
                // Held by the test: still down until the gate opens.
                st.down_until = Some(Instant::now() + Duration::from_secs(86_400));
            }
            st.reboot_gate.clone()
        };
        if let Some(gate) = gate {
            gate.pass().await;
        }
        let mut st = node.lock();
        if let Some(h) = st.rollback.take() {
            h.abort();
        }
        // The boot loader's default is the slot the upgrade wrote, unless
        // that boot fails and Talos falls back to the old one.
        if let Some(installed) = st.installed.take()
            && !st.upgrade_fallback
            && let Ok(version) = Version::parse(&installed)
        {
            *node.running.lock().unwrap_or_else(|e| e.into_inner()) = Running {
                tag: installed,
                version,
            };
        }
        if st.persistent.is_some() {
            st.active = st.persistent.clone();
        }
        st.boot_id = new_uuid();
        st.stage = if st.active.is_some() { 4 } else { 3 };
        st.down_until = None;
        st.rebooting_after_apply = false;
        // etcd starts again at boot (a control plane that left rejoins).
        st.etcd_left = false;
        node.record_boot(&mut st);
        node.refresh(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installer_versions_come_from_the_tag() {
        assert_eq!(
            installer_version("ghcr.io/siderolabs/installer:v1.14.0").unwrap(),
            "v1.14.0"
        );
        assert_eq!(
            installer_version("localhost:5000/installer:v1.14.1@sha256:abcd").unwrap(),
            "v1.14.1"
        );
        assert!(installer_version("localhost:5000/installer").is_err());
        assert!(installer_version("ghcr.io/siderolabs/installer:latest").is_err());
    }
}
