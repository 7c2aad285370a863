//! One emulated node: its identity, its machine config (active and
//! persistent), its resources with their versions, and the writes it takes.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use ichor_talos::version::Version;
use tokio::sync::broadcast;
use tonic::Status;

use ichor_talos_client::proto::cosi::resource as cosi;
use ichor_talos_client::proto::machine;

use crate::derive;
use crate::discovery::{Affiliate, Discovery};
use crate::host;
use crate::journal::Journal;
use crate::resources::{self, Item, NodeView};

/// How an emulated node starts.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The node's hostname (CN and DNS SAN of its certificate; the hostname
    /// it reports unless its config sets one).
    pub hostname: String,
    /// The node's IP: the name `node` metadata uses to reach it and an IP SAN
    /// of its certificate. Any 127.0.0.0/8 address works on Linux.
    pub address: IpAddr,
    /// Port to listen on (0: any free port).
    pub port: u16,
    /// The Talos version it reports, e.g. `v1.13.9`. Also selects the
    /// ApplyConfiguration rules (v1.14+ never asks for a reboot).
    pub talos_version: String,
    /// The machine config; `None` starts the node in maintenance mode.
    pub config: Option<Vec<u8>>,
    /// Its block devices (`talosctl get disks`); one 10 GB virtio disk unless set.
    pub disks: Vec<Disk>,
}

/// A block device of an emulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// `/dev/sda`, `/dev/nvme0n1`, …
    pub dev_path: String,
    /// Bytes.
    pub size: u64,
    pub model: String,
    pub serial: String,
    /// `virtio`, `sata`, `nvme`, …
    pub transport: String,
    pub rotational: bool,
}

impl Disk {
    /// A non-rotational virtio disk.
    pub fn new(dev_path: impl Into<String>, size: u64) -> Self {
        Self {
            dev_path: dev_path.into(),
            size,
            model: "QEMU HARDDISK".to_string(),
            serial: String::new(),
            transport: "virtio".to_string(),
            rotational: false,
        }
    }
}

impl NodeSpec {
    /// A configured node on 127.0.0.1 (any port) running Talos v1.13.9.
    pub fn new(hostname: impl Into<String>, config: impl Into<Vec<u8>>) -> Self {
        Self {
            hostname: hostname.into(),
            address: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            talos_version: "v1.13.9".to_string(),
            config: Some(config.into()),
            disks: vec![Disk::new("/dev/vda", 10_737_418_240)],
        }
    }

    /// A node in maintenance mode (no config; insecure API).
    pub fn maintenance(hostname: impl Into<String>) -> Self {
        Self {
            config: None,
            ..Self::new(hostname, Vec::new())
        }
    }

    /// Another Talos version.
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.talos_version = version.into();
        self
    }

    /// Another address (for several routable nodes: 127.0.0.2, 127.0.0.3, …).
    pub fn with_address(mut self, address: IpAddr) -> Self {
        self.address = address;
        self
    }

    /// Other block devices.
    pub fn with_disks(mut self, disks: Vec<Disk>) -> Self {
        self.disks = disks;
        self
    }

    /// A fixed port.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }
}

/// A fault injected into a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fault {
    /// Normal operation.
    #[default]
    None,
    /// The node is unreachable: connections are dropped, forwarded calls fail `Unavailable`.
    Down,
    /// Every answer is delayed by this long.
    Slow(Duration),
    /// Every call fails with this status code and message.
    Refuse(tonic::Code, String),
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteAction {
    /// An ApplyConfiguration that changed the node (dry runs are not writes).
    ApplyConfiguration {
        /// The mode used (after AUTO was resolved).
        mode: String,
        /// The config bytes sent.
        config: Vec<u8>,
    },
    /// A try-mode config was reverted after its timeout.
    TryRollback,
    /// A reboot (from Reboot, an apply in REBOOT mode or a legacy Upgrade).
    Reboot { actor_id: String },
    /// An image pulled into one of the node's containerd stores (ImageService.Pull).
    ImagePull { image: String },
    /// etcd bootstrapped as a new cluster on this control plane (Bootstrap).
    Bootstrap,
    /// An installer written to the other boot slot: through
    /// `LifecycleService.Upgrade` (`legacy: false`, no reboot) or the
    /// deprecated `MachineService.Upgrade` (`legacy: true`, reboots by itself).
    Upgrade { image: String, legacy: bool },
    /// The node's etcd member handed its leadership on (EtcdForfeitLeadership).
    EtcdForfeitLeadership,
}

/// One write a node took, with the time it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub at: SystemTime,
    /// The hostname of the node written to.
    pub node: String,
    pub action: WriteAction,
}

#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub item: Item,
    pub version: u64,
    pub created: SystemTime,
    pub updated: SystemTime,
}

