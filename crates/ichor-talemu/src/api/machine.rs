//! MachineService: its index (which room answers each method), and the
//! methods of the node's own life: its configuration (ApplyConfiguration),
//! version and hostname, Read, Reboot, the deprecated Upgrade, Bootstrap and
//! Kubeconfig. The methods Ichor's client calls are served through the
//! client crate's MachineService; those only talosctl calls through the
//! emulator's own ([`crate::wire::machine`]); [`super::router`] sends each
//! path to the one that serves it.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use ichor_talos_client::proto::common;
use ichor_talos_client::proto::machine;
use ichor_talos_client::proto::machine::machine_service_server::MachineService;

use super::{ADMIN, BoxStream, NodeApi, OPERATOR, READER, caller};
use crate::host;
use crate::journal::ServiceState;
use crate::node::WriteAction;
use crate::wire;

#[tonic::async_trait]
#[tonic::async_trait]
impl MachineService for NodeApi {
    async fn apply_configuration(
        &self,
        request: Request<machine::ApplyConfigurationRequest>,
    ) -> Result<Response<machine::ApplyConfigurationResponse>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let messages = self
            .unary(&md, |node| {
                let was_in_maintenance = node.in_maintenance();
                let applied = node.apply(req.clone(), caller.is_admin())?;
                if was_in_maintenance && !node.in_maintenance() {
                    let i = self.index_of(node);
                    self.serve_config_ca(i);
                    let _ = self.cluster.configured.send(crate::ConfiguredNode {
                        index: i,
                        hostname: node.hostname(),
                        address: node.spec.address,
                        control_plane: node.is_control_plane(),
                        talos_version: node.talos_version(),
                    });
                }
                Ok(applied)
            })
            .await?;
        Ok(Response::new(machine::ApplyConfigurationResponse {
            messages,
        }))
    }

    async fn hostname(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::HostnameResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                Ok(machine::Hostname {
                    metadata: None,
                    hostname: node.hostname(),
                })
            })
            .await?;
        Ok(Response::new(machine::HostnameResponse { messages }))
    }

    async fn reboot(
        &self,
        request: Request<machine::RebootRequest>,
    ) -> Result<Response<machine::RebootResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR])?;
        let messages = self
            .unary(request.metadata(), |node| Ok(node.reboot()))
            .await?;
        Ok(Response::new(machine::RebootResponse { messages }))
    }

    async fn version(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::VersionResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| Ok(node.version_message()))
            .await?;
        Ok(Response::new(machine::VersionResponse { messages }))
    }

    type ReadStream = BoxStream<common::Data>;

    async fn read(
        &self,
        request: Request<machine::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let i = self.stream_target(request.metadata()).await?;
        let bytes = self.node(i).read_file(&request.get_ref().path)?;
        let data = common::Data {
            metadata: None,
            bytes,
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(data)]))))
    }

    async fn upgrade(
        &self,
        request: Request<machine::UpgradeRequest>,
    ) -> Result<Response<machine::UpgradeResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let md = request.metadata().clone();
        let req = request.into_inner();
        let messages = self
            .unary(&md, |node| {
                let refusal = if node.is_control_plane() {
                    self.etcd_upgrade_refusal()
                } else {
                    None
                };
                node.legacy_upgrade(&req, refusal)
            })
            .await?;
        Ok(Response::new(machine::UpgradeResponse { messages }))
    }

    async fn etcd_member_list(
        &self,
        request: Request<machine::EtcdMemberListRequest>,
    ) -> Result<Response<machine::EtcdMemberListResponse>, Status> {
        self.etcd_member_list_answer(request).await
    }

    async fn bootstrap(
        &self,
        request: Request<machine::BootstrapRequest>,
    ) -> Result<Response<machine::BootstrapResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let messages = self
            .unary(request.metadata(), |node| {
                let i = self.index_of(node);
                self.bootstrap_on(i, request.get_ref())
            })
            .await?;
        Ok(Response::new(machine::BootstrapResponse { messages }))
    }

    type KubeconfigStream = BoxStream<common::Data>;

    async fn kubeconfig(
        &self,
        request: Request<()>,
    ) -> Result<Response<Self::KubeconfigStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let i = self.stream_target(request.metadata()).await?;
        let bytes = self.node(i).kubeconfig_archive()?;
        let data = common::Data {
            metadata: None,
            bytes,
        };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(data)]))))
    }

    async fn etcd_recover(
        &self,
        request: Request<tonic::Streaming<common::Data>>,
    ) -> Result<Response<machine::EtcdRecoverResponse>, Status> {
        self.etcd_recover_answer(request).await
    }

    /// The router sends ServiceList to the emulator's own server; this one
    /// answers the same, re-read as the client crate's messages (the same
    /// field numbers).
    async fn service_list(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::ServiceListResponse>, Status> {
        use prost::Message as _;
        let answer = self.service_list_answer(request).await?.into_inner();
        machine::ServiceListResponse::decode(answer.encode_to_vec().as_slice())
            .map(Response::new)
            .map_err(|e| Status::internal(e.to_string()))
    }

    async fn etcd_forfeit_leadership(
        &self,
        request: Request<machine::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<machine::EtcdForfeitLeadershipResponse>, Status> {
        self.etcd_forfeit_leadership_answer(request).await
    }

    async fn etcd_status(
        &self,
        request: Request<()>,
    ) -> Result<Response<machine::EtcdStatusResponse>, Status> {
        self.etcd_status_answer(request).await
    }

    type EtcdSnapshotStream = BoxStream<common::Data>;

    async fn etcd_snapshot(
        &self,
        request: Request<machine::EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        self.etcd_snapshot_answer(request).await
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<machine::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<machine::EtcdRemoveMemberByIdResponse>, Status> {
        self.etcd_remove_member_by_id_answer(request).await
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<machine::EtcdLeaveClusterRequest>,
    ) -> Result<Response<machine::EtcdLeaveClusterResponse>, Status> {
        self.etcd_leave_cluster_answer(request).await
    }

    async fn reset(
        &self,
        request: Request<machine::ResetRequest>,
    ) -> Result<Response<machine::ResetResponse>, Status> {
        self.reset_answer(request).await
    }
}

/// The methods only talosctl calls, each answered by its room.
#[tonic::async_trait]
impl wire::machine::machine_service_server::MachineService for NodeApi {
    async fn service_list(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::ServiceListResponse>, Status> {
        self.service_list_answer(request).await
    }

    async fn etcd_alarm_list(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::EtcdAlarmListResponse>, Status> {
        self.etcd_alarm_list_answer(request).await
    }

    async fn etcd_alarm_disarm(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::EtcdAlarmDisarmResponse>, Status> {
        self.etcd_alarm_disarm_answer(request).await
    }

    type DmesgStream = BoxStream<common::Data>;

    async fn dmesg(
        &self,
        request: Request<wire::machine::DmesgRequest>,
    ) -> Result<Response<Self::DmesgStream>, Status> {
        self.dmesg_answer(request).await
    }

    type LogsStream = BoxStream<common::Data>;

    async fn logs(
        &self,
        request: Request<wire::machine::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        self.logs_answer(request).await
    }

    async fn logs_containers(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::LogsContainersResponse>, Status> {
        self.logs_containers_answer(request).await
    }

    async fn memory(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::MemoryResponse>, Status> {
        self.memory_answer(request).await
    }

    async fn processes(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::ProcessesResponse>, Status> {
        self.processes_answer(request).await
    }

    async fn mounts(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::machine::MountsResponse>, Status> {
        self.mounts_answer(request).await
    }

    async fn containers(
        &self,
        request: Request<wire::machine::ContainersRequest>,
    ) -> Result<Response<wire::machine::ContainersResponse>, Status> {
        self.containers_answer(request).await
    }

    async fn stats(
        &self,
        request: Request<wire::machine::StatsRequest>,
    ) -> Result<Response<wire::machine::StatsResponse>, Status> {
        self.stats_answer(request).await
    }
}

impl NodeApi {
    /// Bootstrap on one node, with Talos's checks in Talos's order: the node
    /// must be up with a config (else FailedPrecondition, which talosctl
    /// retries), a control plane (Unimplemented), and etcd must hold no data
    /// yet (AlreadyExists "etcd data directory is not empty": every control
    /// plane of a bootstrapped cluster has joined it).
    ///
    /// With `recover_etcd` it answers first and restores afterwards
    /// ([`super::etcd_recover`]).
    fn bootstrap_on(
        &self,
        i: usize,
        request: &machine::BootstrapRequest,
    ) -> Result<machine::Bootstrap, Status> {
        self.cluster.recovery.count_bootstrap(i);
        let node = self.node(i);
        if node.in_maintenance() || node.lock().rebooting_after_apply {
            return Err(Status::failed_precondition(
                "bootstrap is not available yet",
            ));
        }
        if !node.is_control_plane() {
            return Err(Status::unimplemented(
                "bootstrap is only supported on control plane nodes",
            ));
        }
        if self.cluster.bootstrapped() {
            return Err(Status::already_exists("etcd data directory is not empty"));
        }
        if request.recover_etcd {
            node.record(WriteAction::Bootstrap);
            self.accept_recover(i, request.recover_skip_hash_check);
            return Ok(machine::Bootstrap { metadata: None });
        }
        {
            let mut st = node.lock();
            st.etcd_data = true;
            st.journal
                .talos("bootstrap request received: bootstrapping etcd as a new cluster");
        }
        self.start_etcd_members(i);
        node.record(WriteAction::Bootstrap);
        let _ = self.cluster.bootstraps.send(i);
        Ok(machine::Bootstrap { metadata: None })
    }

    /// After a node leaves maintenance mode: serve the Talos API CA its
    /// config names (when the emulator is told to, and the config holds one).
    fn serve_config_ca(&self, i: usize) {
        if !self.cluster.serve_config_ca {
            return;
        }
        let node = self.node(i);
        let Some(config) = node.lock().active.clone() else {
            return;
        };
        // A worker's config holds the CA without its key: its certificate
        // comes from the control planes (trustd), which hold the key.
        let Some(ca) = crate::derive::os_ca(&config).or_else(|| {
            let cert = crate::derive::os_ca_cert(&config)?;
            self.cluster.nodes.all().iter().find_map(|n| {
                let other = n.lock().active.clone()?;
                crate::derive::os_ca(&other).filter(|ca| ca.cert_pem == cert)
            })
        }) else {
            return;
        };
        let built = crate::pki::Pki::from_pem(&ca.cert_pem, &ca.key_pem).and_then(|pki| {
            let cert = pki.server_cert(&node.spec.hostname, &[node.spec.address])?;
            crate::server::mtls_config(pki.ca_pem(), &cert)
        });
        match built {
            Ok(tls) => node.lock().mtls = Some(Arc::new(tls)),
            Err(e) => tracing::warn!(
                node = %node.spec.hostname,
                error = %ichor_api::error_text::chain(&e),
                "the applied config's Talos API CA is unusable, keeping the emulator's"
            ),
        }
    }

    /// etcd is bootstrapped on node `bootstrapper`: every configured control
    /// plane's member starts (the others join it), and says so in its record.
    /// The members are listed before the cluster counts as bootstrapped, so
    /// the etcd service's own pass never sees a bootstrapped cluster without
    /// them (it would join the bootstrapper as a learner).
    pub(super) fn start_etcd_members(&self, bootstrapper: usize) {
        self.add_bootstrap_members(bootstrapper);
        self.cluster.discovery.mark_bootstrapped();
        for (j, n) in self.cluster.nodes.all().iter().enumerate() {
            let mut st = n.lock();
            let Some(config) = st.active.clone() else {
                continue;
            };
            let running = st.journal.service_events("etcd").and_then(|e| e.state())
                == Some(ServiceState::Running);
            if n.etcd_runs(&st) && !running {
                host::record_etcd_start(&mut st.journal, &config, n.member_id(), j == bootstrapper);
            }
            n.refresh(&mut st);
        }
    }
}
