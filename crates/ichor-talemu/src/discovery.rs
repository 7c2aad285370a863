//! What the nodes of one emulator know of each other, as Talos's discovery
//! tells its nodes: each configured node's identity (the cluster's members,
//! `talosctl get members`), and whether etcd was bootstrapped (a control
//! plane's etcd member starts only then).
//!
//! Every node writes its own entry when its state changes; a node's
//! resources that depend on the others (its members) are recomputed when it
//! is read after any entry changed ([`Discovery::generation`]).

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::derive::MachineType;

/// One configured node, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Affiliate {
    /// The node's name (its hostname).
    pub hostname: String,
    pub address: IpAddr,
    pub machine_type: MachineType,
    /// `Talos (v1.13.9)`.
    pub operating_system: String,
    /// The cluster it belongs to (members are the nodes of one cluster).
    pub cluster_id: String,
    /// The node's identity (`nodeId`).
    pub node_id: String,
}

/// The shared knowledge of an emulator's nodes.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    affiliates: Mutex<Vec<Option<Affiliate>>>,
    generation: AtomicU64,
    bootstrapped: AtomicBool,
    /// Where the cluster's Kubernetes API answers, when not at the
    /// endpoint the configs name.
    kubernetes_api: Mutex<Option<String>>,
}

impl Discovery {
    /// Node `index`'s entry (`None`: not configured, not a member). Returns
    /// whether it changed.
    pub fn publish(&self, index: usize, affiliate: Option<Affiliate>) -> bool {
        let mut all = self.affiliates.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() <= index {
            all.resize(index + 1, None);
        }
        if all[index] == affiliate {
            return false;
        }
        all[index] = affiliate;
        self.generation.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// The members of cluster `cluster_id`, in node order.
    pub fn members(&self, cluster_id: &str) -> Vec<Affiliate> {
        self.affiliates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .filter(|a| a.cluster_id == cluster_id)
            .cloned()
            .collect()
    }

    /// Changes each time an entry changes (or etcd is bootstrapped).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// etcd was bootstrapped on some control plane.
    pub fn bootstrapped(&self) -> bool {
        self.bootstrapped.load(Ordering::SeqCst)
    }

    /// Where the cluster's Kubernetes API answers (`None`: at the endpoint
    /// the configs name).
    pub fn kubernetes_api(&self) -> Option<String> {
        self.kubernetes_api
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_kubernetes_api(&self, url: String) {
        *self
            .kubernetes_api
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(url);
    }

    pub fn mark_bootstrapped(&self) {
        if !self.bootstrapped.swap(true, Ordering::SeqCst) {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// etcd's data is gone on every control plane: it waits for a bootstrap again.
    pub fn forget_bootstrap(&self) {
        if self.bootstrapped.swap(false, Ordering::SeqCst) {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A stable etcd member id for a hostname (FNV-1a).
pub(crate) fn member_id(hostname: &str) -> u64 {
    hostname.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A stable node id for a hostname, shaped as Talos's (43 base62 characters).
pub(crate) fn node_id(hostname: &str) -> String {
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut state = hostname.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (0..43)
        .map(|_| {
            // xorshift: a stable stream of digits from the hostname's hash.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            DIGITS[(state % 62) as usize] as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_stable_and_shaped_as_talos_writes_them() {
        assert_eq!(node_id("cp-1"), node_id("cp-1"));
        assert_ne!(node_id("cp-1"), node_id("cp-2"));
        assert_eq!(node_id("cp-1").len(), 43);
    }

    #[test]
    fn members_are_the_nodes_of_one_cluster() {
        let d = Discovery::default();
        let a = |h: &str, c: &str| Affiliate {
            hostname: h.into(),
            address: IpAddr::from([127, 0, 0, 1]),
            machine_type: MachineType::ControlPlane,
            operating_system: "Talos (v1.13.9)".into(),
            cluster_id: c.into(),
            node_id: node_id(h),
        };
        let g = d.generation();
        assert!(d.publish(1, Some(a("b", "x"))));
        assert!(d.publish(0, Some(a("a", "x"))));
        assert!(!d.publish(0, Some(a("a", "x"))));
        d.publish(2, Some(a("c", "y")));
        assert_eq!(d.generation(), g + 3);
        let names: Vec<String> = d.members("x").into_iter().map(|m| m.hostname).collect();
        assert_eq!(names, ["a", "b"]);
    }
}
