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
use crate::snapshot::{Mode, checked_stream};
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
    let write_error = |part: &'static str| {
        move |source| TakeError::Write {
            backup: backup.to_string(),
            part,
            source,
        }
    };
    let encrypt_error = |part: &'static str| {
        move |source| TakeError::Encrypt {
            backup: backup.to_string(),
            part,
            source,
        }
    };

    // The snapshot: checked, then encrypted, as it streams.
    let (checked, check) = checked_stream(Mode::WithTrailer, snapshot);
    let (sealed, digest) =
        encrypt_stream(recipients, checked).map_err(encrypt_error("etcd snapshot"))?;
    let mut written = store
        .upload(&key(Part::EtcdSnapshot), sealed)
        .await
        .map_err(write_error("etcd snapshot"))?;
    let (Some(snapshot), Some(snapshot_digest)) = (check.get(), digest.get()) else {
        return Err(TakeError::Unchecked {
            backup: backup.to_string(),
        });
    };
    let mut parts = vec![PartRecord {
        name: Part::EtcdSnapshot,
        key: key(Part::EtcdSnapshot),
        size: snapshot_digest.size,
        sha256: snapshot_digest.sha256_hex(),
    }];

    // The bundle and the objects are small: whole, each one upload.
    for (part, label, plaintext) in [
        (Part::Bundle, "secrets bundle", &inputs.bundle),
        (Part::Objects, "objects", &inputs.objects),
    ] {
        written += put_whole(store, &key(part), recipients, plaintext)
            .await
            .map_err(|e| match e {
                Whole::Encrypt(source) => encrypt_error(label)(source),
                Whole::Write(source) => write_error(label)(source),
            })?;
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
        .map_err(|e| match e {
            Whole::Encrypt(source) => encrypt_error("manifest")(source),
            Whole::Write(source) => write_error("manifest")(source),
        })?;
    Ok(Taken { manifest, written })
}

enum Whole {
    Encrypt(CryptError),
    Write(StoreError),
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
