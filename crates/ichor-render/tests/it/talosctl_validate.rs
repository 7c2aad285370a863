//! Every config Ichor renders passes the real `talosctl validate --mode
//! metal` (tools cache, `tools/testbin.sh`): the render of each fixture, for
//! each preset, kube-proxy mode, hand-over state and role, with and without
//! the inline CNI manifest.
//!
//! The v1.12 shape is judged by talosctl (v1.13.9, which does not read the
//! v1.14 `Kube*` kinds); the v1.14 shape by Talos's own v1.14 config
//! machinery, the tools cache's `machinery-peer validate --mode metal
//! --strict` (the same loader and validation talosctl runs) — those checks
//! only with the `machinery-peer` feature (`make check-machinery`): the
//! module proxy does not serve that machinery, so CI cannot build the peer.
//!
//! The live configs are the shared stability fixtures and this crate's
//! `cni: none` fixtures, given the install disk every metal node's config
//! names (`machine.install.disk`; the upstream base fixtures name none, and
//! metal mode requires one). Two upstream fixtures (`overrides-*`) fail metal
//! validation as they are (`install.extraKernelArgs` together with
//! `install.grubUseUKICmdline`); for those, every render must fail with
//! exactly the live config's errors: Ichor adds none.
//!
//! Covers: R9.2, R1.6

// The test prints how many cases it judged, for the CI log.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::process::Command;

use crate::common::*;
use ichor_api::{CniPreset, KubeProxyMode, MachineRole};
use ichor_talos::config::MachineConfig;
use ichor_testenv::Tool;

/// Who judges a config: a real Talos validator from the tools cache.
#[derive(Debug, Clone, Copy)]
enum Judge {
    /// `talosctl validate` (v1.13.9).
    Talosctl,
    /// `machinery-peer validate`: Talos's v1.14 config machinery (only with
    /// the `machinery-peer` feature).
    #[cfg_attr(not(feature = "machinery-peer"), allow(dead_code))]
    Machinery,
}

/// What `validate --mode metal --strict` says of a config file: `Ok` or its message.
fn talos_validate(judge: Judge, path: &Path) -> Result<(), String> {
    let out = match judge {
        Judge::Talosctl => Command::new(Tool::Talosctl.path())
            .args(["validate", "--mode", "metal", "--strict", "--config"])
            .arg(path)
            .output(),
        Judge::Machinery => Command::new(Tool::MachineryPeer.path())
            .args(["validate", "--mode", "metal", "--strict"])
            .arg(path)
            .output(),
    }
    .expect("the validator runs");
    if out.status.success() {
        Ok(())
    } else {
        // the file's own name is not part of the verdict
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .replace(&path.display().to_string(), "FILE"))
    }
}

/// A live config as a metal node has it: with its install disk.
fn on_metal(text: &str) -> MachineConfig {
    let mut cfg = parse(text);
    if let Some(v1) = cfg.v1alpha1_mut() {
        let machine = v1.machine.get_or_insert_with(Default::default);
        machine
            .install
            .get_or_insert_with(Default::default)
            .disk
            .get_or_insert_with(|| "/dev/sda".to_string());
    }
    cfg
}

/// The live configs of one shape: (name, text).
fn live_configs(shape: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in [
        "base-controlplane.yaml",
        "base-worker.yaml",
        "overrides-controlplane.yaml",
        "overrides-worker.yaml",
    ] {
        let rel = format!("stability-{shape}/{f}");
        out.push((rel.clone(), fixtures::talos(&rel)));
    }
    for f in ["cni-none-controlplane.yaml", "cni-none-worker.yaml"] {
        let rel = format!("{shape}-{f}");
        out.push((rel.clone(), fixtures::cni_none(&rel)));
    }
    out
}

