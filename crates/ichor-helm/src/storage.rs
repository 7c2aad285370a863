//! Helm's Secret storage driver: records in a storage namespace, found by the
//! same label selectors Helm uses (`owner=helm`, `name=<release>`; Helm's
//! storage lists with that label selector alone, and so does Ichor), listed
//! in protobuf as client-go's clients list them ([`crate::secret_list`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::record::{self, CodecError, Release, Status, Write};
use crate::secret_list::{self, ListedSecret};

/// The label selector of every Helm record (Helm's own).
pub const OWNER_SELECTOR: &str = "owner=helm";

/// The label selector of the records of release `name`.
pub fn release_selector(name: &str) -> String {
    format!("name={name},{OWNER_SELECTOR}")
}

/// The newest `deployed` revision in a history (oldest first).
pub fn newest_deployed(history: &[StoredRelease]) -> Option<&StoredRelease> {
    history
        .iter()
        .rev()
        .find(|s| s.release.status() == Status::Deployed)
}

/// The newest revision of each release `name`, in any namespace, with the
/// namespace its record is stored in (records that cannot be decoded are
/// passed over: they are someone else's).
pub async fn newest_in_every_namespace(
    client: &kube::Client,
    name: &str,
) -> Result<Vec<(String, Release)>, kube::Error> {
    let lp = ListParams::default().labels(&release_selector(name));
    let secrets = secret_list::list(client, None, &lp).await?.items;
    let mut newest: BTreeMap<String, Release> = BTreeMap::new();
    for s in &secrets {
        let Ok(release) = listed_release(s) else {
            continue;
        };
        let ns = s.namespace.clone().unwrap_or_default();
        if newest.get(&ns).is_none_or(|r| r.version < release.version) {
            newest.insert(ns, release);
        }
    }
    Ok(newest.into_iter().collect())
}

/// A record as read from the cluster: the release and the Secret's
/// `resourceVersion` (used for conditional updates) and labels.
#[derive(Debug, Clone)]
pub struct StoredRelease {
    pub release: Release,
    pub resource_version: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl StoredRelease {
    /// When the Secret was created (`createdAt` label), if Helm's label is there.
    pub fn created_at(&self) -> Option<DateTime<Utc>> {
        let secs = self.labels.get("createdAt")?.parse::<i64>().ok()?;
        DateTime::from_timestamp(secs, 0)
    }

    /// When the Secret was last rewritten (`modifiedAt`), else created.
    pub fn modified_at(&self) -> Option<DateTime<Utc>> {
        self.labels
            .get("modifiedAt")
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|s| DateTime::from_timestamp(s, 0))
            .or_else(|| self.created_at())
    }
}

/// Errors of the storage driver.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error(
        "record {namespace}/{secret} already exists: another operation created this revision first; rerun when it has finished"
    )]
    AlreadyExists { namespace: String, secret: String },
    #[error(
        "record {namespace}/{secret} changed while Ichor was updating it (someone else wrote the release); rerun to read the new state"
    )]
    Conflict { namespace: String, secret: String },
    #[error(
        "{action} record(s) of Helm release {release} in namespace {namespace} failed; check that the namespace exists and the caller may {verb} Secrets there"
    )]
    Api {
        action: &'static str,
        verb: &'static str,
        release: String,
        namespace: String,
        source: Box<kube::Error>,
    },
}

/// Helm's Secret storage in one namespace.
#[derive(Clone)]
pub struct SecretStorage {
    api: Api<Secret>,
    client: kube::Client,
    namespace: String,
    custom_labels: BTreeMap<String, String>,
}