impl Stored {
    pub fn to_proto(&self) -> cosi::Resource {
        cosi::Resource {
            metadata: Some(cosi::Metadata {
                namespace: self.item.namespace.clone(),
                r#type: self.item.r#type.clone(),
                id: self.item.id.clone(),
                version: self.version.to_string(),
                owner: String::new(),
                phase: "running".to_string(),
                created: Some(prost_types::Timestamp::from(self.created)),
                updated: Some(prost_types::Timestamp::from(self.updated)),
                finalizers: Vec::new(),
                labels: Default::default(),
                annotations: self.item.annotations.iter().cloned().collect(),
            }),
            spec: Some(cosi::Spec {
                proto_spec: self.item.proto_spec.clone(),
                yaml_spec: self.item.yaml_spec.clone(),
            }),
        }
    }

    /// A tombstone (metadata only) for DESTROYED events.
    pub fn tombstone(&self) -> cosi::Resource {
        let mut r = self.to_proto();
        r.spec = None;
        r
    }
}

type Key = (String, String, String);

pub(crate) struct NodeState {
    pub active: Option<Vec<u8>>,
    pub persistent: Option<Vec<u8>>,
    pub boot_id: String,
    /// 3 maintenance, 4 running, 5 rebooting.
    pub stage: i32,
    pub down_until: Option<Instant>,
    pub rebooting_after_apply: bool,
    pub rollback: Option<tokio::task::JoinHandle<()>>,
    pub store: BTreeMap<Key, Stored>,
    pub fault: Fault,
    /// A pause on COSI reads, set by a test through [`crate::Emulator::pause_reads`].
    pub read_gate: Option<ReadGate>,
    /// Images pulled, by containerd store (driver, namespace) and reference.
    pub pulled: std::collections::BTreeSet<(i32, i32, String)>,
    /// The version an upgrade wrote to the other boot slot; the next boot runs it.
    pub installed: Option<String>,
    /// Fault: the next boot after an upgrade falls back to the old slot.
    pub upgrade_fallback: bool,
    /// Fault: the node's etcd member has not started (empty name in the member list).
    pub etcd_unhealthy: bool,
    /// A pause between a reboot's outage and the node coming back, set by a
    /// test through [`crate::Emulator::hold_reboots`].
    pub reboot_gate: Option<ReadGate>,
    /// etcd's data directory is not empty: the node bootstrapped etcd or
    /// joined a bootstrapped cluster (a control plane started with a config has).
    pub etcd_data: bool,
    /// The TLS configuration a node serves once it left maintenance mode
    /// with a config naming its own Talos API CA (`None`: the emulator's CA).
    pub mtls: Option<Arc<rustls::ServerConfig>>,
    /// What happened to the node since it booted (dmesg, logs, services).
    pub journal: Journal,
    /// The [`Discovery::generation`] the node's resources were computed at.
    pub discovery_seen: u64,
}

/// A pause in a node's COSI reads (get, list, watch; the machine config is
/// read through them) or in a reboot's return: it waits until the test opens
/// the gate. Lets a test change the world while a client is between two
/// calls, without timing.
#[derive(Debug, Clone)]
pub struct ReadGate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    waiting: tokio::sync::watch::Sender<usize>,
    open: tokio::sync::watch::Sender<bool>,
}

