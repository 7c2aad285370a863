//! etcd's disaster recovery, as Talos does it: `EtcdRecover` stores an
//! uploaded snapshot (Talos: `/var/lib/etcd.snapshot`; here a file in the
//! node's folder under the emulator's state folder), and
//! `Bootstrap{recover_etcd}` answers first and restores afterwards.
//!
//! Talos keeps the request to recover only in memory: the restore runs in
//! etcd's pre-state, after the answer. So here: a node that reboots between
//! the answer and the restore forgets it (etcd keeps waiting), and a restore
//! that fails (a snapshot without its sha256 trailer and no
//! `recover_skip_hash_check`) leaves etcd waiting, the reason in the etcd
//! service's events.
//!
//! The restore is real: `etcdutl snapshot restore` into a new data folder,
//! then the lab's hook ([`EtcdRestore::start`]) starts the lab's etcd on it
//! (and the apiserver after it). The lab says when etcd's data is gone with
//! [`crate::Emulator::lose_etcd`]: every control plane's etcd then waits
//! for a bootstrap, as Talos's do after their EPHEMERAL partition is wiped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tonic::{Request, Response, Status, Streaming};

use ichor_talos_client::proto::common;
use ichor_talos_client::proto::machine;

use super::{ADMIN, NodeApi, caller, not_in_maintenance};
use crate::journal::ServiceState;
use crate::node::ReadGate;

/// What the lab's hook returns when it could not start etcd.
pub type RestoreHookError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the lab's etcd on a restored data folder (and the apiserver on it).
pub type RestoreHook = Arc<
    dyn Fn(PathBuf) -> futures::future::BoxFuture<'static, Result<(), RestoreHookError>>
        + Send
        + Sync,
>;

/// How the emulator restores the lab's etcd from a snapshot.
#[derive(Clone)]
pub struct EtcdRestore {
    /// The `etcdutl` binary.
    pub etcdutl: PathBuf,
    /// The arguments that make the restored member the lab's etcd
    /// (`--name`, `--initial-cluster`, `--initial-advertise-peer-urls`).
    pub member_args: Vec<String>,
    /// Starts etcd on the restored data folder.
    pub start: RestoreHook,
}

impl std::fmt::Debug for EtcdRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRestore")
            .field("etcdutl", &self.etcdutl)
            .field("member_args", &self.member_args)
            .finish_non_exhaustive()
    }
}

