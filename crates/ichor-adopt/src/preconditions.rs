//! R1.3a–e: what must hold before adopt asks for consent. Checked read-only;
//! each failure refuses with nothing written.

use serde::Serialize;

use crate::classify::{AdoptMode, Refusal};
use crate::inspection::Inspection;

/// The oldest Talos minor adopt accepts.
pub const MIN_TALOS: (u64, u64) = (1, 12);
/// The port Cilium reaches the API server on (KubePrism).
pub const KUBEPRISM_PORT: u32 = 7445;

/// Pod and service subnets read from the Talos config (class A into `spec.network`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subnets {
    pub pod_subnets: Vec<String>,
    pub service_subnets: Vec<String>,
}

/// Checks every precondition for `mode`, returning all refusals (not only the
/// first) so the operator fixes them in one go; on success, the subnets.
pub fn check(inspection: &Inspection, mode: AdoptMode) -> Result<Subnets, Vec<Refusal>> {
    let mut refusals = Vec::new();
    if inspection.talos.is_empty() {
        refusals.push(Refusal::new(
            "no Talos node was read: give the nodes with --talosconfig (its context's nodes) or --nodes",
        ));
    }
    for node in &inspection.talos {
        match talos_minor(&node.talos_version) {
            Some(v) if v >= MIN_TALOS => {}
            Some(_) => refusals.push(Refusal::new(format!(
                "node {} runs Talos {}; Ichor adopts clusters on Talos v1.12 or later: upgrade the node first",
                node.address, node.talos_version
            ))),
            None => refusals.push(Refusal::new(format!(
                "node {} reports Talos version {:?}, which Ichor cannot read; it needs Talos v1.12 or later",
                node.address, node.talos_version
            ))),
        }
    }
    if mode == AdoptMode::InstallCilium {
        // Stricter than a render-time fix on purpose (R1.3b): Cilium reaches the
        // API server through KubePrism before anything can be rendered.
        for node in &inspection.talos {
            let kp = node.facts.kube_prism;
            if !kp.enabled || kp.port.unwrap_or(KUBEPRISM_PORT) != KUBEPRISM_PORT {
                let state = if kp.enabled {
                    format!("it listens on port {}", kp.port.unwrap_or_default())
                } else {
                    "it is disabled".to_string()
                };
                refusals.push(Refusal::new(format!(
                    "KubePrism must be enabled on port {KUBEPRISM_PORT} on node {} ({state}): Cilium reaches the API server through it. Enable it first (machine.features.kubePrism, or a KubePrismConfig document, with port {KUBEPRISM_PORT}), then run ichor adopt again",
                    node.address
                )));
            }
        }
        for node in &inspection.kube.nodes {
            if node.pod_cidr.as_deref().unwrap_or_default().is_empty() {
                refusals.push(Refusal::new(format!(
                    "node {} has no spec.podCIDR: Cilium runs with ipam.mode=kubernetes and needs one on every node. Let kube-controller-manager allocate node CIDRs (Talos's default), then run ichor adopt again",
                    node.name
                )));
            }
        }
    }
    let subnets = subnets(inspection, &mut refusals);
    if refusals.is_empty() {
        Ok(subnets)
    } else {
        Err(refusals)
    }
}

fn subnets(inspection: &Inspection, refusals: &mut Vec<Refusal>) -> Subnets {
    // Cluster-wide settings live on control-plane nodes (a v1.14 worker carries none).
    let mut found: Option<(&str, Subnets)> = None;
    for node in inspection
        .talos
        .iter()
        .filter(|n| n.facts.machine_type.is_control_plane())
    {
        let these = Subnets {
            pod_subnets: node.facts.pod_subnets.clone(),
            service_subnets: node.facts.service_subnets.clone(),
        };
        match &found {
            None => found = Some((&node.address, these)),
            Some((first, seen)) if *seen != these => refusals.push(Refusal::new(format!(
                "control-plane nodes disagree on the cluster's subnets: {first} has pods {:?} services {:?}, {} has pods {:?} services {:?}. Make them agree, then run ichor adopt again",
                seen.pod_subnets, seen.service_subnets, node.address, these.pod_subnets, these.service_subnets
            ))),
            Some(_) => {}
        }
    }
    match found {
        Some((_, s)) => s,
        None => {
            if !inspection.talos.is_empty() {
                refusals.push(Refusal::new(
                    "no control-plane node was read, so the cluster's subnets are unknown: include a control-plane node in --nodes",
                ));
            }
            Subnets::default()
        }
    }
}

