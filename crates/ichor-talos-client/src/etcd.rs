//! etcd through the Talos API: a member's status (`EtcdStatus`), the
//! snapshot of its database (`EtcdSnapshot`), streamed as the node sends it,
//! the upload of a snapshot to recover from (`EtcdRecover`), and the etcd
//! service's state (`ServiceList`).
//!
//! How a caller tells what etcd does on a node:
//! - **running and healthy**: [`TalosClient::etcd_service`] says
//!   [`ServiceStatus::is_running_and_healthy`] (state `Running`, health
//!   known and healthy), and [`TalosClient::etcd_status`] answers with no
//!   `errors`. `EtcdStatus` alone is not enough: it fails while etcd is
//!   not running, but also for a transport failure.
//! - **waiting for a bootstrap** (no data: a new node, or a control plane
//!   after its etcd data was wiped): the service is in its pre-state,
//!   [`ServiceStatus::is_awaiting_bootstrap`] (`Preparing`, or `Waiting`
//!   on its conditions), and `EtcdStatus` and `EtcdSnapshot` fail (Talos
//!   cannot reach a local member). Only then does Talos take `EtcdRecover`
//!   and `Bootstrap{recover_etcd}`.
//!
//! The snapshot is what etcd's `Maintenance/Snapshot` streams — the bbolt
//! database, then 32 bytes of its sha256 — re-chunked by Talos into
//! messages of at most 1024 bytes. Talos ends the stream without an error
//! when its read from etcd fails, so a cut stream can look complete: the
//! caller checks the size and the trailer.

use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;

use crate::client::TalosClient;
use crate::error::{Error, status_message};
use crate::proto::common;
use crate::proto::machine;

/// A snapshot stream is bounded by the caller (it drops the stream), not by
/// the call timeout: a big database takes longer than one call.
const STREAM_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest message [`TalosClient::etcd_recover`] sends: well under
/// gRPC's default 4 MiB limit on what a server takes.
const UPLOAD_CHUNK: usize = 1024 * 1024;

/// A boxed error from the data a caller uploads.
type UploadError = Box<dyn std::error::Error + Send + Sync>;

/// One service as `ServiceList` reports it (`talosctl service <id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceStatus {
    /// The service's id (`etcd`, `kubelet`, `apid`, …).
    pub id: String,
    /// machined's state for it: `Initialized`, `Waiting`, `Preparing`,
    /// `Running`, `Stopping`, `Finished`, `Failed`, `Skipped`.
    pub state: String,
    /// Its health check passes (meaningless while `health_unknown`).
    pub healthy: bool,
    /// No health check has answered yet.
    pub health_unknown: bool,
    /// The health check's last message (why it is unhealthy).
    pub health_message: String,
    /// The message of the service's latest event (`Running pre state`,
    /// `Health check successful`, or why it failed).
    pub last_event: String,
    /// Every event machined kept, oldest first.
    pub events: Vec<ServiceEvent>,
}

/// One change of a service's state, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEvent {
    /// The state it entered (`Preparing`, `Running`, `Failed`, …).
    pub state: String,
    /// Why (`Running pre state`, or the failure's text).
    pub message: String,
}

impl ServiceStatus {
    /// The service runs and its health check passes.
    pub fn is_running_and_healthy(&self) -> bool {
        self.state == "Running" && self.healthy && !self.health_unknown
    }

    /// The service has not started: it waits for its conditions or runs
    /// its pre-state (etcd's waits there for a bootstrap or to join).
    pub fn is_awaiting_bootstrap(&self) -> bool {
        matches!(self.state.as_str(), "Preparing" | "Waiting")
    }

    fn from_proto(s: machine::ServiceInfo) -> Self {
        let health = s.health.unwrap_or_default();
        let events: Vec<ServiceEvent> = s
            .events
            .map(|e| e.events)
            .unwrap_or_default()
            .into_iter()
            .map(|e| ServiceEvent {
                state: e.state,
                message: e.msg,
            })
            .collect();
        let last_event = events.last().map(|e| e.message.clone()).unwrap_or_default();
        Self {
            id: s.id,
            state: s.state,
            healthy: health.healthy,
            health_unknown: health.unknown,
            health_message: health.last_message,
            last_event,
            events,
        }
    }
}

/// Splits `bytes` into pieces of at most [`UPLOAD_CHUNK`] bytes (no copy).
fn upload_chunks(bytes: Bytes) -> Vec<Bytes> {
    (0..bytes.len())
        .step_by(UPLOAD_CHUNK)
        .map(|at| bytes.slice(at..(at + UPLOAD_CHUNK).min(bytes.len())))
        .collect()
}

