//! Taking a backup into the real S3 server from a real etcd's snapshot: a
//! whole stream becomes a complete backup whose parts the identity opens;
//! a stream cut anywhere, or changed in one byte, fails with the reason and
//! leaves nothing in the backup's folder and no unfinished upload.

use std::io::Read as _;

use bytes::Bytes;
use chrono::{TimeZone as _, Utc};
use futures::TryStreamExt as _;
use ichor_backup::crypt::{Identities, Recipients, decrypt};
use ichor_backup::manifest::{ClusterRef, Layout, Manifest, Part, Reason};
use ichor_backup::store::Store;
use ichor_backup::take::{Inputs, take};

use crate::etcd_snapshot::Etcd;
use crate::store::{s3_store, unfinished_uploads_under};

pub(crate) fn inputs(backup: &str) -> Inputs {
    Inputs {
        cluster: ClusterRef {
            name: "lab".into(),
            uid: "0b8c5f2e".into(),
        },
        backup: backup.into(),
        reason: Reason::Manual,
        started: Utc.with_ymd_and_hms(2026, 12, 2, 1, 0, 0).unwrap(),
        talos_version: "v1.13.9".into(),
        kubernetes_version: "v1.36.0".into(),
        member: "cp-1".into(),
        revision: 7,
        bundle: b"cluster:\n  id: not-a-real-bundle\n".to_vec(),
        objects: b"---\nkind: TalosCluster\n".to_vec(),
    }
}

/// The stream in Talos's messages of at most 1024 bytes.
fn messages(bytes: &[u8]) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
        .chunks(1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

async fn read(store: &Store, key: &str, ids: &Identities) -> Vec<u8> {
    let sealed: Vec<Bytes> = store.get(key).await.unwrap().try_collect().await.unwrap();
    let mut out = Vec::new();
    decrypt(ids, std::io::Cursor::new(sealed.concat()))
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Covers: R13.1, R13.2
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_snapshot_is_a_complete_backup_and_a_cut_or_changed_one_leaves_nothing() {
    let etcd = Etcd::start();
    for i in 0..50 {
        etcd.put(&format!("/registry/k{i}"), &"v".repeat(500));
    }
    let snapshot = etcd.snapshot();
    let ids = Identities::generate();
    let recipients = Recipients::parse(&ids.recipients()).unwrap();
    let store = s3_store("take");
    let layout = Layout::new("");

    let taken = take(
        &store,
        &layout,
        &recipients,
        inputs("lab-20261202010000"),
        messages(&snapshot),
        Utc::now,
    )
    .await
    .expect("a whole snapshot is taken");
    let keys: Vec<String> = store
        .list("lab/lab-20261202010000")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    let manifest_key = layout.key("lab", "lab-20261202010000", Part::Manifest);
    let manifest = Manifest::from_json(&read(&store, &manifest_key, &ids).await).unwrap();
    assert_eq!(manifest, taken.manifest);
    assert_eq!(manifest.etcd.db_size as usize, snapshot.len() - 32);
    let snapshot_key = layout.key("lab", "lab-20261202010000", Part::EtcdSnapshot);
    assert_eq!(
        read(&store, &snapshot_key, &ids).await,
        snapshot,
        "the snapshot reads back whole"
    );
    let bundle_key = layout.key("lab", "lab-20261202010000", Part::Bundle);
    assert_eq!(read(&store, &bundle_key, &ids).await, inputs("x").bundle);

    let mut changed = snapshot.clone();
    changed[snapshot.len() / 3] ^= 0x01;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut-half", snapshot[..snapshot.len() / 2].to_vec(), "cut"),
        (
            "cut-trailer",
            snapshot[..snapshot.len() - 1].to_vec(),
            "cut",
        ),
        ("cut-early", snapshot[..7 * 1024 + 3].to_vec(), "cut"),
        ("changed", changed, "corrupt"),
    ];
    for (i, (what, stream, says)) in cases.into_iter().enumerate() {
        let backup = format!("lab-2026120201000{}", i + 1);
        let err = take(
            &store,
            &layout,
            &recipients,
            inputs(&backup),
            messages(&stream),
            Utc::now,
        )
        .await
        .expect_err(what);
        let chain = ichor_api::error_text::chain(&err);
        assert!(chain.contains(says), "{what}: {chain}");
        let folder = format!("lab/{backup}");
        let left = store.list(&folder).await.unwrap();
        assert!(left.is_empty(), "{what}: objects left behind: {left:?}");
        let unfinished = unfinished_uploads_under(&format!("take/{folder}")).await;
        assert!(
            unfinished.is_empty(),
            "{what}: unfinished uploads: {unfinished:?}"
        );
    }
}