/// `v1.13.9` → (1, 13).
fn talos_minor(version: &str) -> Option<(u64, u64)> {
    ichor_talos::version::Version::parse(version)
        .ok()
        .map(|v| v.major_minor())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspection::{KubeInspection, KubeNode, TalosNode};
    use ichor_talos::config::MachineConfig;

    fn talos(address: &str, version: &str, extra_machine: &str, machine_type: &str) -> TalosNode {
        let text = format!(
            "version: v1alpha1\nmachine:\n  type: {machine_type}\n{extra_machine}cluster:\n  network:\n    cni:\n      name: none\n    podSubnets: [10.244.0.0/16]\n    serviceSubnets: [10.96.0.0/12]\n"
        );
        TalosNode {
            address: address.into(),
            hostname: address.into(),
            talos_version: version.into(),
            facts: MachineConfig::parse(&text).unwrap().facts(),
        }
    }

    const PRISM_ON: &str = "  features:\n    kubePrism:\n      enabled: true\n      port: 7445\n";

    fn kube_node(name: &str, cidr: Option<&str>) -> KubeNode {
        KubeNode {
            name: name.into(),
            ready: false,
            ready_message: None,
            pod_cidr: cidr.map(Into::into),
        }
    }

    fn inspection(talos_nodes: Vec<TalosNode>, nodes: Vec<KubeNode>) -> Inspection {
        Inspection {
            talos: talos_nodes,
            kube: KubeInspection {
                nodes,
                ..Default::default()
            },
        }
    }

    /// Covers: R1.3a, R1.3d
    #[test]
    fn a_good_cluster_passes_and_yields_its_subnets() {
        let i = inspection(
            vec![
                talos("10.5.0.2", "v1.13.9", PRISM_ON, "controlplane"),
                talos("10.5.0.3", "v1.12.0", PRISM_ON, "worker"),
            ],
            vec![
                kube_node("cp-1", Some("10.244.0.0/24")),
                kube_node("w-1", Some("10.244.1.0/24")),
            ],
        );
        let s = check(&i, AdoptMode::InstallCilium).unwrap();
        assert_eq!(s.pod_subnets, vec!["10.244.0.0/16"]);
        assert_eq!(s.service_subnets, vec!["10.96.0.0/12"]);
    }

    /// Covers: R1.3a, R1.3e
    #[test]
    fn talos_older_than_1_12_is_refused_naming_the_node() {
        let i = inspection(
            vec![talos("10.5.0.2", "v1.11.5", "", "controlplane")],
            vec![],
        );
        let r = check(&i, AdoptMode::TakeOverCilium).unwrap_err();
        assert!(
            r[0].message.contains("10.5.0.2 runs Talos v1.11.5"),
            "{r:?}"
        );
        assert!(r[0].message.contains("v1.12 or later"));
    }

    /// Covers: R1.3b, R1.3e
    #[test]
    fn kubeprism_off_or_elsewhere_is_refused_on_the_no_cni_path_only() {
        let off = "  features:\n    kubePrism:\n      enabled: false\n";
        let i = inspection(
            vec![talos("10.5.0.2", "v1.13.9", off, "controlplane")],
            vec![kube_node("cp-1", Some("10.244.0.0/24"))],
        );
        let r = check(&i, AdoptMode::InstallCilium).unwrap_err();
        assert_eq!(r.len(), 1);
        assert!(
            r[0].message.starts_with(
                "KubePrism must be enabled on port 7445 on node 10.5.0.2 (it is disabled)"
            ),
            "{r:?}"
        );
        assert!(r[0].message.contains("Enable it first"));
        // Other paths let the render turn KubePrism on; only the no-CNI
        // path needs it first, since Cilium needs it to start (R1.3b).
        assert!(check(&i, AdoptMode::TakeOverCilium).is_ok());

        let other_port = "  features:\n    kubePrism:\n      enabled: true\n      port: 7446\n";
        let i = inspection(
            vec![talos("10.5.0.2", "v1.13.9", other_port, "controlplane")],
            vec![],
        );
        let r = check(&i, AdoptMode::InstallCilium).unwrap_err();
        assert!(r[0].message.contains("it listens on port 7446"), "{r:?}");
    }

    /// Covers: R1.3c, R1.3e
    #[test]
    fn a_node_without_a_pod_cidr_is_refused() {
        let i = inspection(
            vec![talos("10.5.0.2", "v1.13.9", PRISM_ON, "controlplane")],
            vec![
                kube_node("cp-1", Some("10.244.0.0/24")),
                kube_node("w-1", None),
            ],
        );
        let r = check(&i, AdoptMode::InstallCilium).unwrap_err();
        assert_eq!(r.len(), 1);
        assert!(
            r[0].message.starts_with("node w-1 has no spec.podCIDR"),
            "{r:?}"
        );
    }

    #[test]
    fn every_refusal_is_reported_at_once() {
        let off = "  features:\n    kubePrism:\n      enabled: false\n";
        let i = inspection(
            vec![talos("10.5.0.2", "v1.11.0", off, "controlplane")],
            vec![kube_node("cp-1", None)],
        );
        assert_eq!(check(&i, AdoptMode::InstallCilium).unwrap_err().len(), 3);
    }
}
