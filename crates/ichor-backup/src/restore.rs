//! Reading a backup back (for `ichor recover`): choose one of a cluster's
//! complete backups, decrypt its manifest, its small parts whole and its
//! etcd snapshot as a stream, each checked against the manifest.
//!
//! The snapshot is decrypted on the fly: ciphertext chunks from the store
//! feed age on a blocking thread through bounded channels, so memory holds
//! a few chunks whatever the snapshot's size.

use std::io::{self, Read};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};

use crate::crypt::{CryptError, Identities, decrypt};
use crate::manifest::{Layout, Listed, Manifest, ManifestError, Part, backups_of};
use crate::snapshot::{CheckedSnapshot, Mode, SnapshotCheck, SnapshotError};
use crate::store::{Store, StoreError};

/// The etcd snapshot's plaintext as [`Reader::snapshot`] streams it.
pub type Snapshot = BoxStream<'static, Result<Bytes, RestoreError>>;

/// The plaintext chunk size handed on from the decryption.
const CHUNK: usize = 64 * 1024;

/// Why a backup cannot be read back. The message names the backup (or
/// cluster) and the part; the source says why.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("listing the backups of cluster {cluster} in {destination} failed")]
    List {
        cluster: String,
        destination: String,
        #[source]
        source: Box<StoreError>,
    },
    #[error(
        "cluster {cluster} has no complete backup in {destination} (a backup is complete when its manifest exists)"
    )]
    NoBackup {
        cluster: String,
        destination: String,
    },
    #[error("{backup} is not a backup name of cluster {cluster} (<cluster>-YYYYMMDDhhmmss)")]
    NotOfCluster { cluster: String, backup: String },
    #[error("backup {backup} is not in {destination}")]
    NotFound {
        backup: String,
        destination: String,
        /// The cluster's complete backups, newest first, for the help.
        complete: Vec<String>,
    },
    #[error("backup {backup} has no manifest: it is not complete (debris of a failed run)")]
    Incomplete { backup: String },
    #[error("reading the {part} of backup {backup} failed")]
    Read {
        backup: String,
        part: &'static str,
        #[source]
        source: Box<StoreError>,
    },
    #[error("backup {backup}: the identity cannot open its {part}")]
    Decrypt {
        backup: String,
        part: &'static str,
        #[source]
        source: Box<CryptError>,
    },
    #[error("backup {backup}: its {part} is cut short or was changed after it was written")]
    Cipher {
        backup: String,
        part: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("backup {backup}: its manifest cannot be read")]
    Manifest {
        backup: String,
        #[source]
        source: ManifestError,
    },
    #[error("backup {backup} is of cluster {found}, not of cluster {wanted}")]
    OtherCluster {
        backup: String,
        found: String,
        wanted: String,
    },
    #[error("backup {backup}: its manifest names backup {named}")]
    OtherBackup { backup: String, named: String },
    #[error("backup {backup}: its manifest lists no {part}")]
    Unlisted { backup: String, part: &'static str },
    #[error(
        "backup {backup}: its {part} is {size} bytes with sha256 {found}; the manifest records {want_size} bytes with sha256 {want}"
    )]
    Digest {
        backup: String,
        part: &'static str,
        size: u64,
        found: String,
        want_size: u64,
        want: String,
    },
    #[error("backup {backup}: its etcd snapshot fails the check")]
    Snapshot {
        backup: String,
        #[source]
        source: Box<SnapshotError>,
    },
    #[error(
        "backup {backup}: its etcd snapshot's database has sha256 {found}; the manifest records {want}"
    )]
    SnapshotDigest {
        backup: String,
        found: String,
        want: String,
    },
}

