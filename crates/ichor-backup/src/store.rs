//! Where backups go: an S3-compatible bucket or a local folder, both through
//! `object_store` (its S3 client signs the requests).
//!
//! Keys are relative to the destination's prefix (`<cluster>/<backup>/<part>`).
//! An upload streams its chunks into a multipart upload with a fixed part size
//! and a bounded number of parts in flight, so an upload holds at most
//! `MAX_PARTS_IN_FLIGHT` parts travelling, one filling and the chunk in hand,
//! whatever the object's size. An upload
//! that fails — the source stream errs, the store refuses a part, or the
//! future is dropped — is aborted, so no object and no unfinished multipart
//! upload stays behind.

use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

/// The size of each part of a multipart upload (the last may be smaller).
/// S3 wants at least 5 MiB for every part but the last.
pub const PART_SIZE: usize = 8 * 1024 * 1024;

/// How many parts of one upload travel at once.
pub const MAX_PARTS_IN_FLIGHT: usize = 2;

/// Where a cluster's backups are written.
#[derive(Clone, PartialEq, Eq)]
pub enum Destination {
    S3(S3Destination),
    /// A local folder (created when missing); for tests and for a mounted volume.
    Filesystem {
        root: PathBuf,
    },
}

/// An S3-compatible bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Destination {
    /// The service's URL (`https://s3.example.net:9000`); `None` for AWS
    /// itself, whose endpoint follows from the region.
    pub endpoint: Option<String>,
    pub bucket: String,
    /// The folder inside the bucket under which every key lives; may be empty.
    pub prefix: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Whether a plain `http://` endpoint is allowed (a test server).
    pub allow_http: bool,
}

impl fmt::Debug for S3Destination {
    // The secret key never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Destination")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::S3(s3) => f.debug_tuple("S3").field(s3).finish(),
            Destination::Filesystem { root } => {
                f.debug_struct("Filesystem").field("root", root).finish()
            }
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::S3(s3) => {
                write!(f, "bucket {}", s3.bucket)?;
                if let Some(endpoint) = &s3.endpoint {
                    write!(f, " at {endpoint}")?;
                }
                Ok(())
            }
            Destination::Filesystem { root } => write!(f, "folder {}", root.display()),
        }
    }
}

/// An error of a destination; the message names the key (or prefix) and the
/// destination, the source says why.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the backup destination {destination}")]
    Open {
        destination: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot create the backup folder {root}")]
    CreateRoot {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{key:?} is not a valid object key")]
    Key {
        key: String,
        #[source]
        source: object_store::path::Error,
    },
    #[error("uploading {key} to {destination} failed")]
    Upload {
        key: String,
        destination: String,
        #[source]
        source: object_store::Error,
    },
    #[error("the data for {key} in {destination} broke off; the upload was aborted")]
    Source {
        key: String,
        destination: String,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The upload failed (the source) and so did aborting it (`abort`, which
    /// is no cause of the failure, so the message carries it).
    #[error(
        "the upload of {key} to {destination} failed and aborting it failed too ({abort}); an unfinished multipart upload may remain"
    )]
    AbortFailed {
        key: String,
        destination: String,
        abort: Box<object_store::Error>,
        #[source]
        source: Box<StoreError>,
    },
    #[error("listing {prefix:?} in {destination} failed")]
    List {
        prefix: String,
        destination: String,
        #[source]
        source: object_store::Error,
    },
    #[error("reading {key} from {destination} failed")]
    Get {
        key: String,
        destination: String,
        #[source]
        source: object_store::Error,
    },
    #[error("deleting {key} from {destination} failed")]
    Delete {
        key: String,
        destination: String,
        #[source]
        source: object_store::Error,
    },
}

impl StoreError {
    /// Whether the object asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            StoreError::Get {
                source: object_store::Error::NotFound { .. },
                ..
            }
        )
    }

    /// The step that can help, where Ichor knows one.
    pub fn help(&self) -> Option<String> {
        match self {
            StoreError::AbortFailed { key, .. } => Some(format!(
                "abort the multipart uploads of {key} with the bucket's own tools, or let a lifecycle rule that aborts incomplete multipart uploads remove them"
            )),
            _ => None,
        }
    }
}

