//! `ichor-talemu`: a Talos node emulator for tests and the lab. It speaks the
//! Talos gRPC API (MachineService Version / Hostname / ApplyConfiguration /
//! Reboot / Read / Upgrade / EtcdMemberList / EtcdForfeitLeadership /
//! Bootstrap / Kubeconfig / EtcdStatus / EtcdSnapshot (a real snapshot of
//! the lab's etcd) / EtcdLeaveCluster / EtcdRemoveMemberByID / Reset, and
//! what an operator reads with talosctl:
//! ServiceList, EtcdAlarmList / EtcdAlarmDisarm, Dmesg, Logs,
//! Memory, Processes, Mounts, Containers, Stats; TimeService; ImageService
//! Pull, LifecycleService Upgrade and the COSI State service's Get / List /
//! Watch) over mutual TLS, so that both Ichor's client and the real
//! `talosctl` can talk to it. What it does not emulate answers
//! `Unimplemented` with `not emulated by the lab: <service>/<method>`
//! (docs/lab.md lists both).
//!
//! A node can start in maintenance mode (no config): it then serves the
//! insecure API (no client certificate, the caller is `os:reader`, node
//! routing off) with Version, MachineStatus, Disks and ApplyConfiguration;
//! with [`EmulatorOptions::serve_config_ca`] a configured node serves the
//! Talos API CA of its config, as a real node does.
//!
//! The control planes share one etcd membership, as etcd keeps it: a
//! control plane configured while the cluster runs joins as a learner and
//! is promoted; leaving, removal by id and a graceful Reset take members
//! out under etcd's rules; [`Emulator::membership_log`] lists every change.
//! [`Emulator::add_node`] starts one more node while the others run.
//!
//! **Never use it from production code**: it exists to tell the truth about
//! the client in tests, nothing more.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ichor_talemu::EmuError> {
//! use ichor_talemu::{Emulator, NodeSpec};
//! let config = std::fs::read("base-controlplane.yaml")?;
//! let emu = Emulator::start(vec![NodeSpec::new("cp-1", config)]).await?;
//! let client = emu.admin_client(0)?; // an ichor_talos_client::TalosClient
//! let version = client.version("").await.unwrap();
//! assert_eq!(version.tag, "v1.13.9");
//! # Ok(()) }
//! ```

mod api;
pub mod derive;
pub mod diff;
mod discovery;
mod error;
mod host;
mod journal;
pub mod manifests;
mod membership;
mod node;
pub mod pki;
pub mod resources;
mod server;
pub mod talosconfig;
mod wire;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};

pub use api::{EtcdAlarm, EtcdRestore, RestoreHook, RestoreHookError};
pub use error::EmuError;
pub use membership::{MembershipChange, MembershipChangeKind};
pub use node::{Disk, Fault, NodeSpec, ReadGate, WriteAction, WriteRecord};
pub use pki::{CertifiedKey, ClientCertSpec, Pki};

use api::{Cluster, NodeApi};
use discovery::Discovery;
use node::Node;

/// Options of an emulator.
pub struct EmulatorOptions {
    /// The CA to sign server certificates with; a fresh Ed25519 CA when `None`.
    pub pki: Option<Pki>,
    /// How long a rebooting node stays unreachable.
    pub reboot_outage: Duration,
    /// A node leaving maintenance mode serves mutual TLS with the Talos API
    /// CA of the config it was given (`machine.ca`), as a real node does,
    /// instead of the emulator's CA. On for `ichor init` and the lab.
    pub serve_config_ca: bool,
    /// The client URL (`http://127.0.0.1:PORT`) of the real etcd the
    /// control planes stand for: EtcdSnapshot streams its snapshot. `None`
    /// (no etcd): EtcdSnapshot answers Unavailable. The lab, whose etcd
    /// starts after the nodes, gives it with [`Emulator::serve_etcd_at`].
    pub etcd_url: Option<String>,
    /// Where the nodes keep their files (an uploaded etcd snapshot, the
    /// data folders restored from it), one folder per hostname; `None`: a
    /// fresh folder under the system's temporary folder, removed with the
    /// emulator.
    pub state_dir: Option<std::path::PathBuf>,
    /// The pause between `Bootstrap{recover_etcd}`'s answer and the restore
    /// (Talos restores in etcd's pre-state, after the answer).
    pub recover_delay: Duration,
    /// How often a joining control plane's etcd tries to add itself as a
    /// learner (Talos: every 3 s), and how often the membership log looks
    /// for a change in the healthy voters.
    pub etcd_join_interval: Duration,
    /// How long a learner takes to catch up with the leader before it is
    /// promoted to a voter.
    pub etcd_catch_up: Duration,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        Self {
            pki: None,
            reboot_outage: Duration::from_millis(300),
            serve_config_ca: false,
            etcd_url: None,
            state_dir: None,
            recover_delay: Duration::from_millis(200),
            etcd_join_interval: Duration::from_millis(100),
            etcd_catch_up: Duration::from_millis(300),
        }
    }
}