/// Why a restore did not happen (said in the etcd service's events).
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error("the lab gave the emulator no way to restore etcd")]
    NoRestorer,
    #[error("open /var/lib/etcd.snapshot: no such file or directory")]
    NoSnapshot,
    #[error("cannot run etcdutl")]
    Spawn(#[source] std::io::Error),
    #[error("etcdutl snapshot restore failed: {stderr}")]
    Etcdutl { stderr: String },
    #[error("etcd did not start on the restored data")]
    Start(#[source] RestoreHookError),
}

/// The cluster's recovery state.
pub(crate) struct Recovery {
    /// Where each node's files go (`<dir>/<hostname>/`).
    dir: PathBuf,
    /// The folder is the emulator's own (removed with it).
    owned: bool,
    /// The pause between Bootstrap's answer and the restore.
    delay: Duration,
    restore: Mutex<Option<EtcdRestore>>,
    /// Every Bootstrap call each node received, by node.
    bootstrap_calls: Mutex<HashMap<usize, u32>>,
    /// A node's accepted request to recover, by the boot it was made in.
    pending: Mutex<HashMap<usize, String>>,
    /// Restores a test holds before they run.
    gates: Mutex<HashMap<usize, ReadGate>>,
    /// Names each restore's data folder.
    restores: AtomicU32,
}

impl Recovery {
    pub fn new(dir: Option<PathBuf>, delay: Duration) -> Self {
        let owned = dir.is_none();
        let dir = dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!(
                "ichor-talemu-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ))
        });
        Recovery {
            dir,
            owned,
            delay,
            restore: Mutex::new(None),
            bootstrap_calls: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            restores: AtomicU32::new(0),
        }
    }

    fn node_dir(&self, hostname: &str) -> PathBuf {
        self.dir.join(hostname)
    }

    /// Where node `hostname` keeps an uploaded snapshot.
    pub fn snapshot_path(&self, hostname: &str) -> PathBuf {
        self.node_dir(hostname).join("etcd.snapshot")
    }

    pub fn set_restore(&self, restore: EtcdRestore) {
        *self.restore.lock().unwrap_or_else(|e| e.into_inner()) = Some(restore);
    }

    pub fn count_bootstrap(&self, i: usize) {
        *self
            .bootstrap_calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(i)
            .or_default() += 1;
    }

    pub fn bootstrap_calls(&self, i: usize) -> u32 {
        self.bootstrap_calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&i)
            .copied()
            .unwrap_or(0)
    }

    pub fn hold(&self, i: usize) -> ReadGate {
        let gate = ReadGate::new();
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(i, gate.clone());
        gate
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<usize, String>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Recovery {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Writes the uploaded messages to `path`; on any failure the file is removed.
async fn store_upload(path: &Path, mut upload: Streaming<common::Data>) -> Result<u64, Status> {
    let written = async {
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        let mut size = 0u64;
        while let Some(message) = upload.message().await? {
            file.write_all(&message.bytes)
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            size += message.bytes.len() as u64;
        }
        file.sync_all()
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(size)
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(path).await;
    }
    written
}

impl NodeApi {
    /// EtcdRecover: stores the uploaded snapshot for the next
    /// `Bootstrap{recover_etcd}`. Talos only checks that the node is a
    /// control plane whose `/var/lib` is mounted (it is, once configured).
    pub(super) async fn etcd_recover_answer(
        &self,
        request: Request<Streaming<common::Data>>,
    ) -> Result<Response<machine::EtcdRecoverResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let i = self.stream_target(request.metadata()).await?;
        let node = self.node(i);
        if node.in_maintenance() {
            return Err(not_in_maintenance("EtcdRecover"));
        }
        if !node.is_control_plane() {
            return Err(Status::unimplemented(
                "etcd recover is only available on control plane nodes",
            ));
        }
        let path = self.cluster.recovery.snapshot_path(&node.spec.hostname);
        let size = store_upload(&path, request.into_inner()).await?;
        tracing::info!(node = %node.spec.hostname, size, "etcd recovery snapshot stored");
        Ok(Response::new(machine::EtcdRecoverResponse {
            messages: vec![machine::EtcdRecover { metadata: None }],
        }))
    }

    /// Bootstrap{recover_etcd} on node `i`, after Bootstrap's checks passed:
    /// keeps the request in memory and restores after the answer.
    pub(super) fn accept_recover(&self, i: usize, skip_hash_check: bool) {
        let node = self.node(i);
        let boot_id = {
            let mut st = node.lock();
            st.journal
                .talos("bootstrap request received: recovering etcd from the uploaded snapshot");
            st.boot_id.clone()
        };
        self.cluster.recovery.pending().insert(i, boot_id.clone());
        let api = self.clone();
        tokio::spawn(async move { api.restore_later(i, skip_hash_check, boot_id).await });
    }

    async fn restore_later(&self, i: usize, skip_hash_check: bool, boot_id: String) {
        let recovery = &self.cluster.recovery;
        tokio::time::sleep(recovery.delay).await;
        let gate = recovery
            .gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&i)
            .cloned();
        if let Some(gate) = gate {
            gate.pass().await;
        }
        let node = self.node(i);
        // The request lives in memory only: a reboot since lost it.
        let kept = {
            let mut pending = recovery.pending();
            // A reboot under way (stage 5) has already dropped it too.
            let same_boot = {
                let st = node.lock();
                st.boot_id == boot_id && st.stage == 4
            };
            let kept = pending.get(&i) == Some(&boot_id) && same_boot;
            if pending.get(&i) == Some(&boot_id) {
                pending.remove(&i);
            }
            kept
        };
        if !kept {
            tracing::info!(node = %node.spec.hostname, "the node rebooted: its request to recover etcd is lost");
            return;
        }
        match self.restore(i, skip_hash_check).await {
            Ok(()) => {
                {
                    let mut st = node.lock();
                    st.etcd_data = true;
                    st.journal.talos("etcd recovered from the snapshot");
                }
                self.start_etcd_members(i);
                let _ = self.cluster.bootstraps.send(i);
            }
            Err(e) => {
                let reason = ichor_api::error_text::chain(&e);
                tracing::warn!(node = %node.spec.hostname, error = %reason, "etcd recovery failed");
                let mut st = node.lock();
                st.journal.service(
                    "etcd",
                    ServiceState::Failed,
                    format!(
                        "Failed running service: failed to recover etcd from snapshot: {reason}"
                    ),
                );
                st.journal
                    .service("etcd", ServiceState::Preparing, "Running pre state");
            }
        }
    }

    /// `etcdutl snapshot restore` of node `i`'s uploaded snapshot into a
    /// new data folder, then the lab's hook starts etcd on it.
    async fn restore(&self, i: usize, skip_hash_check: bool) -> Result<(), RestoreError> {
        let recovery = &self.cluster.recovery;
        let restore = recovery
            .restore
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(RestoreError::NoRestorer)?;
        let hostname = &self.node(i).spec.hostname;
        let snapshot = recovery.snapshot_path(hostname);
        if !snapshot.is_file() {
            return Err(RestoreError::NoSnapshot);
        }
        let n = recovery.restores.fetch_add(1, Ordering::SeqCst);
        let data_dir = recovery.node_dir(hostname).join(format!("etcd-{n}"));
        let mut cmd = tokio::process::Command::new(&restore.etcdutl);
        cmd.arg("snapshot")
            .arg("restore")
            .arg(&snapshot)
            .arg(format!("--data-dir={}", data_dir.display()))
            .args(&restore.member_args);
        if skip_hash_check {
            cmd.arg("--skip-hash-check");
        }
        let out = cmd.output().await.map_err(RestoreError::Spawn)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(RestoreError::Etcdutl {
                stderr: restore_failure(&stderr),
            });
        }
        // Talos deletes the snapshot once restored.
        let _ = tokio::fs::remove_file(&snapshot).await;
        (restore.start)(data_dir).await.map_err(RestoreError::Start)
    }
}

/// The line of etcdutl's output that says why it failed (its last
/// non-empty line: etcdutl logs JSON lines before its error).
fn restore_failure(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcdutl_says_why_in_its_last_line() {
        let stderr = "{\"level\":\"info\",\"msg\":\"restoring snapshot\"}\nError: snapshot missing hash but --skip-hash-check=false\n\n";
        assert_eq!(
            restore_failure(stderr),
            "Error: snapshot missing hash but --skip-hash-check=false"
        );
        assert_eq!(restore_failure(""), "no output");
    }
}
