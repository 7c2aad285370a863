//! What the emulator derives from the real fixtures (the facts its resources show).

use ichor_talemu::derive::{MachineType, can_apply_immediate, facts};

/// v1.12 shape: flannel by default, custom CNI and example.com in "overrides".
/// Covers: R1.3b, R1.3d, R1.4b
#[test]
fn v112_fixtures() {
    let base = facts(&crate::common::cp_v112(), false).unwrap();
    assert_eq!(base.machine_type, MachineType::ControlPlane);
    assert_eq!(base.kubeprism_port, Some(7445));
    assert_eq!(base.cni_name, "flannel");
    assert!(base.proxy_enabled);
    assert_eq!(base.dns_domain, "cluster.local");
    assert_eq!(base.pod_subnets, vec!["10.244.0.0/16"]);
    assert_eq!(base.service_subnets, vec!["10.96.0.0/12"]);
    assert_eq!(base.cluster_name, "base");
    assert_eq!(
        base.control_plane_endpoint.as_deref(),
        Some("https://base:6443")
    );

    let over = facts(
        &crate::common::fixture("stability-v1.12/overrides-controlplane.yaml"),
        false,
    )
    .unwrap();
    assert_eq!(over.cni_name, "custom");
    assert_eq!(over.dns_domain, "example.com");

    let worker = facts(&crate::common::worker_v112(), false).unwrap();
    assert_eq!(worker.machine_type, MachineType::Worker);
    assert_eq!(worker.kubeprism_port, Some(7445));
}

/// v1.14 shape: the Kubernetes documents decide (flannel document present in
/// "base", a custom-cni external manifest in "overrides" reads as none, as
/// Talos v1.14 reports it).
/// Covers: R1.3b, R1.3d
#[test]
fn v114_fixtures() {
    let base = facts(&crate::common::cp_v114(), true).unwrap();
    assert_eq!(base.machine_type, MachineType::ControlPlane);
    assert_eq!(base.kubeprism_port, Some(7445));
    assert_eq!(base.cni_name, "flannel");
    assert!(base.proxy_enabled);
    assert_eq!(base.dns_domain, "cluster.local");
    assert_eq!(base.cluster_name, "base");
    assert!(base.has_kubernetes_network);

    let over = facts(
        &crate::common::fixture("stability-v1.14/overrides-controlplane.yaml"),
        true,
    )
    .unwrap();
    assert_eq!(over.cni_name, "none");
    assert_eq!(over.dns_domain, "example.com");
}

/// Talos v1.13's immediate-apply rule: KubePrism, network and cluster changes
/// are live; a machine type change is not.
#[test]
fn immediate_apply_rule() {
    let cp = crate::common::cp_v112();
    let kubeprism = crate::common::edit(&cp, "port: 7445", "port: 7446");
    assert!(can_apply_immediate(&cp, &kubeprism).is_ok());
    let cluster = crate::common::edit(&cp, "dnsDomain: cluster.local", "dnsDomain: other.local");
    assert!(can_apply_immediate(&cp, &cluster).is_ok());
    let machine_type = crate::common::edit(&cp, "type: controlplane", "type: worker");
    let err = can_apply_immediate(&cp, &machine_type)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("this config change can't be applied in immediate mode\ndiff:\n"),
        "{err}"
    );
    assert!(
        err.contains("-    type: controlplane") || err.contains("-  type: controlplane"),
        "{err}"
    );
}