/// A running emulated node, as tests see it.
#[derive(Debug, Clone)]
pub struct NodeHandle {
    pub hostname: String,
    /// The node's IP (what `node` metadata names it by).
    pub address: std::net::IpAddr,
    /// Where it listens.
    pub listen: SocketAddr,
}

impl NodeHandle {
    /// The endpoint to dial, `ip:port`.
    pub fn endpoint(&self) -> String {
        self.listen.to_string()
    }
}

/// A node that left maintenance mode: a config was applied to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredNode {
    /// Its index among the emulator's nodes.
    pub index: usize,
    /// The hostname it reports now (its kubelet registers under it).
    pub hostname: String,
    pub address: std::net::IpAddr,
    pub control_plane: bool,
    /// The Talos version it runs.
    pub talos_version: String,
}

/// A handle on every node's active machine config that outlives a borrow
/// of the [`Emulator`]: the lab's kubelets read it to play each Node's
/// readiness from the config it runs.
#[derive(Clone)]
pub struct ActiveConfigs {
    cluster: Arc<Cluster>,
}

impl std::fmt::Debug for ActiveConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveConfigs").finish_non_exhaustive()
    }
}

impl ActiveConfigs {
    /// Each node's hostname as it was started (the name its kubelet
    /// registers under in the lab) and its active config (`None` in
    /// maintenance mode), in node order.
    pub fn by_hostname(&self) -> Vec<(String, Option<Vec<u8>>)> {
        self.cluster
            .nodes
            .all()
            .iter()
            .map(|n| (n.spec.hostname.clone(), n.lock().active.clone()))
            .collect()
    }
}

/// One emulator process holding N nodes, each on its own listener.
pub struct Emulator {
    pki: Pki,
    cluster: Arc<Cluster>,
    handles: Vec<NodeHandle>,
    writes: Arc<Mutex<Vec<WriteRecord>>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// What a node added later is started with.
    reboot_outage: Duration,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("nodes", &self.handles)
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// Starts the nodes with a fresh CA. Must run inside a tokio runtime.
    pub async fn start(nodes: Vec<NodeSpec>) -> Result<Self, EmuError> {
        Self::start_with(nodes, EmulatorOptions::default()).await
    }

    /// Starts the nodes with the given options.
    pub async fn start_with(
        nodes: Vec<NodeSpec>,
        options: EmulatorOptions,
    ) -> Result<Self, EmuError> {
        let pki = match options.pki {
            Some(p) => p,
            None => Pki::generate()?,
        };
        let writes = Arc::new(Mutex::new(Vec::new()));
        let discovery = Arc::new(Discovery::default());
        let membership = Arc::new(membership::Membership::default());
        let mut built = Vec::new();
        let mut listeners = Vec::new();
        for (index, spec) in nodes.into_iter().enumerate() {
            let listener = server::bind(SocketAddr::new(spec.address, spec.port)).await?;
            listeners.push(listener);
            built.push(Node::new(
                spec,
                Arc::clone(&writes),
                options.reboot_outage,
                Arc::clone(&discovery),
                Arc::clone(&membership),
                index,
            )?);
        }
        let (bootstraps, _) = tokio::sync::broadcast::channel(16);
        let (configured, _) = tokio::sync::broadcast::channel(256);
        let recovery = api::etcd_recover::Recovery::new(options.state_dir, options.recover_delay);
        let cluster = Arc::new(Cluster {
            nodes: api::NodeList::new(built),
            membership,
            etcd_catch_up: options.etcd_catch_up,
            serve_config_ca: options.serve_config_ca,
            bootstraps,
            configured,
            discovery,
            etcd: Mutex::new(Default::default()),
            lab_etcd: Mutex::new(options.etcd_url),
            recovery,
        });
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let mut emulator = Self {
            pki,
            cluster,
            handles: Vec::new(),
            writes,
            shutdown,
            tasks: Vec::new(),
            reboot_outage: options.reboot_outage,
        };
        for (i, listener) in listeners.into_iter().enumerate() {
            emulator.serve_node(i, listener)?;
        }
        emulator.api(0).log_started_members();
        emulator
            .tasks
            .push(tokio::spawn(api::membership::run_etcd_service(
                Arc::clone(&emulator.cluster),
                options.etcd_join_interval,
                shutdown_rx,
            )));
        Ok(emulator)
    }

