//! The built-in gates, always on: every Node Ready, etcd healthy with all
//! its members, no control-plane static pod crash-looping. Each reads what
//! the controller listed and names the first thing wrong. Nodes the
//! operation has taken down on purpose (its machines in flight) are left
//! out by the caller.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::GateFailure;

/// The built-in gates' names, as status and messages give them.
pub const NODES_READY: &str = "nodes-ready";
pub const ETCD_HEALTHY: &str = "etcd-healthy";
pub const STATIC_PODS: &str = "static-pods";

/// The annotation the kubelet sets on a static pod's mirror.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The control-plane components Talos runs as static pods.
const CONTROL_PLANE_PODS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Every Node Ready, except those in `skip` and those no kubelet has
/// reported on yet (no Ready condition).
pub fn nodes_ready(nodes: &[Node], skip: &BTreeSet<String>) -> Option<GateFailure> {
    nodes.iter().find_map(|n| {
        let name = n.metadata.name.clone().unwrap_or_default();
        if skip.contains(&name) {
            return None;
        }
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let value = match ready {
            Some(c) if c.status == "True" => return None,
            Some(c) => format!(
                "Ready={}{}",
                c.status,
                c.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ),
            // Registered, but its kubelet has not reported yet: nothing to
            // judge (a kubelet that stops reporting turns Ready Unknown).
            None => return None,
        };
        Some(GateFailure {
            check: NODES_READY.to_string(),
            object: Some(format!("Node {name}")),
            value: Some(value),
        })
    })
}

/// One etcd member as the Talos API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub id: u64,
    /// Empty while the member has not started.
    pub name: String,
    pub is_learner: bool,
}

/// Whether the etcd gate judges every member's health, or only that none is
/// missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdScope {
    /// Every member started and none a learner, and none missing.
    Full,
    /// Only that the list reads and no member is missing: a batch of control
    /// planes is about to start, and each one's own etcd check (bounded,
    /// failing the operation naming the member) judges the members' health
    /// before that node goes down.
    MembersOnly,
}

/// The etcd member list as read, or why it could not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdRead {
    Members(Vec<EtcdMember>),
    /// The error, with its causes.
    Unreadable(String),
}

/// etcd healthy with all members: the list could be read, as many members
/// as the cluster has control planes, each started and none a learner
/// (the last two left out under [`EtcdScope::MembersOnly`]).
pub fn etcd_healthy(
    read: &EtcdRead,
    control_planes: usize,
    scope: EtcdScope,
) -> Option<GateFailure> {
    let fail = |object: Option<String>, value: String| GateFailure {
        check: ETCD_HEALTHY.to_string(),
        object,
        value: Some(value),
    };
    let members = match read {
        EtcdRead::Members(m) => m,
        EtcdRead::Unreadable(why) => {
            return Some(fail(None, format!("the member list failed: {why}")));
        }
    };
    if members.len() < control_planes {
        return Some(fail(
            None,
            format!(
                "{} members for {control_planes} control planes",
                members.len()
            ),
        ));
    }
    if scope == EtcdScope::MembersOnly {
        return None;
    }
    if let Some(m) = members.iter().find(|m| m.name.is_empty()) {
        return Some(fail(
            Some(format!("etcd member {:x}", m.id)),
            "not started".to_string(),
        ));
    }
    if let Some(m) = members.iter().find(|m| m.is_learner) {
        return Some(fail(
            Some(format!("etcd member {}", m.name)),
            "a learner".to_string(),
        ));
    }
    None
}

