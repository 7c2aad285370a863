//! The pieces together: an emulator whose CA is the OS CA of a real secrets
//! bundle, a talosconfig generated from that bundle by `ichor-talos`, read
//! back by `ichor-talos`, used by our client and by the real talosctl.

use std::time::Duration;

use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};
use ichor_testenv::Tool;

async fn emulator_with_bundle_ca() -> (Emulator, SecretsBundle) {
    let path = crate::common::fixtures_dir().join("stability-secrets.yaml");
    let bundle = SecretsBundle::from_file(&path).unwrap();
    let (ca, key) = bundle.os_ca_pem().expect("the bundle has an OS CA");
    let pki = Pki::from_pem(&ca, &key).unwrap();
    let emu = Emulator::start_with(
        vec![NodeSpec::new("base-cp-1", crate::common::cp_v112())],
        EmulatorOptions {
            pki: Some(pki),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    (emu, bundle)
}

fn client_from(cfg: &Talosconfig) -> TalosClient {
    let (name, ctx) = cfg.context(None, "generated").unwrap();
    let creds = ctx.credentials(name, "generated").unwrap();
    let identity = ClientIdentity::from_pem(
        creds.ca_pem.unwrap(),
        creds.crt_pem.unwrap(),
        creds.key_pem.unwrap(),
    );
    let endpoint = &ctx.require_endpoints(name, "generated").unwrap()[0];
    TalosClient::new(endpoint, &identity, ClientOptions::default()).unwrap()
}

/// An admin talosconfig generated from the bundle works for our client and
/// for talosctl; a reader one cannot read the machine config.
#[tokio::test(flavor = "multi_thread")]
async fn talosconfig_from_bundle_against_the_emulator() {
    let (emu, bundle) = emulator_with_bundle_ca().await;
    let endpoints = vec![emu.endpoint(0)];
    let nodes = vec!["127.0.0.1".to_string()];
    let day = Duration::from_secs(24 * 3600);
    let admin =
        Talosconfig::generate(&bundle, "base", &endpoints, &nodes, Role::Admin, day).unwrap();

    let c = client_from(&admin);
    assert_eq!(
        c.machine_config("127.0.0.1").await.unwrap(),
        crate::common::cp_v112()
    );

    let reader =
        Talosconfig::generate(&bundle, "base", &endpoints, &nodes, Role::Reader, day).unwrap();
    let r = client_from(&reader);
    assert_eq!(r.version("").await.unwrap().tag, "v1.13.9");
    assert!(
        r.machine_config("")
            .await
            .unwrap_err()
            .is_permission_denied()
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("talosconfig");
    admin.write_file(&path).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(Tool::Talosctl.path())
            .arg("--talosconfig")
            .arg(&path)
            .args(["get", "machinetype", "-o", "yaml"])
            .env_remove("TALOSCONFIG")
            .env("HOME", dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("spec: controlplane"), "{stdout}\n{stderr}");
    assert!(emu.writes().is_empty());
}