    /// Serves node `i` on `listener`.
    fn serve_node(&mut self, i: usize, listener: tokio::net::TcpListener) -> Result<(), EmuError> {
        let node = self.cluster.nodes.get(i);
        let ips = vec![node.spec.address];
        let server_cert = self.pki.server_cert(&node.spec.hostname, &ips)?;
        let maint_cert = Pki::self_signed_server_cert(&node.spec.hostname, &ips)?;
        let mtls = Arc::new(server::mtls_config(self.pki.ca_pem(), &server_cert)?);
        let maint = Arc::new(server::maintenance_config(&maint_cert)?);
        self.handles.push(NodeHandle {
            hostname: node.spec.hostname.clone(),
            address: node.spec.address,
            listen: listener.local_addr()?,
        });
        self.tasks.push(tokio::spawn(server::serve(
            listener,
            self.api(i),
            mtls,
            maint,
            self.shutdown.subscribe(),
        )));
        Ok(())
    }

    /// Starts one more node (in maintenance mode when `spec` has no
    /// config), as a machine newly racked would boot: it shares the
    /// others' discovery and etcd membership. Returns its handle; its
    /// index is the number of nodes before it.
    pub async fn add_node(&mut self, spec: NodeSpec) -> Result<NodeHandle, EmuError> {
        let listener = server::bind(SocketAddr::new(spec.address, spec.port)).await?;
        let index = self.cluster.nodes.len();
        let node = Node::new(
            spec,
            Arc::clone(&self.writes),
            self.reboot_outage,
            Arc::clone(&self.cluster.discovery),
            Arc::clone(&self.cluster.membership),
            index,
        )?;
        self.cluster.nodes.push(node);
        self.serve_node(index, listener)?;
        Ok(self.handles[index].clone())
    }

    /// The running nodes, in the order given.
    pub fn nodes(&self) -> &[NodeHandle] {
        &self.handles
    }

    /// Node `i`'s endpoint (`ip:port`).
    pub fn endpoint(&self, i: usize) -> String {
        self.handles[i].endpoint()
    }

    /// The CA that signed the nodes' certificates (PEM).
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// The emulator's CA, to issue more certificates.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// A client certificate signed by the emulator's CA.
    pub fn issue_client_cert(&self, spec: &ClientCertSpec) -> Result<CertifiedKey, EmuError> {
        self.pki.client_cert(spec)
    }

    /// Client TLS material for a certificate like `spec`.
    pub fn client_identity(&self, spec: &ClientCertSpec) -> Result<ClientIdentity, EmuError> {
        let cert = self.pki.client_cert(spec)?;
        Ok(ClientIdentity::from_pem(
            self.pki.ca_pem(),
            cert.cert_pem,
            cert.key_pem,
        ))
    }

    /// An `os:admin` client for node `i`'s endpoint.
    pub fn admin_client(&self, i: usize) -> Result<TalosClient, EmuError> {
        self.client(i, &ClientCertSpec::admin(), ClientOptions::default())
    }

    /// A client for node `i`'s endpoint with a certificate like `spec`.
    pub fn client(
        &self,
        i: usize,
        spec: &ClientCertSpec,
        options: ClientOptions,
    ) -> Result<TalosClient, EmuError> {
        let identity = self.client_identity(spec)?;
        TalosClient::new(&self.endpoint(i), &identity, options).map_err(|e| match e {
            ichor_talos_client::Error::Tls(t) => EmuError::TlsMaterial(t),
            other => EmuError::Client {
                node: self.handles[i].hostname.clone(),
                source: other,
            },
        })
    }

