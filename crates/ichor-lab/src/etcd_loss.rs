//! The loss of the lab's etcd, and its recovery through the Talos API.
//!
//! [`Lab::lose_etcd`] plays a disaster: the lab's kube-apiserver and etcd
//! stop, etcd's data folder is deleted, and every emulated control plane's
//! etcd waits for a bootstrap (service `etcd` `Preparing`, EtcdStatus and
//! EtcdSnapshot failing), as Talos's do after their EPHEMERAL partition was
//! wiped. Recovery is then what it is on Talos: `EtcdRecover` with a
//! snapshot, `Bootstrap{recover_etcd}` on one control plane. The emulator
//! restores with the real `etcdutl snapshot restore` and calls the hook
//! [`install_restore`] gave it, which starts the lab's etcd on the restored
//! data (same client URL) and kube-apiserver after it (same flags and
//! certificates), and waits until the apiserver is ready.

use std::sync::Arc;

use ichor_talemu::{Emulator, EtcdRestore, RestoreHookError};
use ichor_testenv::{TestEnv, Tool};

use crate::{Lab, LabError};

/// Gives the emulator the way to restore the lab's etcd (when `etcdutl`
/// is built; without it a recovery fails and etcd keeps waiting).
pub fn install_restore(emulator: &Emulator, env: &TestEnv) {
    if !Tool::Etcdutl.is_built() {
        tracing::warn!("etcdutl is not built: the lab cannot restore its etcd from a snapshot");
        return;
    }
    let starter = env.etcd_starter();
    emulator.restore_etcd_with(EtcdRestore {
        etcdutl: Tool::Etcdutl.path(),
        member_args: env.etcd_member_args(),
        start: Arc::new(move |data_dir| {
            let starter = starter.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || starter.start_from(&data_dir))
                    .await
                    .map_err(|e| Box::new(e) as RestoreHookError)?
                    .map_err(|e| Box::new(e) as RestoreHookError)
            })
        }),
    });
}

impl Lab {
    /// Plays the loss of etcd's data (see the module's documentation).
    /// Blocks the calling thread while the servers stop (a few seconds at most).
    pub fn lose_etcd(&self) -> Result<(), LabError> {
        self.env.lose_etcd()?;
        self.emulator.lose_etcd();
        Ok(())
    }
}