impl ReadGate {
    pub(crate) fn new() -> Self {
        ReadGate {
            inner: Arc::new(GateInner {
                waiting: tokio::sync::watch::Sender::new(0),
                open: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    /// Completes once a read is waiting at the gate.
    pub async fn reached(&self) {
        let mut rx = self.inner.waiting.subscribe();
        let _ = rx.wait_for(|n| *n > 0).await;
    }

    /// Lets every waiting and later read through.
    pub fn open(&self) {
        self.inner.open.send_replace(true);
    }

    /// Waits here until the gate is open.
    pub(crate) async fn pass(&self) {
        let mut rx = self.inner.open.subscribe();
        self.inner.waiting.send_modify(|n| *n += 1);
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// An emulated node.
pub(crate) struct Node {
    pub spec: NodeSpec,
    /// The Talos version it runs (changes when it boots an upgraded slot).
    /// Its own lock, so rules can read it under the state's.
    running: Mutex<Running>,
    pub state: Mutex<NodeState>,
    pub events: broadcast::Sender<cosi::Event>,
    pub writes: Arc<Mutex<Vec<WriteRecord>>>,
    pub reboot_outage: Duration,
    /// What the emulator's nodes know of each other.
    pub discovery: Arc<Discovery>,
    /// The node's place among the emulator's nodes.
    pub index: usize,
}

/// The Talos a node runs: its tag as given (`v1.13.9`, reported as is) and
/// that tag read.
struct Running {
    tag: String,
    version: Version,
}

/// Where Linux keeps the boot id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The Talos version an installer image installs: its tag (`…/installer:v1.14.0`,
/// a digest after the tag allowed). The emulator has no registry to ask, so an
/// image without a version tag is refused.
pub(crate) fn installer_version(image: &str) -> Result<String, Status> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let tag = last.rsplit_once(':').map(|(_, t)| t);
    match tag {
        Some(t) if Version::parse(t).is_ok() => Ok(t.to_string()),
        _ => Err(Status::invalid_argument(format!(
            "installer image {image:?} has no version tag (vMAJOR.MINOR.PATCH) the emulator can install"
        ))),
    }
}

pub(crate) fn new_uuid() -> String {
    let b: [u8; 16] = rand::random();
    let mut b = b;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Go's `time.Duration.String()` for whole milliseconds (`1m0s`, `30s`, `1.5s`).
pub(crate) fn go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".to_string();
    }
    let h = total_ms / 3_600_000;
    let m = (total_ms / 60_000) % 60;
    let ms = total_ms % 60_000;
    let secs = if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let s = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", s.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

impl Node {
    pub fn new(
        spec: NodeSpec,
        writes: Arc<Mutex<Vec<WriteRecord>>>,
        reboot_outage: Duration,
        discovery: Arc<Discovery>,
        index: usize,
    ) -> Result<Arc<Self>, crate::EmuError> {
        let version =
            Version::parse(&spec.talos_version).map_err(|source| crate::EmuError::Version {
                node: spec.hostname.clone(),
                source,
            })?;
        let multidoc_kubernetes = version.major_minor() >= (1, 14);
        if let Some(cfg) = &spec.config {
            derive::facts(cfg, multidoc_kubernetes).map_err(|source| crate::EmuError::Config {
                node: spec.hostname.clone(),
                source,
            })?;
        }
        let (events, _) = broadcast::channel(1024);
        let node = Arc::new(Self {
            running: Mutex::new(Running {
                tag: spec.talos_version.clone(),
                version,
            }),
            state: Mutex::new(NodeState {
                active: spec.config.clone(),
                persistent: spec.config.clone(),
                boot_id: new_uuid(),
                stage: if spec.config.is_some() { 4 } else { 3 },
                down_until: None,
                rebooting_after_apply: false,
                rollback: None,
                store: BTreeMap::new(),
                fault: Fault::None,
                read_gate: None,
                pulled: Default::default(),
                installed: None,
                upgrade_fallback: false,
                etcd_unhealthy: false,
                reboot_gate: None,
                etcd_data: false,
                mtls: None,
                journal: Journal::boot(),
                discovery_seen: 0,
            }),
            spec,
            events,
            writes,
            reboot_outage,
            discovery,
            index,
        });
        {
            let mut st = node.lock();
            st.etcd_data = st
                .active
                .as_deref()
                .and_then(|c| derive::facts(c, multidoc_kubernetes).ok())
                .is_some_and(|f| f.machine_type.is_control_plane());
            if st.etcd_data {
                node.discovery.mark_bootstrapped();
            }
            node.record_boot(&mut st);
            node.refresh(&mut st);
        }
        Ok(node)
    }

    /// The facts of the node's active config (`None` in maintenance mode).
    pub fn facts_of(&self, st: &NodeState) -> Option<derive::ConfigFacts> {
        st.active
            .as_deref()
            .and_then(|c| derive::facts(c, self.multidoc_kubernetes()).ok())
    }

    /// The id of the node's etcd member (stable: from its hostname).
    pub fn member_id(&self) -> u64 {
        crate::discovery::member_id(&self.spec.hostname)
    }

    /// Whether the node's etcd member runs: a configured control plane of a
    /// bootstrapped cluster whose member is not held down by a fault.
    pub fn etcd_runs(&self, st: &NodeState) -> bool {
        self.discovery.bootstrapped()
            && !st.etcd_unhealthy
            && self
                .facts_of(st)
                .is_some_and(|f| f.machine_type.is_control_plane())
    }

    /// Whether the node runs the control plane's static pods: a configured
    /// control plane of a bootstrapped cluster.
    pub fn static_pods_run(&self, st: &NodeState) -> bool {
        self.discovery.bootstrapped()
            && self
                .facts_of(st)
                .is_some_and(|f| f.machine_type.is_control_plane())
    }

    /// A fresh record for a boot that happens now.
    fn record_boot(&self, st: &mut NodeState) {
        let facts = self.facts_of(st);
        let etcd_runs = self.etcd_runs(st);
        let mut journal = Journal::boot();
        let version = self.talos_version();
        host::record_boot(
            &mut journal,
            &host::Boot {
                talos_version: &version,
                boot_id: &st.boot_id,
                configured: st.active.as_deref().zip(facts.as_ref()),
                etcd_runs,
                member_id: self.member_id(),
            },
        );
        st.journal = journal;
    }

    /// Recomputes the node's resources when what it knows of the other
    /// nodes changed since they were computed.
    pub fn sync(&self, st: &mut NodeState) {
        if st.discovery_seen != self.discovery.generation() {
            self.refresh(st);
        }
    }

    /// Fault: the node's etcd member stops (or starts again); its record says so.
    pub fn set_etcd_unhealthy(&self, on: bool) {
        let mut st = self.lock();
        if st.etcd_unhealthy == on {
            return;
        }
        let was_running = self.etcd_runs(&st);
        st.etcd_unhealthy = on;
        let runs = self.etcd_runs(&st);
        if was_running != runs
            && let Some(config) = st.active.clone()
        {
            host::record_etcd_fault(&mut st.journal, &config, self.member_id(), !runs);
        }
        self.refresh(&mut st);
    }

    pub fn lock(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (major, minor) of the Talos version the node runs now.
    pub fn version(&self) -> (u64, u64) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .version
            .major_minor()
    }

    /// The Talos version tag the node runs now, e.g. `v1.13.9`.
    pub fn talos_version(&self) -> String {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tag
            .clone()
    }

    pub fn multidoc_kubernetes(&self) -> bool {
        self.version() >= (1, 14)
    }

    /// Whether the node runs a control-plane config (only those forward calls).
    pub fn is_control_plane(&self) -> bool {
        let st = self.lock();
        st.active
            .as_deref()
            .and_then(|c| derive::facts(c, self.multidoc_kubernetes()).ok())
            .is_some_and(|f| f.machine_type.is_control_plane())
    }

    pub fn in_maintenance(&self) -> bool {
        self.lock().active.is_none()
    }

    /// Whether the node is down (fault or reboot outage).
    pub fn is_down(&self) -> bool {
        let st = self.lock();
        st.fault == Fault::Down || st.down_until.is_some_and(|t| Instant::now() < t)
    }

    pub(crate) fn record(&self, action: WriteAction) {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WriteRecord {
                at: SystemTime::now(),
                node: self.spec.hostname.clone(),
                action,
            });
    }

    /// Recomputes the node's resources, bumps versions of changed ones and
    /// sends watch events.
    pub fn refresh(&self, st: &mut NodeState) {
        let facts = self.facts_of(st);
        let talos_version = self.talos_version();
        let hostname = facts
            .as_ref()
            .and_then(|f| f.hostname.clone())
            .unwrap_or_else(|| self.spec.hostname.clone());
        let affiliate = facts.as_ref().map(|f| Affiliate {
            hostname: hostname.clone(),
            address: self.spec.address,
            machine_type: f.machine_type,
            operating_system: format!("Talos ({talos_version})"),
            cluster_id: f.cluster_id.clone(),
        });
        self.discovery.publish(self.index, affiliate);
        st.discovery_seen = self.discovery.generation();
        let members = facts
            .as_ref()
            .map(|f| self.discovery.members(&f.cluster_id))
            .unwrap_or_default();
        let view = NodeView {
            hostname: &self.spec.hostname,
            address: self.spec.address,
            talos_version: &talos_version,
            v1_13_or_later: self.version() >= (1, 13),
            active_config: st.active.as_deref(),
            persistent_config: st.persistent.as_deref(),
            facts: facts.as_ref(),
            stage: st.stage,
            disks: &self.spec.disks,
            members: &members,
            journal: &st.journal,
            static_pods_run: self.static_pods_run(st),
        };
        let items = resources::node_items(&view);
        let now = SystemTime::now();
        let mut seen = std::collections::BTreeSet::new();
        for item in items {
            let key = (item.namespace.clone(), item.r#type.clone(), item.id.clone());
            seen.insert(key.clone());
            match st.store.get_mut(&key) {
                Some(stored) if stored.item == item => {}
                Some(stored) => {
                    let old = stored.to_proto();
                    stored.item = item;
                    stored.version += 1;
                    stored.updated = now;
                    let _ = self.events.send(cosi::Event {
                        resource: Some(stored.to_proto()),
                        event_type: cosi::EventType::Updated as i32,
                        old: Some(old),
                        error: None,
                        bookmark: None,
                    });
                }
                None => {
                    let stored = Stored {
                        item,
                        version: 1,
                        created: now,
                        updated: now,
                    };
                    let _ = self.events.send(cosi::Event {
                        resource: Some(stored.to_proto()),
                        event_type: cosi::EventType::Created as i32,
                        old: None,
                        error: None,
                        bookmark: None,
                    });
                    st.store.insert(key, stored);
                }
            }
        }
        let gone: Vec<Key> = st
            .store
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(stored) = st.store.remove(&key) {
                let _ = self.events.send(cosi::Event {
                    resource: Some(stored.tombstone()),
                    event_type: cosi::EventType::Destroyed as i32,
                    old: None,
                    error: None,
                    bookmark: None,
                });
            }
        }
    }

    /// `MachineService/Version` of this node.
    pub fn version_message(&self) -> machine::Version {
        let configured = !self.in_maintenance();
        machine::Version {
            metadata: None,
            version: Some(machine::VersionInfo {
                tag: self.talos_version(),
                sha: "ichor-talemu".to_string(),
                built: String::new(),
                go_version: "emulated".to_string(),
                os: "linux".to_string(),
                arch: "amd64".to_string(),
            }),
            platform: Some(machine::PlatformInfo {
                name: "metal".to_string(),
                mode: "metal".to_string(),
            }),
            features: configured.then_some(machine::FeaturesInfo { rbac: true }),
        }
    }

    /// The hostname the node reports.
    pub fn hostname(&self) -> String {
        let st = self.lock();
        st.active
            .as_deref()
            .and_then(|c| derive::facts(c, self.multidoc_kubernetes()).ok())
            .and_then(|f| f.hostname)
            .unwrap_or_else(|| self.spec.hostname.clone())
    }

    /// `MachineService/Kubeconfig`: the admin kubeconfig generated from the
    /// node's config (cluster name, endpoint, Kubernetes CA), as the
    /// `.tar.gz` holding one file `kubeconfig` (mode 0600) that Talos streams.
    pub fn kubeconfig_archive(&self) -> Result<Vec<u8>, Status> {
        let active =
            self.lock().active.clone().ok_or_else(|| {
                Status::failed_precondition("the machine config is not loaded yet")
            })?;
        let facts = derive::facts(&active, self.multidoc_kubernetes())
            .map_err(|e| Status::internal(e.to_string()))?;
        let ca = derive::kubernetes_ca(&active)
            .filter(|_| facts.machine_type.is_control_plane())
            .ok_or_else(|| {
                Status::failed_precondition("kubernetes API server CA config is not available")
            })?;
        let endpoint = self
            .discovery
            .kubernetes_api()
            .or_else(|| facts.control_plane_endpoint.clone())
            .unwrap_or_default();
        let kubeconfig =
            crate::pki::admin_kubeconfig(&facts.cluster_name, &endpoint, &ca.cert_pem, &ca.key_pem)
                .map_err(|e| {
                    Status::internal(format!(
                        "generating the kubeconfig: {}",
                        ichor_api::error_text::chain(&e)
                    ))
                })?;
        kubeconfig_tar_gz(kubeconfig.as_bytes())
            .map_err(|e| Status::internal(format!("packing the kubeconfig: {e}")))
    }

    /// ApplyConfiguration with the rules of the emulated Talos version.
    pub fn apply(
        self: &Arc<Self>,
        req: machine::ApplyConfigurationRequest,
        is_admin: bool,
    ) -> Result<machine::ApplyConfiguration, Status> {
        use machine::apply_configuration_request::Mode;
        let mut st = self.lock();
        if st.rebooting_after_apply {
            return Err(Status::failed_precondition(
                "configuration was already applied and node is rebooting, cannot apply more configuration changes until next reboot",
            ));
        }
        let in_maintenance = st.active.is_none();
        if !in_maintenance && !is_admin {
            return Err(Status::permission_denied("not authorized"));
        }
        validate_applied_documents(&req.data, in_maintenance)?;
        let v14 = self.multidoc_kubernetes();
        let requested = requested_apply_mode(req.mode, in_maintenance, v14)?;
        let current = st.active.clone().unwrap_or_default();
        let immediate = || {
            if in_maintenance || v14 {
                Ok(())
            } else {
                derive::can_apply_immediate(&current, &req.data)
            }
        };
        let (mode, mut details, mode_err) = settle_apply_mode(requested, immediate)?;

        if req.dry_run {
            return Ok(dry_run_summary(&current, &req.data, mode, &details));
        }

        if mode != Mode::Try
            && let Some(h) = st.rollback.take()
        {
            h.abort();
        }
        let try_timeout = req
            .try_mode_timeout
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or(Duration::from_secs(60));
        let before = self.facts_of(&st);
        self.store_applied_config(&mut st, mode, req.data.clone(), try_timeout, &mut details);
        self.record_apply(&mut st, mode, req.data.len(), before.as_ref(), &details);
        self.refresh(&mut st);
        drop(st);
        self.record(WriteAction::ApplyConfiguration {
            mode: apply_mode_name(mode).to_string(),
            config: req.data,
        });
        if mode == Mode::Reboot {
            self.start_reboot(new_uuid());
        }
        Ok(machine::ApplyConfiguration {
            metadata: None,
            warnings: Vec::new(),
            mode: mode as i32,
            mode_details: details + &mode_err,
        })
    }

    /// What an apply leaves in the node's record: machined's line, the
    /// services starting on a node leaving maintenance mode, the kubelet
    /// restarting when its image changed now.
    fn record_apply(
        &self,
        st: &mut NodeState,
        mode: machine::apply_configuration_request::Mode,
        bytes: usize,
        before: Option<&derive::ConfigFacts>,
        details: &str,
    ) {
        let summary = details.lines().next().unwrap_or_default();
        st.journal.talos(format!(
            "apply config request: mode {}, {bytes} bytes: {summary}",
            apply_mode_name(mode)
        ));
        let Some(after) = self.facts_of(st) else {
            return;
        };
        let etcd_runs = self.etcd_runs(st);
        let member_id = self.member_id();
        let Some(active) = st.active.clone() else {
            return;
        };
        match before {
            None => {
                host::record_services_start(&mut st.journal, &active, &after, etcd_runs, member_id)
            }
            Some(b) if b.kubelet_image != after.kubelet_image => {
                host::record_kubelet_restart(&mut st.journal, &after);
            }
            Some(_) => {}
        }
    }

    /// Stores an applied config where `mode` puts it (active, persistent or
    /// both) and moves a node out of maintenance mode.
    fn store_applied_config(
        self: &Arc<Self>,
        st: &mut NodeState,
        mode: machine::apply_configuration_request::Mode,
        data: Vec<u8>,
        timeout: Duration,
        details: &mut String,
    ) {
        use machine::apply_configuration_request::Mode;
        match mode {
            Mode::Try => {
                details.push_str(&format!(
                    "\nThe config is applied in 'try' mode and will be automatically reverted back in {}",
                    go_duration(timeout)
                ));
                self.schedule_try_rollback(st, timeout);
                st.active = Some(data);
            }
            Mode::NoReboot => {
                st.persistent = Some(data.clone());
                st.active = Some(data);
            }
            Mode::Staged => {
                st.persistent = Some(data);
            }
            Mode::Reboot => {
                st.persistent = Some(data);
                st.rebooting_after_apply = true;
            }
            Mode::Auto => unreachable!("AUTO is resolved above"),
        }
        if st.active.is_none() {
            // A node in maintenance mode becomes configured.
            st.active = st.persistent.clone();
        }
        if st.stage == 3 && st.active.is_some() {
            st.stage = 4;
        }
    }

    /// Replaces any pending rollback with one that restores the persistent
    /// config once the 'try' `timeout` has passed.
    fn schedule_try_rollback(self: &Arc<Self>, st: &mut NodeState, timeout: Duration) {
        if let Some(h) = st.rollback.take() {
            h.abort();
        }
        let node = Arc::clone(self);
        st.rollback = Some(tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let mut st = node.lock();
            st.active = st.persistent.clone();
            st.rollback = None;
            st.journal.talos(format!(
                "the configuration applied in try mode was rolled back after {}",
                go_duration(timeout)
            ));
            node.refresh(&mut st);
            drop(st);
            node.record(WriteAction::TryRollback);
        }));
    }

    /// `ImageService.Pull`: the image lands in the given containerd store.
    pub fn pull_image(&self, driver: i32, namespace: i32, image: &str) -> Result<String, Status> {
        if image.trim().is_empty() {
            return Err(Status::invalid_argument("image reference is required"));
        }
        {
            let mut st = self.lock();
            st.pulled.insert((driver, namespace, image.to_string()));
            st.journal.talos(format!("image pulled: {image}"));
        }
        self.record(WriteAction::ImagePull {
            image: image.to_string(),
        });
        Ok(image.to_string())
    }

    /// `LifecycleService.Upgrade`: writes the installer's version to the other
    /// boot slot, nothing else (no etcd check, no drain, no reboot). The
    /// installer must already be in that containerd store.
    pub fn lifecycle_upgrade(
        &self,
        driver: i32,
        namespace: i32,
        image: &str,
    ) -> Result<Vec<String>, Status> {
        if self.version() < (1, 13) {
            return Err(Status::unimplemented(
                "unknown service machine.LifecycleService",
            ));
        }
        if image.trim().is_empty() {
            return Err(Status::invalid_argument("installer image is required"));
        }
        let target = installer_version(image)?;
        let mut st = self.lock();
        if st.active.is_none() {
            return Err(Status::failed_precondition("Talos is not installed"));
        }
        if !st.pulled.contains(&(driver, namespace, image.to_string())) {
            return Err(Status::failed_precondition(format!(
                "installer image {image:?} not found in containerd store"
            )));
        }
        st.installed = Some(target.clone());
        st.journal.talos(format!(
            "upgrade: installed Talos {target} from {image} to the inactive boot slot; it boots at the next reboot"
        ));
        drop(st);
        self.record(WriteAction::Upgrade {
            image: image.to_string(),
            legacy: false,
        });
        Ok(vec![
            format!("running installer {image}"),
            format!("installed Talos {target} to the inactive boot slot"),
        ])
    }

    /// The deprecated `MachineService.Upgrade`: Talos pulls the installer,
    /// checks etcd on a control plane (unless `force` or `preserve`), writes
    /// the other slot and reboots. `etcd_check` is the cluster's refusal, if any.
    pub fn legacy_upgrade(
        self: &Arc<Self>,
        req: &machine::UpgradeRequest,
        etcd_check: Option<String>,
    ) -> Result<machine::Upgrade, Status> {
        if req.image.trim().is_empty() {
            return Err(Status::invalid_argument("installer image is required"));
        }
        let target = installer_version(&req.image)?;
        if !req.force
            && !req.preserve
            && let Some(reason) = etcd_check
        {
            return Err(Status::failed_precondition(reason));
        }
        {
            let mut st = self.lock();
            st.journal.talos(format!(
                "upgrade request received: installing Talos {target} from {} to the inactive boot slot, then rebooting",
                req.image
            ));
            st.installed = Some(target);
        }
        self.record(WriteAction::Upgrade {
            image: req.image.clone(),
            legacy: true,
        });
        let actor_id = new_uuid();
        self.start_reboot(actor_id.clone());
        Ok(machine::Upgrade {
            metadata: None,
            ack: "Upgrade request received".to_string(),
            actor_id,
        })
    }

    /// `MachineService.Read` of the one file the emulator serves: the boot id,
    /// which is how talosctl tells that a reboot happened.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>, Status> {
        if path == BOOT_ID_PATH {
            Ok(format!("{}\n", self.lock().boot_id).into_bytes())
        } else {
            Err(Status::not_found(format!(
                "open {path}: no such file or directory"
            )))
        }
    }

    /// Reboot: returns the actor id; the node is down for the outage, then
    /// comes back with a new boot id and its persistent config active.
    pub fn reboot(self: &Arc<Self>) -> machine::Reboot {
        let actor_id = new_uuid();
        self.start_reboot(actor_id.clone());
        machine::Reboot {
            metadata: None,
            actor_id,
        }
    }

    pub(crate) fn start_reboot(self: &Arc<Self>, actor_id: String) {
        self.record(WriteAction::Reboot {
            actor_id: actor_id.clone(),
        });
        let outage = self.reboot_outage;
        {
            let mut st = self.lock();
            st.journal.talos(format!("rebooting (actor id {actor_id})"));
            st.stage = 5;
            st.down_until = Some(Instant::now() + outage);
            self.refresh(&mut st);
        }
        let node = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(outage).await;
            let gate = {
                let mut st = node.lock();
                if st.reboot_gate.is_some() {
                    // Held by the test: still down until the gate opens.
                    st.down_until = Some(Instant::now() + Duration::from_secs(86_400));
                }
                st.reboot_gate.clone()
            };
            if let Some(gate) = gate {
                gate.pass().await;
            }
            let mut st = node.lock();
            if let Some(h) = st.rollback.take() {
                h.abort();
            }
            // The boot loader's default is the slot the upgrade wrote, unless
            // that boot fails and Talos falls back to the old one.
            if let Some(installed) = st.installed.take()
                && !st.upgrade_fallback
                && let Ok(version) = Version::parse(&installed)
            {
                *node.running.lock().unwrap_or_else(|e| e.into_inner()) = Running {
                    tag: installed,
                    version,
                };
            }
            if st.persistent.is_some() {
                st.active = st.persistent.clone();
            }
            st.boot_id = new_uuid();
            st.stage = if st.active.is_some() { 4 } else { 3 };
            st.down_until = None;
            st.rebooting_after_apply = false;
            node.record_boot(&mut st);
            node.refresh(&mut st);
        });
    }
}

