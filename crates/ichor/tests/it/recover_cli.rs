//! `ichor recover`, the binary, from a fresh environment (only PATH, an
//! empty HOME and the bucket's credentials) against the real S3 server and
//! identities made by the reference `age-keygen`: every refusal leaves
//! `--out` unwritten, names what failed, and prints no secret.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use chrono::{TimeZone as _, Utc};
use ichor_backup::crypt::{PartDigest, Recipients, encrypt};
use ichor_backup::manifest::{ClusterRef, Layout, Part, Reason};
use ichor_backup::store::{Destination, S3Destination, Store};
use ichor_backup::take::{Inputs, take};
use ichor_testenv::s3::S3Server;
use ichor_testenv::tools::Tool;

use crate::common::text;

pub(crate) const PREFIX: &str = "recover";

/// An age identity made by the reference `age-keygen`, and its recipient.
pub(crate) fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new(Tool::AgeKeygen.path())
        .arg("-o")
        .arg(&path)
        .output()
        .expect("age-keygen runs");
    assert!(out.status.success(), "age-keygen: {}", text(&out));
    let out = Command::new(Tool::AgeKeygen.path())
        .arg("-y")
        .arg(&path)
        .output()
        .expect("age-keygen -y runs");
    (
        path,
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    )
}

/// A database of whole pages, then its sha256: what etcd streams.
pub(crate) fn snapshot() -> Vec<u8> {
    let db: Vec<u8> = (0..512 * 40).map(|i| (i * 7 % 251) as u8).collect();
    let mut s = db.clone();
    s.extend_from_slice(&PartDigest::of(&db).sha256);
    s
}

pub(crate) fn store(s3: &S3Server) -> Store {
    Store::open(&Destination::S3(S3Destination {
        endpoint: Some(s3.endpoint()),
        bucket: s3.bucket().to_string(),
        prefix: PREFIX.into(),
        region: s3.region().to_string(),
        access_key_id: s3.access_key_id().to_string(),
        secret_access_key: s3.secret_access_key().to_string(),
        allow_http: true,
    }))
    .unwrap()
}

/// The objects of cluster `cluster` with one control plane at `address`.
fn objects(cluster: &str, address: &str) -> Vec<u8> {
    format!(
        "---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosCluster\nmetadata:\n  name: {cluster}\n  namespace: default\nspec: {{}}\n---\napiVersion: ichor.maesh.dev/v1alpha1\nkind: TalosMachine\nmetadata:\n  name: cp-1\n  namespace: default\nspec:\n  clusterRef: {{name: {cluster}}}\n  role: controlplane\n  address: \"{address}\"\n"
    )
    .into_bytes()
}

