//! The CNI classification of R1.1a–b and R2.0 (no CNI, Cilium with Ichor's
//! record, Cilium without one, flannel, Calico, another CNI, more than one,
//! or a CNI Ichor cannot classify) and the path adopt takes from it.

use ichor_talos::config::CniName;
use serde::Serialize;

use crate::inspection::{CniKind, Inspection};

/// What the inspection found, one row of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "found", rename_all = "camelCase")]
pub enum CniClassification {
    /// R1.1a: Talos says `cni.name: none`, no CNI workload in Kubernetes, and
    /// every node NotReady for the network plugin.
    NoCni,
    /// Cilium with Ichor's record in `ichor-system`: already handled; adopt only
    /// checks the release exists.
    CiliumWithIchorRecord {
        record_status: String,
    },
    /// Cilium installed by someone else: adopt takes it over (or leaves it
    /// alone with `--cni-unmanaged`).
    CiliumTakeover,
    Flannel,
    Calico,
    /// A CNI Ichor knows by name but does not manage.
    Other {
        name: String,
    },
    /// More than one CNI runs: refused.
    Mixed {
        cnis: Vec<String>,
    },
    /// The evidence does not add up (partly "no CNI"): refused unless
    /// `--cni-unmanaged`.
    Unclassifiable {
        reason: String,
    },
}

impl CniClassification {
    /// How the plan names what was found.
    pub fn describe(&self) -> String {
        match self {
            CniClassification::NoCni => "no CNI".into(),
            CniClassification::CiliumWithIchorRecord { record_status } => {
                format!("Cilium with Ichor's Helm record in ichor-system ({record_status})")
            }
            CniClassification::CiliumTakeover => "Cilium without an Ichor record".into(),
            CniClassification::Flannel => "flannel".into(),
            CniClassification::Calico => "Calico".into(),
            CniClassification::Other { name } => format!("another CNI ({name})"),
            CniClassification::Mixed { cnis } => format!("more than one CNI ({})", cnis.join(", ")),
            CniClassification::Unclassifiable { reason } => {
                format!("a CNI Ichor cannot classify: {reason}")
            }
        }
    }
}

/// Classifies the cluster's CNI from what the inspection read.
pub fn classify_cni(inspection: &Inspection) -> CniClassification {
    let kube = &inspection.kube;
    // The CNIs the one detector finds; Ichor's record is a row of its own here.
    let kinds = ichor_api::cni::cnis_found(&kube.cni_workloads, false);
    let ichor_record = kube.cilium_records.iter().find(|r| r.is_ichors());

    if kinds.len() > 1 {
        return CniClassification::Mixed {
            cnis: kinds.iter().map(|k| k.name().to_string()).collect(),
        };
    }
    if let Some(record) = ichor_record {
        // Ichor's record wins even before its DaemonSet exists (a rerun after an
        // interrupted install, R1.7c) — unless another CNI runs beside it.
        return match kinds.first() {
            None | Some(CniKind::Cilium) => CniClassification::CiliumWithIchorRecord {
                record_status: record.status.clone(),
            },
            Some(other) => CniClassification::Mixed {
                cnis: vec!["cilium (Ichor's record)".into(), other.name().to_string()],
            },
        };
    }
    match kinds.first() {
        Some(CniKind::Cilium) => CniClassification::CiliumTakeover,
        Some(CniKind::Flannel) => CniClassification::Flannel,
        Some(CniKind::Calico) => CniClassification::Calico,
        Some(CniKind::Other(name)) => CniClassification::Other { name: name.clone() },
        None => no_cni_or_why_not(inspection),
    }
}

