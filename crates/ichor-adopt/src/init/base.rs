//! A fresh node's base machine config, made from the secrets bundle: what
//! `ichor init` starts each node's render from, in place of the live config
//! adopt reads. Pure; the result holds secrets and is never printed.
//!
//! The shape follows the Talos version (the two config shapes of
//! docs/adr/0003-typed-machine-config.md): up to v1.13 one `v1alpha1`
//! document holds the Kubernetes settings; from v1.14 they live in `Kube*`
//! documents and the `v1alpha1` document keeps only the machine's identity
//! and etcd's CA. The paths Ichor owns
//! (endpoint, subnets, Kubernetes version, CNI, kube-proxy, the inline
//! Cilium) are set again by the render, so both agree by construction.
//!
//! Every document is built from the typed model of `ichor_talos::config`,
//! whose field order is the order Talos writes.

use ichor_api::endpoint::{Endpoint, KUBERNETES_API_PORT};
use ichor_talos::config::v1alpha1::{
    ApiServerSection, Base64CertAndKey, ClusterNetwork, ClusterSection, ControlPlaneSection,
    DiscoveryRegistries, DiscoveryRegistry, DiscoverySection, EtcdSection, FeaturesSection,
    ImageSection, InstallSection, KubePrismFeature, KubeletSection, MachineNetwork, MachineSection,
    ProxySection, ServiceAccountSection,
};
use ichor_talos::config::{
    DEFAULT_KUBEPRISM_PORT, DiscoveryIdentityConfig, DiscoveryServiceConfig, DiskSelector,
    Document, HostDns, HostnameConfig, Installer, KubeApiServerConfig, KubeAuthorizerConfig,
    KubeCaConfig, KubeClusterConfig, KubeControllerManagerConfig, KubeCoreDnsConfig,
    KubeEtcdEncryptionConfig, KubeNetworkConfig, KubeNodeConfig, KubePrismConfig, KubeProxyConfig,
    KubeSchedulerConfig, KubeServiceAccountConfig, KubeletConfig, MULTIDOC_API_VERSION,
    PemCertAndKey, Provisioning, ResolverConfig, ServiceAccountIssuer, UnattendedInstallConfig,
    V1Alpha1Config,
};
use ichor_talos::pem::unb64;
use ichor_talos::secrets::SecretsBundle;
use serde_yaml_ng::Mapping;

pub use ichor_talos::config::ConfigShape;

/// What a base config is made of besides the bundle.
#[derive(Debug, Clone, Copy)]
pub struct BaseInput<'a> {
    pub shape: ConfigShape,
    pub control_plane: bool,
    pub cluster_name: &'a str,
    /// `https://HOST:PORT`.
    pub endpoint: &'a str,
    /// `v1.34.1`.
    pub kubernetes_version: &'a str,
    /// `v1.13.9`: the installer image's tag.
    pub talos_version: &'a str,
    /// The disk Talos installs to (`/dev/sda`).
    pub install_disk: &'a str,
}

/// The default pod and service subnets (`talosctl gen config`'s for an IPv4 endpoint).
pub const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
pub const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
/// The installer of Image Factory's empty schematic (Talos's default).
pub const INSTALLER_REPOSITORY: &str = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

const EXCLUDE_FROM_LOAD_BALANCERS: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const CONTROL_PLANE_ROLE: &str = "node-role.kubernetes.io/control-plane";

fn some(v: &str) -> Option<String> {
    Some(v.to_string())
}

/// The `apiVersion` of every multi-document kind.
fn api() -> Option<String> {
    some(MULTIDOC_API_VERSION)
}

/// A bundle value as written, `""` when the bundle has none.
fn opt(v: Option<&String>) -> Option<String> {
    Some(v.cloned().unwrap_or_default())
}

/// Base64 PEM (as the bundle and v1alpha1 hold it) → PEM (as `Kube*` documents hold it).
fn pem(v: Option<&String>) -> Option<String> {
    Some(v.and_then(|b| unb64(b)).unwrap_or_default())
}

fn image(repository: &str, version: &str) -> Option<String> {
    Some(format!("{repository}:{version}"))
}

/// The host of `https://HOST[:PORT][/]` as the one endpoint parser reads
/// it (for the API server's certificate SANs).
pub fn endpoint_host(endpoint: &str) -> Option<String> {
    Endpoint::parse_https_url(endpoint, KUBERNETES_API_PORT)
        .ok()
        .map(|e| e.host)
}

#[cfg(test)]
mod endpoint_parity;

/// The API server's certificate SANs: the endpoint's host, none when the
/// endpoint reads as none.
fn api_server_sans(endpoint: &str) -> Vec<String> {
    endpoint_host(endpoint).into_iter().collect()
}