impl RestoreError {
    /// The step that can help, where Ichor knows one.
    pub fn help(&self) -> Option<String> {
        match self {
            RestoreError::NotFound { complete, .. } if complete.is_empty() => {
                Some("the cluster has no complete backup there; check --prefix and the bucket".into())
            }
            RestoreError::NotFound { complete, .. } => Some(format!(
                "complete backups, newest first: {}",
                complete.join(", ")
            )),
            RestoreError::Decrypt { .. } => Some(
                "pass the identity file (AGE-SECRET-KEY-…) whose recipient (age1…) the cluster's spec.backup.recipients listed when the backup was taken".into(),
            ),
            RestoreError::Snapshot { source, .. }
                if matches!(**source, SnapshotError::MissingTrailer { .. }) =>
            {
                Some(
                    "if this part is a raw copy of etcd's member/snap/db (no trailer), pass --skip-hash-check".into(),
                )
            }
            RestoreError::Snapshot { .. }
            | RestoreError::SnapshotDigest { .. }
            | RestoreError::Digest { .. }
            | RestoreError::Cipher { .. } => Some(
                "choose an older backup with --backup NAME; this one cannot be restored as it is".into(),
            ),
            _ => None,
        }
    }
}

/// The backup to restore among a cluster's listing (oldest first): the one
/// named, which must be complete, else the newest complete one.
pub fn choose<'a>(
    listed: &'a [Listed],
    cluster: &str,
    wanted: Option<&str>,
    destination: &str,
) -> Result<&'a Listed, RestoreError> {
    let complete = || {
        listed
            .iter()
            .rev()
            .filter(|l| l.is_complete())
            .map(|l| l.name.clone())
            .collect::<Vec<_>>()
    };
    match wanted {
        None => crate::manifest::newest_complete(listed).ok_or_else(|| RestoreError::NoBackup {
            cluster: cluster.to_string(),
            destination: destination.to_string(),
        }),
        Some(name) => {
            if crate::manifest::backup_time(cluster, name).is_none() {
                return Err(RestoreError::NotOfCluster {
                    cluster: cluster.to_string(),
                    backup: name.to_string(),
                });
            }
            match listed.iter().find(|l| l.name == name) {
                None => Err(RestoreError::NotFound {
                    backup: name.to_string(),
                    destination: destination.to_string(),
                    complete: complete(),
                }),
                Some(l) if !l.is_complete() => Err(RestoreError::Incomplete {
                    backup: name.to_string(),
                }),
                Some(l) => Ok(l),
            }
        }
    }
}

fn label(part: Part) -> &'static str {
    match part {
        Part::EtcdSnapshot => "etcd snapshot",
        Part::Bundle => "secrets bundle",
        Part::Objects => "objects",
        Part::Manifest => "manifest",
    }
}

