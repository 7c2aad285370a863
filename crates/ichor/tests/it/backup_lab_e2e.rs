//! Backups on the lab, after `ichor adopt` on three control planes.
//!
//! What Ichor did: the controller `ichor adopt` installed (its Deployment,
//! under its own ServiceAccount) took the scheduled backups — it read a
//! healthy etcd member through the Talos API, streamed its snapshot through
//! the check and age into the S3 server, and applied the retention. What the
//! lab played: the Talos nodes (the emulator streams a real snapshot of the
//! lab's real etcd, as Talos streams its member's), and the S3-compatible
//! server (versitygw, built from its published module). The judges are
//! independent: the reference `age` decrypts the objects with the identity
//! (and refuses another identity), and `etcdutl snapshot status` reads the
//! snapshot inside.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use ichor_api::backup::{BackupPhase, BackupReason, TalosBackup};
use ichor_api::operation::{MachineStep, OperationPhase};
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use ichor_backup::store::{Destination, S3Destination, Store};
use ichor_testenv::Tool;
use ichor_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use crate::common::{LabHarness, NS, run, text};

/// An age identity made by the reference `age-keygen`, and its recipient.
fn keygen(dir: &Path, name: &str) -> (std::path::PathBuf, String) {
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

async fn succeeded_scheduled(api: &Api<TalosBackup>) -> Vec<TalosBackup> {
    let mut list: Vec<TalosBackup> = api
        .list(&ListParams::default())
        .await
        .expect("list TalosBackups")
        .items
        .into_iter()
        .filter(|b| b.spec.reason == BackupReason::Schedule)
        .filter(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.phase == BackupPhase::Succeeded)
        })
        .collect();
    list.sort_by_key(|b| b.metadata.name.clone());
    list
}

async fn download(store: &Store, key: &str, to: &Path) {
    let bytes: Vec<bytes::Bytes> = store
        .get(key)
        .await
        .expect("get")
        .try_collect()
        .await
        .expect("read");
    std::fs::write(to, bytes.concat()).unwrap();
}

