//! etcd through MachineService: the members (`talosctl etcd members`), a
//! member's status (`etcd status`), the cluster's alarms (`etcd alarm
//! list`, `etcd alarm disarm`), a leader handing its leadership on, and a
//! snapshot of the database (`etcd snapshot`).
//!
//! One member per configured control plane, once etcd was bootstrapped; a
//! member whose node has the `etcd_unhealthy` fault has not started. The
//! leader is the first started member until it forfeits its leadership.
//!
//! With the lab's etcd behind it, EtcdStatus reports that etcd's own
//! figures (database size, raft index and term, version, alarms).
//!
//! The snapshot is real: every control plane stands for the lab's one etcd
//! ([`crate::EmulatorOptions::etcd_url`]), whose `Maintenance/Snapshot` it
//! streams as Talos does — re-chunked into messages of at most 1024 bytes,
//! the sha256 trailer passed through, and a read error ending the stream
//! without one (Talos's chunker swallows it).

use futures::StreamExt as _;
use tonic::{Request, Response, Status};

use ichor_talos_client::proto::common;
use ichor_talos_client::proto::machine;

use super::{ADMIN, BoxStream, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::node::{Node, WriteAction};
use crate::wire::etcdserverpb;
use crate::wire::machine as wire;

/// An etcd alarm, as etcd raises them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdAlarm {
    /// The member's database reached its quota.
    NoSpace,
    /// The member's data is corrupt.
    Corrupt,
}

impl EtcdAlarm {
    fn proto(self) -> i32 {
        match self {
            EtcdAlarm::NoSpace => wire::etcd_member_alarm::AlarmType::Nospace as i32,
            EtcdAlarm::Corrupt => wire::etcd_member_alarm::AlarmType::Corrupt as i32,
        }
    }

    /// What etcd's status says while the alarm is raised.
    fn error(self) -> &'static str {
        match self {
            EtcdAlarm::NoSpace => "etcdserver: mvcc: database space exceeded",
            EtcdAlarm::Corrupt => "etcdserver: corrupt cluster",
        }
    }
}

/// The etcd cluster's own state: who leads, since which term, what alarms.
#[derive(Debug, Default)]
pub(crate) struct EtcdCluster {
    /// The member that leads (`None`: the first started one).
    pub leader: Option<u64>,
    /// Raft's term: one more each time the leadership changes.
    pub term: u64,
    /// Raised alarms: (member id, alarm).
    pub alarms: Vec<(u64, EtcdAlarm)>,
}

/// Talos's role for backups: EtcdSnapshot only.
const ETCD_BACKUP: &str = "os:etcd:backup";

/// Talos's chunker reads the snapshot 1024 bytes at a time.
const SNAPSHOT_CHUNK: usize = 1024;

/// Splits one blob of etcd's stream into Talos's messages (at most
/// [`SNAPSHOT_CHUNK`] bytes each, none empty).
fn snapshot_chunks(blob: &[u8]) -> Vec<common::Data> {
    blob.chunks(SNAPSHOT_CHUNK)
        .map(|c| common::Data {
            metadata: None,
            bytes: c.to_vec(),
        })
        .collect()
}

/// A client of the lab's etcd's Maintenance service at `url`.
async fn lab_etcd_client(
    url: String,
) -> Result<etcdserverpb::maintenance_client::MaintenanceClient<tonic::transport::Channel>, Status>
{
    let failed = |e: String| Status::unknown(format!("failed to create etcd client: {e}"));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| failed(e.to_string()))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok(etcdserverpb::maintenance_client::MaintenanceClient::new(
        channel,
    ))
}

/// `status` with the figures the lab's real etcd reports (its database's
/// size, raft's position, its version, its alarms). The member and leader
/// ids stay the emulated ones: one real etcd stands for every member, and
/// they must match the member list.
fn with_real_figures(
    mut status: machine::EtcdMemberStatus,
    real: &etcdserverpb::StatusResponse,
) -> machine::EtcdMemberStatus {
    status.protocol_version = real.version.clone();
    status.storage_version = real.storage_version.clone();
    status.db_size = real.db_size;
    status.db_size_in_use = real.db_size_in_use;
    status.raft_index = real.raft_index;
    status.raft_term = real.raft_term;
    status.raft_applied_index = real.raft_applied_index;
    status.errors.extend(real.errors.iter().cloned());
    // The lab's one etcd is no learner; the emulated member may be.
    status.is_learner |= real.is_learner;
    status
}

/// The size of every member's database, and how much of it is in use.
const DB_SIZE: i64 = 20_480_000;
const DB_IN_USE: i64 = 9_830_400;

