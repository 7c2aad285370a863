//! What an emulated node holds while it runs, and what a test injects into
//! it: faults and gates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::journal::Journal;

use super::store::{Key, Stored};

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

pub(crate) struct NodeState {
    pub active: Option<Vec<u8>>,
    pub persistent: Option<Vec<u8>>,
    pub boot_id: String,
    /// Talos's machine stage: 3 maintenance, 4 running, 5 rebooting, 7 resetting.
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
    /// The node's etcd left the cluster (or its member was removed): the
    /// service stays stopped until the node boots again.
    pub etcd_left: bool,
    /// Whether the active config is a control plane's, as of the last
    /// [`super::Node::refresh`] (the etcd service's loop reads it without
    /// parsing the config again).
    pub runs_control_plane: bool,
    /// The node's identity (Talos keeps it in STATE: a wipe of STATE makes
    /// a new one).
    pub identity: String,
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
