//! Typed v1.14 multi-document kinds Ichor reads or renders.
//!
//! Field names follow the YAML keys of the Talos documents, as Talos's
//! configuration reference names them. Each struct keeps the keys it does
//! not model in `extra`. The `kind` key is not a field: [`super::Document`]
//! adds it when writing.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};

use super::Extra;

/// The `apiVersion` every Talos multi-document kind uses.
pub const MULTIDOC_API_VERSION: &str = "v1alpha1";

pub(super) fn api_v1alpha1() -> Option<String> {
    Some(MULTIDOC_API_VERSION.to_string())
}

/// `KubePrismConfig`: presence means KubePrism is enabled on `port`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubePrismConfig {
    /// `apiVersion` (always `v1alpha1` today).
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Listen port (1-65535; Talos treats 0 as disabled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// TLS server name used towards the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

impl KubePrismConfig {
    /// A new document enabling KubePrism on `port`.
    pub fn new(port: u32) -> Self {
        Self {
            api_version: api_v1alpha1(),
            port: Some(port),
            ..Default::default()
        }
    }
}

/// `KubeNetworkConfig`: cluster DNS domain and pod/service subnets.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeNetworkConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `dnsDomain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    /// `podSubnets` (CIDR prefixes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_subnets: Option<Vec<String>>,
    /// `serviceSubnets` (CIDR prefixes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_subnets: Option<Vec<String>>,
    /// Fields Ichor does not model (`nodeCIDRMaskSizeIPv4`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeFlannelCNIConfig`: presence means Talos deploys flannel.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeFlannelCniConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `backendType` (for example `vxlan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_type: Option<String>,
    /// `backendPort` (for example 4789).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_port: Option<u32>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeProxyConfig`: kube-proxy settings; `enabled` defaults to true.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `enabled`; absent means enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// kube-proxy image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Proxy mode (`iptables`, `ipvs`, `nftables`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Fields Ichor does not model (`config`, `extraArgs`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl KubeProxyConfig {
    /// Whether kube-proxy is enabled (true unless `enabled: false`).
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

/// `KubeInlineManifestConfig`: one named inline manifest (key `manifest`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeInlineManifestConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Manifest name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The manifest YAML text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

impl KubeInlineManifestConfig {
    /// A new inline manifest document.
    pub fn new(name: impl Into<String>, manifest: impl Into<String>) -> Self {
        Self {
            api_version: api_v1alpha1(),
            name: Some(name.into()),
            manifest: Some(manifest.into()),
            extra: Extra::new(),
        }
    }
}

/// Name of the external manifest that carries a custom CNI in v1.14 configs.
pub const CUSTOM_CNI_MANIFEST_NAME: &str = "custom-cni";

/// `KubeExternalManifestConfig`: a manifest fetched from a URL.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeExternalManifestConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Manifest name (`custom-cni` for a custom CNI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where the manifest is fetched from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent when fetching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<IndexMap<String, String>>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeClusterConfig`: cluster name and control-plane endpoint.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeClusterConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `clusterName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Control-plane endpoint URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A certificate and key as raw PEM strings (multi-document CA kinds).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PemCertAndKey {
    /// Certificate, raw PEM (not base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Private key, raw PEM (not base64); absent on workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeAPIServerCAConfig` and `KubeAggregatorCAConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeCaConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `issuingCA` (control plane only).
    #[serde(rename = "issuingCA", default, skip_serializing_if = "Option::is_none")]
    pub issuing_ca: Option<PemCertAndKey>,
    /// `acceptedCAs` (PEM certificates).
    #[serde(
        rename = "acceptedCAs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub accepted_cas: Option<Vec<String>>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The `issuer` section of `KubeServiceAccountConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountIssuer {
    /// Signing key, raw PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// `issuerURL`.
    #[serde(rename = "issuerURL", default, skip_serializing_if = "Option::is_none")]
    pub issuer_url: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeServiceAccountConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeServiceAccountConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `issuer` (control plane only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<ServiceAccountIssuer>,
    /// Fields Ichor does not model (`accepted`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeEtcdEncryptionConfig`: a free-form kube-apiserver EncryptionConfiguration.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeEtcdEncryptionConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// The EncryptionConfiguration, kept as YAML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

impl KubeEtcdEncryptionConfig {
    /// The EncryptionConfiguration Talos writes for a new cluster: `secrets`
    /// encrypted with one key of `provider` (`secretbox` or `aescbc`),
    /// named `key2`, then read as plain (`identity`).
    pub fn new(provider: &str, secret: &str) -> Self {
        let key = Mapping::from_iter([
            ("name".into(), "key2".into()),
            ("secret".into(), secret.into()),
        ]);
        let keys = Mapping::from_iter([("keys".into(), Value::Sequence(vec![key.into()]))]);
        let providers = vec![
            Mapping::from_iter([(provider.into(), keys.into())]).into(),
            Mapping::from_iter([("identity".into(), Mapping::new().into())]).into(),
        ];
        let block = Mapping::from_iter([
            ("resources".into(), Value::Sequence(vec!["secrets".into()])),
            ("providers".into(), Value::Sequence(providers)),
        ]);
        let config = Mapping::from_iter([
            ("apiVersion".into(), "apiserver.config.k8s.io/v1".into()),
            ("kind".into(), "EncryptionConfiguration".into()),
            ("resources".into(), Value::Sequence(vec![block.into()])),
        ]);
        Self {
            api_version: api_v1alpha1(),
            config: Some(config.into()),
            extra: Extra::new(),
        }
    }

    /// The first key of `provider` (`secretbox` or `aescbc`) in the first
    /// resources block that covers `secrets`.
    pub fn provider_secret(&self, provider: &str) -> Option<String> {
        let resources = self.config.as_ref()?.get("resources")?.as_sequence()?;
        let block = resources.iter().find(|r| {
            r.get("resources")
                .and_then(Value::as_sequence)
                .is_some_and(|rs| rs.iter().any(|x| x.as_str() == Some("secrets")))
        })?;
        block
            .get("providers")?
            .as_sequence()?
            .iter()
            .find_map(|p| p.get(provider))?
            .get("keys")?
            .as_sequence()?
            .first()?
            .get("secret")?
            .as_str()
            .map(str::to_string)
    }
}

/// `KubeletConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// kubelet image; its tag is the Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `defaultRuntimeSeccompProfileEnabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime_seccomp_profile_enabled: Option<bool>,
    /// Fields Ichor does not model (`config`, `extraArgs`, `clusterDNS`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `DiscoveryIdentityConfig`: the cluster ID and secret.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryIdentityConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `clusterID` (opaque base64 string).
    #[serde(rename = "clusterID", default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// `clusterSecret` (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_secret: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `installer` section of `UnattendedInstallConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Installer {
    /// Installer image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `provisioning.diskSelector` of `UnattendedInstallConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskSelector {
    /// CEL expression, for example `disk.dev_path == "/dev/sda"`.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub match_expr: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

impl DiskSelector {
    /// The disk path when the selector is the simple form `disk.dev_path == "<path>"`.
    pub fn dev_path(&self) -> Option<String> {
        let expr = self.match_expr.as_deref()?.trim();
        let rest = expr.strip_prefix("disk.dev_path")?.trim_start();
        let rest = rest.strip_prefix("==")?.trim();
        let inner = rest.strip_prefix('"')?.strip_suffix('"')?;
        (!inner.contains('"')).then(|| inner.to_string())
    }
}

/// `provisioning` section of `UnattendedInstallConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    /// Which disk to install to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_selector: Option<DiskSelector>,
    /// Whether to wipe the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<bool>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `UnattendedInstallConfig` (v1.14 replacement of `machine.install`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnattendedInstallConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Installer image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer: Option<Installer>,
    /// Disk selection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<Provisioning>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeNodeConfig`: the node's Kubernetes labels, annotations and taints.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeNodeConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Node labels.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::scalar::string_map"
    )]
    pub labels: Option<IndexMap<String, String>>,
    /// Node annotations.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::scalar::string_map"
    )]
    pub annotations: Option<IndexMap<String, String>>,
    /// Node taints: key to `value:Effect` (or `Effect`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::scalar::string_map"
    )]
    pub taints: Option<IndexMap<String, String>>,
    /// Fields Ichor does not model (`registerWithFQDN`, `nodeIP`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeAuthorizerConfig`: one named authorizer of the API server.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeAuthorizerConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// Authorizer name (`node`, `rbac`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Authorizer type (`Node`, `RBAC`, `Webhook`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub authorizer_type: Option<String>,
    /// Fields Ichor does not model (`webhook`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeAPIServerConfig`: the API server's image and settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeApiServerConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// kube-apiserver image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `certExtraSANs`: extra names in the API server's certificate.
    #[serde(
        rename = "certExtraSANs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cert_extra_sans: Option<Vec<String>>,
    /// Fields Ichor does not model (`extraArgs`, `env`, `resources`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeControllerManagerConfig`: the controller manager's image and settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeControllerManagerConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// kube-controller-manager image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model (`extraArgs`, `env`, `resources`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeSchedulerConfig`: the scheduler's image and settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeSchedulerConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// kube-scheduler image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model (`config`, `extraArgs`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeCoreDNSConfig`: whether Talos deploys CoreDNS, and its image.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeCoreDnsConfig {
    /// `apiVersion`.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub api_version: Option<String>,
    /// `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// CoreDNS image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}
