//! The gRPC services of an emulated node (MachineService and the COSI State
//! service), with apid's routing on the `node`/`nodes` metadata and the
//! role checks of Talos's authorizer.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Response, Status};

use ichor_talos_client::proto::common;
use ichor_talos_client::proto::cosi::resource as cosi;
use ichor_talos_client::proto::cosi::resource::state_server::State;
use ichor_talos_client::proto::google::rpc;
use ichor_talos_client::proto::machine;
use ichor_talos_client::proto::machine::image_service_server::ImageService;
use ichor_talos_client::proto::machine::lifecycle_service_server::LifecycleService;
use ichor_talos_client::proto::machine::machine_service_server::MachineService;

use crate::node::{Fault, Node, WriteAction};
use crate::resources;

const ADMIN: &str = "os:admin";
const OPERATOR: &str = "os:operator";
const READER: &str = "os:reader";

/// The nodes of one emulator process.
pub(crate) struct Cluster {
    pub nodes: Vec<Arc<Node>>,
    /// A node leaving maintenance mode serves the Talos API CA of its new
    /// config (as Talos does) instead of the emulator's.
    pub serve_config_ca: bool,
    /// The index of every node that bootstraps etcd, as it happens.
    pub bootstraps: tokio::sync::broadcast::Sender<usize>,
}

impl Cluster {
    /// Whether etcd was bootstrapped anywhere (every control plane joins it then).
    pub fn bootstrapped(&self) -> bool {
        self.nodes.iter().any(|n| n.lock().etcd_data)
    }
}

/// Who is calling: a maintenance-mode caller (no certificate) or the roles of
/// the client certificate (its subject's Organization values).
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    Maintenance,
    Roles(Vec<String>),
}

impl Caller {
    fn has_any(&self, roles: &[&str]) -> bool {
        match self {
            // Talos (1.13+) gives a maintenance-mode caller `os:reader`
            // (ApplyConfiguration checks maintenance mode in its handler).
            Caller::Maintenance => roles.contains(&READER),
            Caller::Roles(have) => have.iter().any(|r| roles.contains(&r.as_str())),
        }
    }

    fn is_admin(&self) -> bool {
        self.has_any(&[ADMIN])
    }
}

/// Reads the roles from the verified client certificate of the connection.
fn caller<T>(request: &Request<T>) -> Caller {
    let Some(info) = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() else {
        return Caller::Maintenance;
    };
    let Some(certs) = info.peer_certs() else {
        return Caller::Maintenance;
    };
    let Some(leaf) = certs.first() else {
        return Caller::Maintenance;
    };
    let roles = match x509_parser::parse_x509_certificate(leaf.as_ref()) {
        Ok((_, cert)) => cert
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect(),
        Err(_) => Vec::new(),
    };
    Caller::Roles(roles)
}

enum Route {
    One(usize),
    Many(Vec<String>),
}

/// The services as served by one node (`me`).
#[derive(Clone)]
pub(crate) struct NodeApi {
    pub cluster: Arc<Cluster>,
    pub me: usize,
}

fn unavailable(target: &str) -> Status {
    Status::unavailable(format!(
        "connection error: desc = \"transport: Error while dialing: dial tcp {target}:50000: connect: connection refused\""
    ))
}

impl NodeApi {
    fn node(&self, i: usize) -> &Arc<Node> {
        &self.cluster.nodes[i]
    }

    fn can_forward(&self) -> bool {
        self.node(self.me).is_control_plane()
    }

