//! Taking one backup: the etcd snapshot streamed through its check and age
//! into the destination, then the bundle and Ichor's objects, then the
//! manifest, last. A backup is complete exactly when its manifest exists,
//! so a failure at any step leaves no backup that looks whole; the parts
//! already written are deleted too, so nothing half-written stays behind.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::Stream;

use crate::crypt::{CryptError, Recipients, encrypt, encrypt_stream};
use crate::manifest::{ClusterRef, EtcdFacts, FORMAT, Layout, Manifest, Part, PartRecord, Reason};
use crate::snapshot::{CheckedSnapshot, Mode, checked_stream};
use crate::store::{Store, StoreError};

/// What a backup is of, besides the snapshot stream.
#[derive(Clone)]
pub struct Inputs {
    pub cluster: ClusterRef,
    /// The backup's name (`<cluster>-<UTC YYYYMMDDhhmmss>…`), its folder.
    pub backup: String,
    pub reason: Reason,
    pub started: DateTime<Utc>,
    pub talos_version: String,
    pub kubernetes_version: String,
    /// The control plane the snapshot is read from, and the etcd revision
    /// its status gave just before.
    pub member: String,
    pub revision: u64,
    /// The secrets bundle, as the cluster's Secret holds it.
    pub bundle: Vec<u8>,
    /// Ichor's objects of the cluster, as multi-document YAML.
    pub objects: Vec<u8>,
}

impl std::fmt::Debug for Inputs {
    // The bundle is a secret: its size only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inputs")
            .field("cluster", &self.cluster)
            .field("backup", &self.backup)
            .field("reason", &self.reason)
            .field("member", &self.member)
            .field("bundle_bytes", &self.bundle.len())
            .field("objects_bytes", &self.objects.len())
            .finish_non_exhaustive()
    }
}

/// A backup written whole: its manifest and the bytes written, all parts
/// (ciphertext) together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub manifest: Manifest,
    pub written: u64,
}

/// Why a backup failed. Whatever it had written is deleted first (see
/// [`TakeError::Cleanup`] when that fails too).
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("backup {backup}: writing its {part} failed")]
    Write {
        backup: String,
        part: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("backup {backup}: the etcd snapshot stream ended without its check's result")]
    Unchecked { backup: String },
    #[error("backup {backup}: encrypting its {part} failed")]
    Encrypt {
        backup: String,
        part: &'static str,
        #[source]
        source: CryptError,
    },
    #[error(
        "backup {backup}: deleting what it had written failed, so objects of it may remain (no manifest: it is not complete) after it failed"
    )]
    Cleanup {
        backup: String,
        #[source]
        source: Box<TakeError>,
        cleanup: StoreError,
    },
}

/// Takes one backup of `inputs.cluster` into `store` under `layout`,
/// encrypted to `recipients`, reading the etcd snapshot from `snapshot`
/// (Talos's `EtcdSnapshot` stream: the database, then its sha256). Memory
/// stays bounded by the store's part size and one age chunk; nothing goes to
/// local disk. `clock` gives the manifest's finish time.
pub async fn take<S, E>(
    store: &Store,
    layout: &Layout,
    recipients: &Recipients,
    inputs: Inputs,
    snapshot: S,
    clock: impl Fn() -> DateTime<Utc>,
) -> Result<Taken, TakeError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let name = inputs.cluster.name.clone();
    let backup = inputs.backup.clone();
    let result = write_parts(store, layout, recipients, inputs, snapshot, clock).await;
    match result {
        Ok(taken) => Ok(taken),
        Err(failure) => {
            let keys: Vec<String> = Part::ALL
                .iter()
                .map(|p| layout.key(&name, &backup, *p))
                .collect();
            match store.delete(&keys).await {
                Ok(()) => Err(failure),
                Err(cleanup) => Err(TakeError::Cleanup {
                    backup,
                    source: Box::new(failure),
                    cleanup,
                }),
            }
        }
    }
}