    /// A talosconfig (YAML) with one context named `context`: the
    /// control-plane nodes' endpoints (every node's when none is one), every
    /// node's address as `nodes`, and a fresh client certificate like `spec`.
    pub fn talosconfig(&self, context: &str, spec: &ClientCertSpec) -> Result<String, EmuError> {
        let cert = self.pki.client_cert(spec)?;
        let mut endpoints: Vec<String> = self
            .handles
            .iter()
            .zip(self.cluster.nodes.all())
            .filter(|(_, n)| n.is_control_plane())
            .map(|(h, _)| h.endpoint())
            .collect();
        if endpoints.is_empty() {
            endpoints = self.handles.iter().map(NodeHandle::endpoint).collect();
        }
        let nodes: Vec<String> = self.handles.iter().map(|h| h.address.to_string()).collect();
        talosconfig::render(context, &endpoints, &nodes, self.pki.ca_pem(), &cert)
    }

    /// Every write the nodes took, in order, with times.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Node `i`'s active machine config (`None` in maintenance mode).
    pub fn active_config(&self, i: usize) -> Option<Vec<u8>> {
        self.cluster.nodes.get(i).lock().active.clone()
    }

    /// A handle on every node's active config ([`ActiveConfigs`]).
    pub fn active_configs(&self) -> ActiveConfigs {
        ActiveConfigs {
            cluster: Arc::clone(&self.cluster),
        }
    }

    /// Node `i`'s persisted machine config.
    pub fn persistent_config(&self, i: usize) -> Option<Vec<u8>> {
        self.cluster.nodes.get(i).lock().persistent.clone()
    }

    /// Node `i`'s boot id (changes on every reboot).
    pub fn boot_id(&self, i: usize) -> String {
        self.cluster.nodes.get(i).lock().boot_id.clone()
    }

    /// Replaces node `i`'s config out of band (active and persistent), as an
    /// operator's own `talosctl apply-config` would: for drift tests. Not an
    /// API write, so not in [`Emulator::writes`].
    pub fn set_config(&self, i: usize, config: impl Into<Vec<u8>>) {
        let node = &self.cluster.nodes.get(i);
        let config = config.into();
        let mut st = node.lock();
        st.active = Some(config.clone());
        st.persistent = Some(config);
        if st.stage == 3 {
            st.stage = 4;
        }
        node.refresh(&mut st);
    }

    /// Whether node `i` holds etcd data (it bootstrapped etcd, joined a
    /// bootstrapped cluster, or started configured as a control plane).
    pub fn bootstrapped(&self, i: usize) -> bool {
        self.cluster.nodes.get(i).lock().etcd_data
    }

    /// The index of every node that bootstraps etcd from now on.
    pub fn bootstraps(&self) -> tokio::sync::broadcast::Receiver<usize> {
        self.cluster.bootstraps.subscribe()
    }

    /// Every node that leaves maintenance mode from now on (a config was
    /// applied to it): when its kubelet would register.
    pub fn configured(&self) -> tokio::sync::broadcast::Receiver<ConfiguredNode> {
        self.cluster.configured.subscribe()
    }

    /// Every change of the etcd membership the control planes share, in
    /// order, each with the members, voters and healthy voters after it.
    pub fn membership_log(&self) -> Vec<MembershipChange> {
        self.cluster.membership.changes()
    }

    /// Node `i`'s Talos machine type now (`None` in maintenance mode):
    /// whether it is a control plane.
    pub fn is_control_plane(&self, i: usize) -> bool {
        self.cluster.nodes.get(i).is_control_plane()
    }

    /// Node `i`'s identity (`talosctl get members`' `nodeId`): a wipe of
    /// its STATE makes a new one.
    pub fn identity(&self, i: usize) -> String {
        self.cluster.nodes.get(i).lock().identity.clone()
    }

    /// Whether node `i` is in maintenance mode (no config).
    pub fn in_maintenance(&self, i: usize) -> bool {
        self.cluster.nodes.get(i).in_maintenance()
    }

    /// Injects a fault into node `i`.
    pub fn set_fault(&self, i: usize, fault: Fault) {
        self.cluster.nodes.get(i).lock().fault = fault;
    }

    /// Fault: node `i`'s next boot after an upgrade falls back to the old
    /// boot slot, so it comes back on its old version (`false` clears it).
    pub fn set_upgrade_fallback(&self, i: usize, on: bool) {
        self.cluster.nodes.get(i).lock().upgrade_fallback = on;
    }

    /// Fault: node `i`'s etcd member has not started (`false` clears it).
    /// Its record says so: the etcd service fails, then waits.
    pub fn set_etcd_unhealthy(&self, i: usize, on: bool) {
        self.cluster.nodes.get(i).set_etcd_unhealthy(on);
    }