/// No CNI workload runs: "no CNI" only if every other part of R1.1a
/// holds too (R1.1b); otherwise why the evidence does not add up.
fn no_cni_or_why_not(inspection: &Inspection) -> CniClassification {
    let kube = &inspection.kube;
    if kube.cilium_node_crd {
        return CniClassification::Unclassifiable {
            reason: "the CiliumNode CRD exists but no Cilium DaemonSet runs".into(),
        };
    }
    if let Some(node) = inspection
        .talos
        .iter()
        .find(|n| n.facts.cni.as_ref().is_some_and(|c| *c != CniName::None))
    {
        let name = node
            .facts
            .cni
            .as_ref()
            .map(CniName::as_str)
            .unwrap_or_default();
        return CniClassification::Unclassifiable {
            reason: format!(
                "node {} says cni.name: {name}, but no CNI DaemonSet was found",
                node.address
            ),
        };
    }
    if !inspection
        .talos
        .iter()
        .any(|n| n.facts.cni == Some(CniName::None))
    {
        return CniClassification::Unclassifiable {
            reason: "no node's machine config says which CNI Talos deploys".into(),
        };
    }
    if kube.nodes.is_empty() {
        return CniClassification::Unclassifiable {
            reason: "Kubernetes has no Node objects".into(),
        };
    }
    let ready: Vec<&str> = kube
        .nodes
        .iter()
        .filter(|n| n.ready)
        .map(|n| n.name.as_str())
        .collect();
    if !ready.is_empty() {
        return CniClassification::Unclassifiable {
            reason: format!(
                "cni.name is none and no CNI DaemonSet was found, but nodes are Ready ({}): a CNI Ichor cannot see runs",
                ready.join(", ")
            ),
        };
    }
    if let Some(node) = kube
        .nodes
        .iter()
        .find(|n| !n.not_ready_for_network_plugin())
    {
        return CniClassification::Unclassifiable {
            reason: format!(
                "node {} is NotReady for another reason than the network plugin ({})",
                node.name,
                node.ready_message.as_deref().unwrap_or("no message")
            ),
        };
    }
    CniClassification::NoCni
}

/// The path adopt takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AdoptMode {
    /// No CNI: install Ichor's Cilium first, then Ichor, then adopt (preset cilium).
    InstallCilium,
    /// Cilium is already Ichor's own Helm release (its record is in
    /// `ichor-system`, from `ichor cni bootstrap` or an interrupted adopt):
    /// adopt keeps that release, finishing it if it was left pending, and
    /// only checks it exists (preset cilium).
    KeepIchorsCilium,
    /// Cilium installed by someone else becomes Ichor's release (preset cilium).
    TakeOverCilium,
    /// The CNI stays the user's (preset unmanaged).
    Unmanaged,
}

impl AdoptMode {
    /// Whether adopt runs its Cilium phase: on a cluster with no CNI, and on
    /// the rerun of one (Ichor's release is kept and finished).
    pub fn installs_cilium(self) -> bool {
        matches!(self, AdoptMode::InstallCilium | AdoptMode::KeepIchorsCilium)
    }

    pub fn preset(self) -> ichor_api::CniPreset {
        match self {
            AdoptMode::Unmanaged => ichor_api::CniPreset::Unmanaged,
            _ => ichor_api::CniPreset::Cilium,
        }
    }
}

/// Why adopt will not go on. Nothing has been written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("{message}")]
pub struct Refusal {
    pub message: String,
}

impl Refusal {
    pub fn new(message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
        }
    }
}

/// The text of R1.2b, word for word.
pub const NO_CNI_UNMANAGED_REFUSAL: &str = "this cluster has no CNI, so no pod can run on it, including Ichor's. Run again without --cni-unmanaged and Ichor installs Cilium, or install a CNI yourself first.";