/// Covers: R13.1, R13.3, R13.7
#[tokio::test(flavor = "multi_thread")]
async fn scheduled_backups_land_in_s3_readable_only_with_the_identity() {
    let h = LabHarness::up(|o| {
        o.nodes = 3;
        o.control_planes = 3;
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let client = h.client().await;
    let s3 = S3Server::start().expect("the S3 server starts");

    // The credentials, in Ichor's namespace; the identity stays here.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "backup-s3", "namespace": NS},
        "stringData": {"accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the credentials Secret");
    let (identity, recipient) = keygen(h.dir.path(), "backup.key");
    let (stranger, _) = keygen(h.dir.path(), "stranger.key");

    let clusters = Api::<TalosCluster>::namespaced(client.clone(), NS);
    clusters
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"backup": {
                "destination": {"s3": {
                    "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": "lab-backups",
                    "region": s3.region(), "allowHttp": true,
                    "credentialsSecretRef": {"name": "backup-s3"}}},
                "recipients": [recipient],
                "schedule": {"cron": "* * * * *"},
                "retention": {"keepLast": 2}
            }}})),
        )
        .await
        .expect("the backup spec is accepted");

    // Three scheduled runs, a minute apart; retention keeps two.
    let backups = Api::<TalosBackup>::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(330);
    let mut seen = std::collections::BTreeSet::new();
    loop {
        for b in succeeded_scheduled(&backups).await {
            seen.insert(b.metadata.name.clone().unwrap());
        }
        if seen.len() >= 3 {
            break;
        }
        let failed: Vec<String> = backups
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.phase == BackupPhase::Failed)
            })
            .map(|b| {
                format!(
                    "{:?}: {:?}",
                    b.metadata.name,
                    b.status.and_then(|s| s.message)
                )
            })
            .collect();
        assert!(
            failed.is_empty(),
            "backups failed: {failed:?}\n{}",
            h.logs()
        );
        assert!(
            Instant::now() < deadline,
            "three scheduled backups did not succeed in time (saw {seen:?})\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // Retention runs on the schedule's next tick.
    let deadline = Instant::now() + Duration::from_secs(60);
    let kept = loop {
        let kept = succeeded_scheduled(&backups).await;
        if kept.len() == 2 || Instant::now() > deadline {
            break kept;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert_eq!(kept.len(), 2, "keepLast 2 keeps two: {kept:?}");
    let oldest = seen.iter().next().unwrap().clone();
    assert!(
        kept.iter()
            .all(|b| b.metadata.name.as_deref() != Some(&oldest)),
        "the oldest ({oldest}) is the one deleted"
    );

    let store = Store::open(&Destination::S3(S3Destination {
        endpoint: Some(s3.endpoint()),
        bucket: s3.bucket().to_string(),
        prefix: "lab-backups".into(),
        region: s3.region().to_string(),
        access_key_id: s3.access_key_id().to_string(),
        secret_access_key: s3.secret_access_key().to_string(),
        allow_http: true,
    }))
    .unwrap();
    let keys: Vec<String> = store
        .list("lab")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert!(
        !keys.iter().any(|k| k.contains(&oldest)),
        "the deleted backup's objects are gone: {keys:?}"
    );

    // The newest backup, read as a person with the identity would.
    let newest = kept.last().unwrap();
    let status = newest.status.clone().unwrap();
    assert!(status.verified);
    let etcd = status.etcd.clone().expect("etcd facts");
    assert_eq!(status.parts.len(), 3, "{:?}", status.parts);
    let snapshot_key = &status
        .parts
        .iter()
        .find(|p| p.key.ends_with("etcd.snapshot.age"))
        .expect("the snapshot part")
        .key;
    let sealed = h.dir.path().join("etcd.snapshot.age");
    download(&store, snapshot_key, &sealed).await;
    let plain = h.dir.path().join("etcd.snapshot");
    let out = Command::new(Tool::Age.path())
        .args(["-d", "-i"])
        .arg(&identity)
        .arg("-o")
        .arg(&plain)
        .arg(&sealed)
        .output()
        .unwrap();
    assert!(out.status.success(), "age -d: {}", text(&out));
    let out = Command::new(Tool::Age.path())
        .args(["-d", "-i"])
        .arg(&stranger)
        .arg(&sealed)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "another identity cannot read the backup"
    );

    let out = Command::new(Tool::Etcdutl.path())
        .args(["snapshot", "status", "-w", "json"])
        .arg(&plain)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdutl snapshot status: {}",
        text(&out)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let revision = st["revision"].as_i64().unwrap();
    assert!(
        revision >= etcd.revision.unwrap_or(0),
        "the snapshot's revision {revision} is at least the one recorded before it ({:?})",
        etcd.revision
    );
    assert_eq!(
        std::fs::metadata(&plain).unwrap().len(),
        etcd.db_size as u64 + 32,
        "the snapshot is the database and its 32-byte trailer"
    );

    // The manifest: what it is of, readable with the identity only.
    let manifest_key = format!(
        "{}manifest.json.age",
        snapshot_key.trim_end_matches("etcd.snapshot.age")
    );
    let sealed = h.dir.path().join("manifest.json.age");
    download(&store, &manifest_key, &sealed).await;
    let out = Command::new(Tool::Age.path())
        .args(["-d", "-i"])
        .arg(&identity)
        .arg(&sealed)
        .output()
        .unwrap();
    assert!(out.status.success(), "age -d manifest: {}", text(&out));
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(manifest["cluster"]["name"], "lab");
    assert_eq!(manifest["reason"], "schedule");
    assert_eq!(manifest["etcd"]["sha256"], etcd.sha256.as_str());

    operations_take_their_backup_first(&h, &client).await;
}

async fn operation(client: &kube::Client, name: &str) -> TalosOperation {
    Api::<TalosOperation>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .expect("read the operation")
}

fn upgrade(name: &str) -> TalosOperation {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"kind": "talos-upgrade", "version": "v1.14.0",
            "target": {"clusterRef": {"name": "lab"}}}
    }))
    .unwrap()
}