/// One file `kubeconfig` (0600) in a gzip'd tar, as Talos streams it.
fn kubeconfig_tar_gz(kubeconfig: &[u8]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(kubeconfig.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    header.set_cksum();
    tar.append_data(&mut header, "kubeconfig", kubeconfig)?;
    tar.into_inner()?.finish()
}

/// The documents of an applied config, checked as Talos checks them: not
/// empty, a v1alpha1 document outside maintenance mode, and every other
/// document with its kind and apiVersion.
fn validate_applied_documents(data: &[u8], in_maintenance: bool) -> Result<(), Status> {
    let docs = derive::documents(data).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if docs.is_empty() {
        return Err(Status::invalid_argument("the configuration is empty"));
    }
    let has_v1alpha1 = docs.iter().any(derive::is_v1alpha1);
    if !in_maintenance && !has_v1alpha1 {
        return Err(Status::invalid_argument(
            "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?",
        ));
    }
    for doc in &docs {
        if !derive::is_v1alpha1(doc)
            && (doc.get("apiVersion").is_none() || doc.get("kind").is_none())
        {
            return Err(Status::invalid_argument(
                "error decoding document: missing kind or apiVersion",
            ));
        }
    }
    Ok(())
}

/// The requested apply mode: REBOOT becomes NO_REBOOT in maintenance mode
/// and is refused from v1.14 on.
fn requested_apply_mode(
    mode: i32,
    in_maintenance: bool,
    v14: bool,
) -> Result<machine::apply_configuration_request::Mode, Status> {
    use machine::apply_configuration_request::Mode;
    let mut requested = Mode::try_from(mode)
        .map_err(|_| Status::invalid_argument(format!("unknown mode {mode}")))?;
    if requested == Mode::Reboot {
        if in_maintenance {
            requested = Mode::NoReboot;
        } else if v14 {
            return Err(Status::unimplemented(
                "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
            ));
        }
    }
    Ok(requested)
}

/// The mode an apply runs in (AUTO resolved by whether the change applies
/// without a reboot), its details, and why a reboot is needed when AUTO
/// chose one.
fn settle_apply_mode(
    requested: machine::apply_configuration_request::Mode,
    immediate: impl Fn() -> Result<(), derive::ImmediateError>,
) -> Result<(machine::apply_configuration_request::Mode, String, String), Status> {
    use machine::apply_configuration_request::Mode;
    let mut mode = requested;
    let mut mode_err = String::new();
    let details = match mode {
        Mode::Try | Mode::NoReboot => {
            immediate().map_err(|e| Status::invalid_argument(e.to_string()))?;
            "Applied configuration without a reboot"
        }
        Mode::Staged => "Staged configuration to be applied after the next reboot",
        Mode::Auto => match immediate() {
            Ok(()) => {
                mode = Mode::NoReboot;
                "Applied configuration without a reboot"
            }
            Err(e) => {
                mode = Mode::Reboot;
                mode_err = format!(": {e}");
                "Applied configuration with a reboot"
            }
        },
        Mode::Reboot => "Applied configuration with a reboot",
    }
    .to_string();
    Ok((mode, details, mode_err))
}

/// The answer to a dry run: what would happen and the config diff.
fn dry_run_summary(
    current: &[u8],
    new: &[u8],
    mode: machine::apply_configuration_request::Mode,
    details: &str,
) -> machine::ApplyConfiguration {
    let old = String::from_utf8_lossy(current).into_owned();
    let new = String::from_utf8_lossy(new).into_owned();
    let mut diff = crate::diff::unified(&old, &new);
    if diff.is_empty() {
        diff = "No changes.".to_string();
    }
    machine::ApplyConfiguration {
        metadata: None,
        warnings: Vec::new(),
        mode: mode as i32,
        mode_details: format!(
            "Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{diff}"
        ),
    }
}

/// The mode's name as the write record spells it.
fn apply_mode_name(mode: machine::apply_configuration_request::Mode) -> &'static str {
    use machine::apply_configuration_request::Mode;
    match mode {
        Mode::Reboot => "reboot",
        Mode::Auto => "auto",
        Mode::NoReboot => "no_reboot",
        Mode::Staged => "staged",
        Mode::Try => "try",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    }

    #[test]
    fn versions_parse() {
        assert_eq!(one_parser("v1.13.9"), Some((1, 13)));
        assert_eq!(one_parser("v1.14.0-rc.1"), Some((1, 14)));
        assert_eq!(one_parser("latest"), None);
    }

    /// The version parser the emulator had before it read versions with
    /// the one parser: kept as the oracle of the property tests below.
    fn emulator_parse_version(v: &str) -> Option<(u64, u64)> {
        let v = v.strip_prefix('v').unwrap_or(v);
        let mut parts = v.split(['.', '-']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    }

    /// The one version parser, `ichor_talos::version::Version`, read as the
    /// node's (major, minor).
    fn one_parser(v: &str) -> Option<(u64, u64)> {
        ichor_talos::version::Version::parse(v)
            .ok()
            .map(|v| v.major_minor())
    }

    /// A version as Talos writes its tags: with or without `v`, a major and
    /// minor up to 20 digits (past u64: both parsers refuse it), a patch
    /// that fits u64 (the emulator's parser never read it), a pre-release
    /// and build metadata.
    fn version_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let number = |digits: &str| {
            prop_oneof![
                Just("0".to_string()),
                proptest::string::string_regex(&format!("[1-9][0-9]{{0,{digits}}}"))
                    .expect("a regex"),
            ]
        };
        (
            prop_oneof![Just(""), Just("v")],
            number("19"),
            number("19"),
            number("18"),
            prop::option::of(prop_oneof![
                "(alpha|beta|rc)\\.(0|[1-9][0-9]{0,2})",
                "[a-z][a-z0-9-]{0,6}",
            ]),
            prop::option::of("[a-z0-9]{1,6}"),
        )
            .prop_map(|(v, major, minor, patch, pre, build)| {
                let mut s = format!("{v}{major}.{minor}.{patch}");
                if let Some(pre) = pre {
                    s = format!("{s}-{pre}");
                }
                if let Some(build) = build {
                    s = format!("{s}+{build}");
                }
                s
            })
    }

    /// Anything near a version: short or long cores, leading zeros, signs,
    /// surrounding spaces, words.
    fn near_version() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            version_text(),
            "[v +]{0,2}[0-9.+]{0,9}(-[0-9a-z.]{0,6})?(\\+[0-9a-z.]{0,4})?",
            "v?[0-9]{1,3}(\\.[0-9]{1,3}){0,4}",
            any::<String>(),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// A Talos version tag reads the same with both parsers.
        #[test]
        fn a_version_tag_reads_the_same_with_the_one_parser(v in version_text()) {
            proptest::prop_assert_eq!(one_parser(&v), emulator_parse_version(&v), "{:?}", v);
        }

        /// Any text the one parser reads, the emulator's read the same; the
        /// texts only the emulator's took are no version tag and are now
        /// refused (`v1.14`,
        /// `v01.2.3`, `1.2.3.4`, `+1.2.3`, `v1.2.x`).
        #[test]
        fn the_one_parser_reads_nothing_otherwise(v in near_version()) {
            if let Some(line) = one_parser(&v) && v.trim() == v {
                proptest::prop_assert_eq!(Some(line), emulator_parse_version(&v), "{:?}", v);
            }
        }
    }

    #[test]
    fn installer_versions_come_from_the_tag() {
        assert_eq!(
            installer_version("ghcr.io/siderolabs/installer:v1.14.0").unwrap(),
            "v1.14.0"
        );
        assert_eq!(
            installer_version("localhost:5000/installer:v1.14.1@sha256:abcd").unwrap(),
            "v1.14.1"
        );
        assert!(installer_version("localhost:5000/installer").is_err());
        assert!(installer_version("ghcr.io/siderolabs/installer:latest").is_err());
    }

    #[test]
    fn uuids_look_like_v4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
