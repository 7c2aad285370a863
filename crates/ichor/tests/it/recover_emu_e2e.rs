//! `ichor recover`, the binary, against an emulated control plane that
//! trusts the backup's bundle (its Talos API over mutual TLS): refused while
//! etcd runs there; once etcd is lost, the snapshot reaches the node whole
//! through `EtcdRecover`, and runs killed (SIGKILL) right after each phase
//! and run again send exactly one `Bootstrap` — the emulator's own count.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;

use ichor_backup::crypt::Recipients;
use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_talos::config::MachineConfig;
use ichor_talos::secrets::SecretsBundle;
use ichor_testenv::s3::S3Server;

use crate::common::text;
use crate::recover_cli::{keygen, recover_with, snapshot, store, take_backup};

fn fixture(rel: &str) -> String {
    let path = ichor_testenv::fixtures::talos_dir().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Covers: R20.16, R20.17, R20.18
#[tokio::test(flavor = "multi_thread")]
async fn recover_refuses_a_running_etcd_then_bootstraps_once_across_kills() {
    let cp = fixture("stability-v1.12/base-controlplane.yaml");
    let bundle =
        SecretsBundle::from_machine_config(&MachineConfig::parse(&cp).unwrap(), "fixture").unwrap();
    let (ca, key) = bundle.os_ca_pem().unwrap();
    let key = ichor_talos::pem::relabel(&key, "PRIVATE KEY").unwrap_or(key);
    let emu = Emulator::start_with(
        vec![NodeSpec::new("cp-1", cp.into_bytes()).with_address(IpAddr::from([127, 0, 14, 1]))],
        EmulatorOptions {
            pki: Some(Pki::from_pem(&ca, &key).unwrap()),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    let address = emu.endpoint(0);

    let s3 = S3Server::start().expect("the S3 server starts");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (identity, recipient) = keygen(dir.path(), "backup.key");
    let recipients = Recipients::parse(&[recipient]).unwrap();
    let bundle_yaml = bundle.to_yaml().unwrap();
    let store = store(&s3);
    take_backup(
        &store,
        &recipients,
        "lab",
        1,
        bundle_yaml.as_bytes(),
        &address,
    )
    .await;

    let out_dir = dir.path().join("out");
    let out = out_dir.to_str().unwrap();
    let args = [
        "--cluster",
        "lab",
        "--identity",
        identity.to_str().unwrap(),
        "--out",
        out,
        "--yes",
        "--etcd-timeout",
        "6s",
    ];

    // etcd runs on the control plane: refused, nothing written.
    emu.admin_client(0).unwrap().bootstrap("").await.unwrap();
    let o = recover_with(&s3, &home, &args, &[]);
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("etcd runs on control plane"), "{said}");
    assert!(said.contains("nothing was written"), "{said}");
    assert!(!out_dir.exists());

    emu.lose_etcd();
    let before = emu.bootstrap_calls(0);
    // Off a terminal and without --yes: no consent, nothing written.
    let no_yes: Vec<&str> = args.iter().copied().filter(|a| *a != "--yes").collect();
    let o = recover_with(&s3, &home, &no_yes, &[]);
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("asks for consent on a terminal"), "{said}");
    assert!(!out_dir.exists(), "{said}");
    for phase in ["planned", "files", "uploaded", "bootstrapped"] {
        let o = recover_with(&s3, &home, &args, &[("ICHOR_RECOVER_KILL_AFTER", phase)]);
        assert_eq!(
            o.status.signal(),
            Some(9),
            "killed after {phase}: {}",
            text(&o)
        );
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out_dir.join("recover-state.json")).unwrap())
                .unwrap();
        assert_eq!(state["phase"], phase, "{state}");
    }
    assert_eq!(
        emu.bootstrap_calls(0),
        before + 1,
        "one Bootstrap across the killed runs"
    );
    // The snapshot reached the node whole, decrypted as it streamed.
    assert!(
        std::fs::read(emu.etcd_snapshot_path(0)).unwrap() == snapshot(),
        "the node holds the snapshot byte for byte"
    );
    for f in [
        "secrets.yaml",
        "talosconfig",
        "objects.yaml",
        "recover-state.json",
    ] {
        let mode = std::fs::metadata(out_dir.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // The emulator has no etcd to restore here: etcd keeps waiting, and a
    // rerun waits for it, bounded, without a second Bootstrap.
    let o = recover_with(&s3, &home, &args, &[]);
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("is not healthy after"), "{said}");
    assert!(said.contains("run it again to continue"), "{said}");
    assert_eq!(emu.bootstrap_calls(0), before + 1, "{said}");
    // No secret on the way.
    let key_text = std::fs::read_to_string(&identity).unwrap();
    for line in key_text.lines().filter(|l| l.starts_with("AGE-SECRET-KEY")) {
        assert!(!said.contains(line));
    }
}
