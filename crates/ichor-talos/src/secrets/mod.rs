//! The Talos secrets bundle (`talosctl gen secrets` format) and its recovery
//! from a control-plane machine config in either shape.
//!
//! Keys are the lower-cased Go field names (`bootstraptoken`, `trustdinfo`,
//! `k8saggregator`, ...). Certificates and keys are base64 of PEM. Unknown
//! keys are kept.

mod generate;
mod validate;

pub use generate::CA_VALIDITY;
pub use validate::{BundleProblem, bundle_problems};

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::v1alpha1::{Base64CertAndKey, ClusterSection, MachineSection};
use crate::config::{ConfigError, Document, Extra, MachineConfig, MachineType};
use crate::pem::b64;

/// Errors of the `secrets` module.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The bundle file could not be read.
    #[error("cannot read secrets bundle {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bundle file could not be written.
    #[error("cannot write secrets bundle {path}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bundle is not valid YAML or misses a section.
    #[error("{origin} is not a Talos secrets bundle")]
    Parse {
        /// Where the text came from.
        origin: String,
        /// The YAML error, the values it quotes redacted.
        source: crate::redact::Redacted,
    },
    /// The bundle is YAML of the right shape, but Talos would refuse it.
    #[error(
        "{origin} is not a secrets bundle Talos accepts: {}; fix those fields, or recover the bundle again from a control-plane config (`talosctl gen secrets --from-controlplane-config`)",
        problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Invalid {
        /// Where the bundle came from.
        origin: String,
        /// Every problem found, each naming its field.
        problems: Vec<BundleProblem>,
    },
    /// Generating a new bundle failed.
    #[error(
        "cannot generate a secrets bundle: {0}; this is a bug in ichor-talos or a broken system random source"
    )]
    Generate(String),
    /// Serialising failed (a bug).
    #[error("cannot serialise the secrets bundle")]
    Serialise(#[source] serde_yaml_ng::Error),
    /// The machine config could not be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker config holds no CA keys.
    #[error(
        "{origin} is a worker config: workers hold no CA keys, so no secrets bundle can be recovered from it. Use a control-plane node's config instead (for example `talosctl -n <control-plane-ip> get machineconfig -o yaml`)"
    )]
    WorkerConfig {
        /// Where the config came from.
        origin: String,
    },
    /// A machine config was given where a secrets bundle belongs.
    #[error(
        "{origin} is a Talos machine config ({role}), not a secrets bundle; pass the file `talosctl gen secrets` wrote, or recover one from a control-plane config with `talosctl gen secrets --from-controlplane-config FILE`{worker_note}"
    )]
    MachineConfigNotBundle {
        /// Where the text came from.
        origin: String,
        /// `worker`, `controlplane`, or `unknown role`.
        role: String,
        /// Why a worker's config cannot be used even for recovery.
        worker_note: &'static str,
    },
    /// A control-plane config misses a secret.
    #[error(
        "{origin} has no {what} (looked at {looked_at}); recover the bundle from an unredacted control-plane config read with an os:admin talosconfig"
    )]
    Missing {
        /// Where the config came from.
        origin: String,
        /// Which secret is missing.
        what: &'static str,
        /// Which fields were read.
        looked_at: &'static str,
    },
}

impl SecretsError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Self::Read { .. } => Some("check the path (the file `talosctl gen secrets` wrote)".into()),
            Self::Write { .. } => Some("check that the directory exists and is writable".into()),
            Self::Parse { .. } => Some(
                "expected the YAML `talosctl gen secrets` writes (cluster, secrets, trustdinfo, certs)"
                    .into(),
            ),
            Self::Serialise(_) => Some("this is a bug in ichor-talos; please report it".into()),
            // Transparent: the config error is not a cause of its own in the chain.
            Self::Config(e) => e.help(),
            _ => None,
        }
    }
}

