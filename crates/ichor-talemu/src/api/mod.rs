//! The gRPC services of an emulated node, one room per Talos API: apid's
//! routing on the `node`/`nodes` metadata and the role checks of Talos's
//! authorizer live here; each service (and each group of MachineService
//! methods) in its own file:
//!
//! - [`machine`]: MachineService's index, and the node's configuration,
//!   version, reboot, upgrade, bootstrap and kubeconfig;
//! - [`services`]: the services Talos runs (`talosctl services`);
//! - [`etcd`]: etcd's members, status, alarms, leadership and snapshot;
//! - [`etcd_recover`]: a snapshot's upload and the bootstrap that recovers from it;
//! - [`membership`]: joining, leaving and removing members, and the loop
//!   that joins, promotes and watches health; [`reset`]: Reset;
//! - [`logs`]: the kernel log and the services' logs;
//! - [`system`]: memory, processes, mounts;
//! - [`containers`]: containers and their stats;
//! - [`time`]: TimeService; [`image`]: ImageService; [`lifecycle`]:
//!   LifecycleService; [`cosi`]: the COSI State service (`talosctl get`);
//! - [`router`]: which of the above answers a path, and the answer of
//!   everything the lab does not emulate.

mod containers;
mod cosi;
pub(crate) mod etcd;
pub(crate) mod etcd_recover;
mod image;
mod lifecycle;
mod logs;
mod machine;
pub(crate) mod membership;
mod reset;
pub(crate) mod router;
mod services;
mod system;
mod time;

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};

use ichor_talos_client::proto::common;
use ichor_talos_client::proto::google::rpc;

use crate::discovery::Discovery;
use crate::node::{Fault, Node};
use crate::resources;
use crate::wire;

pub use etcd::EtcdAlarm;
pub use etcd_recover::{EtcdRestore, RestoreHook, RestoreHookError};

const ADMIN: &str = "os:admin";
const OPERATOR: &str = "os:operator";
const READER: &str = "os:reader";

/// The nodes of one emulator process, in the order they were started (a
/// node added later comes last).
#[derive(Default)]
pub(crate) struct NodeList {
    nodes: std::sync::RwLock<Vec<Arc<Node>>>,
}

impl NodeList {
    pub fn new(nodes: Vec<Arc<Node>>) -> Self {
        NodeList {
            nodes: std::sync::RwLock::new(nodes),
        }
    }

    /// Node `i` (panics past the last: indexes come from the emulator).
    pub fn get(&self, i: usize) -> Arc<Node> {
        Arc::clone(&self.nodes.read().unwrap_or_else(|e| e.into_inner())[i])
    }

    /// Node `i`, if there is one.
    pub fn try_get(&self, i: usize) -> Option<Arc<Node>> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(i)
            .cloned()
    }

    /// Every node, in order.
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn push(&self, node: Arc<Node>) {
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(node);
    }
}

/// The nodes of one emulator process.
pub(crate) struct Cluster {
    pub nodes: NodeList,
    /// The etcd membership the control planes share.
    pub membership: Arc<crate::membership::Membership>,
    /// How long a joining learner takes to catch up before it is promoted.
    pub etcd_catch_up: std::time::Duration,
    /// A node leaving maintenance mode serves the Talos API CA of its new
    /// config (as Talos does) instead of the emulator's.
    pub serve_config_ca: bool,
    /// The index of every node that bootstraps etcd, as it happens.
    pub bootstraps: tokio::sync::broadcast::Sender<usize>,
    /// Every node that leaves maintenance mode, as it happens.
    pub configured: tokio::sync::broadcast::Sender<crate::ConfiguredNode>,
    /// What the nodes know of each other (members, etcd bootstrapped).
    pub discovery: Arc<Discovery>,
    /// The etcd cluster's own state: its leader and alarms.
    pub etcd: Mutex<etcd::EtcdCluster>,
    /// The client URL of the real etcd the control planes stand for (the
    /// lab's), whose snapshot EtcdSnapshot streams; `None`: no etcd.
    pub lab_etcd: Mutex<Option<String>>,
    /// Uploaded snapshots, requests to recover, and how to restore.
    pub recovery: etcd_recover::Recovery,
}

impl Cluster {
    /// The lab's etcd's client URL, if there is one.
    pub fn lab_etcd(&self) -> Option<String> {
        self.lab_etcd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether etcd was bootstrapped anywhere (every control plane joins it then).
    pub fn bootstrapped(&self) -> bool {
        self.nodes.all().iter().any(|n| n.lock().etcd_data)
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
pub(crate) fn caller<T>(request: &Request<T>) -> Caller {
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
    fn node(&self, i: usize) -> Arc<Node> {
        self.cluster.nodes.get(i)
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
        if matches(&self.node(self.me)) {
            return Ok(self.me);
        }
        let found = self.cluster.nodes.all().iter().position(|n| matches(n));
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
                Ok(vec![f(&self.node(i))?])
            }
            Route::Many(targets) => {
                let mut out = Vec::new();
                for target in targets {
                    let result = match self.resolve(&target) {
                        Ok(i) => match self.guard(i).await {
                            Ok(()) => f(&self.node(i)),
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

    /// The nodes a streaming call goes to, with the name apid gives each
    /// one's messages (`None`: one node, no metadata). Talos proxies a stream
    /// to many nodes as one stream of all their messages.
    async fn stream_targets(
        &self,
        md: &MetadataMap,
    ) -> Result<Vec<(usize, Option<String>)>, Status> {
        match self.route(md, false)? {
            Route::One(i) => {
                self.guard(i).await?;
                Ok(vec![(i, None)])
            }
            Route::Many(targets) if targets.len() == 1 => {
                let i = self.resolve(&targets[0])?;
                self.guard(i).await?;
                Ok(vec![(i, None)])
            }
            Route::Many(targets) => {
                let mut out = Vec::new();
                for target in targets {
                    let i = self.resolve(&target)?;
                    self.guard(i).await?;
                    out.push((i, Some(target)));
                }
                Ok(out)
            }
        }
    }

    /// The index of `node` among the emulator's nodes.
    fn index_of(&self, node: &Arc<Node>) -> usize {
        node.index
    }
}

/// A method a node in maintenance mode does not serve, as Talos's
/// maintenance API answers it.
fn not_in_maintenance(method: &str) -> Status {
    Status::unimplemented(format!("method {method} not implemented"))
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
    ichor_talos_client::proto::machine::Version,
    ichor_talos_client::proto::machine::Hostname,
    ichor_talos_client::proto::machine::ApplyConfiguration,
    ichor_talos_client::proto::machine::Reboot,
    ichor_talos_client::proto::machine::Upgrade,
    ichor_talos_client::proto::machine::EtcdMembers,
    ichor_talos_client::proto::machine::EtcdForfeitLeadership,
    ichor_talos_client::proto::machine::Bootstrap,
    ichor_talos_client::proto::machine::EtcdStatus,
    ichor_talos_client::proto::machine::EtcdLeaveCluster,
    ichor_talos_client::proto::machine::EtcdRemoveMemberById,
    ichor_talos_client::proto::machine::Reset,
    wire::machine::ServiceList,
    wire::machine::EtcdAlarm,
    wire::machine::EtcdAlarmDisarm,
    wire::machine::LogsContainer,
    wire::machine::Memory,
    wire::machine::Process,
    wire::machine::Mounts,
    wire::machine::Container,
    wire::machine::Stats,
    wire::time::Time
);

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;