    /// Finds the node a `node` value names (address or hostname), preferring this one.
    fn resolve(&self, target: &str) -> Result<usize, Status> {
        let target = target.trim();
        if target.contains(':') && target.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(Status::internal(format!("invalid target {target:?}")));
        }
        let matches = |n: &Node| n.spec.address.to_string() == target || n.spec.hostname == target;
        if matches(self.node(self.me)) {
            return Ok(self.me);
        }
        let found = self.cluster.nodes.iter().position(|n| matches(n));
        match found {
            Some(_) if !self.can_forward() => {
                Err(Status::permission_denied("no request forwarding"))
            }
            Some(i) => Ok(i),
            None => Err(unavailable(target)),
        }
    }

    fn route(&self, md: &MetadataMap, cosi: bool) -> Result<Route, Status> {
        // In maintenance mode apid runs with node routing disabled: `node`
        // metadata (talosctl's `get --insecure` sends an empty one) is ignored.
        if md.get("proxyfrom").is_some() || self.node(self.me).in_maintenance() {
            return Ok(Route::One(self.me));
        }
        let node: Vec<String> = md
            .get_all("node")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        if node.len() > 1 {
            return Err(Status::invalid_argument(
                "node metadata must be single-valued",
            ));
        }
        if let Some(target) = node.first() {
            return Ok(Route::One(self.resolve(target)?));
        }
        let nodes: Vec<String> = md
            .get_all("nodes")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if nodes.is_empty() {
            return Ok(Route::One(self.me));
        }
        if cosi {
            return Err(Status::invalid_argument(
                "one-2-many proxying is not supported for COSI methods",
            ));
        }
        Ok(Route::Many(nodes))
    }

    /// Applies the target node's fault (down, slow, refusing).
    async fn guard(&self, i: usize) -> Result<(), Status> {
        let node = self.node(i);
        if node.is_down() {
            return Err(unavailable(&node.spec.address.to_string()));
        }
        let fault = node.lock().fault.clone();
        match fault {
            Fault::None | Fault::Down => Ok(()),
            Fault::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Fault::Refuse(code, message) => Err(Status::new(code, message)),
        }
    }

    /// Runs a unary MachineService call on the routed node(s). With `nodes`
    /// (one-to-many) each answer gets `metadata.hostname`, and failures
    /// become messages carrying `metadata.error`, as apid aggregates them.
    async fn unary<M, F>(&self, md: &MetadataMap, f: F) -> Result<Vec<M>, Status>
    where
        M: Default,
        F: Fn(&Arc<Node>) -> Result<M, Status>,
        M: HasMetadata,
    {
        match self.route(md, false)? {
            Route::One(i) => {
                self.guard(i).await?;
                Ok(vec![f(self.node(i))?])
            }
            Route::Many(targets) => {
                let mut out = Vec::new();
                for target in targets {
                    let result = match self.resolve(&target) {
                        Ok(i) => match self.guard(i).await {
                            Ok(()) => f(self.node(i)),
                            Err(e) => Err(e),
                        },
                        Err(e) => Err(e),
                    };
                    let m = match result {
                        Ok(m) => {
                            let mut m = m;
                            m.set_metadata(common::Metadata {
                                hostname: target.clone(),
                                ..Default::default()
                            });
                            m
                        }
                        Err(status) => {
                            let mut m = M::default();
                            m.set_metadata(common::Metadata {
                                hostname: target.clone(),
                                error: status.message().to_string(),
                                status: Some(rpc::Status {
                                    code: status.code() as i32,
                                    message: status.message().to_string(),
                                    details: Vec::new(),
                                }),
                            });
                            m
                        }
                    };
                    out.push(m);
                }
                Ok(out)
            }
        }
    }

    fn authorize(caller: &Caller, roles: &[&str]) -> Result<(), Status> {
        if caller.has_any(roles) {
            Ok(())
        } else {
            Err(Status::permission_denied("not authorized"))
        }
    }

    /// The COSI access filter: known type and namespace, read access, admin for sensitive types.
    async fn cosi_target(
        &self,
        md: &MetadataMap,
        caller: &Caller,
        namespace: &str,
        r#type: &str,
    ) -> Result<usize, Status> {
        Self::authorize(caller, &[ADMIN, OPERATOR, READER])?;
        let Route::One(i) = self.route(md, true)? else {
            unreachable!("COSI routes are single");
        };
        self.guard(i).await?;
        let gate = self.node(i).lock().read_gate.clone();
        if let Some(gate) = gate {
            gate.pass().await;
        }
        let def = resources::definition(r#type).ok_or_else(|| {
            Status::permission_denied(format!("resource type {type:?} is not supported"))
        })?;
        if !resources::NAMESPACES.iter().any(|(ns, _)| *ns == namespace) {
            return Err(Status::permission_denied(format!(
                "namespace {namespace:?} is not supported"
            )));
        }
        if def.sensitive && !caller.is_admin() {
            return Err(Status::permission_denied("not authorized"));
        }
        Ok(i)
    }
}