/// A destination's backups of one cluster, read with an identity.
#[derive(Clone)]
pub struct Reader {
    store: Store,
    layout: Layout,
    identities: Arc<Identities>,
    cluster: String,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("store", &self.store)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Reader {
    pub fn new(store: Store, identities: Arc<Identities>, cluster: &str) -> Self {
        Reader {
            store,
            // The store carries the destination's prefix.
            layout: Layout::new(""),
            identities,
            cluster: cluster.to_string(),
        }
    }

    pub fn destination(&self) -> &str {
        self.store.name()
    }

    /// The cluster's backups, oldest first (complete or not).
    pub async fn list(&self) -> Result<Vec<Listed>, RestoreError> {
        let folder = self.layout.cluster_folder(&self.cluster);
        let objects = self
            .store
            .list(folder.trim_end_matches('/'))
            .await
            .map_err(|source| RestoreError::List {
                cluster: self.cluster.clone(),
                destination: self.store.name().to_string(),
                source: Box::new(source),
            })?;
        Ok(backups_of(
            &self.layout,
            &self.cluster,
            objects.iter().map(|o| o.key.as_str()),
        ))
    }

    /// The backup's manifest, decrypted, of this cluster and this backup.
    pub async fn manifest(&self, backup: &str) -> Result<Manifest, RestoreError> {
        let key = self.layout.key(&self.cluster, backup, Part::Manifest);
        let json = self.whole(backup, Part::Manifest, &key).await?;
        let manifest = Manifest::from_json(&json).map_err(|source| RestoreError::Manifest {
            backup: backup.to_string(),
            source,
        })?;
        if manifest.cluster.name != self.cluster {
            return Err(RestoreError::OtherCluster {
                backup: backup.to_string(),
                found: manifest.cluster.name,
                wanted: self.cluster.clone(),
            });
        }
        if manifest.backup != backup {
            return Err(RestoreError::OtherBackup {
                backup: backup.to_string(),
                named: manifest.backup,
            });
        }
        Ok(manifest)
    }

    /// A small part (the bundle, the objects), decrypted whole and checked
    /// against the manifest's size and sha256.
    pub async fn part(&self, manifest: &Manifest, part: Part) -> Result<Vec<u8>, RestoreError> {
        let backup = &manifest.backup;
        let record = manifest.part(part).ok_or_else(|| RestoreError::Unlisted {
            backup: backup.clone(),
            part: label(part),
        })?;
        let plain = self.whole(backup, part, &record.key).await?;
        let found = hex::encode(Sha256::digest(&plain));
        if plain.len() as u64 != record.size || found != record.sha256 {
            return Err(RestoreError::Digest {
                backup: backup.clone(),
                part: label(part),
                size: plain.len() as u64,
                found,
                want_size: record.size,
                want: record.sha256.clone(),
            });
        }
        Ok(plain)
    }

    async fn whole(&self, backup: &str, part: Part, key: &str) -> Result<Vec<u8>, RestoreError> {
        let read = |source| RestoreError::Read {
            backup: backup.to_string(),
            part: label(part),
            source: Box::new(source),
        };
        let mut stream = self.store.get(key).await.map_err(read)?;
        let mut sealed = Vec::new();
        while let Some(chunk) = stream.next().await {
            sealed.extend_from_slice(&chunk.map_err(read)?);
        }
        let mut plain = Vec::new();
        decrypt(&self.identities, &sealed[..])
            .map_err(|source| RestoreError::Decrypt {
                backup: backup.to_string(),
                part: label(part),
                source: Box::new(source),
            })?
            .read_to_end(&mut plain)
            .map_err(|source| RestoreError::Cipher {
                backup: backup.to_string(),
                part: label(part),
                source,
            })?;
        Ok(plain)
    }

    /// The etcd snapshot's plaintext as a stream, decrypted on the fly and
    /// checked on the way: the stream ends with an error instead of its end
    /// when the snapshot fails the check (`mode`), its part's digest or the
    /// manifest's database sha256. Its chunks are what `EtcdRecover` takes.
    pub async fn snapshot(
        &self,
        manifest: &Manifest,
        mode: Mode,
    ) -> Result<BoxStream<'static, Result<Bytes, RestoreError>>, RestoreError> {
        let backup = manifest.backup.clone();
        let part = Part::EtcdSnapshot;
        let record = manifest
            .part(part)
            .ok_or_else(|| RestoreError::Unlisted {
                backup: backup.clone(),
                part: label(part),
            })?
            .clone();
        let sealed = self
            .store
            .get(&record.key)
            .await
            .map_err(|source| RestoreError::Read {
                backup: backup.clone(),
                part: label(part),
                source: Box::new(source),
            })?;
        let plain = decrypt_stream(self.identities.clone(), backup.clone(), sealed);
        let tally = Tally {
            backup,
            mode,
            want_part: (record.size, record.sha256),
            want_db: manifest.etcd.sha256.clone(),
        };
        Ok(checked(plain, tally).boxed())
    }

    /// Reads the whole snapshot through its checks and drops it: what
    /// recover does before it writes anything.
    pub async fn verify_snapshot(
        &self,
        manifest: &Manifest,
        mode: Mode,
    ) -> Result<u64, RestoreError> {
        let mut stream = self.snapshot(manifest, mode).await?;
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            size += chunk?.len() as u64;
        }
        Ok(size)
    }
}

/// What a snapshot stream must add up to.
struct Tally {
    backup: String,
    mode: Mode,
    want_part: (u64, String),
    want_db: String,
}

