//! What adopt's inspection read, as plain data (no clients, no I/O).

use ichor_talos::config::ConfigFacts;
use serde::Serialize;

/// One node as read through the Talos API.
#[derive(Debug, Clone)]
pub struct TalosNode {
    /// The address adopt reached the node at.
    pub address: String,
    /// The node's hostname (its Kubernetes node name).
    pub hostname: String,
    /// Talos version tag, for example `v1.13.9`.
    pub talos_version: String,
    /// What the node's machine config says, whatever its shape.
    pub facts: ConfigFacts,
}

/// One Kubernetes Node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeNode {
    pub name: String,
    /// The Ready condition is True.
    pub ready: bool,
    /// The Ready condition's message, as the kubelet wrote it.
    pub ready_message: Option<String>,
    /// `spec.podCIDR`.
    pub pod_cidr: Option<String>,
}

impl KubeNode {
    /// NotReady because the network plugin is not ready: the kubelet's message
    /// carries `cni plugin not initialized` / `NetworkPluginNotReady`.
    pub fn not_ready_for_network_plugin(&self) -> bool {
        !self.ready
            && self.ready_message.as_deref().is_some_and(|m| {
                m.contains("cni plugin not initialized") || m.contains("NetworkPluginNotReady")
            })
    }
}

// What a CNI's DaemonSet is, and the detector, are ichor-api's: the
// controller reads the same DaemonSets the same way (one detector).
pub use ichor_api::cni::{CniKind, CniWorkload};

/// A Helm record of a release named `cilium`, wherever it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumRecord {
    /// Where the record Secret lives.
    pub storage_namespace: String,
    /// The namespace the release's objects are in.
    pub release_namespace: String,
    /// Helm's status of the newest revision (`deployed`, `pending-install`, …).
    pub status: String,
    pub revision: u32,
}

impl CiliumRecord {
    /// Ichor's own record: release `cilium` in `kube-system`, stored in `ichor-system`.
    pub fn is_ichors(&self) -> bool {
        self.storage_namespace == ichor_api::SYSTEM_NAMESPACE
            && self.release_namespace == "kube-system"
    }
}

/// The Kubernetes side of the inspection.
#[derive(Debug, Clone, Default)]
pub struct KubeInspection {
    pub nodes: Vec<KubeNode>,
    /// DaemonSets recognised as a CNI's, in every namespace.
    pub cni_workloads: Vec<CniWorkload>,
    /// The `ciliumnodes.cilium.io` CRD exists.
    pub cilium_node_crd: bool,
    /// The `ciliumnetworkpolicies.cilium.io` CRD exists and is Established.
    pub cilium_policy_crd_established: bool,
    /// Helm records of a release named `cilium`, newest revision of each.
    pub cilium_records: Vec<CiliumRecord>,
    /// The `kube-system/kube-proxy` DaemonSet exists.
    pub kube_proxy_daemonset: bool,
}

impl KubeInspection {
    /// `status.cni.detected` as the one detector judges what was read: the
    /// CNI DaemonSets, and Cilium once Ichor's release is deployed (the
    /// controller asks the same question of the same reads).
    pub fn detected_cni(&self) -> ichor_api::DetectedCni {
        let ichor_release_deployed = self
            .cilium_records
            .iter()
            .any(|r| r.is_ichors() && r.status == "deployed");
        ichor_api::cni::detect(&self.cni_workloads, ichor_release_deployed)
    }
}

/// Everything adopt read before deciding, nodes in the order they were given.
#[derive(Debug, Clone, Default)]
pub struct Inspection {
    pub talos: Vec<TalosNode>,
    pub kube: KubeInspection,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kubelets_network_plugin_message_counts_as_no_cni() {
        let node = |ready, msg: &str| KubeNode {
            name: "n".into(),
            ready,
            ready_message: Some(msg.into()),
            pod_cidr: None,
        };
        assert!(node(false, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized").not_ready_for_network_plugin());
        assert!(
            !node(false, "Kubelet stopped posting node status.").not_ready_for_network_plugin()
        );
        assert!(!node(true, "kubelet is posting ready status").not_ready_for_network_plugin());
    }
}
