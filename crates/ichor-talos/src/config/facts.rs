//! [`ConfigFacts`]: what adopt needs from a machine config, whatever its shape.

use super::kube::{
    CUSTOM_CNI_MANIFEST_NAME, KubeClusterConfig, KubeFlannelCniConfig, KubeNetworkConfig,
    KubePrismConfig, KubeProxyConfig, KubeletConfig, UnattendedInstallConfig,
};
use super::v1alpha1::{ClusterNetwork, ClusterSection, DEFAULT_KUBEPRISM_PORT, MachineSection};
use super::{Document, MachineConfig, OtherDocument};

/// Talos's default pod subnet when the config names none.
pub const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
/// Talos's default service subnet when the config names none.
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
/// Talos's default cluster DNS domain.
pub const DEFAULT_DNS_DOMAIN: &str = "cluster.local";

/// Where the Kubernetes settings of a config live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ConfigShape {
    /// v1.12/v1.13 (and configs upgraded from them): inside the `v1alpha1` document.
    #[serde(rename = "v1alpha1")]
    Legacy,
    /// v1.14: in separate `Kube*` documents.
    #[serde(rename = "multidoc")]
    Multidoc,
}

impl ConfigShape {
    /// The shape a Talos release writes for a new node.
    pub fn for_version(talos: &crate::version::Version) -> ConfigShape {
        if talos.major_minor() >= (1, 14) {
            ConfigShape::Multidoc
        } else {
            ConfigShape::Legacy
        }
    }

    /// How messages name the shape.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigShape::Legacy => "v1alpha1",
            ConfigShape::Multidoc => "multi-document",
        }
    }
}

/// The machine type (`machine.type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineType {
    /// `controlplane`.
    ControlPlane,
    /// `init` (an old first control-plane node).
    Init,
    /// `worker`.
    Worker,
    /// Absent or unknown; the value as read (empty when absent).
    Unknown(String),
}

impl MachineType {
    /// Reads `machine.type`.
    pub fn parse(s: &str) -> Self {
        match s {
            "controlplane" => Self::ControlPlane,
            "init" => Self::Init,
            "worker" => Self::Worker,
            other => Self::Unknown(other.to_string()),
        }
    }

    /// Whether this node runs the control plane (and so holds the keys).
    pub fn is_control_plane(&self) -> bool {
        matches!(self, Self::ControlPlane | Self::Init)
    }

    /// The YAML value.
    pub fn as_str(&self) -> &str {
        match self {
            Self::ControlPlane => "controlplane",
            Self::Init => "init",
            Self::Worker => "worker",
            Self::Unknown(s) => s,
        }
    }
}

/// The CNI Talos deploys, from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CniName {
    /// Talos deploys flannel.
    Flannel,
    /// Talos applies manifests from URLs (`custom`).
    Custom,
    /// Talos deploys no CNI.
    None,
    /// A `cni.name` value Talos does not define, as read.
    Other(String),
}

impl CniName {
    /// The name as Talos writes it (`flannel`, `custom`, `none`).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Flannel => "flannel",
            Self::Custom => "custom",
            Self::None => "none",
            Self::Other(s) => s,
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "flannel" => Self::Flannel,
            "custom" => Self::Custom,
            "none" => Self::None,
            other => Self::Other(other.to_string()),
        }
    }
}

/// KubePrism state from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubePrismFact {
    /// Whether KubePrism is enabled.
    pub enabled: bool,
    /// The port it listens on when enabled (7445 when the config says 0 or nothing).
    pub port: Option<u32>,
}

/// One inline manifest (v1alpha1 `cluster.inlineManifests[]` or `KubeInlineManifestConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineManifestFact {
    /// Manifest name.
    pub name: String,
    /// Manifest YAML text.
    pub contents: String,
}