impl NodeApi {
    /// The etcd members, as the shared membership holds them. A member
    /// whose node has the `etcd_unhealthy` fault has not started, which
    /// Talos shows as an empty name.
    pub(super) fn etcd_members(&self) -> Vec<machine::EtcdMember> {
        self.cluster
            .membership
            .members()
            .into_iter()
            .map(|m| {
                let started = self
                    .cluster
                    .nodes
                    .try_get(m.node)
                    .is_none_or(|n| !n.lock().etcd_unhealthy);
                let address = m.address;
                machine::EtcdMember {
                    id: m.id,
                    hostname: if started { m.hostname } else { String::new() },
                    peer_urls: vec![format!("https://{address}:2380")],
                    client_urls: vec![format!("https://{address}:2379")],
                    is_learner: m.learner,
                }
            })
            .collect()
    }

    /// What the legacy Upgrade's etcd pre-check (`ValidateForUpgrade`) refuses, if anything.
    pub(super) fn etcd_upgrade_refusal(&self) -> Option<String> {
        let members = self.etcd_members();
        if members.len() == 2 {
            return Some(
                "etcd member count(2) is insufficient to maintain quorum if upgrade commences"
                    .to_string(),
            );
        }
        members.iter().find(|m| m.hostname.is_empty()).map(|m| {
            format!(
                "etcd member {:x} is not started, all members must be running to perform an upgrade",
                m.id
            )
        })
    }

    /// The member that leads now: the one that took the leadership, while it
    /// runs, else the first started member.
    fn etcd_leader(&self) -> Option<u64> {
        let started: Vec<u64> = self
            .etcd_members()
            .into_iter()
            .filter(|m| !m.hostname.is_empty() && !m.is_learner)
            .map(|m| m.id)
            .collect();
        let chosen = self.etcd_cluster().leader;
        chosen
            .filter(|l| started.contains(l))
            .or_else(|| started.first().copied())
    }

    fn etcd_cluster(&self) -> std::sync::MutexGuard<'_, EtcdCluster> {
        self.cluster.etcd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raises an alarm on node `i`'s member.
    pub(crate) fn raise_etcd_alarm(&self, i: usize, alarm: EtcdAlarm) {
        let id = self.node(i).member_id();
        let mut etcd = self.etcd_cluster();
        if !etcd.alarms.contains(&(id, alarm)) {
            etcd.alarms.push((id, alarm));
        }
    }

    /// The checks of an etcd call on `node` (`api`: its name in Talos's
    /// refusal): a configured control plane whose member runs.
    fn local_etcd(node: &Node, method: &str, api: &str) -> Result<(), Status> {
        if node.in_maintenance() {
            return Err(not_in_maintenance(method));
        }
        if !node.is_control_plane() {
            return Err(Status::unimplemented(format!(
                "{api} is only available on control plane nodes"
            )));
        }
        let st = node.lock();
        if !node.etcd_runs(&st) {
            return Err(Status::unknown(format!(
                "failed to create etcd client: the etcd member on this node is not running (service etcd is {})",
                st.journal
                    .service_events("etcd")
                    .and_then(|e| e.state())
                    .map_or("not started", |s| s.as_str())
            )));
        }
        Ok(())
    }

