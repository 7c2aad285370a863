//! Node credentials: the cluster's bundle Secret → an `os:admin` client
//! certificate minted in memory from the bundle's OS CA. Nothing here is
//! logged or written anywhere; the cache holds the identity only in memory
//! and mints a new one when the Secret changes or the certificate ages.
//!
//! Talos clients are not kept between reconciles: a machine is read again
//! at its resync, minutes later, and thousands of idle mutual-TLS
//! connections (each with its TLS and HTTP/2 buffers) would cost far more
//! memory than one handshake per reconcile costs time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ichor_api::TalosCluster;
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, generate_client_certificate};
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::{BundleError, Error, Result};

/// How long a minted client certificate is valid.
pub const CERT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// A cached identity is minted again after this long.
const REMINT_AFTER: Duration = Duration::from_secs(12 * 3600);
/// For this long after the Secret was read, its cached identity is used
/// without reading the Secret again (the machines of one cluster reconcile
/// together: one read serves them all).
const RECHECK_AFTER: Duration = Duration::from_secs(10);

struct Entry {
    resource_version: String,
    minted: Instant,
    /// When the Secret was last read and found at `resource_version`.
    checked: Instant,
    identity: ClientIdentity,
    /// Changes with every mint, so clients made with an older identity are replaced.
    serial: u64,
    /// The bundle's CA dates, for the metrics.
    dates: crate::metrics::CaDates,
}

/// Minted identities by (namespace, Secret name).
#[derive(Default)]
pub struct Cache {
    entries: Mutex<HashMap<(String, String), Entry>>,
    /// Held while a Secret is read, so concurrent misses read it once.
    reading: tokio::sync::Mutex<()>,
    serial: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

impl Cache {
    /// A Talos client for `endpoint` with the admin identity of `cluster`
    /// (it connects on its first call; dropped, it closes its connection).
    pub async fn talos_client(
        &self,
        client: &kube::Client,
        cluster: &TalosCluster,
        endpoint: &str,
        options: ClientOptions,
    ) -> Result<Result<TalosClient, ichor_talos_client::Error>> {
        let (identity, _) = self.identity_and_serial(client, cluster).await?;
        Ok(TalosClient::new(endpoint, &identity, options))
    }

    /// The admin identity for `cluster`'s nodes.
    pub async fn identity(
        &self,
        client: &kube::Client,
        cluster: &TalosCluster,
    ) -> Result<ClientIdentity> {
        Ok(self.identity_and_serial(client, cluster).await?.0)
    }

    async fn identity_and_serial(
        &self,
        client: &kube::Client,
        cluster: &TalosCluster,
    ) -> Result<(ClientIdentity, u64)> {
        let source = BundleSource::of(cluster);
        let cache_key = (source.namespace.clone(), source.secret.clone());
        let fresh = || {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .get(&cache_key)
                .filter(|e| fresh_enough(e.checked.elapsed(), e.minted.elapsed()))
                .map(|e| (e.identity.clone(), e.serial))
        };
        if let Some(found) = fresh() {
            return Ok(found);
        }
        // The machines of a cluster reconcile together: one of them reads
        // the Secret, the others wait for it and find the identity cached.
        let _reading = self.reading.lock().await;
        if let Some(found) = fresh() {
            return Ok(found);
        }
        let secret = source.read(client).await?;
        let rv = secret.resource_version().unwrap_or_default();
        {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = entries.get_mut(&cache_key)
                && e.resource_version == rv
                && e.minted.elapsed() < REMINT_AFTER
            {
                e.checked = Instant::now();
                return Ok((e.identity.clone(), e.serial));
            }
        }
        let text = source.text(&secret)?;
        let origin = source.origin();
        let identity = identity_from_bundle_text(text, &origin).map_err(|e| source.error(e))?;
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                cache_key,
                Entry {
                    resource_version: rv,
                    minted: Instant::now(),
                    checked: Instant::now(),
                    identity: identity.clone(),
                    serial,
                    dates: ca_dates(&secret, text, &origin),
                },
            );
        Ok((identity, serial))
    }
}

impl Cache {
    /// The CA dates of every bundle read so far, by (namespace, Secret name).
    pub(crate) fn bundle_dates(
        &self,
    ) -> std::collections::HashMap<(String, String), crate::metrics::CaDates> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, e)| (k.clone(), e.dates.clone()))
            .collect()
    }
}

/// The CA dates of the bundle `text` of `secret`, for the metrics: read
/// with the identity, so a scrape never reads a Secret (none when it does
/// not parse: the identity's error says why).
fn ca_dates(secret: &Secret, text: &str, origin: &str) -> crate::metrics::CaDates {
    let created = secret
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second());
    SecretsBundle::parse(text, origin)
        .map(|b| crate::metrics::bundle_dates(&b, created))
        .unwrap_or_default()
}