/// What adopt needs from one node's machine config, in either shape.
///
/// Rules (as Talos reads its two config shapes, docs/adr/0003-typed-machine-config.md):
/// * the shape is [`ConfigShape::Legacy`] when the `v1alpha1` document holds
///   Kubernetes settings (`cluster.network`, `controlPlane`, `clusterName`,
///   `apiServer` or `proxy`: a v1.12/v1.13 config, or one upgraded from them)
///   or when there is no `Kube*` document; [`ConfigShape::Multidoc`] otherwise;
/// * a legacy field wins when present (Talos refuses a config that has both);
/// * CNI, legacy shape: `cluster.network.cni.name`, default `flannel`;
///   multidoc shape (v1.14): `flannel` when a `KubeFlannelCNIConfig` exists, `custom`
///   when a `KubeExternalManifestConfig` named `custom-cni` exists, else
///   `none` on a control-plane node and unknown (`None`) on a worker, whose
///   v1.14 config does not carry cluster-wide settings;
/// * kube-proxy: legacy `!cluster.proxy.disabled`; v1.14 `KubeProxyConfig.enabled`
///   (default true), absent document = disabled on a control-plane node and
///   unknown on a worker;
/// * KubePrism: a `KubePrismConfig` document (port 0 = disabled), else
///   `machine.features.kubePrism` (port 0 or absent = 7445).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFacts {
    /// Where the Kubernetes settings live.
    pub shape: ConfigShape,
    /// `machine.type`.
    pub machine_type: MachineType,
    /// The CNI, when the config says (see the rules above).
    pub cni: Option<CniName>,
    /// CNI manifest URLs (`custom`).
    pub cni_urls: Vec<String>,
    /// Pod subnets (Talos's default when the config names none).
    pub pod_subnets: Vec<String>,
    /// Service subnets (Talos's default when the config names none).
    pub service_subnets: Vec<String>,
    /// Cluster DNS domain (default `cluster.local`).
    pub dns_domain: String,
    /// Whether kube-proxy is deployed, when the config says.
    pub kube_proxy_enabled: Option<bool>,
    /// KubePrism state.
    pub kube_prism: KubePrismFact,
    /// Inline manifests, in order.
    pub inline_manifests: Vec<InlineManifestFact>,
    /// Install disk (`machine.install.disk`, or the simple `UnattendedInstallConfig` selector).
    pub install_disk: Option<String>,
    /// Installer image.
    pub install_image: Option<String>,
    /// Kubernetes version: the tag of the kubelet image (for example `v1.28.0`).
    pub kubernetes_version: Option<String>,
    /// Cluster name.
    pub cluster_name: Option<String>,
    /// Control-plane endpoint URL.
    pub control_plane_endpoint: Option<String>,
}

fn is_kube_kind(d: &Document) -> bool {
    match d {
        Document::V1Alpha1(_)
        | Document::DiscoveryIdentity(_)
        | Document::UnattendedInstall(_)
        | Document::DiscoveryService(_)
        | Document::Resolver(_)
        | Document::Hostname(_) => false,
        Document::Other(OtherDocument { .. }) => d
            .kind_name()
            .strip_prefix("Kube")
            .is_some_and(|rest| !rest.starts_with("Span")),
        _ => true,
    }
}

fn image_tag(image: &str) -> Option<String> {
    let last = image.rsplit('/').next()?;
    let without_digest = last.split('@').next()?;
    let (_, tag) = without_digest.rsplit_once(':')?;
    (!tag.is_empty()).then(|| tag.to_string())
}

/// The multi-document config's Kubernetes documents (the last of each kind).
#[derive(Default)]
struct KubeDocuments<'a> {
    flannel: Option<&'a KubeFlannelCniConfig>,
    kube_network: Option<&'a KubeNetworkConfig>,
    kube_proxy: Option<&'a KubeProxyConfig>,
    kube_prism: Option<&'a KubePrismConfig>,
    /// The URL of the custom CNI's external manifest.
    custom_cni_url: Option<String>,
    kube_cluster: Option<&'a KubeClusterConfig>,
    kubelet: Option<&'a KubeletConfig>,
    unattended: Option<&'a UnattendedInstallConfig>,
    inline_manifests: Vec<InlineManifestFact>,
}

impl<'a> KubeDocuments<'a> {
    fn scan(cfg: &'a MachineConfig) -> Self {
        let mut found = KubeDocuments::default();
        for d in &cfg.documents {
            match d {
                Document::KubeFlannelCni(f) => found.flannel = Some(f),
                Document::KubeNetwork(n) => found.kube_network = Some(n),
                Document::KubeProxy(p) => found.kube_proxy = Some(p),
                Document::KubePrism(p) => found.kube_prism = Some(p),
                Document::KubeCluster(c) => found.kube_cluster = Some(c),
                Document::Kubelet(k) => found.kubelet = Some(k),
                Document::UnattendedInstall(u) => found.unattended = Some(u),
                Document::KubeExternalManifest(e)
                    if e.name.as_deref() == Some(CUSTOM_CNI_MANIFEST_NAME) =>
                {
                    found.custom_cni_url = Some(e.url.clone().unwrap_or_default());
                }
                Document::KubeInlineManifest(m) => {
                    found.inline_manifests.push(InlineManifestFact {
                        name: m.name.clone().unwrap_or_default(),
                        contents: m.manifest.clone().unwrap_or_default(),
                    })
                }
                _ => {}
            }
        }
        found
    }
}