pub(crate) async fn take_backup(
    store: &Store,
    recipients: &Recipients,
    cluster: &str,
    hour: u32,
    bundle: &[u8],
    address: &str,
) -> String {
    let started = Utc.with_ymd_and_hms(2026, 12, 2, hour, 0, 0).unwrap();
    let name = ichor_backup::manifest::backup_name(cluster, started, None);
    let s = snapshot();
    let chunks: Vec<Result<Bytes, std::io::Error>> = s
        .chunks(1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    take(
        store,
        &Layout::new(""),
        recipients,
        Inputs {
            cluster: ClusterRef {
                name: cluster.into(),
                uid: "uid-1".into(),
            },
            backup: name.clone(),
            reason: Reason::Manual,
            started,
            talos_version: "v1.13.0".into(),
            kubernetes_version: "v1.36.0".into(),
            member: "cp-1".into(),
            revision: 42,
            bundle: bundle.to_vec(),
            objects: objects(cluster, address),
        },
        futures::stream::iter(chunks),
        Utc::now,
    )
    .await
    .expect("the backup is taken");
    name
}

async fn put(store: &Store, key: &str, sealed: Vec<u8>) {
    let chunk: Result<Bytes, std::io::Error> = Ok(Bytes::from(sealed));
    store
        .upload(key, futures::stream::iter([chunk]))
        .await
        .unwrap();
}

/// Runs the binary with nothing of this machine's environment but PATH and
/// an empty HOME, and the bucket's credentials.
fn recover(s3: &S3Server, home: &Path, args: &[&str]) -> Output {
    recover_with(s3, home, args, &[])
}

/// [`recover`] with more of the environment (the test hook).
pub(crate) fn recover_with(
    s3: &S3Server,
    home: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ichor"))
        .env_clear()
        .envs(env.iter().copied())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("AWS_ACCESS_KEY_ID", s3.access_key_id())
        .env("AWS_SECRET_ACCESS_KEY", s3.secret_access_key())
        .arg("recover")
        .args([
            "--endpoint",
            &s3.endpoint(),
            "--allow-http",
            "--bucket",
            s3.bucket(),
            "--region",
            s3.region(),
            "--prefix",
            PREFIX,
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ichor runs")
}

/// Covers: R20.18, R20.15, R20.16
#[tokio::test(flavor = "multi_thread")]
async fn recover_refuses_bad_backups_and_unreachable_nodes_with_nothing_written() {
    let s3 = S3Server::start().expect("the S3 server starts");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (identity, recipient) = keygen(dir.path(), "backup.key");
    let (stranger, _) = keygen(dir.path(), "stranger.key");
    let recipients = Recipients::parse(&[recipient]).unwrap();
    let bundle = ichor_talos::secrets::SecretsBundle::generate()
        .unwrap()
        .to_yaml()
        .unwrap();
    let store = store(&s3);
    // A closed port: the control plane cannot be reached.
    let address = format!("127.0.0.1:{}", ichor_testenv::free_port());
    let good = take_backup(&store, &recipients, "lab", 1, bundle.as_bytes(), &address).await;
    let corrupt = take_backup(&store, &recipients, "lab", 2, bundle.as_bytes(), &address).await;
    let raw = take_backup(&store, &recipients, "lab", 3, bundle.as_bytes(), &address).await;
    let other = take_backup(&store, &recipients, "other", 4, bundle.as_bytes(), &address).await;
    let layout = Layout::new("");

    // One byte of the corrupt backup's snapshot changed, sealed again.
    let mut flipped = snapshot();
    flipped[700] ^= 1;
    put(
        &store,
        &layout.key("lab", &corrupt, Part::EtcdSnapshot),
        encrypt(&recipients, &flipped).unwrap(),
    )
    .await;
    // The raw backup holds a copy of the database without its trailer, and
    // a manifest that records that copy.
    let s = snapshot();
    let copy = &s[..s.len() - 32];
    put(
        &store,
        &layout.key("lab", &raw, Part::EtcdSnapshot),
        encrypt(&recipients, copy).unwrap(),
    )
    .await;
    let reader = ichor_backup::restore::Reader::new(
        store.clone(),
        std::sync::Arc::new(
            ichor_backup::crypt::Identities::parse(&std::fs::read_to_string(&identity).unwrap())
                .unwrap(),
        ),
        "lab",
    );
    let mut m = reader.manifest(&raw).await.unwrap();
    let d = PartDigest::of(copy);
    for p in m.parts.iter_mut().filter(|p| p.name == Part::EtcdSnapshot) {
        p.size = d.size;
        p.sha256 = d.sha256_hex();
    }
    m.etcd.sha256 = d.sha256_hex();
    put(
        &store,
        &layout.key("lab", &raw, Part::Manifest),
        encrypt(&recipients, &m.to_json()).unwrap(),
    )
    .await;

    let id = identity.to_str().unwrap();
    let out_dir = dir.path().join("out");
    let out = out_dir.to_str().unwrap();
    let secrets = [
        std::fs::read_to_string(&identity).unwrap(),
        s3.secret_access_key().to_string(),
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--cluster",
                "lab",
                "--backup",
                &good,
                "--identity",
                stranger.to_str().unwrap(),
            ],
            "the identity cannot open its manifest",
        ),
        (
            vec!["--cluster", "lab", "--backup", &other, "--identity", id],
            "is not a backup name of cluster lab",
        ),
        (
            vec!["--cluster", "lab", "--backup", &corrupt, "--identity", id],
            "its etcd snapshot is",
        ),
        (
            vec!["--cluster", "lab", "--backup", &raw, "--identity", id],
            "has no sha256 trailer",
        ),
        // Past the snapshot's checks: the control plane cannot be reached.
        (
            vec![
                "--cluster",
                "lab",
                "--backup",
                &raw,
                "--skip-hash-check",
                "--identity",
                id,
            ],
            "cannot be reached with the backup's credentials",
        ),
        // The newest complete backup by default: the raw one, refused.
        (
            vec!["--cluster", "lab", "--identity", id],
            "has no sha256 trailer",
        ),
        (
            vec!["--cluster", "nobody", "--identity", id],
            "has no complete backup",
        ),
    ];
    for (args, says) in cases {
        let mut all = args.clone();
        all.extend(["--out", out, "--yes"]);
        let o = recover(&s3, &home, &all);
        let said = text(&o);
        assert!(!o.status.success(), "{args:?} is refused: {said}");
        assert!(said.contains(says), "{args:?} says {says:?}: {said}");
        assert!(
            said.contains("nothing was written"),
            "{args:?} says nothing was written: {said}"
        );
        assert!(!out_dir.exists(), "{args:?} wrote nothing: {said}");
        for secret in &secrets {
            for line in secret.lines().filter(|l| l.len() > 20) {
                assert!(!said.contains(line.trim()), "{args:?} prints no secret");
            }
        }
        for line in bundle
            .lines()
            .filter(|l| l.contains("key:") || l.contains("secret:"))
        {
            if let Some((_, v)) = line.split_once(':') {
                let v = v.trim();
                if v.len() > 20 {
                    assert!(!said.contains(v), "{args:?} prints no bundle secret");
                }
            }
        }
    }
}

/// Covers: R20.18
#[test]
fn recover_help_teaches_the_phases_and_the_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["recover", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--identity",
        "--backup",
        "--skip-hash-check",
        "--nodes",
        "--etcd-timeout",
        "EtcdRecover",
        "Bootstrap{recover_etcd}",
        "recover-state.json",
        "AWS_ACCESS_KEY_ID",
    ] {
        assert!(help.contains(word), "--help names {word}: {help}");
    }
}
