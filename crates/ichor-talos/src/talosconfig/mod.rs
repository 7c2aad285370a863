//! The talosconfig client file: read it the way talosctl does, write it, and
//! generate one from a secrets bundle (an Ed25519 client certificate signed by
//! the bundle's OS CA).
//!
//! File format (as talosctl reads it): `context` names the current context;
//! `contexts.<name>` holds `endpoints`, `nodes`, and `ca`/`crt`/`key` as
//! standard base64 of PEM. The key's PEM label is `ED25519 PRIVATE KEY`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use crate::config::Extra;
use crate::pem::{ED25519_PEM_LABEL, b64, unb64};
use crate::secrets::SecretsBundle;

/// Environment variable naming the talosconfig file.
pub const TALOSCONFIG_ENV: &str = "TALOSCONFIG";
/// Environment variable naming Talos's home directory (absolute paths only).
pub const TALOS_HOME_ENV: &str = "TALOS_HOME";
/// The in-pod talosconfig path Talos mounts for workloads with API access.
pub const IN_POD_TALOSCONFIG: &str = "/var/run/secrets/talos.dev/config";
/// Default client certificate lifetime (Talos: one year).
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Errors of the `talosconfig` module.
#[derive(Debug, thiserror::Error)]
pub enum TalosconfigError {
    /// No home directory to find `~/.talos/config` in.
    #[error(
        "cannot find a talosconfig: no --talosconfig, no ${TALOSCONFIG_ENV}, and no home directory; pass --talosconfig FILE"
    )]
    NoPath,
    /// The file could not be read.
    #[error("cannot read talosconfig {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file could not be written.
    #[error("cannot write talosconfig {path}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not a talosconfig.
    #[error("{origin} is not a valid talosconfig")]
    Parse {
        /// Where the text came from.
        origin: String,
        /// The YAML error, the values it quotes redacted.
        source: crate::redact::Redacted,
    },
    /// Serialising failed (a bug).
    #[error("cannot serialise the talosconfig")]
    Serialise(#[source] serde_yaml_ng::Error),
    /// No current context.
    #[error(
        "{origin} has no current context (`context:` is empty); set one with `talosctl config context NAME`"
    )]
    NoContext {
        /// Where the talosconfig came from.
        origin: String,
    },
    /// The named context does not exist.
    #[error("{origin} has no context named {name:?} (it has: {available})")]
    UnknownContext {
        /// Where the talosconfig came from.
        origin: String,
        /// The requested name.
        name: String,
        /// The context names present.
        available: String,
    },
    /// A context has no endpoints.
    #[error(
        "context {name:?} in {origin} has no endpoints; add them with `talosctl config endpoint IP...`"
    )]
    NoEndpoints {
        /// Where the talosconfig came from.
        origin: String,
        /// The context.
        name: String,
    },
    /// A `ca`/`crt`/`key` value is not base64 of PEM text.
    #[error(
        "context {name:?} in {origin}: `{field}` is not base64-encoded PEM (is the file cut short?); regenerate the talosconfig (talosctl config new, or from the secrets bundle)"
    )]
    BadBase64 {
        /// Where the talosconfig came from.
        origin: String,
        /// The context.
        name: String,
        /// `ca`, `crt` or `key`.
        field: &'static str,
    },
    /// The bundle has no usable OS CA.
    #[error(
        "the secrets bundle has no usable OS CA (certs.os): {reason}; use the bundle `talosctl gen secrets` wrote, or recover it from a control-plane config"
    )]
    BadCa {
        /// What is wrong.
        reason: String,
    },
    /// Creating the certificate failed.
    #[error("cannot create the Talos client certificate")]
    Certificate(#[source] rcgen::Error),
}

impl TalosconfigError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Self::Read { .. } => Some(format!("pass --talosconfig FILE or set ${TALOSCONFIG_ENV}")),
            Self::Write { .. } => Some("check that the directory exists and is writable".into()),
            Self::Parse { .. } => {
                Some("expected `context:` and `contexts:` as talosctl writes them".into())
            }
            Self::UnknownContext { .. } => Some("pick one of the contexts it has".into()),
            Self::Serialise(_) | Self::Certificate(_) => {
                Some("this is a bug in ichor-talos; please report it".into())
            }
            _ => None,
        }
    }
}

/// A Talos API role, carried in the client certificate's Organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `os:admin`: everything, including the sensitive machine config.
    Admin,
    /// `os:operator`.
    Operator,
    /// `os:reader`: read-only, no sensitive resources.
    Reader,
}

impl Role {
    /// The Organization value (`os:admin`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "os:admin",
            Self::Operator => "os:operator",
            Self::Reader => "os:reader",
        }
    }
}

/// One talosconfig context.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosContext {
    /// API endpoints (`host` or `host:port`; talosctl adds `:50000`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
    /// Default target nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
    /// OS CA: base64 of PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Client certificate: base64 of PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crt: Option<String>,
    /// Client key: base64 of PEM (label `ED25519 PRIVATE KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Keys Ichor does not model (`auth`, `cluster`, `proxy-url`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// The decoded credentials of a context, as PEM text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextCredentials {
    /// OS CA certificate(s), PEM.
    pub ca_pem: Option<String>,
    /// Client certificate, PEM.
    pub crt_pem: Option<String>,
    /// Client key, PEM as stored (label `ED25519 PRIVATE KEY` for Talos keys).
    pub key_pem: Option<String>,
}

