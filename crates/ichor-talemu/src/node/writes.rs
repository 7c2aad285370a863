//! The writes a node takes, as tests read them back
//! ([`crate::Emulator::writes`]).

use std::time::SystemTime;

use super::Node;

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
    /// The node's etcd member left the cluster (EtcdLeaveCluster).
    EtcdLeaveCluster,
    /// A member was removed by id through this node (EtcdRemoveMemberByID).
    EtcdRemoveMemberById { member_id: u64 },
    /// A Reset was taken (answered at once; it runs after the answer).
    Reset {
        graceful: bool,
        reboot: bool,
        /// The system volumes wiped, by label; empty: the whole system disk.
        wipe: Vec<String>,
    },
}

/// One write a node took, with the time it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    pub at: SystemTime,
    /// The hostname of the node written to.
    pub node: String,
    pub action: WriteAction,
}

impl Node {
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
}
