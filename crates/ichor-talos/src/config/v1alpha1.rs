//! The legacy `v1alpha1` document (keys `version`, `debug`, `persist`,
//! `machine`, `cluster`). In v1.12 and v1.13 it holds every Kubernetes
//! setting; in v1.14 configs those move to multi-document kinds, and configs
//! upgraded from earlier versions keep them here.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::Extra;
use super::host::HostDns;

/// The `v1alpha1` document.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct V1Alpha1Config {
    /// `version` (always `v1alpha1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `debug`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug: Option<bool>,
    /// `persist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist: Option<bool>,
    /// `machine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineSection>,
    /// `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSection>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A certificate and key as base64 of PEM (`machine.ca`, `cluster.ca`, ...).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Base64CertAndKey {
    /// Certificate: base64 of PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crt: Option<String>,
    /// Private key: base64 of PEM; empty on workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `machine`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSection {
    /// `type`: `controlplane`, `worker` or `init`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// `token`: the trustd token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `ca`: the OS (Talos API) CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<Base64CertAndKey>,
    /// `certSANs`.
    #[serde(rename = "certSANs", default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    /// `kubelet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletSection>,
    /// `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<MachineNetwork>,
    /// `install`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallSection>,
    /// `features`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeaturesSection>,
    /// `nodeLabels`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::scalar::string_map"
    )]
    pub node_labels: Option<IndexMap<String, String>>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A section with an `image` (kubelet, apiServer, controllerManager, scheduler).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSection {
    /// Container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `machine.kubelet`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSection {
    /// kubelet image; its tag is the Kubernetes version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `defaultRuntimeSeccompProfileEnabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime_seccomp_profile_enabled: Option<bool>,
    /// `disableManifestsDirectory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_manifests_directory: Option<bool>,
    /// Fields Ichor does not model (`extraArgs`, `extraMounts`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `machine.network`: Ichor models none of its fields.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MachineNetwork {
    /// Fields Ichor does not model (`hostname`, `interfaces`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `machine.install`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallSection {
    /// Install disk, for example `/dev/sda`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Installer image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Whether to wipe the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<bool>,
    /// Fields Ichor does not model (`diskSelector`, `extraKernelArgs`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `machine.features`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FeaturesSection {
    /// `rbac`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbac: Option<bool>,
    /// `apidCheckExtKeyUsage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apid_check_ext_key_usage: Option<bool>,
    /// `diskQuotaSupport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_quota_support: Option<bool>,
    /// `kubePrism`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_prism: Option<KubePrismFeature>,
    /// `hostDNS`.
    #[serde(rename = "hostDNS", default, skip_serializing_if = "Option::is_none")]
    pub host_dns: Option<HostDns>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Default KubePrism port when `port` is absent or 0.
pub const DEFAULT_KUBEPRISM_PORT: u32 = 7445;

/// `machine.features.kubePrism`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubePrismFeature {
    /// Enabled when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Port (0 or absent means 7445).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSection {
    /// `id`: the cluster ID (discovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `secret`: the cluster secret (discovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `controlPlane`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlaneSection>,
    /// `clusterName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetwork>,
    /// `token`: the bootstrap token `<6>.<16>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `aescbcEncryptionSecret` (pre-1.3 clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbc_encryption_secret: Option<String>,
    /// `secretboxEncryptionSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretbox_encryption_secret: Option<String>,
    /// `ca`: the Kubernetes CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<Base64CertAndKey>,
    /// `aggregatorCA`.
    #[serde(
        rename = "aggregatorCA",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub aggregator_ca: Option<Base64CertAndKey>,
    /// `serviceAccount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountSection>,
    /// `apiServer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<ApiServerSection>,
    /// `controllerManager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_manager: Option<ImageSection>,
    /// `proxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySection>,
    /// `scheduler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<ImageSection>,
    /// `discovery`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoverySection>,
    /// `etcd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdSection>,
    /// `inlineManifests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_manifests: Option<Vec<InlineManifest>>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.apiServer`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerSection {
    /// kube-apiserver image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `certSANs`: extra names in the API server's certificate.
    #[serde(rename = "certSANs", default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    /// Fields Ichor does not model (`extraArgs`, `admissionControl`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.discovery`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverySection {
    /// `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `registries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registries: Option<DiscoveryRegistries>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.discovery.registries`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryRegistries {
    /// `kubernetes`: the registry kept in Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<DiscoveryRegistry>,
    /// `service`: the discovery service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<DiscoveryRegistry>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One registry of `cluster.discovery.registries`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryRegistry {
    /// `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Fields Ichor does not model (`endpoint`).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.controlPlane`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneSection {
    /// Control-plane endpoint URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.network`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// `cni`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniSection>,
    /// `dnsDomain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    /// `podSubnets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_subnets: Option<Vec<String>>,
    /// `serviceSubnets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_subnets: Option<Vec<String>>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.network.cni`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniSection {
    /// `flannel`, `custom` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Manifest URLs (custom only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    /// Fields Ichor does not model (`flannel`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.serviceAccount`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountSection {
    /// Signing key: base64 of PEM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.proxy`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxySection {
    /// kube-proxy is enabled unless this is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// kube-proxy image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fields Ichor does not model (`mode`, `extraArgs`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cluster.etcd`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSection {
    /// The etcd CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<Base64CertAndKey>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One entry of `cluster.inlineManifests` (key `contents`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InlineManifest {
    /// Manifest name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Manifest YAML text. Leading tabs, line breaks and form feeds are
    /// dropped when read, as Talos does when it loads the config (spaces stay).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "trimmed_manifest_contents"
    )]
    pub contents: Option<String>,
    /// Fields Ichor does not model.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The characters Talos trims from the start of an inline manifest's
/// `contents` when it loads a config (not the space).
pub const INLINE_MANIFEST_TRIMMED: &[char] = &['\t', '\n', '\u{b}', '\u{c}', '\r'];

fn trimmed_manifest_contents<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    let v: Option<String> = Option::deserialize(d)?;
    Ok(v.map(|s| s.trim_start_matches(INLINE_MANIFEST_TRIMMED).to_string()))
}
