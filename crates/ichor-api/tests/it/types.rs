//! Serde defaults and wire names of the types (no server).

use ichor_api::{
    CniPreset, KubeProxyMode, OperationKind, TalosClusterSpec, TalosMachineSpec,
    TalosOperationSpec, Tunnel,
};

/// Covers: R1.4a
#[test]
fn cluster_defaults() {
    let spec: TalosClusterSpec = serde_json::from_value(serde_json::json!({
        "endpoint": "https://10.0.0.10:6443",
        "talosVersion": "v1.12.1",
        "kubernetesVersion": "v1.34.1",
        "secretsRef": {"name": "bundle"}
    }))
    .expect("minimal spec");
    assert_eq!(spec.cni.preset, CniPreset::Cilium);
    assert_eq!(spec.cni.tunnel, Tunnel::Vxlan);
    assert_eq!(spec.cni.kube_proxy, KubeProxyMode::Enabled);
    assert_eq!(spec.secrets_ref.key_or_default(), "secrets.yaml");
}

/// Covers: R1.1c
#[test]
fn unmanaged_talos_cni_none_is_valid() {
    let spec: TalosClusterSpec = serde_json::from_value(serde_json::json!({
        "endpoint": "https://e:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
        "secretsRef": {"name": "b"},
        "cni": {"preset": "unmanaged", "unmanaged": {"talosCNI": "none"}}
    }))
    .expect("unmanaged spec");
    assert_eq!(spec.cni.preset, CniPreset::Unmanaged);
    let back = serde_json::to_value(&spec.cni).expect("serialise");
    assert_eq!(back["unmanaged"]["talosCNI"], "none");
}

/// Covers: R1.7a
#[test]
fn machines_are_held_by_default() {
    let spec: TalosMachineSpec = serde_json::from_value(serde_json::json!({
        "clusterRef": {"name": "c"}, "role": "controlplane", "address": "10.0.0.2"
    }))
    .expect("machine spec");
    assert!(spec.hold);
}

#[test]
fn operation_kinds_are_kebab_case() {
    let spec: TalosOperationSpec = serde_json::from_value(serde_json::json!({
        "kind": "kubernetes-upgrade", "target": {"clusterRef": {"name": "c"}}, "version": "v1.35.0"
    }))
    .expect("operation spec");
    assert_eq!(spec.kind, OperationKind::KubernetesUpgrade);
}