/// Where a cluster keeps its secrets bundle: the Secret beside it and the
/// key in it. Every read of a bundle goes through here.
struct BundleSource {
    namespace: String,
    cluster: String,
    secret: String,
    key: String,
}

impl BundleSource {
    fn of(cluster: &TalosCluster) -> Self {
        BundleSource {
            namespace: cluster.namespace().unwrap_or_default(),
            cluster: cluster.name_any(),
            secret: cluster.spec.secrets_ref.name.clone(),
            key: cluster.spec.secrets_ref.key_or_default().to_owned(),
        }
    }

    /// `source` as the cluster's error, naming the Secret and the key.
    fn error(&self, source: BundleError) -> Error {
        Error::Bundle {
            namespace: self.namespace.clone(),
            cluster: self.cluster.clone(),
            secret: self.secret.clone(),
            key: self.key.clone(),
            source: Box::new(source),
        }
    }

    fn origin(&self) -> String {
        format!("Secret {}/{}", self.namespace, self.secret)
    }

    async fn read(&self, client: &kube::Client) -> Result<Secret> {
        Api::<Secret>::namespaced(client.clone(), &self.namespace)
            .get_opt(&self.secret)
            .await
            .map_err(Error::kube(format!("reading {}", self.origin())))?
            .ok_or_else(|| self.error(BundleError::NoSecret))
    }

    /// The bundle's text in `secret`.
    fn text<'a>(&self, secret: &'a Secret) -> Result<&'a str> {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&self.key))
            .ok_or_else(|| {
                self.error(BundleError::NoKey {
                    key: self.key.clone(),
                })
            })?;
        std::str::from_utf8(&data.0).map_err(|e| self.error(BundleError::NotUtf8(e)))
    }
}

/// The cluster's secrets bundle, read from its Secret now (no cache: the
/// identity cache keeps no bundle). A parse error's quoted values are
/// redacted.
pub(crate) async fn read_bundle(
    client: &kube::Client,
    cluster: &TalosCluster,
) -> Result<SecretsBundle> {
    let source = BundleSource::of(cluster);
    let secret = source.read(client).await?;
    SecretsBundle::parse(source.text(&secret)?, &source.origin())
        .map_err(|e| source.error(BundleError::Read(BundleError::redacted(&e))))
}

/// Whether a cached identity is used without reading its Secret: read
/// less than [`RECHECK_AFTER`] ago and minted less than [`REMINT_AFTER`] ago.
fn fresh_enough(since_checked: Duration, since_minted: Duration) -> bool {
    since_checked < RECHECK_AFTER && since_minted < REMINT_AFTER
}

/// Parses a bundle and mints an `os:admin` client identity from its OS CA.
/// The error's chain never contains key material.
pub fn identity_from_bundle_text(text: &str, origin: &str) -> Result<ClientIdentity, BundleError> {
    // A parse error may quote the value it choked on, which in a bundle can be a key.
    let bundle = SecretsBundle::parse(text, origin)
        .map_err(|e| BundleError::Read(BundleError::redacted(&e)))?;
    let (ca_pem, _) = bundle.os_ca_pem().ok_or(BundleError::NoOsCa)?;
    let cert = generate_client_certificate(&bundle, Role::Admin, CERT_VALIDITY)
        .map_err(|e| BundleError::Certificate(BundleError::redacted(&e)))?;
    Ok(ClientIdentity::from_pem(ca_pem, cert.crt_pem, cert.key_pem))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: the controller-at-scale goal (docs/benchmarks.md): one Secret read serves a cluster's machines
    #[test]
    fn a_recently_read_secret_is_not_read_again_until_it_ages() {
        assert!(fresh_enough(Duration::from_secs(1), Duration::from_secs(1)));
        assert!(!fresh_enough(RECHECK_AFTER, Duration::from_secs(1)));
        assert!(!fresh_enough(Duration::from_secs(1), REMINT_AFTER));
    }

    #[test]
    fn a_bundle_gives_an_admin_identity_and_errors_name_no_secret() {
        let text = ichor_testenv::fixtures::talos("stability-secrets.yaml");
        let id = identity_from_bundle_text(&text, "fixture").unwrap();
        assert!(format!("{id:?}").contains("<redacted>"));
        let err = identity_from_bundle_text("certs: \"c2VjcmV0\"\n", "bad").unwrap_err();
        let said = format!("{} {err:?}", ichor_api::error_text::chain(&err));
        assert!(said.contains("(redacted)"), "{said}");
        assert!(!said.contains("c2VjcmV0"), "{said}");
    }
}