impl NodeApi {
    /// The one node a streaming call goes to (one-to-many is not served for streams).
    async fn stream_target(&self, md: &MetadataMap) -> Result<usize, Status> {
        match self.route(md, false)? {
            Route::One(i) => {
                self.guard(i).await?;
                Ok(i)
            }
            // talosctl still sends one node as `nodes` for some streams (read).
            Route::Many(targets) if targets.len() == 1 => {
                let i = self.resolve(&targets[0])?;
                self.guard(i).await?;
                Ok(i)
            }
            Route::Many(_) => Err(Status::invalid_argument(
                "one-2-many proxying is not supported for streaming methods",
            )),
        }
    }

    /// The etcd members: one per configured control plane. A member whose
    /// node has the `etcd_unhealthy` fault has not started, which Talos shows
    /// as an empty name.
    fn etcd_members(&self) -> Vec<machine::EtcdMember> {
        self.cluster
            .nodes
            .iter()
            .filter(|n| !n.in_maintenance() && n.is_control_plane())
            .filter(|_| self.cluster.bootstrapped())
            .map(|n| {
                let started = !n.lock().etcd_unhealthy;
                let address = n.spec.address;
                machine::EtcdMember {
                    id: member_id(&n.spec.hostname),
                    hostname: if started { n.hostname() } else { String::new() },
                    peer_urls: vec![format!("https://{address}:2380")],
                    client_urls: vec![format!("https://{address}:2379")],
                    is_learner: false,
                }
            })
            .collect()
    }

    /// What the legacy Upgrade's etcd pre-check (`ValidateForUpgrade`) refuses, if anything.
    fn etcd_upgrade_refusal(&self) -> Option<String> {
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
}

impl NodeApi {
    /// Bootstrap on one node, with Talos's checks in Talos's order: the node
    /// must be up with a config (else FailedPrecondition, which talosctl
    /// retries), a control plane (Unimplemented), and etcd must hold no data
    /// yet (AlreadyExists "etcd data directory is not empty": every control
    /// plane of a bootstrapped cluster has joined it).
    fn bootstrap_on(&self, i: usize) -> Result<machine::Bootstrap, Status> {
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
        node.lock().etcd_data = true;
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
            self.cluster.nodes.iter().find_map(|n| {
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
                "the applied config's Talos API CA is unusable, keeping the emulator's: {e}"
            ),
        }
    }
}

/// A stable etcd member id for a hostname (FNV-1a).
fn member_id(hostname: &str) -> u64 {
    hostname.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Messages of the `messages` pattern carry a `common.Metadata` in field 1.
pub(crate) trait HasMetadata {
    fn set_metadata(&mut self, md: common::Metadata);
}

macro_rules! has_metadata {
    ($($t:ty),*) => {$(
        impl HasMetadata for $t {
            fn set_metadata(&mut self, md: common::Metadata) {
                self.metadata = Some(md);
            }
        }
    )*};
}
has_metadata!(
    machine::Version,
    machine::Hostname,
    machine::ApplyConfiguration,
    machine::Reboot,
    machine::Upgrade,
    machine::EtcdMembers,
    machine::EtcdForfeitLeadership,
    machine::Bootstrap
);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

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
                    let i = self
                        .cluster
                        .nodes
                        .iter()
                        .position(|n| Arc::ptr_eq(n, node))
                        .unwrap_or(self.me);
                    self.serve_config_ca(i);
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
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(Status::failed_precondition("etcd is not running"));
                }
                let members = self.etcd_members();
                let started = members.iter().filter(|m| !m.hostname.is_empty()).count();
                // The call requires a leader: a majority of members must run.
                if started * 2 <= members.len() {
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

    async fn bootstrap(
        &self,
        request: Request<machine::BootstrapRequest>,
    ) -> Result<Response<machine::BootstrapResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let messages = self
            .unary(request.metadata(), |node| {
                let i = self
                    .cluster
                    .nodes
                    .iter()
                    .position(|n| Arc::ptr_eq(n, node))
                    .unwrap_or(self.me);
                self.bootstrap_on(i)
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

    async fn etcd_forfeit_leadership(
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
                node.record(WriteAction::EtcdForfeitLeadership);
                Ok(machine::EtcdForfeitLeadership {
                    metadata: None,
                    member: node.hostname(),
                })
            })
            .await?;
        Ok(Response::new(machine::EtcdForfeitLeadershipResponse {
            messages,
        }))
    }
}

#[tonic::async_trait]
impl ImageService for NodeApi {
    type PullStream = BoxStream<machine::ImageServicePullResponse>;

