//! One emulated node: its identity, its machine config (active and
//! persistent), its resources with their versions, and the writes it takes.
//!
//! `spec` is how a node starts, `state` what it holds while it runs (and the
//! faults and gates a test injects), `store` its COSI resources and their
//! watch events, `writes` the writes it took; `apply`, `lifecycle` (reboots
//! and upgrades) and `kubeconfig` are the API's writes and the kubeconfig.

mod apply;
mod kubeconfig;
mod lifecycle;
mod reset;
mod spec;
mod state;
mod store;
mod writes;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use ichor_talos::version::Version;
use tokio::sync::broadcast;

use ichor_talos_client::proto::cosi::resource as cosi;
use ichor_talos_client::proto::machine;

use crate::derive;
use crate::discovery::{Affiliate, Discovery};
use crate::host;
use crate::journal::Journal;
use crate::membership::{Member, Membership};
use crate::resources::{self, NodeView};

pub(crate) use reset::{Wipe, check_reset};
pub use spec::{Disk, NodeSpec};
pub(crate) use state::NodeState;
pub use state::{Fault, ReadGate};
pub use writes::{WriteAction, WriteRecord};

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
    /// The etcd membership the control planes share.
    pub membership: Arc<Membership>,
    /// The node's place among the emulator's nodes.
    pub index: usize,
}

/// The Talos a node runs: its tag as given (`v1.13.9`, reported as is) and
/// that tag read.
struct Running {
    tag: String,
    version: Version,
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

impl Node {
    pub fn new(
        spec: NodeSpec,
        writes: Arc<Mutex<Vec<WriteRecord>>>,
        reboot_outage: Duration,
        discovery: Arc<Discovery>,
        membership: Arc<Membership>,
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
                etcd_left: false,
                runs_control_plane: false,
                identity: crate::discovery::node_id(&spec.hostname),
            }),
            spec,
            events,
            writes,
            reboot_outage,
            discovery,
            membership,
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
                // A control plane started configured is a member already.
                let _ = node.membership.add(node.new_member(
                    &st,
                    crate::discovery::member_id(&node.spec.hostname),
                    false,
                ));
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

    /// The id of the node's etcd member: the member it runs, else the one
    /// it would start as (stable: from its hostname).
    pub fn member_id(&self) -> u64 {
        self.membership.member_of(self.index).map_or_else(
            || crate::discovery::member_id(&self.spec.hostname),
            |m| m.id,
        )
    }

    /// A member this node runs, named by its hostname now.
    pub fn new_member(&self, st: &NodeState, id: u64, learner: bool) -> Member {
        Member {
            id,
            hostname: self.hostname_in(st),
            node: self.index,
            address: self.spec.address,
            learner,
            added: Instant::now(),
        }
    }

    /// Whether the node's etcd member runs: a configured control plane of a
    /// bootstrapped cluster, a member of it, not held down by a fault.
    pub fn etcd_runs(&self, st: &NodeState) -> bool {
        self.discovery.bootstrapped()
            && !st.etcd_unhealthy
            && self
                .facts_of(st)
                .is_some_and(|f| f.machine_type.is_control_plane())
            && st.etcd_data
            && self.membership.member_of(self.index).is_some()
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

    /// Recomputes the node's resources, bumps versions of changed ones and
    /// sends watch events.
    pub fn refresh(&self, st: &mut NodeState) {
        let facts = self.facts_of(st);
        st.runs_control_plane = facts
            .as_ref()
            .is_some_and(|f| f.machine_type.is_control_plane());
        let talos_version = self.talos_version();
        self.publish(st, facts.as_ref(), &talos_version);
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
        for event in store::update(&mut st.store, items, SystemTime::now()) {
            let _ = self.events.send(event);
        }
    }

    /// Tells the other nodes what this one is now (nothing in maintenance
    /// mode), and notes the discovery generation its resources see.
    fn publish(
        &self,
        st: &mut NodeState,
        facts: Option<&derive::ConfigFacts>,
        talos_version: &str,
    ) {
        let affiliate = facts.map(|f| Affiliate {
            hostname: f
                .hostname
                .clone()
                .unwrap_or_else(|| self.spec.hostname.clone()),
            address: self.spec.address,
            machine_type: f.machine_type,
            operating_system: format!("Talos ({talos_version})"),
            cluster_id: f.cluster_id.clone(),
            node_id: st.identity.clone(),
        });
        self.discovery.publish(self.index, affiliate);
        st.discovery_seen = self.discovery.generation();
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
        self.hostname_in(&self.lock())
    }

    /// The hostname the node reports, its state already locked.
    fn hostname_in(&self, st: &NodeState) -> String {
        st.active
            .as_deref()
            .and_then(|c| derive::facts(c, self.multidoc_kubernetes()).ok())
            .and_then(|f| f.hostname)
            .unwrap_or_else(|| self.spec.hostname.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn uuids_look_like_v4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