/// Where the config keeps its Kubernetes settings.
fn shape_of(cfg: &MachineConfig) -> ConfigShape {
    let cluster = cfg.v1alpha1().and_then(|v| v.cluster.as_ref());
    // Legacy Kubernetes settings in the v1alpha1 document (a v1.14 config
    // generated for the multi-document contract has none of these).
    let legacy_kubernetes = cluster.is_some_and(|c| {
        c.network.is_some()
            || c.control_plane.is_some()
            || c.cluster_name.is_some()
            || c.api_server.is_some()
            || c.proxy.is_some()
    });
    if !legacy_kubernetes && cfg.documents.iter().any(is_kube_kind) {
        ConfigShape::Multidoc
    } else {
        ConfigShape::Legacy
    }
}

/// The CNI Talos deploys, and its manifest URLs: the v1alpha1 document's
/// `cluster.network.cni` (flannel when it names none), else the
/// multi-document flannel or custom-CNI document; a control plane with
/// neither deploys none, a worker does not say.
fn cni_fact(
    shape: ConfigShape,
    network: Option<&ClusterNetwork>,
    flannel: bool,
    custom_cni_url: Option<String>,
    control_plane: bool,
) -> (Option<CniName>, Vec<String>) {
    if shape == ConfigShape::Legacy {
        let c = network.and_then(|n| n.cni.as_ref());
        let name = c
            .and_then(|c| c.name.as_deref())
            .map_or(CniName::Flannel, CniName::parse);
        (
            Some(name),
            c.and_then(|c| c.urls.clone()).unwrap_or_default(),
        )
    } else if flannel {
        (Some(CniName::Flannel), Vec::new())
    } else if let Some(url) = custom_cni_url {
        (Some(CniName::Custom), vec![url])
    } else if control_plane {
        (Some(CniName::None), Vec::new())
    } else {
        (None, Vec::new())
    }
}

/// Whether kube-proxy runs: `cluster.proxy`, else the `KubeProxyConfig`
/// document, else the shape's default (on in the legacy shape, off on a
/// multi-document control plane; a worker does not say).
fn kube_proxy_fact(
    shape: ConfigShape,
    cluster: Option<&ClusterSection>,
    kube_proxy: Option<&KubeProxyConfig>,
    control_plane: bool,
) -> Option<bool> {
    if let Some(p) = cluster.and_then(|c| c.proxy.as_ref()) {
        Some(p.disabled != Some(true))
    } else if let Some(p) = kube_proxy {
        Some(p.is_enabled())
    } else if shape == ConfigShape::Legacy {
        Some(true)
    } else if control_plane {
        Some(false)
    } else {
        None
    }
}

/// Pod subnets, service subnets and DNS domain: the v1alpha1 document's,
/// else the `KubeNetworkConfig` document's, else Talos's defaults.
fn network_fact(
    network: Option<&ClusterNetwork>,
    kube_network: Option<&KubeNetworkConfig>,
) -> (Vec<String>, Vec<String>, String) {
    let pod_subnets = network
        .and_then(|n| n.pod_subnets.clone())
        .or_else(|| kube_network.and_then(|n| n.pod_subnets.clone()))
        .unwrap_or_else(|| vec![DEFAULT_POD_SUBNET.to_string()]);
    let service_subnets = network
        .and_then(|n| n.service_subnets.clone())
        .or_else(|| kube_network.and_then(|n| n.service_subnets.clone()))
        .unwrap_or_else(|| vec![DEFAULT_SERVICE_SUBNET.to_string()]);
    let dns_domain = network
        .and_then(|n| n.dns_domain.clone())
        .or_else(|| kube_network.and_then(|n| n.dns_domain.clone()))
        .unwrap_or_else(|| DEFAULT_DNS_DOMAIN.to_string());
    (pod_subnets, service_subnets, dns_domain)
}

/// KubePrism as the config sets it: the multi-document `KubePrismConfig`
/// (port 0 or none: off), else `machine.features.kubePrism` (on with
/// Talos's default port when it names none).
fn kube_prism_fact(
    doc: Option<&KubePrismConfig>,
    machine: Option<&MachineSection>,
) -> KubePrismFact {
    if let Some(doc) = doc {
        match doc.port {
            Some(0) | None => KubePrismFact {
                enabled: false,
                port: None,
            },
            Some(p) => KubePrismFact {
                enabled: true,
                port: Some(p),
            },
        }
    } else {
        let f = machine
            .and_then(|m| m.features.as_ref())
            .and_then(|f| f.kube_prism.as_ref());
        match f {
            Some(f) if f.enabled == Some(true) => KubePrismFact {
                enabled: true,
                port: Some(match f.port {
                    Some(0) | None => DEFAULT_KUBEPRISM_PORT,
                    Some(p) => p,
                }),
            },
            _ => KubePrismFact {
                enabled: false,
                port: None,
            },
        }
    }
}

