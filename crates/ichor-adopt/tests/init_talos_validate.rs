//! Every config `ichor init` renders is one Talos accepts: the real
//! `talosctl validate --mode metal --strict` (v1.13.9, tools cache) judges
//! the v1alpha1 shape for each role, kube-proxy mode and tunnel, with a
//! generated bundle and with the stability fixtures' bundle. The v1.14
//! multi-document shape is judged by Talos's own v1.14 machinery
//! (`machinery-peer validate`, with the `machinery-peer` feature only: the
//! module proxy does not serve that machinery, so CI cannot build the peer).
//!
//! Covers: R10.2

use std::process::Command;

use ichor_adopt::init::{InitRequest, NodeAnswer, NodeProbe, PatchFile, plan};
use ichor_api::{KubeProxyMode, Tunnel};
use ichor_talos::secrets::SecretsBundle;
use ichor_testenv::Tool;

fn fixture_bundle() -> SecretsBundle {
    SecretsBundle::from_file(&ichor_testenv::fixtures::talos_path(
        "stability-secrets.yaml",
    ))
    .unwrap()
}

fn probe(address: &str, hostname: &str) -> NodeProbe {
    NodeProbe {
        address: address.into(),
        answer: NodeAnswer::Maintenance {
            hostname: hostname.into(),
            talos_version: "v1.13.9".into(),
            disks: vec!["/dev/sda".into()],
        },
    }
}

fn talosctl_validate(path: &std::path::Path) -> Result<(), String> {
    let out = Command::new(Tool::Talosctl.path())
        .args(["validate", "--mode", "metal", "--strict", "--config"])
        .arg(path)
        .output()
        .expect("talosctl runs");
    verdict(out)
}

fn verdict(out: std::process::Output) -> Result<(), String> {
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn configs(talos_version: &str, bundle: &SecretsBundle) -> Vec<(String, String)> {
    let manifest = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n";
    let mut out = Vec::new();
    for kube_proxy in KubeProxyMode::ALL {
        let request = InitRequest {
            cluster: "lab".into(),
            endpoint: "https://10.5.0.2:6443".into(),
            control_planes: vec!["10.5.0.2".into()],
            workers: vec!["10.5.0.3".into()],
            talos_version: Some(talos_version.into()),
            kube_proxy,
            secrets_source: "generated".into(),
            ..InitRequest::default()
        };
        let probes = [probe("10.5.0.2", "cp-1"), probe("10.5.0.3", "worker-1")];
        let (_, writes) = plan(&request, &probes, bundle, manifest).unwrap();
        out.extend(writes.configs);
    }
    out
}

/// The v1.14 shape, judged by Talos v1.14's own config machinery.
#[cfg(feature = "machinery-peer")]
#[test]
fn talos_v1_14_machinery_accepts_every_multidoc_init_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut judged = 0;
    for bundle in [SecretsBundle::generate().unwrap(), fixture_bundle()] {
        for (address, config) in configs("v1.14.0", &bundle) {
            assert!(config.contains("kind: KubeClusterConfig"), "multi-document");
            let path = dir.path().join(format!("{address}.yaml"));
            std::fs::write(&path, &config).unwrap();
            let out = Command::new(Tool::MachineryPeer.path())
                .args(["validate", "--mode", "metal", "--strict"])
                .arg(&path)
                .output()
                .expect("machinery-peer runs");
            if let Err(e) = verdict(out) {
                panic!("{address}: Talos v1.14 refuses: {e}");
            }
            judged += 1;
        }
    }
    assert_eq!(judged, 8);
}

#[test]
fn talosctl_accepts_every_init_config() {
    assert_eq!(configs("v1.13.9", &fixture_bundle()).len(), 4);
    let dir = tempfile::tempdir().unwrap();
    let manifest = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n";
    let mut judged = 0;
    for bundle in [SecretsBundle::generate().unwrap(), fixture_bundle()] {
        for kube_proxy in KubeProxyMode::ALL {
            for tunnel in Tunnel::ALL {
                let request = InitRequest {
                    cluster: "lab".into(),
                    endpoint: "https://10.5.0.2:6443".into(),
                    control_planes: vec!["10.5.0.2".into()],
                    workers: vec!["10.5.0.3".into()],
                    tunnel,
                    kube_proxy,
                    patches: vec![PatchFile {
                        name: "ntp.yaml".into(),
                        text: "machine:\n  time:\n    servers: [time.cloudflare.com]\n".into(),
                    }],
                    secrets_source: "generated".into(),
                    ..InitRequest::default()
                };
                let probes = [probe("10.5.0.2", "cp-1"), probe("10.5.0.3", "worker-1")];
                let (_, writes) = plan(&request, &probes, &bundle, manifest).unwrap();
                for (address, config) in &writes.configs {
                    let path = dir.path().join(format!("{address}.yaml"));
                    std::fs::write(&path, config).unwrap();
                    if let Err(e) = talosctl_validate(&path) {
                        panic!("{address} ({kube_proxy:?}, {tunnel:?}): talosctl refuses: {e}");
                    }
                    judged += 1;
                }
            }
        }
    }
    assert_eq!(judged, 16);
}