/// The base config of one node, as YAML documents.
pub fn base_config(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Mapping> {
    let docs = match input.shape {
        ConfigShape::Legacy => v1alpha1_shape(bundle, input),
        ConfigShape::Multidoc => multidoc_shape(bundle, input),
    };
    docs.iter()
        .map(|d| d.to_mapping().expect("a typed document serialises"))
        .collect()
}

/// A bundle certificate and key as `v1alpha1` holds them; the key only on a
/// control plane (`""` on a worker).
fn cert_and_key(c: &Base64CertAndKey, control_plane: bool) -> Base64CertAndKey {
    Base64CertAndKey {
        crt: opt(c.crt.as_ref()),
        key: if control_plane {
            opt(c.key.as_ref())
        } else {
            some("")
        },
        ..Default::default()
    }
}

fn host_dns() -> HostDns {
    HostDns {
        enabled: Some(true),
        forward_kube_dns_to_host: Some(true),
        ..Default::default()
    }
}

fn kubelet_image(input: &BaseInput<'_>) -> Option<String> {
    image("ghcr.io/siderolabs/kubelet", input.kubernetes_version)
}

fn hostname_doc() -> Document {
    Document::Hostname(HostnameConfig {
        api_version: api(),
        auto: some("stable"),
        ..Default::default()
    })
}

/// The `v1alpha1` document's header and its `machine` and `cluster`.
fn v1alpha1_doc(machine: MachineSection, cluster: ClusterSection) -> Document {
    Document::V1Alpha1(Box::new(V1Alpha1Config {
        version: some("v1alpha1"),
        debug: Some(false),
        persist: Some(true),
        machine: Some(machine),
        cluster: Some(cluster),
        ..Default::default()
    }))
}

fn v1alpha1_shape(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Document> {
    let v1 = v1alpha1_doc(legacy_machine(bundle, input), legacy_cluster(bundle, input));
    vec![v1, hostname_doc()]
}

/// The machine's identity, in both shapes: its type, trustd token, OS CA.
fn machine_identity(bundle: &SecretsBundle, control_plane: bool) -> MachineSection {
    MachineSection {
        machine_type: some(if control_plane {
            "controlplane"
        } else {
            "worker"
        }),
        token: some(&bundle.trustdinfo.token),
        ca: Some(cert_and_key(&bundle.certs.os, control_plane)),
        cert_sans: Some(vec![]),
        ..Default::default()
    }
}

/// `machine` of the legacy shape: the node's identity, kubelet, install and features.
fn legacy_machine(bundle: &SecretsBundle, input: &BaseInput<'_>) -> MachineSection {
    let cp = input.control_plane;
    MachineSection {
        kubelet: Some(KubeletSection {
            image: kubelet_image(input),
            default_runtime_seccomp_profile_enabled: Some(true),
            disable_manifests_directory: Some(true),
            ..Default::default()
        }),
        network: Some(MachineNetwork::default()),
        install: Some(InstallSection {
            disk: some(input.install_disk),
            image: image(INSTALLER_REPOSITORY, input.talos_version),
            wipe: Some(false),
            ..Default::default()
        }),
        features: Some(FeaturesSection {
            rbac: Some(true),
            apid_check_ext_key_usage: Some(true),
            disk_quota_support: Some(true),
            kube_prism: Some(KubePrismFeature {
                enabled: Some(true),
                port: Some(DEFAULT_KUBEPRISM_PORT),
                ..Default::default()
            }),
            host_dns: Some(host_dns()),
            ..Default::default()
        }),
        node_labels: cp.then(|| {
            [(EXCLUDE_FROM_LOAD_BALANCERS.to_string(), String::new())]
                .into_iter()
                .collect()
        }),
        ..machine_identity(bundle, cp)
    }
}

/// `cluster` of the legacy shape: identity, network and tokens, the
/// control plane's secrets and components, discovery and etcd's CA.
fn legacy_cluster(bundle: &SecretsBundle, input: &BaseInput<'_>) -> ClusterSection {
    let cp = input.control_plane;
    let control_plane = if cp {
        legacy_control_plane(bundle, input)
    } else {
        ClusterSection::default()
    };
    ClusterSection {
        id: some(&bundle.cluster.id),
        secret: some(&bundle.cluster.secret),
        control_plane: Some(ControlPlaneSection {
            endpoint: some(input.endpoint),
            ..Default::default()
        }),
        cluster_name: some(input.cluster_name),
        network: Some(ClusterNetwork {
            dns_domain: some("cluster.local"),
            pod_subnets: Some(vec![DEFAULT_POD_SUBNET.to_string()]),
            service_subnets: Some(vec![DEFAULT_SERVICE_SUBNET.to_string()]),
            ..Default::default()
        }),
        token: some(&bundle.secrets.bootstraptoken),
        ca: Some(cert_and_key(&bundle.certs.k8s, cp)),
        discovery: Some(legacy_discovery()),
        ..control_plane
    }
}

/// A control plane's part of `cluster`: the encryption secrets, the
/// Kubernetes CAs, the components and etcd's CA.
fn legacy_control_plane(bundle: &SecretsBundle, input: &BaseInput<'_>) -> ClusterSection {
    let certs = &bundle.certs;
    let k8s = input.kubernetes_version;
    let component = |repository: &str| ImageSection {
        image: image(repository, k8s),
        ..Default::default()
    };
    ClusterSection {
        aescbc_encryption_secret: bundle.secrets.aescbcencryptionsecret.clone(),
        secretbox_encryption_secret: bundle.secrets.secretboxencryptionsecret.clone(),
        aggregator_ca: Some(cert_and_key(&certs.k8saggregator, true)),
        service_account: Some(ServiceAccountSection {
            key: opt(certs.k8sserviceaccount.key.as_ref()),
            ..Default::default()
        }),
        api_server: Some(ApiServerSection {
            image: image("registry.k8s.io/kube-apiserver", k8s),
            cert_sans: Some(api_server_sans(input.endpoint)),
            ..Default::default()
        }),
        controller_manager: Some(component("registry.k8s.io/kube-controller-manager")),
        proxy: Some(ProxySection {
            image: image("registry.k8s.io/kube-proxy", k8s),
            ..Default::default()
        }),
        scheduler: Some(component("registry.k8s.io/kube-scheduler")),
        etcd: Some(etcd(bundle)),
        ..Default::default()
    }
}

fn legacy_discovery() -> DiscoverySection {
    DiscoverySection {
        enabled: Some(true),
        registries: Some(DiscoveryRegistries {
            kubernetes: Some(DiscoveryRegistry {
                disabled: Some(true),
                ..Default::default()
            }),
            service: Some(DiscoveryRegistry::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn etcd(bundle: &SecretsBundle) -> EtcdSection {
    EtcdSection {
        ca: Some(cert_and_key(&bundle.certs.etcd, true)),
        ..Default::default()
    }
}

/// etcd's encryption at rest, as Talos v1.14 writes it from the bundle's
/// secretbox (or aescbc) secret.
fn etcd_encryption(bundle: &SecretsBundle) -> Document {
    let (provider, secret) = match (
        &bundle.secrets.secretboxencryptionsecret,
        &bundle.secrets.aescbcencryptionsecret,
    ) {
        (Some(sb), _) => ("secretbox", sb.as_str()),
        (None, Some(aes)) => ("aescbc", aes.as_str()),
        (None, None) => ("secretbox", ""),
    };
    Document::KubeEtcdEncryption(KubeEtcdEncryptionConfig::new(provider, secret))
}

fn multidoc_shape(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Document> {
    let mut docs = vec![multidoc_v1alpha1(bundle, input)];
    docs.extend(machine_docs(bundle, input));
    docs.extend(kubernetes_node_docs(bundle, input));
    if input.control_plane {
        docs.extend(control_plane_docs(bundle, input));
    }
    docs
}

/// The `v1alpha1` document of the multi-document shape: the machine's
/// identity, and etcd's CA on a control plane.
fn multidoc_v1alpha1(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Document {
    let cp = input.control_plane;
    let machine = MachineSection {
        features: Some(FeaturesSection {
            disk_quota_support: Some(true),
            ..Default::default()
        }),
        ..machine_identity(bundle, cp)
    };
    let cluster = ClusterSection {
        token: some(&bundle.secrets.bootstraptoken),
        etcd: cp.then(|| etcd(bundle)),
        ..Default::default()
    };
    v1alpha1_doc(machine, cluster)
}

/// Discovery, DNS, hostname, install and the cluster's name and endpoint.
fn machine_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Document> {
    vec![
        Document::DiscoveryService(DiscoveryServiceConfig {
            api_version: api(),
            name: some("default"),
            endpoint: some("https://discovery.talos.dev/"),
            ..Default::default()
        }),
        Document::DiscoveryIdentity(DiscoveryIdentityConfig {
            api_version: api(),
            cluster_id: some(&bundle.cluster.id),
            cluster_secret: some(&bundle.cluster.secret),
            ..Default::default()
        }),
        Document::Resolver(ResolverConfig {
            api_version: api(),
            host_dns: Some(host_dns()),
            ..Default::default()
        }),
        hostname_doc(),
        Document::UnattendedInstall(UnattendedInstallConfig {
            api_version: api(),
            installer: Some(Installer {
                image: image(INSTALLER_REPOSITORY, input.talos_version),
                ..Default::default()
            }),
            provisioning: Some(Provisioning {
                disk_selector: Some(DiskSelector {
                    match_expr: Some(format!("disk.dev_path == \"{}\"", input.install_disk)),
                    ..Default::default()
                }),
                wipe: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }),
        Document::KubeCluster(KubeClusterConfig {
            api_version: api(),
            cluster_name: some(input.cluster_name),
            endpoint: some(input.endpoint),
            ..Default::default()
        }),
    ]
}

/// What every node runs Kubernetes with: its labels and taints (a control
/// plane's), the kubelet, the network, the API server's CA, KubePrism.
fn kubernetes_node_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Document> {
    let k8s_ca = &bundle.certs.k8s;
    let mut docs = Vec::new();
    if input.control_plane {
        docs.push(Document::KubeNode(KubeNodeConfig {
            api_version: api(),
            labels: Some(
                [CONTROL_PLANE_ROLE, EXCLUDE_FROM_LOAD_BALANCERS]
                    .into_iter()
                    .map(|l| (l.to_string(), String::new()))
                    .collect(),
            ),
            taints: Some(
                [(CONTROL_PLANE_ROLE.to_string(), "NoSchedule".to_string())]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }));
    }
    docs.push(Document::Kubelet(KubeletConfig {
        api_version: api(),
        image: kubelet_image(input),
        default_runtime_seccomp_profile_enabled: Some(true),
        ..Default::default()
    }));
    docs.push(Document::KubeNetwork(KubeNetworkConfig {
        api_version: api(),
        dns_domain: some("cluster.local"),
        pod_subnets: Some(vec![DEFAULT_POD_SUBNET.to_string()]),
        service_subnets: Some(vec![DEFAULT_SERVICE_SUBNET.to_string()]),
        ..Default::default()
    }));
    let api_server_ca = if input.control_plane {
        KubeCaConfig {
            issuing_ca: Some(pem_cert_and_key(k8s_ca)),
            ..Default::default()
        }
    } else {
        KubeCaConfig {
            accepted_cas: pem(k8s_ca.crt.as_ref()).map(|crt| vec![crt]),
            ..Default::default()
        }
    };
    docs.push(Document::KubeApiServerCa(KubeCaConfig {
        api_version: api(),
        ..api_server_ca
    }));
    docs.push(Document::KubePrism(KubePrismConfig::new(
        DEFAULT_KUBEPRISM_PORT,
    )));
    docs
}

/// A bundle CA (base64 PEM) as a `Kube*` CA document's issuing CA (PEM).
fn pem_cert_and_key(c: &Base64CertAndKey) -> PemCertAndKey {
    PemCertAndKey {
        cert: pem(c.crt.as_ref()),
        key: pem(c.key.as_ref()),
        ..Default::default()
    }
}

/// A control plane's own documents: the aggregator's CA, the authorizers,
/// etcd's encryption, the service account, the components, CoreDNS.
fn control_plane_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Document> {
    let certs = &bundle.certs;
    let k8s = input.kubernetes_version;
    let authorizer = |name: &str, authorizer_type: &str| {
        Document::KubeAuthorizer(KubeAuthorizerConfig {
            api_version: api(),
            name: some(name),
            authorizer_type: some(authorizer_type),
            ..Default::default()
        })
    };
    vec![
        Document::KubeAggregatorCa(KubeCaConfig {
            api_version: api(),
            issuing_ca: Some(pem_cert_and_key(&certs.k8saggregator)),
            ..Default::default()
        }),
        authorizer("node", "Node"),
        authorizer("rbac", "RBAC"),
        etcd_encryption(bundle),
        Document::KubeServiceAccount(KubeServiceAccountConfig {
            api_version: api(),
            issuer: Some(ServiceAccountIssuer {
                private_key: pem(certs.k8sserviceaccount.key.as_ref()),
                issuer_url: some(input.endpoint),
                ..Default::default()
            }),
            ..Default::default()
        }),
        Document::KubeApiServer(KubeApiServerConfig {
            api_version: api(),
            image: image("registry.k8s.io/kube-apiserver", k8s),
            cert_extra_sans: Some(api_server_sans(input.endpoint)),
            ..Default::default()
        }),
        Document::KubeControllerManager(KubeControllerManagerConfig {
            api_version: api(),
            image: image("registry.k8s.io/kube-controller-manager", k8s),
            ..Default::default()
        }),
        Document::KubeScheduler(KubeSchedulerConfig {
            api_version: api(),
            image: image("registry.k8s.io/kube-scheduler", k8s),
            ..Default::default()
        }),
        Document::KubeProxy(KubeProxyConfig {
            api_version: api(),
            image: image("registry.k8s.io/kube-proxy", k8s),
            ..Default::default()
        }),
        Document::KubeCoreDns(KubeCoreDnsConfig {
            api_version: api(),
            enabled: Some(true),
            ..Default::default()
        }),
    ]
}