    async fn pull(
        &self,
        request: Request<machine::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR])?;
        let i = self.stream_target(request.metadata()).await?;
        let req = request.into_inner();
        let store = req.containerd.unwrap_or_default();
        let name = self
            .node(i)
            .pull_image(store.driver, store.namespace, &req.image_ref)?;
        use machine::image_service_pull_response::Response as Pull;
        let progress = machine::ImageServicePullResponse {
            response: Some(Pull::PullProgress(machine::ImageServicePullProgress {
                layer_id: "sha256:0000000000000000000000000000000000000000000000000000000000000000"
                    .to_string(),
                progress: Some(machine::ImageServicePullLayerProgress {
                    status: machine::image_service_pull_layer_progress::Status::ExtractComplete
                        as i32,
                    elapsed: None,
                    offset: 0,
                    total: 0,
                }),
            })),
        };
        let done = machine::ImageServicePullResponse {
            response: Some(Pull::Name(name)),
        };
        Ok(Response::new(Box::pin(futures::stream::iter([
            Ok(progress),
            Ok(done),
        ]))))
    }
}

#[tonic::async_trait]
impl LifecycleService for NodeApi {
    type UpgradeStream = BoxStream<machine::LifecycleServiceUpgradeResponse>;

    async fn upgrade(
        &self,
        request: Request<machine::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let i = self.stream_target(request.metadata()).await?;
        let req = request.into_inner();
        let store = req.containerd.unwrap_or_default();
        let image = req.source.map(|s| s.image_name).unwrap_or_default();
        let lines = self
            .node(i)
            .lifecycle_upgrade(store.driver, store.namespace, &image)?;
        use machine::lifecycle_service_install_progress::Response as Progress;
        let progress = |p| {
            Ok(machine::LifecycleServiceUpgradeResponse {
                progress: Some(machine::LifecycleServiceInstallProgress { response: Some(p) }),
            })
        };
        let mut out: Vec<Result<_, Status>> = lines
            .into_iter()
            .map(|l| progress(Progress::Message(l)))
            .collect();
        out.push(progress(Progress::ExitCode(0)));
        Ok(Response::new(Box::pin(futures::stream::iter(out))))
    }
}

fn not_found(r#type: &str, id: &str) -> Status {
    Status::not_found(format!("resource {type}/{id} doesn't exist"))
}