/// One object under a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key, relative to the destination's prefix.
    pub key: String,
    pub size: u64,
    pub last_modified: chrono::DateTime<chrono::Utc>,
}

/// An opened destination.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// The destination's prefix as a path (empty for none).
    prefix: Path,
    /// The destination as messages name it.
    name: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("destination", &self.name)
            .field("prefix", &self.prefix.as_ref())
            .finish()
    }
}

impl Store {
    /// Opens `destination`: builds its client (no request is sent) or creates
    /// its folder.
    pub fn open(destination: &Destination) -> Result<Store, StoreError> {
        let name = destination.to_string();
        let (inner, prefix): (Arc<dyn ObjectStore>, &str) = match destination {
            Destination::S3(s3) => {
                // reqwest takes the process's TLS provider and needs one
                // installed: ring, the one every other client here uses
                // (a no-op when one is installed already).
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut builder = AmazonS3Builder::new()
                    .with_bucket_name(&s3.bucket)
                    .with_region(&s3.region)
                    .with_access_key_id(&s3.access_key_id)
                    .with_secret_access_key(&s3.secret_access_key)
                    .with_allow_http(s3.allow_http);
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                let store = builder.build().map_err(|source| StoreError::Open {
                    destination: name.clone(),
                    source,
                })?;
                (Arc::new(store), s3.prefix.as_str())
            }
            Destination::Filesystem { root } => {
                std::fs::create_dir_all(root).map_err(|source| StoreError::CreateRoot {
                    root: root.clone(),
                    source,
                })?;
                let store = LocalFileSystem::new_with_prefix(root)
                    .map_err(|source| StoreError::Open {
                        destination: name.clone(),
                        source,
                    })?
                    // Retention's deletes leave no empty backup folders behind.
                    .with_automatic_cleanup(true)
                    .with_fsync(true);
                (Arc::new(store), "")
            }
        };
        let prefix = Path::parse(prefix).map_err(|source| StoreError::Key {
            key: prefix.to_string(),
            source,
        })?;
        Ok(Store {
            inner,
            prefix,
            name,
        })
    }