/// `cluster`: discovery identity.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterIdentity {
    /// Cluster ID (opaque base64 string).
    #[serde(default)]
    pub id: String,
    /// Cluster secret (base64).
    #[serde(default)]
    pub secret: String,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `secrets`: tokens and encryption secrets.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterSecrets {
    /// Kubernetes bootstrap token `<6>.<16>`.
    #[serde(default)]
    pub bootstraptoken: String,
    /// Secretbox encryption secret (base64 32 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretboxencryptionsecret: Option<String>,
    /// AES-CBC encryption secret (pre-1.3 clusters only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbcencryptionsecret: Option<String>,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `trustdinfo`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TrustdInfo {
    /// trustd token `<6>.<16>`.
    #[serde(default)]
    pub token: String,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `certs`: the CAs (certificate and key, base64 of PEM).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BundleCerts {
    /// etcd CA (ECDSA).
    #[serde(default)]
    pub etcd: Base64CertAndKey,
    /// Kubernetes CA (ECDSA).
    #[serde(default)]
    pub k8s: Base64CertAndKey,
    /// Kubernetes aggregator CA (ECDSA).
    #[serde(default)]
    pub k8saggregator: Base64CertAndKey,
    /// Service-account signing key (`key` only).
    #[serde(default)]
    pub k8sserviceaccount: Base64CertAndKey,
    /// Talos OS (API) CA (Ed25519, key label `ED25519 PRIVATE KEY`).
    #[serde(default)]
    pub os: Base64CertAndKey,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A Talos secrets bundle.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SecretsBundle {
    /// Discovery identity.
    #[serde(default)]
    pub cluster: ClusterIdentity,
    /// Tokens and encryption secrets.
    #[serde(default)]
    pub secrets: ClusterSecrets,
    /// trustd token.
    #[serde(default)]
    pub trustdinfo: TrustdInfo,
    /// The CAs.
    #[serde(default)]
    pub certs: BundleCerts,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The role of `text` when it reads as a Talos machine config (a first
/// document with `version` and `machine`) rather than a bundle.
fn machine_config_role(text: &str) -> Option<String> {
    let first = serde_yaml_ng::Deserializer::from_str(text).next()?;
    let doc = serde_yaml_ng::Value::deserialize(first).ok()?;
    let machine = doc.get("machine")?;
    doc.get("version")?;
    Some(
        machine
            .get("type")
            .and_then(serde_yaml_ng::Value::as_str)
            .filter(|t| matches!(*t, "worker" | "controlplane" | "init"))
            .unwrap_or("unknown role")
            .to_string(),
    )
}

fn non_empty(s: Option<&String>) -> Option<String> {
    s.filter(|s| !s.is_empty()).cloned()
}

/// The multi-document config's documents that carry secrets.
#[derive(Default)]
struct SecretDocuments<'a> {
    identity: Option<&'a crate::config::DiscoveryIdentityConfig>,
    api_ca: Option<&'a crate::config::PemCertAndKey>,
    agg_ca: Option<&'a crate::config::PemCertAndKey>,
    sa: Option<&'a crate::config::ServiceAccountIssuer>,
    enc: Option<&'a crate::config::KubeEtcdEncryptionConfig>,
}

impl<'a> SecretDocuments<'a> {
    fn scan(cfg: &'a MachineConfig) -> Self {
        let mut found = SecretDocuments::default();
        for d in &cfg.documents {
            match d {
                Document::DiscoveryIdentity(d) => found.identity = Some(d),
                Document::KubeApiServerCa(d) => found.api_ca = d.issuing_ca.as_ref(),
                Document::KubeAggregatorCa(d) => found.agg_ca = d.issuing_ca.as_ref(),
                Document::KubeServiceAccount(d) => found.sa = d.issuer.as_ref(),
                Document::KubeEtcdEncryption(d) => found.enc = Some(d),
                _ => {}
            }
        }
        found
    }
}

/// A certificate and key pair with both halves, as the bundle keeps it.
fn full(c: Option<&Base64CertAndKey>) -> Option<Base64CertAndKey> {
    c.filter(|c| non_empty(c.crt.as_ref()).is_some() && non_empty(c.key.as_ref()).is_some())
        .map(|c| Base64CertAndKey {
            crt: c.crt.clone(),
            key: c.key.clone(),
            extra: Extra::new(),
        })
}

/// A multi-document PEM pair with both halves, as the bundle keeps it (base64).
fn from_pem(c: Option<&crate::config::PemCertAndKey>) -> Option<Base64CertAndKey> {
    c.and_then(
        |c| match (non_empty(c.cert.as_ref()), non_empty(c.key.as_ref())) {
            (Some(cert), Some(key)) => Some(Base64CertAndKey {
                crt: Some(b64(&cert)),
                key: Some(b64(&key)),
                extra: Extra::new(),
            }),
            _ => None,
        },
    )
}

/// The CAs and the service-account key, each from the v1alpha1 document or
/// the multi-document config's own document.
fn recovered_certs(
    machine: Option<&MachineSection>,
    cluster: Option<&ClusterSection>,
    api_ca: Option<&crate::config::PemCertAndKey>,
    agg_ca: Option<&crate::config::PemCertAndKey>,
    sa: Option<&crate::config::ServiceAccountIssuer>,
    missing: &dyn Fn(&'static str, &'static str) -> SecretsError,
) -> Result<BundleCerts, SecretsError> {
    let os = full(machine.and_then(|m| m.ca.as_ref()))
        .ok_or_else(|| missing("OS CA certificate and key", "machine.ca"))?;
    let etcd = full(
        cluster
            .and_then(|c| c.etcd.as_ref())
            .and_then(|e| e.ca.as_ref()),
    )
    .ok_or_else(|| missing("etcd CA certificate and key", "cluster.etcd.ca"))?;
    let k8s = full(cluster.and_then(|c| c.ca.as_ref()))
        .or_else(|| from_pem(api_ca))
        .ok_or_else(|| {
            missing(
                "Kubernetes CA certificate and key",
                "cluster.ca, KubeAPIServerCAConfig.issuingCA",
            )
        })?;
    let k8saggregator = full(cluster.and_then(|c| c.aggregator_ca.as_ref()))
        .or_else(|| from_pem(agg_ca))
        .ok_or_else(|| {
            missing(
                "aggregator CA certificate and key",
                "cluster.aggregatorCA, KubeAggregatorCAConfig.issuingCA",
            )
        })?;
    let sa_key = non_empty(
        cluster
            .and_then(|c| c.service_account.as_ref())
            .and_then(|s| s.key.as_ref()),
    )
    .or_else(|| non_empty(sa.and_then(|s| s.private_key.as_ref())).map(|k| b64(&k)))
    .ok_or_else(|| {
        missing(
            "service-account key",
            "cluster.serviceAccount.key, KubeServiceAccountConfig.issuer.privateKey",
        )
    })?;
    Ok(BundleCerts {
        etcd,
        k8s,
        k8saggregator,
        k8sserviceaccount: Base64CertAndKey {
            crt: None,
            key: Some(sa_key),
            extra: Extra::new(),
        },
        os,
        extra: Extra::new(),
    })
}

impl SecretsBundle {
    /// Parses bundle YAML and validates it as Talos does ([`Self::validate`]);
    /// `origin` is named in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SecretsError> {
        if let Some(role) = machine_config_role(text) {
            let worker_note = if role == "worker" {
                " (not from this file: workers hold no CA keys)"
            } else {
                ""
            };
            return Err(SecretsError::MachineConfigNotBundle {
                origin: origin.to_string(),
                role,
                worker_note,
            });
        }
        let bundle: Self = serde_yaml_ng::from_str(text).map_err(|e| SecretsError::Parse {
            origin: origin.to_string(),
            source: crate::redact::Redacted::of(&e),
        })?;
        bundle.validate(origin)?;
        Ok(bundle)
    }

    /// Checks the bundle as Talos does before it uses one: every required
    /// field, exactly one etcd encryption secret, every certificate and key
    /// parses with a key type its PEM label promises. All problems are
    /// reported in one [`SecretsError::Invalid`], each naming its field.
    pub fn validate(&self, origin: &str) -> Result<(), SecretsError> {
        let problems = bundle_problems(self);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SecretsError::Invalid {
                origin: origin.to_string(),
                problems,
            })
        }
    }

    /// Reads a bundle file.
    pub fn from_file(path: &Path) -> Result<Self, SecretsError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Serialises the bundle (deterministic).
    pub fn to_yaml(&self) -> Result<String, SecretsError> {
        serde_yaml_ng::to_string(self).map_err(SecretsError::Serialise)
    }

    /// Writes the bundle with mode 0600 (it holds every key of the cluster).
    pub fn write_file(&self, path: &Path) -> Result<(), SecretsError> {
        let text = self.to_yaml()?;
        crate::write_private_file(path, text.as_bytes()).map_err(|source| SecretsError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    /// Recovers the bundle from a control-plane machine config, in either shape
    /// (what `talosctl gen secrets --from-controlplane-config` does).
    ///
    /// A worker config is refused with [`SecretsError::WorkerConfig`].
    pub fn from_machine_config(cfg: &MachineConfig, origin: &str) -> Result<Self, SecretsError> {
        let facts = cfg.facts();
        if facts.machine_type == MachineType::Worker {
            return Err(SecretsError::WorkerConfig {
                origin: origin.to_string(),
            });
        }
        let missing = |what, looked_at| SecretsError::Missing {
            origin: origin.to_string(),
            what,
            looked_at,
        };
        let v1 = cfg.v1alpha1();
        let machine = v1.and_then(|v| v.machine.as_ref());
        let cluster = v1.and_then(|v| v.cluster.as_ref());

        let SecretDocuments {
            identity,
            api_ca,
            agg_ca,
            sa,
            enc,
        } = SecretDocuments::scan(cfg);

        let id = non_empty(cluster.and_then(|c| c.id.as_ref()))
            .or_else(|| non_empty(identity.and_then(|i| i.cluster_id.as_ref())))
            .ok_or_else(|| {
                missing(
                    "cluster ID",
                    "cluster.id, DiscoveryIdentityConfig.clusterID",
                )
            })?;
        let secret = non_empty(cluster.and_then(|c| c.secret.as_ref()))
            .or_else(|| non_empty(identity.and_then(|i| i.cluster_secret.as_ref())))
            .ok_or_else(|| {
                missing(
                    "cluster secret",
                    "cluster.secret, DiscoveryIdentityConfig.clusterSecret",
                )
            })?;
        let bootstraptoken = non_empty(cluster.and_then(|c| c.token.as_ref()))
            .ok_or_else(|| missing("bootstrap token", "cluster.token"))?;
        let secretbox = non_empty(cluster.and_then(|c| c.secretbox_encryption_secret.as_ref()))
            .or_else(|| enc.and_then(|e| e.provider_secret("secretbox")));
        let aescbc = non_empty(cluster.and_then(|c| c.aescbc_encryption_secret.as_ref()))
            .or_else(|| enc.and_then(|e| e.provider_secret("aescbc")));
        if secretbox.is_none() && aescbc.is_none() {
            return Err(missing(
                "etcd encryption secret",
                "cluster.secretboxEncryptionSecret, cluster.aescbcEncryptionSecret, KubeEtcdEncryptionConfig",
            ));
        }
        let trustd = non_empty(machine.and_then(|m| m.token.as_ref()))
            .ok_or_else(|| missing("trustd token", "machine.token"))?;

        let certs = recovered_certs(machine, cluster, api_ca, agg_ca, sa, &missing)?;

        let bundle = Self {
            cluster: ClusterIdentity {
                id,
                secret,
                extra: Extra::new(),
            },
            secrets: ClusterSecrets {
                bootstraptoken,
                secretboxencryptionsecret: secretbox,
                aescbcencryptionsecret: aescbc,
                extra: Extra::new(),
            },
            trustdinfo: TrustdInfo {
                token: trustd,
                extra: Extra::new(),
            },
            certs,
            extra: Extra::new(),
        };
        bundle.validate(origin)?;
        Ok(bundle)
    }

    /// Recovers the bundle from a control-plane config file: a plain machine
    /// config or `talosctl get machineconfig -o yaml` output.
    pub fn from_config_file(path: &Path) -> Result<Self, SecretsError> {
        let cfg = MachineConfig::from_file_live(path)?;
        Self::from_machine_config(&cfg, &path.display().to_string())
    }

    /// The OS CA as (certificate PEM, key PEM), decoded from base64.
    pub fn os_ca_pem(&self) -> Option<(String, String)> {
        let crt = crate::pem::unb64(self.certs.os.crt.as_deref()?)?;
        let key = crate::pem::unb64(self.certs.os.key.as_deref()?)?;
        Some((crt, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{fixture, fixtures_dir};
    use pretty_assertions::assert_eq;
    use serde_yaml_ng::Value;

    fn as_value(s: &str) -> Value {
        serde_yaml_ng::from_str(s).unwrap()
    }

    #[test]
    fn bundle_fixture_round_trips() {
        let text = fixture("stability-secrets.yaml");
        let b = SecretsBundle::parse(&text, "stability-secrets.yaml").unwrap();
        assert_eq!(b.secrets.bootstraptoken, "inn7ol.u4ehnti8qyls9ymo");
        assert!(b.secrets.aescbcencryptionsecret.is_none());
        let out = b.to_yaml().unwrap();
        assert_eq!(as_value(&text), as_value(&out));
        assert_eq!(
            SecretsBundle::parse(&out, "out")
                .unwrap()
                .to_yaml()
                .unwrap(),
            out
        );
    }

    #[test]
    fn recover_from_both_shapes_gives_the_fixture_bundle() {
        let want = as_value(&fixture("stability-secrets.yaml"));
        for f in [
            "stability-v1.12/base-controlplane.yaml",
            "stability-v1.14/base-controlplane.yaml",
            "stability-v1.12/overrides-controlplane.yaml",
            "stability-v1.14/overrides-controlplane.yaml",
        ] {
            let cfg = MachineConfig::from_file(&fixtures_dir().join(f)).unwrap();
            let b = SecretsBundle::from_machine_config(&cfg, f).unwrap();
            assert_eq!(as_value(&b.to_yaml().unwrap()), want, "{f}");
        }
    }

    #[test]
    fn worker_configs_are_refused_with_what_to_do() {
        for f in [
            "stability-v1.12/base-worker.yaml",
            "stability-v1.14/base-worker.yaml",
        ] {
            let cfg = MachineConfig::parse(&fixture(f)).unwrap();
            let err = SecretsBundle::from_machine_config(&cfg, f).unwrap_err();
            assert!(
                matches!(err, SecretsError::WorkerConfig { .. }),
                "{f}: {err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains(f) && msg.contains("control-plane node's config"),
                "{msg}"
            );
        }
    }

    #[test]
    fn redacted_or_partial_control_plane_config_says_what_is_missing() {
        let cfg =
            MachineConfig::parse("version: v1alpha1\nmachine:\n  type: controlplane\n").unwrap();
        let err = SecretsBundle::from_machine_config(&cfg, "cp.yaml").unwrap_err();
        assert!(
            err.to_string().contains("cp.yaml has no cluster ID"),
            "{err}"
        );
    }

    #[test]
    fn recover_from_a_file() {
        let p = fixtures_dir().join("stability-v1.14/base-controlplane.yaml");
        let b = SecretsBundle::from_config_file(&p).unwrap();
        assert_eq!(b.trustdinfo.token, "d8cwfa.eyvpi0xwxyarbfid");
        let w = fixtures_dir().join("stability-v1.14/base-worker.yaml");
        let err = SecretsBundle::from_config_file(&w).unwrap_err().to_string();
        assert!(err.contains("base-worker.yaml is a worker config"), "{err}");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn s() -> impl Strategy<Value = String> {
            "[a-zA-Z0-9+/=.\\- ]{0,24}"
        }

        fn ck() -> impl Strategy<Value = Base64CertAndKey> {
            (prop::option::of(s()), prop::option::of(s())).prop_map(|(crt, key)| Base64CertAndKey {
                crt,
                key,
                extra: Extra::new(),
            })
        }

        proptest! {
            /// parse(serialise(x)) == x and serialisation is deterministic.
            #[test]
            fn bundle_round_trips(
                id in s(), secret in s(), token in s(), sb in prop::option::of(s()),
                aes in prop::option::of(s()), trustd in s(),
                certs in (ck(), ck(), ck(), ck(), ck()),
            ) {
                let b = SecretsBundle {
                    cluster: ClusterIdentity { id, secret, extra: Extra::new() },
                    secrets: ClusterSecrets {
                        bootstraptoken: token,
                        secretboxencryptionsecret: sb,
                        aescbcencryptionsecret: aes,
                        extra: Extra::new(),
                    },
                    trustdinfo: TrustdInfo { token: trustd, extra: Extra::new() },
                    certs: BundleCerts {
                        etcd: certs.0, k8s: certs.1, k8saggregator: certs.2,
                        k8sserviceaccount: certs.3, os: certs.4, extra: Extra::new(),
                    },
                    extra: Extra::new(),
                };
                let text = b.to_yaml().unwrap();
                // the values are not real keys: decode without validating
                let back: SecretsBundle = serde_yaml_ng::from_str(&text).unwrap();
                prop_assert_eq!(&back, &b);
                prop_assert_eq!(back.to_yaml().unwrap(), text);
            }
        }
    }

    /// Covers: the bundle check of ADR 0009 (all problems at once, each naming its field, no value quoted)
    #[test]
    fn an_invalid_bundle_is_refused_with_every_problem_named() {
        let mut b = SecretsBundle::parse(&fixture("stability-secrets.yaml"), "f").unwrap();
        let secret = b.cluster.secret.clone();
        b.cluster.secret.clear();
        b.trustdinfo.token.clear();
        b.certs.k8saggregator = Base64CertAndKey::default();
        let text = b.to_yaml().unwrap();
        let err = SecretsBundle::parse(&text, "bad.yaml").unwrap_err();
        let SecretsError::Invalid { problems, .. } = &err else {
            panic!("{err}");
        };
        let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["cluster.secret", "trustdinfo.token", "certs.k8saggregator"]
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("bad.yaml is not a secrets bundle Talos accepts"),
            "{msg}"
        );
        assert!(
            !msg.contains(&secret) && !msg.contains(&b.cluster.id),
            "{msg}"
        );
    }

    #[test]
    fn write_and_read_back_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secrets.yaml");
        let b = SecretsBundle::parse(&fixture("stability-secrets.yaml"), "f").unwrap();
        b.write_file(&p).unwrap();
        assert_eq!(SecretsBundle::from_file(&p).unwrap(), b);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let (crt, key) = b.os_ca_pem().unwrap();
        assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
    }
}