#[tonic::async_trait]
impl State for NodeApi {
    async fn get(
        &self,
        request: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let st = self.node(i).lock();
        let key = (req.namespace.clone(), req.r#type.clone(), req.id.clone());
        let stored = st
            .store
            .get(&key)
            .ok_or_else(|| not_found(&req.r#type, &req.id))?;
        Ok(Response::new(cosi::GetResponse {
            resource: Some(stored.to_proto()),
        }))
    }

    type ListStream = BoxStream<cosi::ListResponse>;

    async fn list(
        &self,
        request: Request<cosi::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let items: Vec<Result<cosi::ListResponse, Status>> = {
            let st = self.node(i).lock();
            st.store
                .iter()
                .filter(|((ns, t, _), _)| *ns == req.namespace && *t == req.r#type)
                .map(|(_, s)| {
                    Ok(cosi::ListResponse {
                        resource: Some(s.to_proto()),
                    })
                })
                .collect()
        };
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }

    type WatchStream = BoxStream<cosi::WatchResponse>;

    async fn watch(
        &self,
        request: Request<cosi::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let options = req.options.clone().unwrap_or_default();
        if req.id.is_some() && (options.bootstrap_contents || !options.label_query.is_empty()) {
            return Err(Status::unimplemented(
                "bootstrap contents and label queries are not supported for single resource watch",
            ));
        }
        let node = Arc::clone(self.node(i));
        // Subscribe before reading the current state, so no change is lost.
        let events = node.events.subscribe();
        let initial = initial_watch_events(&node, &req, options.bootstrap_contents);
        let live = live_watch_events(events, req.namespace, req.r#type, req.id);
        let stream =
            futures::StreamExt::chain(futures::stream::iter(initial.into_iter().map(Ok)), live);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One watch event for `resource` (none for a bootstrapped marker).
fn watch_event(
    resource: Option<cosi::Resource>,
    event_type: cosi::EventType,
) -> cosi::WatchResponse {
    cosi::WatchResponse {
        event: vec![cosi::Event {
            resource,
            event_type: event_type as i32,
            old: None,
            error: None,
            bookmark: None,
        }],
    }
}

/// What a watch sends first: an empty response, then the watched resource
/// (a tombstone when it does not exist), or with bootstrap contents every
/// resource of the type and (API version 1 on) a bootstrapped marker.
fn initial_watch_events(
    node: &Node,
    req: &cosi::WatchRequest,
    bootstrap_contents: bool,
) -> Vec<cosi::WatchResponse> {
    let mut initial: Vec<cosi::WatchResponse> = vec![cosi::WatchResponse { event: Vec::new() }];
    let st = node.lock();
    match &req.id {
        Some(id) => {
            let key = (req.namespace.clone(), req.r#type.clone(), id.clone());
            match st.store.get(&key) {
                Some(s) => initial.push(watch_event(Some(s.to_proto()), cosi::EventType::Created)),
                None => {
                    let tombstone = cosi::Resource {
                        metadata: Some(cosi::Metadata {
                            namespace: req.namespace.clone(),
                            r#type: req.r#type.clone(),
                            id: id.clone(),
                            version: "undefined".to_string(),
                            phase: "running".to_string(),
                            ..Default::default()
                        }),
                        spec: None,
                    };
                    initial.push(watch_event(Some(tombstone), cosi::EventType::Destroyed));
                }
            }
        }
        None if bootstrap_contents => {
            for ((ns, t, _), s) in &st.store {
                if *ns == req.namespace && *t == req.r#type {
                    initial.push(watch_event(Some(s.to_proto()), cosi::EventType::Created));
                }
            }
            if req.api_version >= 1 {
                initial.push(watch_event(None, cosi::EventType::Bootstrapped));
            }
        }
        None => {}
    }
    initial
}

/// The node's changes to resources of `ns`/`ty` (and `id`, when given), as
/// they happen; a lagging watcher skips what it missed.
fn live_watch_events(
    mut events: tokio::sync::broadcast::Receiver<cosi::Event>,
    ns: String,
    ty: String,
    id: Option<String>,
) -> impl Stream<Item = Result<cosi::WatchResponse, Status>> + Send + 'static {
    async_stream_events(move |tx| async move {
        loop {
            match events.recv().await {
                Ok(ev) => {
                    let Some(md) = ev.resource.as_ref().and_then(|r| r.metadata.as_ref()) else {
                        continue;
                    };
                    if md.namespace != ns || md.r#type != ty {
                        continue;
                    }
                    if id.as_ref().is_some_and(|id| *id != md.id) {
                        continue;
                    }
                    if tx
                        .send(Ok(cosi::WatchResponse { event: vec![ev] }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// A stream fed by a task through a channel (the task ends when the stream is dropped).
fn async_stream_events<F, Fut>(
    f: F,
) -> impl Stream<Item = Result<cosi::WatchResponse, Status>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<cosi::WatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
