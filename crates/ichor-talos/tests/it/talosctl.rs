//! What this crate writes, checked by the real `talosctl` (built by
//! `tools/testbin.sh`): configs we serialise pass Talos's own validator, a
//! bundle we generate is accepted by `talosctl gen config`, and our bundle
//! recovery agrees with `talosctl gen secrets --from-controlplane-config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use ichor_talos::config::{CniName, MachineConfig};
use ichor_talos::patch::ConfigPatch;
use ichor_talos::secrets::{SecretsBundle, SecretsError};
use ichor_talos::talosconfig::{DEFAULT_CERT_VALIDITY, Role, Talosconfig};
use ichor_testenv::Tool;
use serde_yaml_ng::Value;

fn fixtures() -> PathBuf {
    ichor_testenv::fixtures::talos_dir()
}

fn talosctl(args: &[&str]) -> String {
    let out = Command::new(Tool::Talosctl.path())
        .args(args)
        .output()
        .expect("talosctl runs");
    assert!(
        out.status.success(),
        "talosctl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn validate(path: &Path, mode: &str) {
    talosctl(&[
        "validate",
        "--config",
        path.to_str().unwrap(),
        "--mode",
        mode,
    ]);
}

fn value(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// Configs we serialise from the v1.12 fixtures pass `talosctl validate`
/// (container mode: the fixtures name no install disk, which metal mode requires).
#[test]
fn serialised_fixtures_pass_the_talos_validator() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "base-controlplane.yaml",
        "base-worker.yaml",
        "overrides-controlplane.yaml",
        "overrides-worker.yaml",
    ] {
        let cfg = MachineConfig::from_file(&fixtures().join("stability-v1.12").join(name)).unwrap();
        let out = dir.path().join(name);
        std::fs::write(&out, cfg.to_yaml().unwrap()).unwrap();
        validate(&out, "container");
    }
}

/// Covers: R6.2, R1.3b, R1.3d
///
/// A bundle we generate → `talosctl gen config --with-secrets` accepts it;
/// our recovery from the generated control-plane config gives our bundle back
/// and agrees with `talosctl gen secrets --from-controlplane-config`; the
/// generated configs, re-serialised and patched by us, pass `talosctl validate
/// --mode metal`; talosctl's talosconfig reads with ours, and ours reads with
/// talosctl.
#[test]
fn generated_bundle_round_trips_through_talosctl() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let bundle = SecretsBundle::generate().unwrap();
    bundle.write_file(&d("secrets.yaml")).unwrap();
    let out_dir = d("out");
    talosctl(&[
        "gen",
        "config",
        "lab",
        "https://10.5.0.2:6443",
        "--with-secrets",
        d("secrets.yaml").to_str().unwrap(),
        "--install-disk",
        "/dev/vda",
        "-o",
        out_dir.to_str().unwrap(),
    ]);
    let cp_path = out_dir.join("controlplane.yaml");
    let cp = MachineConfig::from_file(&cp_path).unwrap();
    let facts = cp.facts();
    assert_eq!(facts.cni, Some(CniName::Flannel));
    assert!(facts.kube_prism.enabled);
    assert_eq!(facts.kube_prism.port, Some(7445));
    assert_eq!(facts.install_disk.as_deref(), Some("/dev/vda"));
    assert_eq!(facts.pod_subnets, vec!["10.244.0.0/16"]);

    // recovery gives our bundle back, and agrees with talosctl's own recovery
    let recovered = SecretsBundle::from_config_file(&cp_path).unwrap();
    assert_eq!(
        value(&recovered.to_yaml().unwrap()),
        value(&bundle.to_yaml().unwrap())
    );
    talosctl(&[
        "gen",
        "secrets",
        "--from-controlplane-config",
        cp_path.to_str().unwrap(),
        "-o",
        d("theirs.yaml").to_str().unwrap(),
    ]);
    let theirs = SecretsBundle::from_file(&d("theirs.yaml")).unwrap();
    assert_eq!(
        value(&theirs.to_yaml().unwrap()),
        value(&recovered.to_yaml().unwrap())
    );
    let worker = SecretsBundle::from_config_file(&out_dir.join("worker.yaml")).unwrap_err();
    assert!(
        matches!(worker, SecretsError::WorkerConfig { .. }),
        "{worker}"
    );

    // our serialisation and our patches give configs Talos accepts
    std::fs::write(d("ours.yaml"), cp.to_yaml().unwrap()).unwrap();
    validate(&d("ours.yaml"), "metal");
    let patch = ConfigPatch::parse(
        "cluster:\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: true\n  inlineManifests:\n    - name: cilium\n      contents: |\n        apiVersion: v1\n        kind: Namespace\n        metadata:\n          name: cilium-test\n",
        "no-cni patch",
    )
    .unwrap();
    let patched = patch.apply(&cp, "no-cni patch").unwrap();
    assert_eq!(patched.facts().cni, Some(CniName::None));
    assert_eq!(patched.facts().kube_proxy_enabled, Some(false));
    std::fs::write(d("patched.yaml"), patched.to_yaml().unwrap()).unwrap();
    validate(&d("patched.yaml"), "metal");

    // talosctl's talosconfig reads with ours
    let theirs_tc = Talosconfig::from_file(&out_dir.join("talosconfig")).unwrap();
    let (name, ctx) = theirs_tc.context(None, "talosconfig").unwrap();
    assert_eq!(name, "lab");
    let creds = ctx.credentials(name, "talosconfig").unwrap();
    assert_eq!(creds.ca_pem, bundle.os_ca_pem().map(|(c, _)| c));
    assert!(
        creds
            .key_pem
            .unwrap()
            .starts_with("-----BEGIN ED25519 PRIVATE KEY-----")
    );

    // ours reads with talosctl
    let ours_tc = Talosconfig::generate(
        &bundle,
        "ichor",
        &["10.5.0.2".to_string()],
        &["10.5.0.3".to_string()],
        Role::Admin,
        DEFAULT_CERT_VALIDITY,
    )
    .unwrap();
    ours_tc.write_file(&d("talosconfig")).unwrap();
    let info = talosctl(&[
        "--talosconfig",
        d("talosconfig").to_str().unwrap(),
        "config",
        "info",
    ]);
    assert!(
        info.contains("ichor") && info.contains("10.5.0.2") && info.contains("os:admin"),
        "{info}"
    );
}
