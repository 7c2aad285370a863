//! The [`Document`] enum: one machine-config document, typed when Ichor knows it.

use serde_yaml_ng::{Mapping, Value};

use super::ConfigError;
use super::host::*;
use super::kube::*;
use super::v1alpha1::V1Alpha1Config;

macro_rules! documents {
    ($( $variant:ident($ty:ty) = $kind:literal ),* $(,)?) => {
        /// One machine-config document.
        ///
        /// Multi-document kinds are stored without their `apiVersion` and
        /// `kind` keys (the variant says the kind; `api_version` is a field
        /// of each struct); they are written back first, in that order.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Document {
            /// The legacy `v1alpha1` document (keys `version`, `machine`, `cluster`, ...; no `kind`).
            V1Alpha1(Box<V1Alpha1Config>),
            $(
                #[doc = concat!("A `", $kind, "` document.")]
                $variant($ty),
            )*
            /// Any other document, kept as read.
            Other(OtherDocument),
        }

        /// The kind of a [`Document`], without its contents.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DocumentKind {
            /// The legacy `v1alpha1` document.
            V1Alpha1,
            $(
                #[doc = concat!("`", $kind, "`.")]
                $variant,
            )*
            /// Any document kind Ichor does not type.
            Other,
        }

        impl DocumentKind {
            /// The kind for a `kind:` value; [`DocumentKind::Other`] when not typed.
            pub fn from_kind_name(kind: &str) -> Self {
                match kind {
                    $( $kind => Self::$variant, )*
                    _ => Self::Other,
                }
            }

            /// The `kind:` value (`v1alpha1` for the legacy document, `""` for `Other`).
            pub fn kind_name(self) -> &'static str {
                match self {
                    Self::V1Alpha1 => "v1alpha1",
                    $( Self::$variant => $kind, )*
                    Self::Other => "",
                }
            }
        }

        impl Document {
            /// The kind of this document.
            pub fn kind(&self) -> DocumentKind {
                match self {
                    Self::V1Alpha1(_) => DocumentKind::V1Alpha1,
                    $( Self::$variant(_) => DocumentKind::$variant, )*
                    Self::Other(_) => DocumentKind::Other,
                }
            }

            /// The `kind:` value (`v1alpha1` for the legacy document).
            pub fn kind_name(&self) -> &str {
                match self {
                    Self::Other(o) => o.kind().unwrap_or("<no kind>"),
                    other => other.kind().kind_name(),
                }
            }

            fn typed_from_mapping(
                kind: &str,
                mut m: Mapping,
                origin: &str,
                index: usize,
            ) -> Result<Self, ConfigError> {
                let shape = |source: serde_yaml_ng::Error| ConfigError::Shape {
                    origin: origin.to_string(),
                    index,
                    kind: kind.to_string(),
                    detail: crate::redact::quoted_values(&source.to_string()),
                };
                match kind {
                    $( $kind => {
                        m.shift_remove("kind");
                        let v: $ty = serde_yaml_ng::from_value(Value::Mapping(m)).map_err(shape)?;
                        Ok(Self::$variant(v))
                    } )*
                    _ => Ok(Self::Other(OtherDocument { mapping: m })),
                }
            }

            /// The document as a YAML mapping (what is written).
            pub fn to_mapping(&self) -> Result<Mapping, serde_yaml_ng::Error> {
                match self {
                    Self::V1Alpha1(v) => to_mapping(v.as_ref()),
                    $( Self::$variant(v) => with_kind(to_mapping(v)?, $kind), )*
                    Self::Other(o) => Ok(o.mapping.clone()),
                }
            }
        }
    };
}