impl Tally {
    fn judge(
        &self,
        check: SnapshotCheck,
        digest: Sha256,
        size: u64,
    ) -> Result<CheckedSnapshot, RestoreError> {
        let found = hex::encode(digest.finalize());
        if size != self.want_part.0 || found != self.want_part.1 {
            return Err(RestoreError::Digest {
                backup: self.backup.clone(),
                part: label(Part::EtcdSnapshot),
                size,
                found,
                want_size: self.want_part.0,
                want: self.want_part.1.clone(),
            });
        }
        let checked = check.finish().map_err(|source| RestoreError::Snapshot {
            backup: self.backup.clone(),
            source: Box::new(source),
        })?;
        // A raw copy has no trailer; its sha256 is of the whole copy, what
        // the manifest recorded when it was taken.
        if self.mode == Mode::WithTrailer && checked.sha256_hex() != self.want_db {
            return Err(RestoreError::SnapshotDigest {
                backup: self.backup.clone(),
                found: checked.sha256_hex(),
                want: self.want_db.clone(),
            });
        }
        Ok(checked)
    }
}

/// `plain` passed through unchanged; at its end, the check's verdict: an
/// error instead of the end when the snapshot is not what the manifest says.
fn checked<S>(plain: S, tally: Tally) -> impl Stream<Item = Result<Bytes, RestoreError>>
where
    S: Stream<Item = Result<Bytes, RestoreError>> + Send + Unpin + 'static,
{
    struct St<S> {
        plain: S,
        check: SnapshotCheck,
        digest: Sha256,
        size: u64,
        tally: Tally,
        done: bool,
    }
    let st = St {
        plain,
        check: SnapshotCheck::new(tally.mode),
        digest: Sha256::new(),
        size: 0,
        tally,
        done: false,
    };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        match st.plain.next().await {
            Some(Ok(chunk)) => {
                st.check.update(&chunk);
                st.digest.update(&chunk);
                st.size += chunk.len() as u64;
                Some((Ok(chunk), st))
            }
            Some(Err(e)) => {
                st.done = true;
                Some((Err(e), st))
            }
            None => {
                st.done = true;
                let check = std::mem::take(&mut st.check);
                let digest = std::mem::take(&mut st.digest);
                match st.tally.judge(check, digest, st.size) {
                    Ok(_) => None,
                    Err(e) => Some((Err(e), st)),
                }
            }
        }
    })
}

/// Reads the ciphertext from a channel the async side fills.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, io::Error>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.current = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Why the ciphertext stopped coming: the store's error, carried through
/// age's reader as the source of an [`io::Error`].
#[derive(Debug, thiserror::Error)]
#[error("reading the ciphertext failed")]
struct Feed(#[source] StoreError);

/// The plaintext of `sealed`, decrypted on a blocking thread with bounded
/// channels on both sides.
fn decrypt_stream(
    identities: Arc<Identities>,
    backup: String,
    mut sealed: BoxStream<'static, Result<Bytes, StoreError>>,
) -> impl Stream<Item = Result<Bytes, RestoreError>> + Send + Unpin + 'static {
    let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(2);
    let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Result<Bytes, RestoreError>>(2);
    tokio::spawn(async move {
        while let Some(chunk) = sealed.next().await {
            let failed = chunk.is_err();
            let item = chunk.map_err(|e| io::Error::other(Feed(e)));
            if in_tx.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    tokio::task::spawn_blocking(move || {
        let part = label(Part::EtcdSnapshot);
        let reader = ChannelReader {
            rx: in_rx,
            current: Bytes::new(),
        };
        let mut plain = match decrypt(&identities, reader) {
            Ok(r) => r,
            Err(source) => {
                let _ = out_tx.blocking_send(Err(RestoreError::Decrypt {
                    backup,
                    part,
                    source: Box::new(source),
                }));
                return;
            }
        };
        loop {
            let mut buf = vec![0u8; CHUNK];
            let mut filled = 0;
            // Whole chunks where the data allows: fewer, larger messages.
            let ended = loop {
                match plain.read(&mut buf[filled..]) {
                    Ok(0) => break Ok(true),
                    Ok(n) => {
                        filled += n;
                        if filled == CHUNK {
                            break Ok(false);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            match ended {
                Err(source) => {
                    let _ = out_tx.blocking_send(Err(RestoreError::Cipher {
                        backup,
                        part,
                        source,
                    }));
                    return;
                }
                Ok(end) => {
                    buf.truncate(filled);
                    if filled > 0 && out_tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                        return;
                    }
                    if end {
                        return;
                    }
                }
            }
        }
    });
    futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}