/// A talos-upgrade on a cluster with a backup destination: with the
/// destination's credentials gone, its backup fails and it stops with no
/// node touched; with them back, it waits for its backup, then starts the
/// first control plane only after the backup succeeded.
/// (Part of the test above: one lab.)
async fn operations_take_their_backup_first(h: &LabHarness, client: &kube::Client) {
    let ops = Api::<TalosOperation>::namespaced(client.clone(), NS);
    let backups = Api::<TalosBackup>::namespaced(client.clone(), NS);
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    let cp = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| m.spec.role == ichor_api::MachineRole::Controlplane)
        .expect("a control plane");
    let cp_name = cp.metadata.name.clone().unwrap();
    machines
        .patch(
            &cp_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"hold": false}})),
        )
        .await
        .expect("release one control plane");
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), NS);
    let set_credentials = |name: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    "lab",
                    &PatchParams::default(),
                    &Patch::Merge(
                        serde_json::json!({"spec": {"backup": {"destination": {"s3": {
                        "credentialsSecretRef": {"name": name}}}}}}),
                    ),
                )
                .await
                .expect("patch the destination");
        }
    };

    // No credentials: the backup fails, the operation stops before any node.
    set_credentials("no-such-secret").await;
    ops.create(&PostParams::default(), &upgrade("up-broken"))
        .await
        .expect("create the operation");
    let deadline = Instant::now() + Duration::from_secs(120);
    let failed = loop {
        let op = operation(client, "up-broken").await;
        let st = op.status.clone().unwrap_or_default();
        if st.phase == Some(OperationPhase::Failed) {
            break op;
        }
        assert!(
            st.phase != Some(OperationPhase::Succeeded),
            "the operation went on without its backup: {st:?}"
        );
        assert!(
            Instant::now() < deadline,
            "the operation did not stop: {st:?}\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let st = failed.status.unwrap();
    let complete = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("Complete condition");
    assert_eq!(complete.reason, "BackupFailed", "{complete:?}");
    assert!(
        st.machines
            .iter()
            .all(|m| m.step == MachineStep::Pending || m.step == MachineStep::Skipped),
        "no node is touched when the backup fails: {:?}",
        st.machines
    );
    let named = st.backup.clone().expect("status.backup names the backup");
    let b = backups
        .get(&named)
        .await
        .expect("the operation's TalosBackup");
    assert_eq!(b.spec.reason, BackupReason::Operation);
    assert_eq!(b.spec.operation.as_deref(), Some("up-broken"));
    assert_eq!(b.status.unwrap().phase, BackupPhase::Failed);

    // Credentials back: the backup first, then the control plane.
    set_credentials("backup-s3").await;
    ops.create(&PostParams::default(), &upgrade("up"))
        .await
        .expect("create the operation");
    let deadline = Instant::now() + Duration::from_secs(180);
    let started = loop {
        let op = operation(client, "up").await;
        let st = op.status.clone().unwrap_or_default();
        if let Some(m) = st
            .machines
            .iter()
            .find(|m| m.machine == cp_name && m.start_time.is_some())
        {
            break (st.backup.clone(), m.start_time.clone().unwrap());
        }
        assert!(
            st.phase != Some(OperationPhase::Failed),
            "the operation failed: {st:?}\n{}",
            h.logs()
        );
        assert!(
            Instant::now() < deadline,
            "the control plane did not start: {st:?}\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (named, machine_started) = started;
    let named = named.expect("status.backup names the backup");
    let b = backups
        .get(&named)
        .await
        .expect("the operation's TalosBackup");
    let bs = b.status.expect("its status");
    assert_eq!(bs.phase, BackupPhase::Succeeded, "{bs:?}");
    let backed_up = bs.completion_time.expect("finished");
    assert!(
        backed_up.0 <= machine_started.0,
        "the backup ({backed_up:?}) finished before the first control plane started ({machine_started:?})"
    );
    // Stop it before its next step; the lab goes with the test. The drain
    // of the first control plane evicts the controller's pod, and until its
    // replacement is Ready the validating webhook has no endpoints: the API
    // server refuses the write then, as a real cluster does, so it is tried
    // again.
    let cancel = Patch::Merge(
        serde_json::json!({"metadata": {"annotations": {ichor_api::CANCEL_ANNOTATION: "true"}}}),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match ops.patch("up", &PatchParams::default(), &cancel).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 500 && Instant::now() < deadline => {
                assert!(
                    e.message.contains("failed calling webhook"),
                    "cancel: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("cancel: {e:?}\n{}", h.logs()),
        }
    }
}