impl ContextCredentials {
    /// The client key re-labelled `PRIVATE KEY` (PKCS#8), which rustls and
    /// other standard PEM readers accept.
    pub fn key_pem_pkcs8(&self) -> Option<String> {
        let key = self.key_pem.as_deref()?;
        crate::pem::relabel(key, "PRIVATE KEY")
    }
}

/// A talosconfig file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Talosconfig {
    /// Name of the current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Contexts by name, in file order.
    #[serde(default)]
    pub contexts: IndexMap<String, TalosContext>,
    /// Keys Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Where talosctl looks for its config, given the flag, an environment
/// lookup, the home directory and a file-exists check.
///
/// Order: `--talosconfig`, `$TALOSCONFIG`, `$TALOS_HOME/config` (absolute
/// `$TALOS_HOME` only), `~/.talos/config`, and, when that does not exist but
/// the in-pod file does, `/var/run/secrets/talos.dev/config`.
pub fn resolve_path_with(
    flag: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
    home: Option<PathBuf>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    if let Some(p) = flag.filter(|p| !p.as_os_str().is_empty()) {
        return Some(p.to_path_buf());
    }
    if let Some(p) = env(TALOSCONFIG_ENV).filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(h) = env(TALOS_HOME_ENV)
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
    {
        return Some(h.join("config"));
    }
    let default = home.map(|h| h.join(".talos").join("config"));
    let in_pod = Path::new(IN_POD_TALOSCONFIG);
    match default {
        Some(d) if exists(&d) => Some(d),
        _ if exists(in_pod) => Some(in_pod.to_path_buf()),
        d => d,
    }
}

/// [`resolve_path_with`] on this process's environment and home directory.
pub fn resolve_path(flag: Option<&Path>) -> Result<PathBuf, TalosconfigError> {
    resolve_path_with(
        flag,
        |k| std::env::var(k).ok(),
        dirs::home_dir(),
        Path::exists,
    )
    .ok_or(TalosconfigError::NoPath)
}

impl Talosconfig {
    /// Parses talosconfig YAML. A deprecated `target:` is moved into `endpoints`, as talosctl does.
    pub fn parse(text: &str, origin: &str) -> Result<Self, TalosconfigError> {
        let mut cfg: Self = serde_yaml_ng::from_str(text).map_err(|e| TalosconfigError::Parse {
            origin: origin.to_string(),
            source: crate::redact::Redacted::of(&e),
        })?;
        for ctx in cfg.contexts.values_mut() {
            if let Some(target) = ctx.extra.shift_remove("target")
                && let Some(t) = target.as_str().filter(|t| !t.is_empty())
                && !ctx.endpoints.iter().any(|e| e == t)
            {
                ctx.endpoints.push(t.to_string());
            }
        }
        Ok(cfg)
    }

    /// Reads a talosconfig file.
    pub fn from_file(path: &Path) -> Result<Self, TalosconfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| TalosconfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Finds and reads the talosconfig the way talosctl does (see [`resolve_path_with`]).
    pub fn load(flag: Option<&Path>) -> Result<(Self, PathBuf), TalosconfigError> {
        let path = resolve_path(flag)?;
        Ok((Self::from_file(&path)?, path))
    }

    /// Serialises the talosconfig (deterministic).
    pub fn to_yaml(&self) -> Result<String, TalosconfigError> {
        serde_yaml_ng::to_string(self).map_err(TalosconfigError::Serialise)
    }

    /// Writes the talosconfig with mode 0600 (it holds a client key).
    pub fn write_file(&self, path: &Path) -> Result<(), TalosconfigError> {
        let text = self.to_yaml()?;
        crate::write_private_file(path, text.as_bytes()).map_err(|source| TalosconfigError::Write {
            path: path.display().to_string(),
            source,
        })
    }

