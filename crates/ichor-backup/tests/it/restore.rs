//! Reading a backup back as `ichor recover` does, from the real S3 server:
//! a real etcd's snapshot taken into a backup comes back byte for byte,
//! decrypted as it streams; a wrong identity, a backup of another cluster,
//! a changed or cut snapshot are refused, each naming the backup; a raw
//! database copy passes only in the raw mode (skip the hash check).

use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt as _;
use ichor_backup::crypt::{Identities, Recipients, encrypt};
use ichor_backup::manifest::{Layout, Part};
use ichor_backup::restore::{Reader, RestoreError, choose};
use ichor_backup::snapshot::{Mode, SnapshotError};
use ichor_backup::store::Store;
use ichor_backup::take::take;

use crate::etcd_snapshot::Etcd;
use crate::store::s3_store;

fn messages(bytes: &[u8]) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
        .chunks(1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    futures::stream::iter(chunks)
}

async fn put(store: &Store, key: &str, sealed: Vec<u8>) {
    let chunk: Result<Bytes, std::io::Error> = Ok(Bytes::from(sealed));
    store
        .upload(key, futures::stream::iter([chunk]))
        .await
        .unwrap();
}

async fn backup(
    store: &Store,
    recipients: &Recipients,
    cluster: &str,
    name: &str,
    snapshot: &[u8],
) -> ichor_backup::manifest::Manifest {
    let mut inputs = crate::take::inputs(name);
    inputs.cluster.name = cluster.into();
    take(
        store,
        &Layout::new(""),
        recipients,
        inputs,
        messages(snapshot),
        Utc::now,
    )
    .await
    .expect("the backup is taken")
    .manifest
}

async fn read_all(
    reader: &Reader,
    m: &ichor_backup::manifest::Manifest,
    mode: Mode,
) -> Result<Vec<u8>, RestoreError> {
    let mut s = reader.snapshot(m, mode).await?;
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// Covers: R20.15
#[tokio::test(flavor = "multi_thread")]
async fn a_backup_reads_back_whole_and_every_bad_one_is_refused() {
    let etcd = Etcd::start();
    for i in 0..300 {
        etcd.put(&format!("/registry/k{i}"), &"v".repeat(700));
    }
    let snapshot = etcd.snapshot();
    let ids = std::sync::Arc::new(Identities::generate());
    let recipients = Recipients::parse(&ids.recipients()).unwrap();
    let store = s3_store("restore");
    let old = backup(&store, &recipients, "lab", "lab-20261202010000", &snapshot).await;
    let m = backup(&store, &recipients, "lab", "lab-20261202020000", &snapshot).await;
    // Debris of a failed run: a snapshot part, no manifest.
    put(
        &store,
        &Layout::new("").key("lab", "lab-20261202030000", Part::EtcdSnapshot),
        encrypt(&recipients, b"x").unwrap(),
    )
    .await;

    let reader = Reader::new(store.clone(), ids.clone(), "lab");
    let listed = reader.list().await.unwrap();
    assert_eq!(listed.len(), 3);
    let chosen = choose(&listed, "lab", None, "here").unwrap();
    assert_eq!(
        chosen.name, m.backup,
        "the newest complete one, not the debris"
    );
    assert!(matches!(
        choose(&listed, "lab", Some("lab-20261202030000"), "here"),
        Err(RestoreError::Incomplete { .. })
    ));
    assert!(matches!(
        choose(&listed, "lab", Some("other-20261202010000"), "here"),
        Err(RestoreError::NotOfCluster { .. })
    ));
    assert_eq!(
        choose(&listed, "lab", Some(&old.backup), "here")
            .unwrap()
            .name,
        old.backup
    );

    let manifest = reader.manifest(&m.backup).await.unwrap();
    assert_eq!(manifest, m);
    assert_eq!(
        reader.part(&manifest, Part::Bundle).await.unwrap(),
        crate::take::inputs("x").bundle
    );
    // Decrypted as it streams, byte for byte the snapshot etcd gave.
    let back = read_all(&reader, &manifest, Mode::WithTrailer)
        .await
        .unwrap();
    assert!(back == snapshot, "the snapshot comes back whole");
    assert_eq!(
        reader
            .verify_snapshot(&manifest, Mode::WithTrailer)
            .await
            .unwrap(),
        snapshot.len() as u64
    );

    // A wrong identity opens nothing.
    let stranger = Reader::new(
        store.clone(),
        std::sync::Arc::new(Identities::generate()),
        "lab",
    );
    let e = stranger.manifest(&m.backup).await.unwrap_err();
    assert!(matches!(e, RestoreError::Decrypt { .. }), "{e:?}");
    assert!(e.to_string().contains(&m.backup), "{e}");
    assert!(e.help().is_some());

    // A backup of another cluster, its manifest put where lab's would be.
    let other = backup(
        &store,
        &recipients,
        "other",
        "other-20261202010000",
        &snapshot,
    )
    .await;
    let sealed: Vec<Bytes> = futures::TryStreamExt::try_collect(
        store
            .get(&Layout::new("").key("other", &other.backup, Part::Manifest))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    let moved = "lab-20261202040000";
    put(
        &store,
        &Layout::new("").key("lab", moved, Part::Manifest),
        sealed.concat(),
    )
    .await;
    let e = reader.manifest(moved).await.unwrap_err();
    assert!(
        matches!(&e, RestoreError::OtherCluster { found, .. } | RestoreError::OtherBackup { named: found, .. } if !found.is_empty()),
        "{e:?}"
    );

    // One byte of the snapshot changed, sealed again with the same key: the
    // manifest's digest and the trailer refuse it.
    let mut flipped = snapshot.clone();
    flipped[100] ^= 1;
    let key = &manifest.part(Part::EtcdSnapshot).unwrap().key;
    put(&store, key, encrypt(&recipients, &flipped).unwrap()).await;
    let e = read_all(&reader, &manifest, Mode::WithTrailer)
        .await
        .unwrap_err();
    assert!(matches!(e, RestoreError::Digest { .. }), "{e:?}");
    // Cut short: the ciphertext is refused.
    let mut cut = encrypt(&recipients, &snapshot).unwrap();
    cut.truncate(cut.len() - 100);
    put(&store, key, cut).await;
    let e = reader
        .verify_snapshot(&manifest, Mode::WithTrailer)
        .await
        .unwrap_err();
    assert!(matches!(e, RestoreError::Cipher { .. }), "{e:?}");

    // A raw copy of the database (no trailer): refused by the trailer
    // check, accepted in the raw mode.
    let raw = &snapshot[..snapshot.len() - 32];
    let mut raw_manifest = manifest.clone();
    let record = raw_manifest
        .parts
        .iter_mut()
        .find(|p| p.name == Part::EtcdSnapshot)
        .unwrap();
    let d = ichor_backup::crypt::PartDigest::of(raw);
    record.size = d.size;
    record.sha256 = d.sha256_hex();
    put(&store, key, encrypt(&recipients, raw).unwrap()).await;
    let e = read_all(&reader, &raw_manifest, Mode::WithTrailer)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RestoreError::Snapshot { source, .. } if matches!(**source, SnapshotError::MissingTrailer { .. })),
        "{e:?}"
    );
    assert!(e.help().unwrap().contains("--skip-hash-check"));
    assert!(read_all(&reader, &raw_manifest, Mode::RawDb).await.unwrap() == raw);
}