/// One etcd member's status as `EtcdStatus` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    pub member_id: u64,
    /// etcd's version (`3.6.5`).
    pub protocol_version: String,
    /// The storage format version (Talos v1.14+; empty before).
    pub storage_version: String,
    /// The database's size on disk, in bytes.
    pub db_size: i64,
    /// The bytes of the database in use (the rest is free pages).
    pub db_size_in_use: i64,
    /// The member that leads, as this member sees it.
    pub leader: u64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    /// The raised alarms, in etcd's words.
    pub errors: Vec<String>,
    pub is_learner: bool,
}

impl EtcdStatus {
    fn from_proto(s: machine::EtcdMemberStatus) -> Self {
        Self {
            member_id: s.member_id,
            protocol_version: s.protocol_version,
            storage_version: s.storage_version,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            leader: s.leader,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            errors: s.errors,
            is_learner: s.is_learner,
        }
    }
}

/// The error a node reported in a message's metadata (apid's way when it
/// proxies), if any.
fn reported(metadata: Option<&common::Metadata>) -> Option<&str> {
    metadata.map(|m| m.error.as_str()).filter(|e| !e.is_empty())
}

impl TalosClient {
    /// `MachineService/EtcdStatus` of the member on `node` (a control plane).
    pub async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, Error> {
        let call = "EtcdStatus";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().etcd_status(request))
            .await?;
        let message = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        let status = message.member_status.ok_or_else(|| Error::EmptyResponse {
            node: self.node_label(node),
            call: call.to_string(),
        })?;
        Ok(EtcdStatus::from_proto(status))
    }

    /// `MachineService/EtcdSnapshot` of the member on `node` (a control
    /// plane; needs `os:admin`, `os:operator` or `os:etcd:backup`): the
    /// snapshot's bytes as they come, chunk by chunk, never gathered. Only
    /// the start of the call is bounded by the call timeout; the stream runs
    /// until it ends or the caller drops it. The stream's end is not a proof
    /// of completeness (see the module's documentation).
    pub async fn etcd_snapshot(
        &self,
        node: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, Error>> + Send + 'static + use<>, Error> {
        let call = "EtcdSnapshot";
        let mut request = self.request(node, machine::EtcdSnapshotRequest {})?;
        request.set_timeout(STREAM_DEADLINE);
        let mut client = self.machine();
        let stream = self.call(node, call, client.etcd_snapshot(request)).await?;
        let node = self.node_label(node);
        Ok(stream.map(move |item| match item {
            Ok(data) => match reported(data.metadata.as_ref()) {
                Some(error) => Err(Error::NodeReported {
                    node: node.clone(),
                    call: call.to_string(),
                    message: error.to_string(),
                }),
                None => Ok(Bytes::from(data.bytes)),
            },
            Err(status) => Err(Error::Status {
                node: node.clone(),
                call: call.to_string(),
                code: status.code(),
                message: status_message(&status),
            }),
        }))
    }
}

impl TalosClient {
    /// `MachineService/EtcdRecover` on `node` (a control plane; admin): uploads
    /// `snapshot` (a `talosctl etcd snapshot` file, or a copy of etcd's
    /// `member/snap/db`), which the node keeps for the next
    /// [`TalosClient::bootstrap_recover`]. Talos only stores it (as
    /// `/var/lib/etcd.snapshot`); it refuses with `FailedPrecondition` while
    /// the node's `/var` is not mounted yet, and the bootstrap that follows
    /// is refused while etcd holds data.
    ///
    /// The upload is bounded by the caller, not by the call timeout. When
    /// `snapshot` yields an error the call is cancelled (the node then drops
    /// what it received) and the error is [`Error::Upload`].
    pub async fn etcd_recover<S, E>(&self, node: &str, snapshot: S) -> Result<(), Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<UploadError> + Send + 'static,
    {
        let call = "EtcdRecover";
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<UploadError>();
        // A failed read never ends the stream: ending it would look like
        // a complete upload. The call is dropped instead, which cancels it.
        let upload = futures::stream::unfold(
            (Box::pin(snapshot), Some(failed_tx)),
            |(mut snapshot, mut failed)| async move {
                match snapshot.next().await {
                    Some(Ok(bytes)) => Some((bytes, (snapshot, failed))),
                    Some(Err(e)) => {
                        if let Some(tx) = failed.take() {
                            let _ = tx.send(e.into());
                        }
                        futures::future::pending().await
                    }
                    None => None,
                }
            },
        )
        .flat_map(|bytes| futures::stream::iter(upload_chunks(bytes)))
        .map(|bytes| common::Data {
            metadata: None,
            bytes: bytes.to_vec(),
        });
        let mut request = self.request(node, upload)?;
        request.set_timeout(STREAM_DEADLINE);
        let mut client = self.machine();
        let answer = client.etcd_recover(request);
        tokio::pin!(answer);
        // A closed channel (the upload ended whole) disables its branch:
        // the answer decides then.
        let response = tokio::select! {
            answer = &mut answer => answer,
            Ok(source) = failed_rx => {
                return Err(Error::Upload {
                    node: self.node_label(node),
                    call: call.to_string(),
                    source,
                });
            }
        };
        let response = response.map_err(|status| Error::Status {
            node: self.node_label(node),
            call: call.to_string(),
            code: status.code(),
            message: status_message(&status),
        })?;
        if let Some(error) = response
            .into_inner()
            .messages
            .first()
            .and_then(|m| reported(m.metadata.as_ref()))
        {
            return Err(Error::NodeReported {
                node: self.node_label(node),
                call: call.to_string(),
                message: error.to_string(),
            });
        }
        Ok(())
    }