async fn write_parts<S, E>(
    store: &Store,
    layout: &Layout,
    recipients: &Recipients,
    inputs: Inputs,
    snapshot: S,
    clock: impl Fn() -> DateTime<Utc>,
) -> Result<Taken, TakeError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let cluster = inputs.cluster.name.as_str();
    let backup = inputs.backup.as_str();
    let key = |part| layout.key(cluster, backup, part);
    let (mut written, snapshot, record) = upload_snapshot(
        store,
        &key(Part::EtcdSnapshot),
        recipients,
        backup,
        snapshot,
    )
    .await?;
    let mut parts = vec![record];
    // The bundle and the objects are small: whole, each one upload.
    for (part, label, plaintext) in [
        (Part::Bundle, "secrets bundle", &inputs.bundle),
        (Part::Objects, "objects", &inputs.objects),
    ] {
        written += put_whole(store, &key(part), recipients, plaintext)
            .await
            .map_err(|e| e.into_take(backup, label))?;
        let d = crate::crypt::PartDigest::of(plaintext);
        parts.push(PartRecord {
            name: part,
            key: key(part),
            size: d.size,
            sha256: d.sha256_hex(),
        });
    }

    let manifest = Manifest {
        format: FORMAT,
        cluster: inputs.cluster.clone(),
        backup: backup.to_string(),
        reason: inputs.reason,
        started: inputs.started,
        finished: clock(),
        talos_version: inputs.talos_version.clone(),
        kubernetes_version: inputs.kubernetes_version.clone(),
        etcd: EtcdFacts {
            revision: inputs.revision,
            member: inputs.member.clone(),
            db_size: snapshot.db_size,
            sha256: snapshot.sha256_hex(),
        },
        parts,
        bundle_fingerprint: crate::crypt::PartDigest::of(&inputs.bundle).sha256_hex(),
    };
    // Last: its presence is what makes the backup complete.
    written += put_whole(store, &key(Part::Manifest), recipients, &manifest.to_json())
        .await
        .map_err(|e| e.into_take(backup, "manifest"))?;
    Ok(Taken { manifest, written })
}

/// The etcd snapshot, checked then encrypted as it streams into `key`:
/// the bytes written, the checked snapshot's facts, and its part's record.
async fn upload_snapshot<S, E>(
    store: &Store,
    key: &str,
    recipients: &Recipients,
    backup: &str,
    snapshot: S,
) -> Result<(u64, CheckedSnapshot, PartRecord), TakeError>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
    E: std::error::Error + Send + Sync + 'static,
{
    let (checked, check) = checked_stream(Mode::WithTrailer, snapshot);
    let (sealed, digest) = encrypt_stream(recipients, checked)
        .map_err(|e| Whole::Encrypt(e).into_take(backup, "etcd snapshot"))?;
    let written = store
        .upload(key, sealed)
        .await
        .map_err(|e| Whole::Write(e).into_take(backup, "etcd snapshot"))?;
    let (Some(snapshot), Some(digest)) = (check.get(), digest.get()) else {
        return Err(TakeError::Unchecked {
            backup: backup.to_string(),
        });
    };
    let record = PartRecord {
        name: Part::EtcdSnapshot,
        key: key.to_string(),
        size: digest.size,
        sha256: digest.sha256_hex(),
    };
    Ok((written, snapshot, record))
}

/// Why one part could not be written.
enum Whole {
    Encrypt(CryptError),
    Write(StoreError),
}

impl Whole {
    fn into_take(self, backup: &str, part: &'static str) -> TakeError {
        let backup = backup.to_string();
        match self {
            Whole::Encrypt(source) => TakeError::Encrypt {
                backup,
                part,
                source,
            },
            Whole::Write(source) => TakeError::Write {
                backup,
                part,
                source,
            },
        }
    }
}

async fn put_whole(
    store: &Store,
    key: &str,
    recipients: &Recipients,
    plaintext: &[u8],
) -> Result<u64, Whole> {
    let sealed = encrypt(recipients, plaintext).map_err(Whole::Encrypt)?;
    let chunk: Result<Bytes, std::io::Error> = Ok(Bytes::from(sealed));
    store
        .upload(key, futures::stream::iter([chunk]))
        .await
        .map_err(Whole::Write)
}