    pub(super) async fn etcd_member_list_answer(
        &self,
        request: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(Status::failed_precondition("etcd is not running"));
                }
                let members = self.etcd_members();
                let voters = members.iter().filter(|m| !m.is_learner).count();
                let started = members
                    .iter()
                    .filter(|m| !m.hostname.is_empty() && !m.is_learner)
                    .count();
                // The call requires a leader: a majority of voters must run.
                if started * 2 <= voters {
                    return Err(Status::unavailable("etcdserver: no leader"));
                }
                Ok(machine::EtcdMembers {
                    metadata: None,
                    legacy_members: Vec::new(),
                    members,
                })
            })
            .await?;
        Ok(Response::new(machine::EtcdMemberListResponse { messages }))
    }

    pub(super) async fn etcd_forfeit_leadership_answer(
        &self,
        request: Request<machine::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<machine::EtcdForfeitLeadershipResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() || !node.is_control_plane() {
                    return Err(Status::failed_precondition(
                        "etcd is not running on this node",
                    ));
                }
                let me = node.member_id();
                let mut moved_to = String::new();
                if self.etcd_leader() == Some(me) {
                    let next = self
                        .etcd_members()
                        .into_iter()
                        .find(|m| !m.hostname.is_empty() && !m.is_learner && m.id != me);
                    if let Some(next) = next {
                        moved_to = next.hostname.clone();
                        {
                            let mut etcd = self.etcd_cluster();
                            etcd.leader = Some(next.id);
                            etcd.term += 1;
                        }
                        node.lock().journal.output(
                            "etcd",
                            format!(
                                "{{\"level\":\"info\",\"msg\":\"leadership transferred\",\"from\":\"{me:x}\",\"to\":\"{:x}\"}}",
                                next.id
                            ),
                        );
                    }
                }
                node.record(WriteAction::EtcdForfeitLeadership);
                // Talos names the member that leads now, or nothing when
                // this one did not lead.
                Ok(machine::EtcdForfeitLeadership {
                    metadata: None,
                    member: moved_to,
                })
            })
            .await?;
        Ok(Response::new(machine::EtcdForfeitLeadershipResponse {
            messages,
        }))
    }

    pub(super) async fn etcd_status_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::EtcdStatusResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                Self::local_etcd(node, "EtcdStatus", "etcd status")?;
                let me = node.member_id();
                let (term, errors) = {
                    let etcd = self.etcd_cluster();
                    let errors = etcd
                        .alarms
                        .iter()
                        .filter(|(m, _)| *m == me)
                        .map(|(_, a)| a.error().to_string())
                        .collect();
                    (etcd.term, errors)
                };
                let config = node.lock().active.clone().unwrap_or_default();
                let image = crate::derive::etcd_image(&config)
                    .unwrap_or_else(|| crate::host::DEFAULT_ETCD_IMAGE.to_string());
                let version = image
                    .rsplit_once(':')
                    .map_or("3.6.12", |(_, t)| t)
                    .trim_start_matches('v')
                    .split('-')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let storage = {
                    let mut parts = version.split('.');
                    match (parts.next(), parts.next()) {
                        (Some(a), Some(b)) => format!("{a}.{b}.0"),
                        _ => "unknown".to_string(),
                    }
                };
                let raft_index = 12_345 + 100 * (term + 2);
                Ok(machine::EtcdStatus {
                    metadata: None,
                    member_status: Some(machine::EtcdMemberStatus {
                        protocol_version: version,
                        db_size: DB_SIZE,
                        db_size_in_use: DB_IN_USE,
                        leader: self.etcd_leader().unwrap_or_default(),
                        raft_index,
                        raft_term: term + 2,
                        raft_applied_index: raft_index,
                        errors,
                        is_learner: self
                            .cluster
                            .membership
                            .member_of(node.index)
                            .is_some_and(|m| m.learner),
                        member_id: me,
                        storage_version: storage,
                    }),
                })
            })
            .await?;
        let mut messages = messages;
        let answered = messages.iter().any(|m| m.member_status.is_some());
        if let Some(url) = self.cluster.lab_etcd().filter(|_| answered) {
            let real = lab_etcd_client(url)
                .await?
                .status(etcdserverpb::StatusRequest {})
                .await
                .map_err(|s| {
                    Status::unknown(format!("failed to query etcd status: {}", s.message()))
                })?
                .into_inner();
            for m in &mut messages {
                if let Some(status) = m.member_status.take() {
                    m.member_status = Some(with_real_figures(status, &real));
                }
            }
        }
        Ok(Response::new(machine::EtcdStatusResponse { messages }))
    }

    /// EtcdSnapshot: the lab's etcd's snapshot, streamed from the node the
    /// call is routed to (a control plane whose member runs).
    pub(super) async fn etcd_snapshot_answer(
        &self,
        request: Request<machine::EtcdSnapshotRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, ETCD_BACKUP])?;
        let i = self.stream_target(request.metadata()).await?;
        Self::local_etcd(&self.node(i), "EtcdSnapshot", "etcd snapshot")?;
        let url = self
            .cluster
            .lab_etcd()
            .ok_or_else(|| Status::unavailable("etcd is not running"))?;
        let failed = |what: &str, reason: String| Status::unknown(format!("{what}: {reason}"));
        let mut etcd = lab_etcd_client(url).await?;
        let snapshot = etcd
            .snapshot(etcdserverpb::SnapshotRequest {})
            .await
            .map_err(|s| failed("failed reading etcd snapshot", s.message().to_string()))?
            .into_inner();
        let hostname = self.node(i).spec.hostname.clone();
        let messages = snapshot
            .take_while(move |item| {
                if let Err(status) = item {
                    tracing::warn!(
                        node = %hostname,
                        error = %status.message(),
                        "the etcd snapshot stream broke; ending it as Talos does, without an error"
                    );
                }
                std::future::ready(item.is_ok())
            })
            .flat_map(|item| {
                let chunks = item.map_or_else(|_| Vec::new(), |m| snapshot_chunks(&m.blob));
                futures::stream::iter(chunks.into_iter().map(Ok))
            });
        Ok(Response::new(Box::pin(messages)))
    }

    fn alarms(&self) -> Vec<wire::EtcdMemberAlarm> {
        self.etcd_cluster()
            .alarms
            .iter()
            .map(|(member_id, alarm)| wire::EtcdMemberAlarm {
                member_id: *member_id,
                alarm: alarm.proto(),
            })
            .collect()
    }

    pub(super) async fn etcd_alarm_list_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::EtcdAlarmListResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                Self::local_etcd(node, "EtcdAlarmList", "etcd alarm list")?;
                Ok(wire::EtcdAlarm {
                    metadata: None,
                    member_alarms: self.alarms(),
                })
            })
            .await?;
        Ok(Response::new(wire::EtcdAlarmListResponse { messages }))
    }

    pub(super) async fn etcd_alarm_disarm_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::EtcdAlarmDisarmResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let messages = self
            .unary(request.metadata(), |node| {
                Self::local_etcd(node, "EtcdAlarmDisarm", "etcd alarm disarm")?;
                let disarmed = self.alarms();
                self.etcd_cluster().alarms.clear();
                if !disarmed.is_empty() {
                    node.lock().journal.output(
                        "etcd",
                        format!(
                            "{{\"level\":\"info\",\"msg\":\"disarmed alarms\",\"count\":{}}}",
                            disarmed.len()
                        ),
                    );
                }
                Ok(wire::EtcdAlarmDisarm {
                    metadata: None,
                    member_alarms: disarmed,
                })
            })
            .await?;
        Ok(Response::new(wire::EtcdAlarmDisarmResponse { messages }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An etcd whose snapshot stream breaks after its first blob.
    struct CutEtcd;

    #[tonic::async_trait]
    impl etcdserverpb::maintenance_server::Maintenance for CutEtcd {
        type SnapshotStream = BoxStream<etcdserverpb::SnapshotResponse>;

        async fn snapshot(
            &self,
            _: Request<etcdserverpb::SnapshotRequest>,
        ) -> Result<Response<Self::SnapshotStream>, Status> {
            let first = etcdserverpb::SnapshotResponse {
                header: None,
                remaining_bytes: 8_500,
                blob: vec![7; 1500],
                version: "3.6.0".to_string(),
            };
            let broken = Status::unavailable("etcd went away");
            Ok(Response::new(Box::pin(futures::stream::iter([
                Ok(first),
                Err(broken),
            ]))))
        }

        async fn status(
            &self,
            _: Request<etcdserverpb::StatusRequest>,
        ) -> Result<Response<etcdserverpb::StatusResponse>, Status> {
            Err(Status::unavailable("etcd went away"))
        }
    }

    /// Talos's chunker swallows a read error: the stream of a broken
    /// snapshot ends as a whole one does, with what came before the break
    /// (the caller's size and trailer checks are what catch it).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_broken_etcd_stream_ends_without_an_error_as_talos_ends_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let etcd = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(etcdserverpb::maintenance_server::MaintenanceServer::new(
                    CutEtcd,
                ))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let config = std::fs::read(
            ichor_testenv::fixtures::talos_dir().join("stability-v1.12/base-controlplane.yaml"),
        )
        .unwrap();
        let emu = crate::Emulator::start_with(
            vec![crate::NodeSpec::new("cp-1", config)],
            crate::EmulatorOptions {
                etcd_url: Some(etcd),
                ..crate::EmulatorOptions::default()
            },
        )
        .await
        .unwrap();
        let stream = emu
            .admin_client(0)
            .unwrap()
            .etcd_snapshot("")
            .await
            .unwrap();
        let sizes: Vec<usize> = stream
            .map(|chunk| chunk.unwrap().len())
            .collect::<Vec<_>>()
            .await;
        assert_eq!(sizes, [1024, 476]);
    }

    #[test]
    fn a_blob_becomes_messages_of_at_most_1024_bytes_in_order() {
        let blob: Vec<u8> = (0..2600u32).map(|i| (i % 251) as u8).collect();
        let chunks = snapshot_chunks(&blob);
        let sizes: Vec<usize> = chunks.iter().map(|c| c.bytes.len()).collect();
        assert_eq!(sizes, [1024, 1024, 552]);
        let joined: Vec<u8> = chunks.into_iter().flat_map(|c| c.bytes).collect();
        assert_eq!(joined, blob);
        // The 32-byte trailer comes as a blob of its own and stays one message.
        assert_eq!(snapshot_chunks(&[7; 32]).len(), 1);
        assert!(snapshot_chunks(&[]).is_empty());
    }
}
