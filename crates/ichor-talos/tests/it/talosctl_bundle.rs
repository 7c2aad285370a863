//! Secrets bundles validated as Talos validates them: each kind of defect,
//! given to the real `talosctl gen config --with-secrets` (tools cache) and
//! to Ichor's bundle parser, is refused by both, each naming the field.
//!
//! Covers: the bundle check of ADR 0009

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use ichor_talos::secrets::{SecretsBundle, SecretsError};
use ichor_testenv::Tool;
use serde_yaml_ng::{Mapping, Value};

fn fixture_bundle() -> Mapping {
    serde_yaml_ng::from_str(&ichor_testenv::fixtures::talos("stability-secrets.yaml")).unwrap()
}

fn section<'a>(b: &'a mut Mapping, path: &[&str]) -> &'a mut Mapping {
    let mut cur = b;
    for k in path {
        cur = cur.get_mut(*k).unwrap().as_mapping_mut().unwrap();
    }
    cur
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// What `talosctl gen config --with-secrets` says of a bundle: `Ok` or its error text.
fn talosctl_gen_config(dir: &Path, bundle: &str) -> Result<(), String> {
    let file = dir.join("secrets.yaml");
    std::fs::write(&file, bundle).unwrap();
    let out_dir: PathBuf = dir.join("out");
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = Command::new(Tool::Talosctl.path())
        .args([
            "gen",
            "config",
            "lab",
            "https://10.5.0.2:6443",
            "--with-secrets",
        ])
        .arg(&file)
        .arg("-o")
        .arg(&out_dir)
        .output()
        .expect("talosctl runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn ichor_fields(bundle: &str) -> Result<Vec<String>, String> {
    match SecretsBundle::parse(bundle, "secrets.yaml") {
        Ok(_) => Ok(vec![]),
        Err(SecretsError::Invalid { problems, .. }) => {
            Ok(problems.into_iter().map(|p| p.field).collect())
        }
        Err(other) => Err(ichor_api::error_text::chain(&other)),
    }
}

/// One defect: both refuse; talosctl's error says `talos_says`, Ichor names `ichor_field`.
fn assert_both_refuse(edit: impl FnOnce(&mut Mapping), talos_says: &str, ichor_field: &str) {
    let mut b = fixture_bundle();
    edit(&mut b);
    let text = serde_yaml_ng::to_string(&b).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let theirs = talosctl_gen_config(dir.path(), &text).expect_err("talosctl refuses the bundle");
    assert!(theirs.contains(talos_says), "talosctl said: {theirs}");
    let ours = ichor_fields(&text).unwrap();
    assert_eq!(
        ours,
        vec![ichor_field.to_string()],
        "talosctl said: {theirs}"
    );
    let msg = SecretsBundle::parse(&text, "secrets.yaml")
        .unwrap_err()
        .to_string();
    assert!(msg.contains(ichor_field), "{msg}");
}

/// The bundle both accept: the fixture, unchanged.
#[test]
fn the_fixture_bundle_is_accepted_by_both() {
    let text = serde_yaml_ng::to_string(&fixture_bundle()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    talosctl_gen_config(dir.path(), &text).unwrap();
    assert_eq!(ichor_fields(&text).unwrap(), Vec::<String>::new());
}

#[test]
fn no_cluster_secret() {
    assert_both_refuse(
        |b| {
            section(b, &["cluster"]).shift_remove("secret");
        },
        "cluster.secret is required",
        "cluster.secret",
    );
}

#[test]
fn neither_encryption_secret() {
    assert_both_refuse(
        |b| {
            section(b, &["secrets"]).shift_remove("secretboxencryptionsecret");
        },
        "one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is required",
        "secrets.secretboxencryptionsecret",
    );
}

#[test]
fn both_encryption_secrets() {
    assert_both_refuse(
        |b| {
            let s = section(b, &["secrets"]);
            let sb = s["secretboxencryptionsecret"].clone();
            s.insert("aescbcencryptionsecret".into(), sb);
        },
        "only one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is allowed",
        "secrets.aescbcencryptionsecret",
    );
}

#[test]
fn no_trustdinfo() {
    assert_both_refuse(
        |b| {
            b.shift_remove("trustdinfo");
        },
        "trustdinfo is required",
        "trustdinfo.token",
    );
}

#[test]
fn a_certificate_whose_pem_does_not_parse() {
    assert_both_refuse(
        |b| {
            section(b, &["certs", "k8s"]).insert(
                "crt".into(),
                Value::from(b64(
                    "-----BEGIN CERTIFICATE-----\nthis is not base64 !!\n-----END CERTIFICATE-----\n",
                )),
            );
        },
        "certs.k8s is invalid",
        "certs.k8s.crt",
    );
}

#[test]
fn a_missing_aggregator_ca() {
    assert_both_refuse(
        |b| {
            section(b, &["certs"]).shift_remove("k8saggregator");
        },
        "certs.k8saggregator is required",
        "certs.k8saggregator",
    );
}

/// The OS CA's key labelled Ed25519 but holding a P-256 key.
#[test]
fn a_private_key_of_the_wrong_type() {
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let pem = ichor_talos::pem::encode("ED25519 PRIVATE KEY", &p256.serialize_der());
    assert_both_refuse(
        |b| {
            section(b, &["certs", "os"]).insert("key".into(), Value::from(b64(&pem)));
        },
        "certs.os is invalid",
        "certs.os.key",
    );
}

/// A service-account key with a PEM label Talos does not read.
#[test]
fn a_service_account_key_with_an_unknown_label() {
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let pem = ichor_talos::pem::encode("DSA PRIVATE KEY", &p256.serialize_der());
    assert_both_refuse(
        |b| {
            section(b, &["certs", "k8sserviceaccount"])
                .insert("key".into(), Value::from(b64(&pem)));
        },
        "certs.k8sserviceaccount.key is invalid",
        "certs.k8sserviceaccount.key",
    );
}

/// Every defect at once: both report all of them, Ichor in one error.
#[test]
fn every_defect_at_once_is_reported_at_once() {
    let mut b = fixture_bundle();
    section(&mut b, &["cluster"]).shift_remove("secret");
    section(&mut b, &["secrets"]).shift_remove("secretboxencryptionsecret");
    b.shift_remove("trustdinfo");
    section(&mut b, &["certs"]).shift_remove("k8saggregator");
    section(&mut b, &["certs", "k8s"]).insert("crt".into(), Value::from(b64("not pem")));
    let text = serde_yaml_ng::to_string(&b).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let theirs = talosctl_gen_config(dir.path(), &text).unwrap_err();
    for says in [
        "cluster.secret",
        "secrets.secretboxencryptionsecret",
        "trustdinfo",
        "certs.k8saggregator",
        "certs.k8s is invalid",
    ] {
        assert!(theirs.contains(says), "talosctl said: {theirs}");
    }
    assert_eq!(
        ichor_fields(&text).unwrap(),
        vec![
            "cluster.secret",
            "secrets.secretboxencryptionsecret",
            "trustdinfo.token",
            "certs.k8s.crt",
            "certs.k8saggregator",
        ]
    );
}