    /// Where the cluster's Kubernetes API answers when it is not at the
    /// endpoint the nodes' configs name — the lab's one API server stands in
    /// for the control planes' on an address of its own: the kubeconfig the
    /// control planes hand out (`talosctl kubeconfig`, and the Kubernetes
    /// checks of `talosctl health`) names `url` instead.
    pub fn serve_kubernetes_at(&self, url: impl Into<String>) {
        self.cluster.discovery.set_kubernetes_api(url.into());
    }

    /// The client URL of the real etcd the control planes stand for, from
    /// now on (see [`EmulatorOptions::etcd_url`]).
    pub fn serve_etcd_at(&self, url: impl Into<String>) {
        *self
            .cluster
            .lab_etcd
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(url.into());
    }

    /// Fault: etcd raises `alarm` on node `i`'s member (as etcd does when
    /// its database is full); `talosctl etcd alarm disarm` clears it.
    pub fn raise_etcd_alarm(&self, i: usize, alarm: EtcdAlarm) {
        self.api(i).raise_etcd_alarm(i, alarm);
    }

    fn api(&self, i: usize) -> NodeApi {
        NodeApi {
            cluster: Arc::clone(&self.cluster),
            me: i,
        }
    }

    /// Node `i`'s reboots stay down after their outage until the returned
    /// gate is opened: a test decides when the node comes back.
    pub fn hold_reboots(&self, i: usize) -> ReadGate {
        let gate = ReadGate::new();
        self.cluster.nodes.get(i).lock().reboot_gate = Some(gate.clone());
        gate
    }

    /// etcd's data is gone (the lab stopped its etcd and deleted its data):
    /// every configured control plane's etcd waits for a bootstrap, as
    /// Talos's do after their EPHEMERAL partition was wiped — the service
    /// `etcd` is `Preparing` ("Running pre state"), EtcdStatus and
    /// EtcdSnapshot fail, the member list is empty, and Bootstrap (plain or
    /// `recover_etcd`) is taken again.
    pub fn lose_etcd(&self) {
        self.cluster.discovery.forget_bootstrap();
        {
            let mut etcd = self.cluster.etcd.lock().unwrap_or_else(|e| e.into_inner());
            etcd.leader = None;
            etcd.alarms.clear();
        }
        self.cluster.membership.clear();
        self.cluster
            .membership
            .log(MembershipChangeKind::Lost, None, |_| false);
        for n in self.cluster.nodes.all() {
            let control_plane = n.is_control_plane();
            let mut st = n.lock();
            let had_data = st.etcd_data;
            st.etcd_data = false;
            if had_data && control_plane {
                st.journal.service(
                    "etcd",
                    journal::ServiceState::Finished,
                    "Service finished successfully",
                );
                st.journal.service(
                    "etcd",
                    journal::ServiceState::Preparing,
                    "Running pre state",
                );
            }
            n.refresh(&mut st);
        }
    }

    /// How a `Bootstrap{recover_etcd}` restores the lab's etcd from then on
    /// (without it, the restore fails and etcd keeps waiting).
    pub fn restore_etcd_with(&self, restore: EtcdRestore) {
        self.cluster.recovery.set_restore(restore);
    }

    /// How many Bootstrap calls (plain or `recover_etcd`, taken or refused)
    /// node `i` received.
    pub fn bootstrap_calls(&self, i: usize) -> u32 {
        self.cluster.recovery.bootstrap_calls(i)
    }

    /// Holds node `i`'s next restore after `Bootstrap{recover_etcd}`'s
    /// answer until the returned gate is opened (a test reboots the node
    /// in that window).
    pub fn hold_etcd_restore(&self, i: usize) -> ReadGate {
        self.cluster.recovery.hold(i)
    }

    /// Where node `i` keeps an uploaded etcd snapshot (Talos's
    /// `/var/lib/etcd.snapshot`).
    pub fn etcd_snapshot_path(&self, i: usize) -> std::path::PathBuf {
        self.cluster
            .recovery
            .snapshot_path(&self.cluster.nodes.get(i).spec.hostname)
    }

    /// The Talos version node `i` runs now (changes when it boots an upgrade).
    pub fn talos_version(&self, i: usize) -> String {
        self.cluster.nodes.get(i).talos_version()
    }

    /// Pauses node `i`'s COSI reads (the machine config among them) until
    /// the returned gate is opened.
    pub fn pause_reads(&self, i: usize) -> ReadGate {
        let gate = ReadGate::new();
        self.cluster.nodes.get(i).lock().read_gate = Some(gate.clone());
        gate
    }

    /// Stops every node.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}