/// Decides the path from the classification and `--cni-unmanaged` (R1.2a–b, R2.0).
pub fn decide_mode(found: &CniClassification, cni_unmanaged: bool) -> Result<AdoptMode, Refusal> {
    use CniClassification as C;
    match (found, cni_unmanaged) {
        (C::NoCni, true) => Err(Refusal::new(NO_CNI_UNMANAGED_REFUSAL)),
        (C::NoCni, false) => Ok(AdoptMode::InstallCilium),
        (C::Mixed { cnis }, _) => Err(Refusal::new(format!(
            "this cluster runs more than one CNI ({}); Ichor adopts a cluster with one CNI. Remove all but one, then run ichor adopt again.",
            cnis.join(", ")
        ))),
        (_, true) => Ok(AdoptMode::Unmanaged),
        (C::CiliumWithIchorRecord { .. }, false) => Ok(AdoptMode::KeepIchorsCilium),
        (C::CiliumTakeover, false) => Ok(AdoptMode::TakeOverCilium),
        (C::Flannel | C::Calico | C::Other { .. }, false) => Err(Refusal::new(format!(
            "this cluster runs {}; Ichor manages only Cilium. Run again with --cni-unmanaged to adopt it and leave its CNI to you.",
            found.describe()
        ))),
        (C::Unclassifiable { reason }, false) => Err(Refusal::new(format!(
            "Ichor cannot classify this cluster's CNI: {reason}. Run again with --cni-unmanaged to adopt it and leave its CNI to you, or fix the CNI first."
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspection::{CiliumRecord, CniWorkload, KubeInspection, KubeNode, TalosNode};
    use ichor_api::DetectedCni;
    use ichor_talos::config::MachineConfig;

    fn i_detected(i: &Inspection) -> DetectedCni {
        i.kube.detected_cni()
    }

    const NO_CNI_MESSAGE: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

    fn talos_node(cni: &str) -> TalosNode {
        let text = format!(
            "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  network:\n    cni:\n      name: {cni}\n"
        );
        TalosNode {
            address: "10.5.0.2".into(),
            hostname: "cp-1".into(),
            talos_version: "v1.13.9".into(),
            facts: MachineConfig::parse(&text).unwrap().facts(),
        }
    }

    fn node(name: &str, ready: bool, message: &str) -> KubeNode {
        KubeNode {
            name: name.into(),
            ready,
            ready_message: Some(message.into()),
            pod_cidr: Some("10.244.0.0/24".into()),
        }
    }

    fn workload(ns: &str, name: &str, image: &str) -> CniWorkload {
        CniWorkload::recognise(ns, name, &[image.into()]).unwrap()
    }

    fn record(storage: &str, status: &str) -> CiliumRecord {
        CiliumRecord {
            storage_namespace: storage.into(),
            release_namespace: "kube-system".into(),
            status: status.into(),
            revision: 1,
        }
    }

    /// A cluster that is "no CNI" in every respect.
    fn no_cni() -> Inspection {
        Inspection {
            talos: vec![talos_node("none")],
            kube: KubeInspection {
                nodes: vec![
                    node("cp-1", false, NO_CNI_MESSAGE),
                    node("w-1", false, NO_CNI_MESSAGE),
                ],
                ..Default::default()
            },
        }
    }

    fn cilium_ds() -> CniWorkload {
        workload("kube-system", "cilium", "quay.io/cilium/cilium:v1.18.0")
    }

    /// Covers: R1.1a, R1.2a
    #[test]
    fn row_no_cni_installs_cilium() {
        let found = classify_cni(&no_cni());
        assert_eq!(found, CniClassification::NoCni);
        assert_eq!(i_detected(&no_cni()), DetectedCni::None);
        assert_eq!(decide_mode(&found, false), Ok(AdoptMode::InstallCilium));
        assert_eq!(
            AdoptMode::InstallCilium.preset(),
            ichor_api::CniPreset::Cilium
        );
    }

    /// Covers: R1.2b
    #[test]
    fn row_no_cni_refuses_cni_unmanaged_with_the_specs_text() {
        let err = decide_mode(&classify_cni(&no_cni()), true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "this cluster has no CNI, so no pod can run on it, including Ichor's. Run again without --cni-unmanaged and Ichor installs Cilium, or install a CNI yourself first."
        );
    }

    /// Covers: R1.1b
    #[test]
    fn partly_true_some_nodes_ready_is_not_no_cni() {
        let mut i = no_cni();
        i.kube.nodes[1] = node("w-1", true, "kubelet is posting ready status");
        let found = classify_cni(&i);
        assert!(
            matches!(found, CniClassification::Unclassifiable { ref reason } if reason.contains("w-1")),
            "{found:?}"
        );
        assert!(decide_mode(&found, false).is_err());
        assert_eq!(decide_mode(&found, true), Ok(AdoptMode::Unmanaged));
    }

    /// Covers: R1.1b, R1.1c
    #[test]
    fn partly_true_cni_none_with_a_cni_applied_by_hand_is_the_existing_cni_case() {
        let mut i = no_cni();
        i.kube.cni_workloads = vec![workload(
            "calico-system",
            "calico-node",
            "docker.io/calico/node:v3.29",
        )];
        let found = classify_cni(&i);
        assert_eq!(found, CniClassification::Calico);
        assert_eq!(decide_mode(&found, true), Ok(AdoptMode::Unmanaged));
    }

    /// Covers: R1.1a
    #[test]
    fn partly_true_a_ciliumnode_crd_without_a_daemonset_is_not_no_cni() {
        let mut i = no_cni();
        i.kube.cilium_node_crd = true;
        assert!(matches!(
            classify_cni(&i),
            CniClassification::Unclassifiable { .. }
        ));
    }

    /// Covers: R1.1a
    #[test]
    fn partly_true_nodes_not_ready_for_another_reason_is_not_no_cni() {
        let mut i = no_cni();
        i.kube.nodes[0] = node("cp-1", false, "Kubelet stopped posting node status.");
        assert!(
            matches!(classify_cni(&i), CniClassification::Unclassifiable { ref reason } if reason.contains("cp-1"))
        );
    }

    /// Covers: R1.1a
    #[test]
    fn partly_true_talos_deploys_flannel_but_nothing_runs_is_not_no_cni() {
        let mut i = no_cni();
        i.talos = vec![talos_node("flannel")];
        assert!(
            matches!(classify_cni(&i), CniClassification::Unclassifiable { ref reason } if reason.contains("cni.name: flannel"))
        );
    }

    /// Covers: R1.7c, R4.4c
    #[test]
    fn row_cilium_with_ichor_record_is_already_handled_even_while_pending() {
        let mut i = no_cni();
        i.kube.cilium_records = vec![record("ichor-system", "pending-install")];
        let found = classify_cni(&i);
        assert_eq!(
            found,
            CniClassification::CiliumWithIchorRecord {
                record_status: "pending-install".into()
            }
        );
        assert_eq!(decide_mode(&found, false), Ok(AdoptMode::KeepIchorsCilium));
        i.kube.cni_workloads = vec![cilium_ds()];
        assert_eq!(
            decide_mode(&classify_cni(&i), false),
            Ok(AdoptMode::KeepIchorsCilium)
        );
    }

    /// Covers: R2.0
    #[test]
    fn row_cilium_without_ichor_record_is_taken_over_or_left_alone() {
        let mut i = no_cni();
        i.kube.cni_workloads = vec![cilium_ds()];
        i.kube.cilium_records = vec![record("kube-system", "deployed")];
        let found = classify_cni(&i);
        assert_eq!(found, CniClassification::CiliumTakeover);
        assert_eq!(i_detected(&i), DetectedCni::Cilium);
        assert_eq!(decide_mode(&found, false), Ok(AdoptMode::TakeOverCilium));
        assert_eq!(decide_mode(&found, true), Ok(AdoptMode::Unmanaged));
    }

    /// Covers: R2.0
    #[test]
    fn rows_flannel_calico_other_need_cni_unmanaged() {
        for (ds, expected) in [
            (
                workload(
                    "kube-system",
                    "kube-flannel",
                    "ghcr.io/siderolabs/flannel:v0.26",
                ),
                CniClassification::Flannel,
            ),
            (
                workload(
                    "calico-system",
                    "calico-node",
                    "docker.io/calico/node:v3.29",
                ),
                CniClassification::Calico,
            ),
            (
                workload("kube-system", "weave-net", "weaveworks/weave-kube:2.8"),
                CniClassification::Other {
                    name: "weave-net".into(),
                },
            ),
        ] {
            let mut i = no_cni();
            i.talos = vec![talos_node("flannel")];
            i.kube.cni_workloads = vec![ds];
            let found = classify_cni(&i);
            assert_eq!(found, expected);
            let refusal = decide_mode(&found, false).unwrap_err();
            assert!(refusal.message.contains("--cni-unmanaged"), "{refusal}");
            assert_eq!(decide_mode(&found, true), Ok(AdoptMode::Unmanaged));
        }
    }

    /// Covers: R2.0
    #[test]
    fn row_mixed_is_refused_even_with_cni_unmanaged() {
        let mut i = no_cni();
        i.kube.cni_workloads = vec![
            cilium_ds(),
            workload(
                "kube-system",
                "kube-flannel",
                "ghcr.io/siderolabs/flannel:v0.26",
            ),
        ];
        let found = classify_cni(&i);
        assert_eq!(
            found,
            CniClassification::Mixed {
                cnis: vec!["cilium".into(), "flannel".into()]
            }
        );
        assert!(
            decide_mode(&found, true)
                .unwrap_err()
                .message
                .contains("more than one CNI")
        );
        assert!(decide_mode(&found, false).is_err());
    }

    /// Covers: R2.0
    #[test]
    fn cilium_and_its_envoy_daemonset_are_one_cni() {
        let mut i = no_cni();
        i.kube.cni_workloads = vec![
            cilium_ds(),
            workload(
                "kube-system",
                "cilium-envoy",
                "quay.io/cilium/cilium-envoy:v1",
            ),
        ];
        assert_eq!(classify_cni(&i), CniClassification::CiliumTakeover);
    }

    /// Covers: R2.0
    #[test]
    fn ichor_record_beside_another_cni_is_mixed() {
        let mut i = no_cni();
        i.kube.cilium_records = vec![record("ichor-system", "deployed")];
        i.kube.cni_workloads = vec![workload(
            "calico-system",
            "calico-node",
            "docker.io/calico/node:v3.29",
        )];
        assert!(matches!(classify_cni(&i), CniClassification::Mixed { .. }));
    }
}
