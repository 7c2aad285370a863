//! Shared test helpers: spec builders (the fixtures are `ichor_testenv::fixtures`).
#![allow(dead_code)]

use ichor_api::{
    ClusterNetwork, ClusterRef, CniPreset, CniSpec, KubeProxyMode, MachinePatch, MachineRole,
    SecretsRef, TalosClusterSpec, TalosMachineSpec,
};
use ichor_render::{RenderInput, Rendered};
use ichor_talos::config::MachineConfig;

pub use ichor_testenv::fixtures;

pub fn parse(text: &str) -> MachineConfig {
    MachineConfig::parse(text).expect("fixture parses")
}

/// The cluster spec that matches the stability fixtures (endpoint, versions, subnets).
pub fn cluster(preset: CniPreset, kube_proxy: KubeProxyMode) -> TalosClusterSpec {
    TalosClusterSpec {
        endpoint: "https://base:6443".into(),
        talos_version: "v1.12.0".into(),
        kubernetes_version: "v1.28.0".into(),
        network: ClusterNetwork {
            pod_subnets: vec!["10.244.0.0/16".into()],
            service_subnets: vec!["10.96.0.0/12".into()],
        },
        cni: CniSpec {
            preset,
            kube_proxy,
            ..Default::default()
        },
        secrets_ref: SecretsRef {
            name: "bundle".into(),
            key: None,
        },
        backup: None,
        maintenance_windows: Vec::new(),
        alertmanager: None,
        apply_mode: None,
        try_timeout: None,
        revisions_kept: None,
    }
}

pub fn machine(role: MachineRole, patches: &[(&str, &str)]) -> TalosMachineSpec {
    TalosMachineSpec {
        cluster_ref: ClusterRef {
            name: "base".into(),
        },
        role,
        address: "10.0.0.2".into(),
        hold: true,
        patches: patches
            .iter()
            .map(|(n, p)| MachinePatch {
                name: (*n).into(),
                inline: (*p).into(),
            })
            .collect(),
        removal: None,
        replaces: None,
        apply_mode: None,
        try_timeout: None,
    }
}

pub fn role_of(file: &str) -> MachineRole {
    if file.contains("worker") {
        MachineRole::Worker
    } else {
        MachineRole::Controlplane
    }
}

pub fn render(
    cluster: &TalosClusterSpec,
    machine: &TalosMachineSpec,
    live: &MachineConfig,
    handover: bool,
    inline_cni: Option<&str>,
) -> Rendered {
    ichor_render::render(&RenderInput {
        machine_name: "m1",
        cluster,
        cni_handover: handover,
        machine,
        live,
        inline_cni,
        taken_over_inline: None,
    })
    .expect("render")
}
