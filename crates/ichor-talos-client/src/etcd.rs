//! etcd through the Talos API: a member's status (`EtcdStatus`) and the
//! snapshot of its database (`EtcdSnapshot`), streamed as the node sends it.
//!
//! The snapshot is what etcd's `Maintenance/Snapshot` streams — the bbolt
//! database, then 32 bytes of its sha256 — re-chunked by Talos into
//! messages of at most 1024 bytes. Talos ends the stream without an error
//! when its read from etcd fails, so a cut stream can look complete: the
//! caller checks the size and the trailer.

use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::bytes::Bytes;
use tonic::metadata::MetadataValue;

use crate::client::TalosClient;
use crate::error::{Error, status_message};
use crate::proto::common;
use crate::proto::machine;

/// A snapshot stream is bounded by the caller (it drops the stream), not by
/// the call timeout: a big database takes longer than one call.
const STREAM_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

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
    fn node_name(&self, node: &str) -> String {
        if node.is_empty() {
            self.endpoint().to_string()
        } else {
            node.to_string()
        }
    }

    /// A request aimed at `node` (the endpoint itself when empty) with the call timeout.
    fn etcd_request<T>(&self, node: &str, message: T) -> Result<tonic::Request<T>, Error> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.options().call_timeout);
        if !node.is_empty() {
            let value = MetadataValue::try_from(node).map_err(|e| Error::InvalidNode {
                node: node.to_string(),
                reason: e.to_string(),
            })?;
            request.metadata_mut().insert("node", value);
        }
        Ok(request)
    }

    /// `MachineService/EtcdStatus` of the member on `node` (a control plane).
    pub async fn etcd_status(&self, node: &str) -> Result<EtcdStatus, Error> {
        let call = "EtcdStatus";
        let request = self.etcd_request(node, ())?;
        let response = self
            .call(node, call, self.machine().etcd_status(request))
            .await?;
        let message = response
            .messages
            .into_iter()
            .next()
            .ok_or_else(|| Error::EmptyResponse {
                node: self.node_name(node),
                call: call.to_string(),
            })?;
        if let Some(error) = reported(message.metadata.as_ref()) {
            return Err(Error::NodeReported {
                node: self.node_name(node),
                call: call.to_string(),
                message: error.to_string(),
            });
        }
        let status = message.member_status.ok_or_else(|| Error::EmptyResponse {
            node: self.node_name(node),
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
        let mut request = self.etcd_request(node, machine::EtcdSnapshotRequest {})?;
        request.set_timeout(STREAM_DEADLINE);
        let mut client = self.machine();
        let stream = self.call(node, call, client.etcd_snapshot(request)).await?;
        let node = self.node_name(node);
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