impl SecretStorage {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        SecretStorage {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            custom_labels: BTreeMap::new(),
        }
    }

    /// Labels added to every record written (never Helm's system labels).
    pub fn with_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.custom_labels = labels;
        self
    }

    /// The storage namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api_err(
        &self,
        action: &'static str,
        verb: &'static str,
        release: &str,
    ) -> impl FnOnce(kube::Error) -> StorageError {
        let namespace = self.namespace.clone();
        let release = release.to_string();
        move |source| StorageError::Api {
            action,
            verb,
            release,
            namespace,
            source: Box::new(source),
        }
    }

    /// The records of the storage namespace that `lp` selects.
    async fn list(&self, lp: &ListParams) -> Result<Vec<ListedSecret>, kube::Error> {
        Ok(secret_list::list(&self.client, Some(&self.namespace), lp)
            .await?
            .items)
    }

    /// Every revision of `release`, oldest first.
    pub async fn history(&self, release: &str) -> Result<Vec<StoredRelease>, StorageError> {
        let lp = ListParams::default().labels(&release_selector(release));
        let list = self
            .list(&lp)
            .await
            .map_err(self.api_err("listing", "list", release))?;
        let mut out = stored_all(&list)?;
        out.sort_by_key(|s| s.release.version);
        Ok(out)
    }

    /// The newest `deployed` revision of `release`. Found as Helm's own
    /// storage finds it, by the `status=deployed` label, so that only the
    /// deployed record is read and decoded, not the whole history; when no
    /// record with that label is deployed (labels written by another tool),
    /// the whole history is read.
    pub async fn deployed(&self, release: &str) -> Result<Option<Release>, StorageError> {
        let lp = ListParams::default().labels(&format!(
            "{},status={}",
            release_selector(release),
            Status::Deployed.as_str()
        ));
        let list = self
            .list(&lp)
            .await
            .map_err(self.api_err("listing", "list", release))?;
        let mut labelled = stored_all(&list)?;
        labelled.sort_by_key(|s| s.release.version);
        if let Some(s) = newest_deployed(&labelled) {
            return Ok(Some(s.release.clone()));
        }
        let history = self.history(release).await?;
        Ok(newest_deployed(&history).map(|s| s.release.clone()))
    }

    /// Every record in the namespace (`owner=helm`), any release.
    pub async fn list_all(&self) -> Result<Vec<StoredRelease>, StorageError> {
        let lp = ListParams::default().labels(OWNER_SELECTOR);
        let list = self
            .list(&lp)
            .await
            .map_err(self.api_err("listing", "list", "*"))?;
        stored_all(&list)
    }

    /// One revision, `None` when it does not exist.
    pub async fn get(
        &self,
        release: &str,
        revision: u32,
    ) -> Result<Option<StoredRelease>, StorageError> {
        let s = self
            .api
            .get_opt(&record::secret_name(release, revision))
            .await
            .map_err(self.api_err("reading", "get", release))?;
        s.as_ref().map(stored).transpose()
    }

    /// Creates a new revision's record. An existing Secret of that name is
    /// [`StorageError::AlreadyExists`]: the create is the lock.
    pub async fn create(&self, rel: &Release) -> Result<StoredRelease, StorageError> {
        let secret = record::to_secret(
            rel,
            &self.namespace,
            &self.custom_labels,
            Write::Create,
            Utc::now(),
        )?;
        match self.api.create(&PostParams::default(), &secret).await {
            Ok(s) => stored(&s),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(StorageError::AlreadyExists {
                namespace: self.namespace.clone(),
                secret: rel.secret_name(),
            }),
            Err(e) => Err(self.api_err("creating", "create", &rel.name)(e)),
        }
    }

    /// Rewrites a revision's record. With the `resourceVersion` of `prev` the
    /// update is conditional ([`StorageError::Conflict`] when it changed).
    pub async fn update(
        &self,
        prev: Option<&StoredRelease>,
        rel: &Release,
    ) -> Result<StoredRelease, StorageError> {
        let labels = prev
            .map(|p| record_labels(&p.labels))
            .unwrap_or_else(|| self.custom_labels.clone());
        let mut secret =
            record::to_secret(rel, &self.namespace, &labels, Write::Update, Utc::now())?;
        if let Some(created) = prev.and_then(|p| p.labels.get("createdAt")) {
            // Keep when it was created: the pending-record repair reads it.
            secret
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert("createdAt".into(), created.clone());
        }
        secret.metadata.resource_version = prev.and_then(|p| p.resource_version.clone());
        let name = rel.secret_name();
        match self
            .api
            .replace(&name, &PostParams::default(), &secret)
            .await
        {
            Ok(s) => stored(&s),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(StorageError::Conflict {
                namespace: self.namespace.clone(),
                secret: name,
            }),
            Err(e) => Err(self.api_err("updating", "update", &rel.name)(e)),
        }
    }

    /// Deletes one revision's record (absent is fine).
    pub async fn delete(&self, release: &str, revision: u32) -> Result<(), StorageError> {
        match self
            .api
            .delete(
                &record::secret_name(release, revision),
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.api_err("deleting", "delete", release)(e)),
        }
    }
}

fn record_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| !record::SYSTEM_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Every record of a list, decoded, in the list's order.
fn stored_all(items: &[ListedSecret]) -> Result<Vec<StoredRelease>, StorageError> {
    items
        .iter()
        .map(|s| {
            Ok(StoredRelease {
                release: listed_release(s)?,
                resource_version: s.resource_version.clone(),
                labels: s.labels.clone(),
            })
        })
        .collect()
}

fn listed_release(s: &ListedSecret) -> Result<Release, CodecError> {
    let data = s.release.as_ref().ok_or_else(|| CodecError::MissingData {
        secret: s.display_name(),
    })?;
    record::decode_release(data, &s.display_name())
}

fn stored(s: &Secret) -> Result<StoredRelease, StorageError> {
    Ok(StoredRelease {
        release: record::from_secret(s)?,
        resource_version: s.metadata.resource_version.clone(),
        labels: s.metadata.labels.clone().unwrap_or_default(),
    })
}