/// No control-plane static pod (the kubelet's mirror of kube-apiserver,
/// kube-controller-manager or kube-scheduler) in CrashLoopBackOff, except
/// on the nodes in `skip`.
pub fn static_pods(pods: &[Pod], skip: &BTreeSet<String>) -> Option<GateFailure> {
    pods.iter().find_map(|p| {
        let mirror = p
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        if !mirror
            || !CONTROL_PLANE_PODS.iter().any(|c| name.starts_with(c))
            || node.is_some_and(|n| skip.contains(&n))
        {
            return None;
        }
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())?;
        let looping = statuses.iter().find(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                == Some("CrashLoopBackOff")
        })?;
        Some(GateFailure {
            check: STATIC_PODS.to_string(),
            object: Some(format!(
                "Pod {}/{name}",
                p.metadata.namespace.as_deref().unwrap_or_default()
            )),
            value: Some(format!(
                "container {} in CrashLoopBackOff ({} restarts)",
                looping.name, looping.restart_count
            )),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]}
        }))
        .unwrap()
    }

    /// Covers: R15.6
    #[test]
    fn a_node_not_ready_fails_unless_the_operation_took_it_down() {
        let nodes = [node("a", "True"), node("b", "False")];
        let f = nodes_ready(&nodes, &BTreeSet::new()).unwrap();
        assert_eq!(f.check, NODES_READY);
        assert_eq!(f.object.as_deref(), Some("Node b"));
        assert_eq!(f.value.as_deref(), Some("Ready=False (KubeletNotReady)"));
        assert_eq!(
            nodes_ready(&nodes, &BTreeSet::from(["b".to_string()])),
            None
        );
    }

    /// Covers: R15.6
    #[test]
    fn etcd_needs_every_member_started_and_voting() {
        let m = |id, name: &str, is_learner| EtcdMember {
            id,
            name: name.to_string(),
            is_learner,
        };
        let three = [m(1, "cp1", false), m(2, "cp2", false), m(3, "cp3", false)];
        let full = EtcdScope::Full;
        assert_eq!(
            etcd_healthy(&EtcdRead::Members(three.to_vec()), 3, full),
            None
        );
        let f = etcd_healthy(&EtcdRead::Members(three[..2].to_vec()), 3, full).unwrap();
        assert_eq!(f.value.as_deref(), Some("2 members for 3 control planes"));
        let unstarted = [m(1, "cp1", false), m(10, "", false)];
        let f = etcd_healthy(&EtcdRead::Members(unstarted.to_vec()), 2, full).unwrap();
        assert_eq!(f.object.as_deref(), Some("etcd member a"));
        let f = etcd_healthy(&EtcdRead::Members(vec![m(1, "cp1", true)]), 1, full).unwrap();
        assert_eq!(f.value.as_deref(), Some("a learner"));
        assert!(
            etcd_healthy(&EtcdRead::Unreadable("connection refused".into()), 1, full).is_some()
        );
        // Before a batch of control planes, their own etcd check judges
        // the members' health; the gate still sees one missing.
        let only = EtcdScope::MembersOnly;
        assert_eq!(
            etcd_healthy(&EtcdRead::Members(unstarted.to_vec()), 2, only),
            None
        );
        assert!(etcd_healthy(&EtcdRead::Members(three[..2].to_vec()), 3, only).is_some());
        assert!(
            etcd_healthy(&EtcdRead::Unreadable("connection refused".into()), 1, only).is_some()
        );
    }

    /// Covers: R15.6
    #[test]
    fn a_crash_looping_control_plane_static_pod_fails() {
        let pod = |name: &str, mirror: bool, reason: &str| -> Pod {
            let annotations = if mirror {
                json!({MIRROR_ANNOTATION: "x"})
            } else {
                json!({})
            };
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "kube-system", "annotations": annotations},
                "spec": {"nodeName": "cp1", "containers": []},
                "status": {"containerStatuses": [{
                    "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 7,
                    "state": {"waiting": {"reason": reason}}
                }]}
            }))
            .unwrap()
        };
        let none = BTreeSet::new();
        assert_eq!(
            static_pods(
                &[pod("kube-apiserver-cp1", true, "ContainerCreating")],
                &none
            ),
            None
        );
        assert_eq!(
            static_pods(&[pod("coredns-x", false, "CrashLoopBackOff")], &none),
            None
        );
        let f = static_pods(
            &[pod("kube-scheduler-cp1", true, "CrashLoopBackOff")],
            &none,
        )
        .unwrap();
        assert_eq!(
            f.object.as_deref(),
            Some("Pod kube-system/kube-scheduler-cp1")
        );
        assert_eq!(
            f.value.as_deref(),
            Some("container c in CrashLoopBackOff (7 restarts)")
        );
        let cp1 = BTreeSet::from(["cp1".to_string()]);
        assert_eq!(
            static_pods(&[pod("kube-scheduler-cp1", true, "CrashLoopBackOff")], &cp1),
            None
        );
    }
}
