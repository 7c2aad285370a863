//! The etcd restore driven over a [`Nodes`]: look, decide with
//! [`etcd_step`], act, record. Every action is recorded before the next
//! look, so a kill at any phase boundary leaves a state a rerun finishes.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;

use super::{Etcd, Phase, Seen, State, Step, etcd_step};
use crate::restore::RestoreError;

/// The Talos API calls recover makes on a control plane. Its futures need
/// not be `Send`: recover drives them on one task.
pub trait Nodes {
    type Error: std::error::Error + Send + Sync + 'static;

    /// The node's boot id (a new one after each boot).
    fn boot_id(&self, node: &str) -> impl Future<Output = Result<String, Self::Error>>;
    /// etcd on the node.
    fn etcd(&self, node: &str) -> impl Future<Output = Result<Etcd, Self::Error>>;
    /// `EtcdRecover`: the snapshot, streamed.
    fn upload(
        &self,
        node: &str,
        snapshot: BoxStream<'static, Result<Bytes, RestoreError>>,
    ) -> impl Future<Output = Result<(), Self::Error>>;
    /// `Bootstrap{recover_etcd: true}`.
    fn bootstrap(
        &self,
        node: &str,
        skip_hash_check: bool,
    ) -> impl Future<Output = Result<(), Self::Error>>;
}

/// Why the etcd restore stopped. Each names the node; the source says why.
#[derive(Debug, thiserror::Error)]
pub enum EtcdRunError<E: std::error::Error + 'static, S: std::error::Error + 'static> {
    #[error("control plane {node}: reading its boot id or etcd failed")]
    Look {
        node: String,
        #[source]
        source: E,
    },
    #[error("control plane {node}: uploading the snapshot (EtcdRecover) failed")]
    Upload {
        node: String,
        #[source]
        source: E,
    },
    #[error("control plane {node}: Bootstrap{{recover_etcd}} failed")]
    Bootstrap {
        node: String,
        #[source]
        source: E,
    },
    #[error("reading the snapshot from the backup failed")]
    Snapshot(#[source] RestoreError),
    #[error("recording phase {phase} in the state file failed")]
    Save {
        phase: Phase,
        #[source]
        source: S,
    },
    #[error(
        "control plane {node}: etcd runs, and this recovery never bootstrapped it: another etcd cluster started there"
    )]
    NotOurs { node: String },
    #[error("control plane {node}: etcd is not healthy after {waited:?} ({why})")]
    Timeout {
        node: String,
        waited: Duration,
        why: &'static str,
    },
}

/// What the etcd restore did in this run (the emulator's record shows the
/// same from the node's side).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdRun {
    pub uploads: u32,
    pub bootstraps: u32,
}

/// Records `phase` in `state` and saves it.
fn record<E, S>(
    save: &mut impl FnMut(&State) -> Result<(), S>,
    state: &mut State,
    phase: Phase,
) -> Result<(), EtcdRunError<E, S>>
where
    E: std::error::Error + 'static,
    S: std::error::Error + 'static,
{
    state.reach(phase);
    save(state).map_err(|source| EtcdRunError::Save { phase, source })
}

/// The node's boot id and etcd.
async fn look<N: Nodes, S>(nodes: &N, node: &str) -> Result<Seen, EtcdRunError<N::Error, S>>
where
    S: std::error::Error + 'static,
{
    let look = |source| EtcdRunError::Look {
        node: node.to_string(),
        source,
    };
    let boot_id = nodes.boot_id(node).await.map_err(look)?;
    let etcd = nodes.etcd(node).await.map_err(look)?;
    Ok(Seen { boot_id, etcd })
}

/// What to tell the operator before an upload.
fn upload_words(state: &State, node: &str) -> String {
    if state.bootstrapped() {
        format!(
            "{node} booted again (boot id changed) before etcd started: it lost the restore's intent; uploading the snapshot again"
        )
    } else {
        format!("uploading the etcd snapshot to {node} (EtcdRecover)")
    }
}

/// Drives the restore on `state.node` until etcd runs healthy there, or
/// `timeout`. `snapshot` opens the backup's snapshot stream for an upload;
/// `save` records the state (the state file) after each action; `say`
/// tells the operator.
#[allow(clippy::too_many_arguments)]
pub async fn run_etcd<N, F, Fut, S>(
    nodes: &N,
    state: &mut State,
    skip_hash_check: bool,
    mut snapshot: F,
    mut save: impl FnMut(&State) -> Result<(), S>,
    mut say: impl FnMut(&str),
    poll: Duration,
    timeout: Duration,
) -> Result<EtcdRun, EtcdRunError<N::Error, S>>
where
    N: Nodes,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<BoxStream<'static, Result<Bytes, RestoreError>>, RestoreError>>,
    S: std::error::Error + 'static,
{
    let node = state.node.clone();
    let started = tokio::time::Instant::now();
    let mut done = EtcdRun::default();
    let mut said = None;
    loop {
        let seen = look(nodes, &node).await?;
        let boot_id = seen.boot_id.clone();
        let step = etcd_step(state, &seen);
        match step {
            Step::Refuse => return Err(EtcdRunError::NotOurs { node }),
            Step::Done => {
                record(&mut save, state, Phase::EtcdRunning)?;
                say(&format!("etcd runs and is healthy on {node}"));
                return Ok(done);
            }
            Step::Upload => {
                say(&upload_words(state, &node));
                let stream = snapshot().await.map_err(EtcdRunError::Snapshot)?;
                nodes
                    .upload(&node, stream)
                    .await
                    .map_err(|source| EtcdRunError::Upload {
                        node: node.clone(),
                        source,
                    })?;
                done.uploads += 1;
                state.uploaded_at_boot = Some(boot_id);
                record(&mut save, state, Phase::Uploaded)?;
            }
            Step::Bootstrap => {
                say(&format!(
                    "bootstrapping etcd on {node} from the snapshot (Bootstrap{{recover_etcd}})"
                ));
                nodes
                    .bootstrap(&node, skip_hash_check)
                    .await
                    .map_err(|source| EtcdRunError::Bootstrap {
                        node: node.clone(),
                        source,
                    })?;
                done.bootstraps += 1;
                state.bootstraps.push(boot_id);
                record(&mut save, state, Phase::Bootstrapped)?;
            }
            Step::Wait(why) => {
                if started.elapsed() > timeout {
                    return Err(EtcdRunError::Timeout {
                        node,
                        waited: timeout,
                        why,
                    });
                }
                if said != Some(why) {
                    said = Some(why);
                    say(&format!("waiting on {node}: {why}"));
                }
                tokio::time::sleep(poll).await;
            }
        }
    }
}