/// The install disk and installer image: `machine.install`, else the
/// multi-document `UnattendedInstallConfig`.
fn install_target(
    machine: Option<&MachineSection>,
    unattended: Option<&UnattendedInstallConfig>,
) -> (Option<String>, Option<String>) {
    let install = machine.and_then(|m| m.install.as_ref());
    let install_disk = install.and_then(|i| i.disk.clone()).or_else(|| {
        unattended
            .and_then(|u| u.provisioning.as_ref())
            .and_then(|p| p.disk_selector.as_ref())
            .and_then(|s| s.dev_path())
    });
    let install_image = install.and_then(|i| i.image.clone()).or_else(|| {
        unattended
            .and_then(|u| u.installer.as_ref())
            .and_then(|i| i.image.clone())
    });
    (install_disk, install_image)
}

pub(super) fn compute(cfg: &MachineConfig) -> ConfigFacts {
    let v1 = cfg.v1alpha1();
    let machine = v1.and_then(|v| v.machine.as_ref());
    let cluster = v1.and_then(|v| v.cluster.as_ref());
    let network = cluster.and_then(|c| c.network.as_ref());
    let shape = shape_of(cfg);
    let machine_type = MachineType::parse(
        machine
            .and_then(|m| m.machine_type.as_deref())
            .unwrap_or_default(),
    );
    let cp = machine_type.is_control_plane();

    let KubeDocuments {
        flannel,
        kube_network,
        kube_proxy,
        kube_prism: kube_prism_doc,
        custom_cni_url,
        kube_cluster,
        kubelet,
        unattended,
        mut inline_manifests,
    } = KubeDocuments::scan(cfg);
    if let Some(list) = cluster.and_then(|c| c.inline_manifests.as_ref()) {
        let legacy = list.iter().map(|m| InlineManifestFact {
            name: m.name.clone().unwrap_or_default(),
            contents: m.contents.clone().unwrap_or_default(),
        });
        inline_manifests.splice(0..0, legacy);
    }

    let (cni, cni_urls) = cni_fact(shape, network, flannel.is_some(), custom_cni_url, cp);

    let (pod_subnets, service_subnets, dns_domain) = network_fact(network, kube_network);

    let kube_proxy_enabled = kube_proxy_fact(shape, cluster, kube_proxy, cp);

    let kube_prism = kube_prism_fact(kube_prism_doc, machine);

    let (install_disk, install_image) = install_target(machine, unattended);

    let kubernetes_version = machine
        .and_then(|m| m.kubelet.as_ref())
        .and_then(|k| k.image.as_deref())
        .or_else(|| kubelet.and_then(|k| k.image.as_deref()))
        .and_then(image_tag);

    let cluster_name = cluster
        .and_then(|c| c.cluster_name.clone())
        .or_else(|| kube_cluster.and_then(|c| c.cluster_name.clone()));
    let control_plane_endpoint = cluster
        .and_then(|c| c.control_plane.as_ref())
        .and_then(|c| c.endpoint.clone())
        .or_else(|| kube_cluster.and_then(|c| c.endpoint.clone()));

    ConfigFacts {
        shape,
        machine_type,
        cni,
        cni_urls,
        pod_subnets,
        service_subnets,
        dns_domain,
        kube_proxy_enabled,
        kube_prism,
        inline_manifests,
        install_disk,
        install_image,
        kubernetes_version,
        cluster_name,
        control_plane_endpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::image_tag;

    #[test]
    fn image_tag_handles_registry_ports_and_digests() {
        assert_eq!(
            image_tag("ghcr.io/siderolabs/kubelet:v1.28.0").as_deref(),
            Some("v1.28.0")
        );
        assert_eq!(
            image_tag("localhost:5000/kubelet:v1.30.1").as_deref(),
            Some("v1.30.1")
        );
        assert_eq!(image_tag("localhost:5000/kubelet").as_deref(), None);
        assert_eq!(
            image_tag("r.io/kubelet:v1.2.3@sha256:abcd").as_deref(),
            Some("v1.2.3")
        );
    }
}
