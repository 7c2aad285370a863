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

/// The CNI a workload belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CniKind {
    Cilium,
    Flannel,
    Calico,
    /// A CNI Ichor knows by name but does not manage (weave, kube-router, …).
    Other(String),
}

impl CniKind {
    pub fn name(&self) -> &str {
        match self {
            CniKind::Cilium => "cilium",
            CniKind::Flannel => "flannel",
            CniKind::Calico => "calico",
            CniKind::Other(n) => n,
        }
    }
}

/// A DaemonSet recognised as a CNI's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CniWorkload {
    pub namespace: String,
    pub name: String,
    pub kind: CniKind,
}

impl CniWorkload {
    /// Recognises a DaemonSet as a CNI's from its name and container images;
    /// `None` for anything else (kube-proxy, storage agents, …).
    pub fn recognise(namespace: &str, name: &str, images: &[String]) -> Option<CniWorkload> {
        let has_image = |needle: &str| images.iter().any(|i| image_repo(i).contains(needle));
        let kind = if name == "cilium" || name == "cilium-envoy" || has_image("cilium/cilium") {
            CniKind::Cilium
        } else if name.contains("flannel") || has_image("flannel") {
            CniKind::Flannel
        } else if name == "calico-node" || has_image("calico/node") {
            CniKind::Calico
        } else if let Some(other) = OTHER_CNIS
            .iter()
            .find(|(ds, image)| name == *ds || has_image(image))
        {
            CniKind::Other(other.0.to_string())
        } else {
            return None;
        };
        Some(CniWorkload {
            namespace: namespace.to_string(),
            name: name.to_string(),
            kind,
        })
    }
}

/// CNIs known by their DaemonSet name and an image repository fragment.
const OTHER_CNIS: &[(&str, &str)] = &[
    ("weave-net", "weaveworks/weave-kube"),
    ("kube-router", "kube-router"),
    ("antrea-agent", "antrea/antrea-agent"),
    ("canal", "calico/cni"),
    ("kube-ovn-cni", "kube-ovn"),
    ("multus", "multus-cni"),
];

fn image_repo(image: &str) -> &str {
    image.split('@').next().unwrap_or(image)
}

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

/// Everything adopt read before deciding, nodes in the order they were given.
#[derive(Debug, Clone, Default)]
pub struct Inspection {
    pub talos: Vec<TalosNode>,
    pub kube: KubeInspection,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(ns: &str, name: &str, image: &str) -> Option<CniKind> {
        CniWorkload::recognise(ns, name, &[image.to_string()]).map(|w| w.kind)
    }

    #[test]
    fn daemonsets_are_recognised_by_name_or_image() {
        assert_eq!(
            kind("kube-system", "cilium", "quay.io/cilium/cilium:v1.18.0"),
            Some(CniKind::Cilium)
        );
        assert_eq!(
            kind(
                "kube-system",
                "cilium-envoy",
                "quay.io/cilium/cilium-envoy:v1"
            ),
            Some(CniKind::Cilium)
        );
        assert_eq!(
            kind("cni", "agent", "quay.io/cilium/cilium:v1.17.0@sha256:00"),
            Some(CniKind::Cilium)
        );
        assert_eq!(
            kind(
                "kube-system",
                "kube-flannel",
                "ghcr.io/siderolabs/flannel:v0.26"
            ),
            Some(CniKind::Flannel)
        );
        assert_eq!(
            kind(
                "calico-system",
                "calico-node",
                "docker.io/calico/node:v3.29"
            ),
            Some(CniKind::Calico)
        );
        assert_eq!(
            kind("kube-system", "weave-net", "weaveworks/weave-kube:2.8"),
            Some(CniKind::Other("weave-net".into()))
        );
        assert_eq!(
            kind(
                "kube-system",
                "kube-proxy",
                "registry.k8s.io/kube-proxy:v1.34.1"
            ),
            None
        );
        assert_eq!(
            kind(
                "longhorn",
                "longhorn-manager",
                "longhornio/longhorn-manager:v1"
            ),
            None
        );
    }

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