documents! {
    KubePrism(KubePrismConfig) = "KubePrismConfig",
    KubeNetwork(KubeNetworkConfig) = "KubeNetworkConfig",
    KubeFlannelCni(KubeFlannelCniConfig) = "KubeFlannelCNIConfig",
    KubeProxy(KubeProxyConfig) = "KubeProxyConfig",
    KubeInlineManifest(KubeInlineManifestConfig) = "KubeInlineManifestConfig",
    KubeExternalManifest(KubeExternalManifestConfig) = "KubeExternalManifestConfig",
    KubeCluster(KubeClusterConfig) = "KubeClusterConfig",
    KubeApiServerCa(KubeCaConfig) = "KubeAPIServerCAConfig",
    KubeAggregatorCa(KubeCaConfig) = "KubeAggregatorCAConfig",
    KubeServiceAccount(KubeServiceAccountConfig) = "KubeServiceAccountConfig",
    KubeEtcdEncryption(KubeEtcdEncryptionConfig) = "KubeEtcdEncryptionConfig",
    Kubelet(KubeletConfig) = "KubeletConfig",
    DiscoveryIdentity(DiscoveryIdentityConfig) = "DiscoveryIdentityConfig",
    UnattendedInstall(UnattendedInstallConfig) = "UnattendedInstallConfig",
    KubeNode(KubeNodeConfig) = "KubeNodeConfig",
    KubeAuthorizer(KubeAuthorizerConfig) = "KubeAuthorizerConfig",
    KubeApiServer(KubeApiServerConfig) = "KubeAPIServerConfig",
    KubeControllerManager(KubeControllerManagerConfig) = "KubeControllerManagerConfig",
    KubeScheduler(KubeSchedulerConfig) = "KubeSchedulerConfig",
    KubeCoreDns(KubeCoreDnsConfig) = "KubeCoreDNSConfig",
    DiscoveryService(DiscoveryServiceConfig) = "DiscoveryServiceConfig",
    Resolver(ResolverConfig) = "ResolverConfig",
    Hostname(HostnameConfig) = "HostnameConfig",
}

impl Document {
    /// Decodes one document from its YAML mapping.
    ///
    /// A mapping with a `kind` key is a multi-document kind; one without
    /// `kind` but with any of `version`, `machine`, `cluster`, `debug`,
    /// `persist` is the legacy `v1alpha1` document (as Talos decides);
    /// anything else is kept as [`OtherDocument`].
    pub fn from_mapping(m: Mapping, origin: &str, index: usize) -> Result<Self, ConfigError> {
        if let Some(kind) = m.get("kind") {
            let kind = kind.as_str().unwrap_or_default().to_string();
            return Self::typed_from_mapping(&kind, m, origin, index);
        }
        if super::is_v1alpha1_mapping(&m) {
            let v: V1Alpha1Config =
                serde_yaml_ng::from_value(Value::Mapping(m)).map_err(|source| {
                    ConfigError::Shape {
                        origin: origin.to_string(),
                        index,
                        kind: "v1alpha1".to_string(),
                        detail: crate::redact::quoted_values(&source.to_string()),
                    }
                })?;
            return Ok(Self::V1Alpha1(Box::new(v)));
        }
        Ok(Self::Other(OtherDocument { mapping: m }))
    }

    /// The document's `name` (named multi-document kinds), if any.
    pub fn name(&self) -> Option<String> {
        match self {
            Self::V1Alpha1(_) => None,
            Self::KubeInlineManifest(d) => d.name.clone(),
            Self::KubeExternalManifest(d) => d.name.clone(),
            Self::KubeAuthorizer(d) => d.name.clone(),
            Self::DiscoveryService(d) => d.name.clone(),
            Self::Other(o) => o.name().map(str::to_string),
            other => other
                .to_mapping()
                .ok()
                .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string)),
        }
    }
}

/// A document Ichor does not type, kept exactly as read (key order included).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OtherDocument {
    /// The whole document, `apiVersion` and `kind` included.
    pub mapping: Mapping,
}

impl OtherDocument {
    /// The `kind:` value.
    pub fn kind(&self) -> Option<&str> {
        self.mapping.get("kind").and_then(Value::as_str)
    }

    /// The `apiVersion:` value.
    pub fn api_version(&self) -> Option<&str> {
        self.mapping.get("apiVersion").and_then(Value::as_str)
    }

    /// The `name:` value.
    pub fn name(&self) -> Option<&str> {
        self.mapping.get("name").and_then(Value::as_str)
    }
}

fn to_mapping<T: serde::Serialize>(v: &T) -> Result<Mapping, serde_yaml_ng::Error> {
    match serde_yaml_ng::to_value(v)? {
        Value::Mapping(m) => Ok(m),
        Value::Null => Ok(Mapping::new()),
        other => Err(serde::ser::Error::custom(format!(
            "expected a mapping, got a {}",
            super::value_kind(&other)
        ))),
    }
}

/// Puts `apiVersion` first and `kind` second, then the rest.
fn with_kind(m: Mapping, kind: &str) -> Result<Mapping, serde_yaml_ng::Error> {
    let mut out = Mapping::with_capacity(m.len() + 1);
    let mut rest = m;
    if let Some(api) = rest.shift_remove("apiVersion") {
        out.insert("apiVersion".into(), api);
    }
    out.insert("kind".into(), Value::String(kind.to_string()));
    for (k, v) in rest {
        out.insert(k, v);
    }
    Ok(out)
}