/// Renders every combination for the live configs of one shape and
/// validates each distinct result; returns how many were validated.
fn render_and_validate_all(shape: &str, judge: Judge) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut failures = Vec::new();
    let mut valid_lives = 0;
    for (name, text) in live_configs(shape) {
        let live = on_metal(&text);
        let role = role_of(&name);
        let live_path = dir.path().join("live.yaml");
        std::fs::write(&live_path, live.to_yaml().unwrap()).unwrap();
        let live_verdict = talos_validate(judge, &live_path);
        valid_lives += usize::from(live_verdict.is_ok());
        for preset in [CniPreset::Cilium, CniPreset::Unmanaged] {
            for mode in [KubeProxyMode::Enabled, KubeProxyMode::Replaced] {
                for handover in [false, true] {
                    for inline in [None, Some(CILIUM_LIKE_MANIFEST)] {
                        let spec = cluster(preset, mode);
                        let m = machine(role, &[]);
                        let out = render(&spec, &m, &live, handover, inline);
                        let yaml = out.yaml().unwrap();
                        if !seen.insert(yaml.clone()) {
                            continue;
                        }
                        let path = dir.path().join(format!("render-{}.yaml", seen.len()));
                        std::fs::write(&path, &yaml).unwrap();
                        let verdict = talos_validate(judge, &path);
                        if verdict != live_verdict {
                            failures.push(format!(
                                "{name} preset {preset:?} kube-proxy {mode:?} handover {handover} inline {}: the live config gives {live_verdict:?}, the render {verdict:?}\n{yaml}",
                                inline.is_some()
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} rendered configs are judged otherwise than their live config by {judge:?} validate --mode metal:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert_eq!(
        valid_lives, 4,
        "the base and cni-none fixtures pass as they are"
    );
    seen.len()
}

/// A multi-document manifest like the Cilium one Ichor keeps inline, with a
/// leading blank line (Talos drops it on load; the render must still be valid).
const CILIUM_LIKE_MANIFEST: &str = "\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cilium-config\n  namespace: kube-system\ndata:\n  kube-proxy-replacement: \"true\"\n";

/// Covers: R9.2 — every v1.12-shape render passes metal
/// validation (or, for the two fixtures that fail as they are, fails with
/// exactly their errors).
#[test]
fn every_v1_12_render_passes_talos_metal_validation() {
    let n = render_and_validate_all("v1.12", Judge::Talosctl);
    eprintln!("{n} distinct v1.12-shape renders judged by talosctl validate --mode metal");
    assert!(n >= 12, "only {n} distinct renders");
}

/// The checks against Talos's own v1.14 machinery: built only with the
/// `machinery-peer` feature (`make check-machinery`), because the module
/// proxy does not serve Talos's v1.14 machinery, so a fresh machine cannot
/// build the peer (ADR 0001).
#[cfg(feature = "machinery-peer")]
mod machinery_peer {
    use super::*;

    /// Covers: R9.2 — every v1.14-shape render is judged by Talos's
    /// own v1.14 machinery like its live config, with every `Kube*` document.
    #[test]
    fn every_v1_14_render_is_judged_by_talos_v1_14_machinery_like_its_live_config() {
        let n = render_and_validate_all("v1.14", Judge::Machinery);
        eprintln!(
            "{n} distinct v1.14-shape renders judged by machinery-peer validate --mode metal"
        );
        assert!(n >= 12, "only {n} distinct renders");
    }

    /// The machinery peer can refuse: a v1.14 config whose `KubeNetworkConfig`
    /// names a pod subnet that is not a CIDR fails its validation, so the test
    /// above could fail.
    #[test]
    fn the_machinery_peer_refuses_an_invalid_v1_14_config() {
        let dir = tempfile::tempdir().unwrap();
        let text = fixtures::talos("stability-v1.14/base-controlplane.yaml");
        let path = dir.path().join("good.yaml");
        std::fs::write(&path, &text).unwrap();
        talos_validate(Judge::Machinery, &path).unwrap();
        let broken = text.replace("10.244.0.0/16", "not-a-cidr");
        assert_ne!(
            broken, text,
            "the fixture names the pod subnet 10.244.0.0/16"
        );
        std::fs::write(&path, &broken).unwrap();
        let err = talos_validate(Judge::Machinery, &path).unwrap_err();
        assert!(err.contains("not-a-cidr") || err.contains("CIDR"), "{err}");
    }
}

/// A render with a machine patch (the kind users write) passes too.
#[test]
fn a_patched_render_passes_talos_metal_validation() {
    let dir = tempfile::tempdir().unwrap();
    let live = on_metal(&fixtures::talos("stability-v1.12/base-controlplane.yaml"));
    let spec = cluster(CniPreset::Cilium, KubeProxyMode::Replaced);
    let m = machine(
        MachineRole::Controlplane,
        &[(
            "network",
            "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\ncluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n",
        )],
    );
    let out = render(&spec, &m, &live, true, None);
    let path = dir.path().join("patched.yaml");
    std::fs::write(&path, out.yaml().unwrap()).unwrap();
    talos_validate(Judge::Talosctl, &path).unwrap();
    assert!(!out.yaml().unwrap().contains("PodSecurity"));
}