    /// `MachineService/ServiceList` of `node`: every service machined runs.
    pub async fn services(&self, node: &str) -> Result<Vec<ServiceStatus>, Error> {
        let call = "ServiceList";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().service_list(request))
            .await?;
        let message = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(message
            .services
            .into_iter()
            .map(ServiceStatus::from_proto)
            .collect())
    }

    /// The etcd service of `node` (see the module's documentation for how
    /// to read it); `None` on a node that runs no etcd (a worker).
    pub async fn etcd_service(&self, node: &str) -> Result<Option<ServiceStatus>, Error> {
        Ok(self
            .services(node)
            .await?
            .into_iter()
            .find(|s| s.id == "etcd"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_keeps_every_field() {
        let status = EtcdStatus::from_proto(machine::EtcdMemberStatus {
            protocol_version: "3.6.5".into(),
            db_size: 20_480,
            db_size_in_use: 16_384,
            leader: 7,
            raft_index: 12,
            raft_term: 3,
            raft_applied_index: 11,
            errors: vec!["etcdserver: mvcc: database space exceeded".into()],
            is_learner: true,
            member_id: 9,
            storage_version: "3.6.0".into(),
        });
        assert_eq!(
            status,
            EtcdStatus {
                member_id: 9,
                protocol_version: "3.6.5".into(),
                storage_version: "3.6.0".into(),
                db_size: 20_480,
                db_size_in_use: 16_384,
                leader: 7,
                raft_index: 12,
                raft_term: 3,
                raft_applied_index: 11,
                errors: vec!["etcdserver: mvcc: database space exceeded".into()],
                is_learner: true,
            }
        );
    }

    #[test]
    fn an_upload_is_cut_into_pieces_of_at_most_a_mebibyte() {
        let bytes = Bytes::from(vec![3u8; 2 * UPLOAD_CHUNK + 10]);
        let sizes: Vec<usize> = upload_chunks(bytes).iter().map(Bytes::len).collect();
        assert_eq!(sizes, [UPLOAD_CHUNK, UPLOAD_CHUNK, 10]);
        assert!(upload_chunks(Bytes::new()).is_empty());
    }

    #[test]
    fn a_service_reads_as_running_and_healthy_or_awaiting_bootstrap() {
        let service = |state: &str, healthy: bool, unknown: bool| {
            ServiceStatus::from_proto(machine::ServiceInfo {
                id: "etcd".into(),
                state: state.into(),
                events: Some(machine::ServiceEvents {
                    events: vec![
                        machine::ServiceEvent {
                            msg: "Starting service".into(),
                            ..Default::default()
                        },
                        machine::ServiceEvent {
                            msg: "Running pre state".into(),
                            ..Default::default()
                        },
                    ],
                }),
                health: Some(machine::ServiceHealth {
                    unknown,
                    healthy,
                    ..Default::default()
                }),
            })
        };
        let waiting = service("Preparing", false, true);
        assert_eq!(waiting.last_event, "Running pre state");
        assert!(waiting.is_awaiting_bootstrap());
        assert!(!waiting.is_running_and_healthy());
        assert!(service("Running", true, false).is_running_and_healthy());
        assert!(!service("Running", false, false).is_running_and_healthy());
        assert!(!service("Running", true, true).is_running_and_healthy());
        assert!(!service("Running", true, false).is_awaiting_bootstrap());
    }

    #[test]
    fn only_a_non_empty_metadata_error_is_reported() {
        assert_eq!(reported(None), None);
        assert_eq!(reported(Some(&common::Metadata::default())), None);
        let md = common::Metadata {
            error: "etcd snapshot is only available on control plane nodes".into(),
            ..Default::default()
        };
        assert_eq!(
            reported(Some(&md)),
            Some("etcd snapshot is only available on control plane nodes")
        );
    }
}
