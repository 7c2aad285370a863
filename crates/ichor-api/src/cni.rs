//! The one CNI detector: which CNI runs in a cluster, judged from its
//! DaemonSets and whether Ichor's Cilium release exists. Adopt (its
//! classification and the `status.cni.detected` it writes) and the
//! controller (`status.cni.detected` on every reconcile) both ask it, so
//! they name the same CNI for the same cluster.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use serde::Serialize;

use crate::DetectedCni;

/// The CNI a DaemonSet belongs to.
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

    /// The value of `status.cni.detected` when this CNI runs alone.
    pub fn detected(&self) -> DetectedCni {
        match self {
            CniKind::Cilium => DetectedCni::Cilium,
            CniKind::Flannel => DetectedCni::Flannel,
            CniKind::Calico => DetectedCni::Calico,
            CniKind::Other(_) => DetectedCni::Other,
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
    /// Recognises a DaemonSet as a CNI's, from its namespace, name and the
    /// images of its pod template's containers; `None` for anything else.
    pub fn of_daemonset(ds: &DaemonSet) -> Option<CniWorkload> {
        let images: Vec<String> = ds
            .spec
            .template
            .spec
            .as_ref()
            .map(|p| {
                p.containers
                    .iter()
                    .filter_map(|c| c.image.clone())
                    .collect()
            })
            .unwrap_or_default();
        CniWorkload::recognise(
            ds.metadata.namespace.as_deref().unwrap_or_default(),
            ds.metadata.name.as_deref().unwrap_or_default(),
            &images,
        )
    }

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

/// The CNIs that run: the kinds of the recognised DaemonSets, and Cilium
/// when Ichor's Cilium release exists (R2.2: Cilium is found from the
/// moment Ichor's release is there, before its DaemonSet is).
pub fn cnis_found(workloads: &[CniWorkload], ichor_cilium_release: bool) -> BTreeSet<CniKind> {
    let mut kinds: BTreeSet<CniKind> = workloads.iter().map(|w| w.kind.clone()).collect();
    if ichor_cilium_release {
        kinds.insert(CniKind::Cilium);
    }
    kinds
}

/// `status.cni.detected`: none, the one CNI that runs, or mixed.
pub fn detect(workloads: &[CniWorkload], ichor_cilium_release: bool) -> DetectedCni {
    let found = cnis_found(workloads, ichor_cilium_release);
    match (found.len(), found.first()) {
        (1, Some(kind)) => kind.detected(),
        (0, _) => DetectedCni::None,
        _ => DetectedCni::Mixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(namespace: &str, name: &str, image: &str) -> CniWorkload {
        CniWorkload::recognise(namespace, name, &[image.to_string()])
            .unwrap_or_else(|| panic!("{namespace}/{name} is a CNI's DaemonSet"))
    }

    fn cilium() -> CniWorkload {
        ds("kube-system", "cilium", "quay.io/cilium/cilium:v1.18.5")
    }

    fn flannel() -> CniWorkload {
        ds(
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.26",
        )
    }

    fn calico() -> CniWorkload {
        ds(
            "calico-system",
            "calico-node",
            "docker.io/calico/node:v3.29",
        )
    }

    #[test]
    fn row_no_cni() {
        assert_eq!(detect(&[], false), DetectedCni::None);
    }

    #[test]
    fn row_cilium_without_ichors_record() {
        assert_eq!(detect(&[cilium()], false), DetectedCni::Cilium);
        // Its envoy DaemonSet is the same CNI.
        let envoy = ds(
            "kube-system",
            "cilium-envoy",
            "quay.io/cilium/cilium-envoy:v1",
        );
        assert_eq!(detect(&[cilium(), envoy], false), DetectedCni::Cilium);
    }

    /// Covers: R2.2
    #[test]
    fn row_cilium_with_ichors_record_counts_before_its_daemonset() {
        assert_eq!(detect(&[], true), DetectedCni::Cilium);
        assert_eq!(detect(&[cilium()], true), DetectedCni::Cilium);
    }

    #[test]
    fn row_flannel() {
        assert_eq!(detect(&[flannel()], false), DetectedCni::Flannel);
    }

    #[test]
    fn row_calico_in_either_namespace() {
        assert_eq!(detect(&[calico()], false), DetectedCni::Calico);
        let in_kube_system = ds("kube-system", "calico-node", "docker.io/calico/node:v3.29");
        assert_eq!(detect(&[in_kube_system], false), DetectedCni::Calico);
    }

    #[test]
    fn row_weave_is_another_cni() {
        let weave = ds("kube-system", "weave-net", "weaveworks/weave-kube:2.8");
        assert_eq!(weave.kind, CniKind::Other("weave-net".into()));
        assert_eq!(detect(&[weave], false), DetectedCni::Other);
    }

    #[test]
    fn row_other_by_name_or_by_image() {
        let by_image = ds("net", "agent", "docker.io/cloudnativelabs/kube-router:v2");
        assert_eq!(by_image.kind, CniKind::Other("kube-router".into()));
        assert_eq!(detect(&[by_image], false), DetectedCni::Other);
        let by_name = ds("kube-system", "antrea-agent", "example.org/agent:v1");
        assert_eq!(detect(&[by_name], false), DetectedCni::Other);
    }

    #[test]
    fn row_mixed() {
        assert_eq!(detect(&[cilium(), flannel()], false), DetectedCni::Mixed);
        // Ichor's release beside another CNI is mixed too.
        assert_eq!(detect(&[calico()], true), DetectedCni::Mixed);
    }

    #[test]
    fn daemonsets_are_recognised_by_name_or_image() {
        let kind = |ns: &str, name: &str, image: &str| {
            CniWorkload::recognise(ns, name, &[image.to_string()]).map(|w| w.kind)
        };
        assert_eq!(
            kind("cni", "agent", "quay.io/cilium/cilium:v1.17.0@sha256:00"),
            Some(CniKind::Cilium)
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
}