    /// The destination as messages name it.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn path(&self, key: &str) -> Result<Path, StoreError> {
        let relative = Path::parse(key).map_err(|source| StoreError::Key {
            key: key.to_string(),
            source,
        })?;
        Ok(self.prefix.parts().chain(relative.parts()).collect())
    }

    fn relative_key(&self, path: &Path) -> String {
        match path.prefix_match(&self.prefix) {
            Some(parts) => Path::from_iter(parts).to_string(),
            None => path.to_string(),
        }
    }

    /// Uploads `data` to `key` as a multipart upload and returns the number of
    /// bytes written. The object appears only when every chunk arrived and the
    /// upload completed; on an error from `data` or from the store, and when
    /// this future is dropped, the upload is aborted (on drop, by a task
    /// spawned on the current Tokio runtime).
    pub async fn upload<S, E>(&self, key: &str, data: S) -> Result<u64, StoreError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        let path = self.path(key)?;
        let upload_error = |source| StoreError::Upload {
            key: key.to_string(),
            destination: self.name.clone(),
            source,
        };
        let upload = self
            .inner
            .put_multipart(&path)
            .await
            .map_err(upload_error)?;
        let mut guard = AbortOnDrop {
            write: Some(WriteMultipart::new_with_chunk_size(upload, PART_SIZE)),
            key: path.to_string(),
        };
        let mut size = 0u64;
        let mut data = std::pin::pin!(data);
        let failure = loop {
            let chunk = match data.next().await {
                None => break None,
                Some(Ok(chunk)) => chunk,
                Some(Err(source)) => {
                    break Some(StoreError::Source {
                        key: key.to_string(),
                        destination: self.name.clone(),
                        source: source.into(),
                    });
                }
            };
            size += chunk.len() as u64;
            if let Err(e) = guard.put_bounded(chunk).await {
                break Some(upload_error(e));
            }
        };
        let write = guard.write.take().expect("the upload is still open");
        match failure {
            None => {
                // finish aborts the upload itself when completing fails.
                write.finish().await.map_err(upload_error)?;
                Ok(size)
            }
            Some(failure) => match write.abort().await {
                Ok(()) => Err(failure),
                Err(abort) => Err(StoreError::AbortFailed {
                    key: key.to_string(),
                    destination: self.name.clone(),
                    abort: Box::new(abort),
                    source: Box::new(failure),
                }),
            },
        }
    }

    /// Every object whose key lies under `prefix` (by whole path segments:
    /// `c1` holds `c1/x` but not `c10/x`); an empty prefix lists everything.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let path = self.path(prefix)?;
        let list_error = |source| StoreError::List {
            prefix: prefix.to_string(),
            destination: self.name.clone(),
            source,
        };
        let metas: Vec<_> = self
            .inner
            .list(Some(&path))
            .try_collect()
            .await
            .map_err(list_error)?;
        let mut objects: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|meta| ObjectInfo {
                key: self.relative_key(&meta.location),
                size: meta.size,
                last_modified: meta.last_modified,
            })
            .collect();
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The object at `key`, as a stream of chunks.
    pub async fn get(
        &self,
        key: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, StoreError>>, StoreError> {
        let path = self.path(key)?;
        let get_error = {
            let key = key.to_string();
            let destination = self.name.clone();
            move |source| StoreError::Get {
                key: key.clone(),
                destination: destination.clone(),
                source,
            }
        };
        let result = self.inner.get(&path).await.map_err(get_error.clone())?;
        Ok(result.into_stream().map_err(get_error).boxed())
    }

    /// Deletes each of `keys`; a key that is already gone is no error.
    pub async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        let paths = keys
            .iter()
            .map(|key| Ok((key.clone(), self.path(key)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        futures::stream::iter(paths)
            // Owned keys: a borrowed one makes this future's type
            // higher-ranked, and callers inside a controller cannot name it.
            .map(|(key, path): (String, Path)| async move {
                match self.inner.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(source) => Err(StoreError::Delete {
                        key: key.clone(),
                        destination: self.name.clone(),
                        source,
                    }),
                }
            })
            .buffer_unordered(MAX_PARTS_IN_FLIGHT * 2)
            .try_collect::<()>()
            .await
    }
}

/// An open multipart upload that is aborted when dropped before it is taken
/// (the upload future was cancelled).
struct AbortOnDrop {
    write: Option<WriteMultipart>,
    key: String,
}

impl AbortOnDrop {
    /// Hands `chunk` to the upload at most a part at a time, waiting while
    /// `MAX_PARTS_IN_FLIGHT` parts travel, so a large chunk cannot start many
    /// parts at once.
    async fn put_bounded(&mut self, mut chunk: Bytes) -> object_store::Result<()> {
        let write = self.write.as_mut().expect("the upload is still open");
        while !chunk.is_empty() {
            write.wait_for_capacity(MAX_PARTS_IN_FLIGHT).await?;
            let piece = chunk.split_to(chunk.len().min(PART_SIZE));
            write.put(piece);
        }
        Ok(())
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(write) = self.write.take() else {
            return;
        };
        let key = std::mem::take(&mut self.key);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = write.abort().await {
                        tracing::warn!(key, error = %e, "aborting a cancelled multipart upload failed");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(
                    key,
                    "a cancelled multipart upload outlived its runtime and could not be aborted"
                );
            }
        }
    }
}