    /// The context named `name`, or the current one when `name` is `None`.
    pub fn context(
        &self,
        name: Option<&str>,
        origin: &str,
    ) -> Result<(&str, &TalosContext), TalosconfigError> {
        let name = match name.or(self.context.as_deref()) {
            Some(n) if !n.is_empty() => n,
            _ => {
                return Err(TalosconfigError::NoContext {
                    origin: origin.to_string(),
                });
            }
        };
        self.contexts
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| TalosconfigError::UnknownContext {
                origin: origin.to_string(),
                name: name.to_string(),
                available: self.contexts.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Adds or replaces a context and makes it current.
    pub fn set_context(&mut self, name: &str, ctx: TalosContext) {
        self.contexts.insert(name.to_string(), ctx);
        self.context = Some(name.to_string());
    }

    /// A talosconfig with one context holding a fresh client certificate for
    /// `role`, signed by the bundle's OS CA (what `talosctl gen config` writes
    /// for [`Role::Admin`]).
    ///
    /// Covers requirement R6.2: extended key usage exactly ClientAuth, the
    /// role in Organization.
    pub fn generate(
        bundle: &SecretsBundle,
        context_name: &str,
        endpoints: &[String],
        nodes: &[String],
        role: Role,
        validity: Duration,
    ) -> Result<Self, TalosconfigError> {
        let (ca_pem, _) = bundle.os_ca_pem().ok_or_else(|| TalosconfigError::BadCa {
            reason: "certs.os.crt or certs.os.key is missing or not base64".to_string(),
        })?;
        let cert = generate_client_certificate(bundle, role, validity)?;
        let ctx = TalosContext {
            endpoints: endpoints.to_vec(),
            nodes: (!nodes.is_empty()).then(|| nodes.to_vec()),
            ca: Some(b64(&ca_pem)),
            crt: Some(b64(&cert.crt_pem)),
            key: Some(b64(&cert.key_pem)),
            extra: Extra::new(),
        };
        let mut cfg = Self::default();
        cfg.set_context(context_name, ctx);
        Ok(cfg)
    }
}

impl TalosContext {
    /// Decodes `ca`, `crt` and `key` from base64; `name` and `origin` are named in errors.
    pub fn credentials(
        &self,
        name: &str,
        origin: &str,
    ) -> Result<ContextCredentials, TalosconfigError> {
        let dec = |v: &Option<String>, field| match v.as_deref().filter(|s| !s.is_empty()) {
            None => Ok(None),
            Some(s) => unb64(s)
                .filter(|pem| complete_pem(pem))
                .map(Some)
                .ok_or_else(|| TalosconfigError::BadBase64 {
                    origin: origin.to_string(),
                    name: name.to_string(),
                    field,
                }),
        };
        Ok(ContextCredentials {
            ca_pem: dec(&self.ca, "ca")?,
            crt_pem: dec(&self.crt, "crt")?,
            key_pem: dec(&self.key, "key")?,
        })
    }

    /// The endpoints, refusing an empty list.
    pub fn require_endpoints(
        &self,
        name: &str,
        origin: &str,
    ) -> Result<&[String], TalosconfigError> {
        if self.endpoints.is_empty() {
            return Err(TalosconfigError::NoEndpoints {
                origin: origin.to_string(),
                name: name.to_string(),
            });
        }
        Ok(&self.endpoints)
    }
}

/// Whether `pem` holds at least one whole PEM block and nothing cut: every
/// `-----BEGIN` has its `-----END`, and the text ends after one.
fn complete_pem(pem: &str) -> bool {
    let begins = pem.matches("-----BEGIN ").count();
    begins > 0 && begins == pem.matches("-----END ").count() && pem.trim_end().ends_with("-----")
}

/// A client certificate and its key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// Certificate PEM.
    pub crt_pem: String,
    /// Ed25519 key, PKCS#8 v1, PEM label `ED25519 PRIVATE KEY`.
    pub key_pem: String,
}

/// Mints a Talos API client certificate: Ed25519 key, Organization = the
/// role, key usage DigitalSignature, extended key usage exactly ClientAuth,
/// signed by the bundle's OS CA, valid from 10 seconds ago for `validity`.
///
/// Covers requirement R6.2.
pub fn generate_client_certificate(
    bundle: &SecretsBundle,
    role: Role,
    validity: Duration,
) -> Result<ClientCertificate, TalosconfigError> {
    let (ca_crt_pem, ca_key_pem) = bundle.os_ca_pem().ok_or_else(|| TalosconfigError::BadCa {
        reason: "certs.os.crt or certs.os.key is missing or not base64".to_string(),
    })?;
    let ca_key_pkcs8 =
        crate::pem::relabel(&ca_key_pem, "PRIVATE KEY").ok_or_else(|| TalosconfigError::BadCa {
            reason: "certs.os.key is not a PEM block".to_string(),
        })?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pkcs8).map_err(|e| TalosconfigError::BadCa {
        reason: format!("certs.os.key is not a PKCS#8 private key: {e}"),
    })?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_crt_pem, &ca_key).map_err(|e| {
        TalosconfigError::BadCa {
            reason: format!("certs.os.crt is not a certificate: {e}"),
        }
    })?;

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
        .map_err(TalosconfigError::Certificate)?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, role.as_str());
    params.distinguished_name = dn;
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + now.saturating_sub(Duration::from_secs(10));
    params.not_after = epoch + now + validity;
    params.serial_number = Some(random_serial()?);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(TalosconfigError::Certificate)?;

    let v1 = crate::pem::ed25519_pkcs8_v1(key.serialized_der()).ok_or(
        TalosconfigError::Certificate(rcgen::Error::CouldNotParseKeyPair),
    )?;
    Ok(ClientCertificate {
        crt_pem: cert.pem(),
        key_pem: crate::pem::encode(ED25519_PEM_LABEL, &v1),
    })
}

fn random_serial() -> Result<rcgen::SerialNumber, TalosconfigError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| TalosconfigError::Certificate(rcgen::Error::RingUnspecified))?;
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x01; // no leading zero byte
    Ok(rcgen::SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
mod tests;
