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

use ichor_api::endpoint::{Endpoint, KUBERNETES_API_PORT};
use ichor_talos::pem::unb64;
use ichor_talos::secrets::SecretsBundle;
use serde_yaml_ng::{Mapping, Value};

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

fn s(v: &str) -> Value {
    Value::from(v)
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(Value::from(k), v);
    }
    Value::Mapping(m)
}

fn list(items: &[&str]) -> Value {
    Value::Sequence(items.iter().map(|i| s(i)).collect())
}

fn opt(v: Option<&String>) -> Value {
    s(v.map(String::as_str).unwrap_or(""))
}

/// Base64 PEM (as the bundle and v1alpha1 hold it) → PEM (as `Kube*` documents hold it).
fn pem(v: Option<&String>) -> Value {
    s(&v.and_then(|b| unb64(b)).unwrap_or_default())
}

/// The host of `https://HOST:PORT` (for the API server's certificate SANs).
pub fn endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    (!host.is_empty()).then_some(host)
}

/// The host of `https://HOST[:PORT][/]` as the one endpoint parser reads it.
fn api_server_host(endpoint: &str) -> Option<String> {
    Endpoint::parse_https_url(endpoint, KUBERNETES_API_PORT)
        .ok()
        .map(|e| e.host)
}

#[cfg(test)]
mod endpoint_parity;

fn image(repository: &str, version: &str) -> Value {
    s(&format!("{repository}:{version}"))
}

/// The base config of one node, as YAML documents.
pub fn base_config(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Mapping> {
    let docs = match input.shape {
        ConfigShape::Legacy => v1alpha1_shape(bundle, input),
        ConfigShape::Multidoc => multidoc_shape(bundle, input),
    };
    docs.into_iter()
        .filter_map(|d| match d {
            Value::Mapping(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn os_ca(bundle: &SecretsBundle, control_plane: bool) -> Value {
    let c = &bundle.certs.os;
    map([
        ("crt", opt(c.crt.as_ref())),
        (
            "key",
            if control_plane {
                opt(c.key.as_ref())
            } else {
                s("")
            },
        ),
    ])
}

fn features() -> Value {
    map([
        ("rbac", Value::from(true)),
        ("apidCheckExtKeyUsage", Value::from(true)),
        ("diskQuotaSupport", Value::from(true)),
        (
            "kubePrism",
            map([("enabled", Value::from(true)), ("port", Value::from(7445))]),
        ),
        (
            "hostDNS",
            map([
                ("enabled", Value::from(true)),
                ("forwardKubeDNSToHost", Value::from(true)),
            ]),
        ),
    ])
}

fn kubelet_image(input: &BaseInput<'_>) -> Value {
    image("ghcr.io/siderolabs/kubelet", input.kubernetes_version)
}

fn hostname_doc() -> Value {
    map([
        ("apiVersion", s("v1alpha1")),
        ("kind", s("HostnameConfig")),
        ("auto", s("stable")),
    ])
}

fn v1alpha1_shape(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Value> {
    let v1 = map([
        ("version", s("v1alpha1")),
        ("debug", Value::from(false)),
        ("persist", Value::from(true)),
        ("machine", Value::Mapping(legacy_machine(bundle, input))),
        ("cluster", Value::Mapping(legacy_cluster(bundle, input))),
    ]);
    vec![v1, hostname_doc()]
}

fn machine_type(control_plane: bool) -> Value {
    s(if control_plane {
        "controlplane"
    } else {
        "worker"
    })
}

/// `machine` of the legacy shape: the node's identity, kubelet, install and features.
fn legacy_machine(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Mapping {
    let cp = input.control_plane;
    let mut machine = Mapping::new();
    machine.insert(s("type"), machine_type(cp));
    machine.insert(s("token"), s(&bundle.trustdinfo.token));
    machine.insert(s("ca"), os_ca(bundle, cp));
    machine.insert(s("certSANs"), Value::Sequence(vec![]));
    machine.insert(
        s("kubelet"),
        map([
            ("image", kubelet_image(input)),
            ("defaultRuntimeSeccompProfileEnabled", Value::from(true)),
            ("disableManifestsDirectory", Value::from(true)),
        ]),
    );
    machine.insert(s("network"), Value::Mapping(Mapping::new()));
    machine.insert(
        s("install"),
        map([
            ("disk", s(input.install_disk)),
            ("image", image(INSTALLER_REPOSITORY, input.talos_version)),
            ("wipe", Value::from(false)),
        ]),
    );
    machine.insert(s("features"), features());
    if cp {
        machine.insert(
            s("nodeLabels"),
            map([(
                "node.kubernetes.io/exclude-from-external-load-balancers",
                s(""),
            )]),
        );
    }
    machine
}

/// `cluster` of the legacy shape: identity, network and tokens, the
/// control plane's secrets and components, discovery and etcd's CA.
fn legacy_cluster(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Mapping {
    let cp = input.control_plane;
    let mut cluster = Mapping::new();
    cluster.insert(s("id"), s(&bundle.cluster.id));
    cluster.insert(s("secret"), s(&bundle.cluster.secret));
    cluster.insert(s("controlPlane"), map([("endpoint", s(input.endpoint))]));
    cluster.insert(s("clusterName"), s(input.cluster_name));
    cluster.insert(
        s("network"),
        map([
            ("dnsDomain", s("cluster.local")),
            ("podSubnets", list(&[DEFAULT_POD_SUBNET])),
            ("serviceSubnets", list(&[DEFAULT_SERVICE_SUBNET])),
        ]),
    );
    cluster.insert(s("token"), s(&bundle.secrets.bootstraptoken));
    if cp {
        legacy_control_plane_secrets(&mut cluster, bundle);
        legacy_control_plane_components(&mut cluster, input);
    } else {
        cluster.insert(
            s("ca"),
            map([("crt", opt(bundle.certs.k8s.crt.as_ref())), ("key", s(""))]),
        );
    }
    cluster.insert(s("discovery"), legacy_discovery());
    if cp {
        cluster.insert(s("etcd"), map([("ca", etcd_ca(bundle))]));
    }
    cluster
}

/// A control plane's encryption secrets and Kubernetes CAs, in `cluster`.
fn legacy_control_plane_secrets(cluster: &mut Mapping, bundle: &SecretsBundle) {
    let certs = &bundle.certs;
    if let Some(secretbox) = &bundle.secrets.secretboxencryptionsecret {
        cluster.insert(s("secretboxEncryptionSecret"), s(secretbox));
    }
    if let Some(aescbc) = &bundle.secrets.aescbcencryptionsecret {
        cluster.insert(s("aescbcEncryptionSecret"), s(aescbc));
    }
    cluster.insert(
        s("ca"),
        map([
            ("crt", opt(certs.k8s.crt.as_ref())),
            ("key", opt(certs.k8s.key.as_ref())),
        ]),
    );
    cluster.insert(
        s("aggregatorCA"),
        map([
            ("crt", opt(certs.k8saggregator.crt.as_ref())),
            ("key", opt(certs.k8saggregator.key.as_ref())),
        ]),
    );
    cluster.insert(
        s("serviceAccount"),
        map([("key", opt(certs.k8sserviceaccount.key.as_ref()))]),
    );
}

/// A control plane's Kubernetes components, in `cluster`.
fn legacy_control_plane_components(cluster: &mut Mapping, input: &BaseInput<'_>) {
    let k8s = input.kubernetes_version;
    let sans: Vec<&str> = endpoint_host(input.endpoint).into_iter().collect();
    cluster.insert(
        s("apiServer"),
        map([
            ("image", image("registry.k8s.io/kube-apiserver", k8s)),
            ("certSANs", list(&sans)),
        ]),
    );
    cluster.insert(
        s("controllerManager"),
        map([(
            "image",
            image("registry.k8s.io/kube-controller-manager", k8s),
        )]),
    );
    cluster.insert(
        s("proxy"),
        map([("image", image("registry.k8s.io/kube-proxy", k8s))]),
    );
    cluster.insert(
        s("scheduler"),
        map([("image", image("registry.k8s.io/kube-scheduler", k8s))]),
    );
}

fn legacy_discovery() -> Value {
    map([
        ("enabled", Value::from(true)),
        (
            "registries",
            map([
                ("kubernetes", map([("disabled", Value::from(true))])),
                ("service", Value::Mapping(Mapping::new())),
            ]),
        ),
    ])
}

fn etcd_ca(bundle: &SecretsBundle) -> Value {
    let etcd = &bundle.certs.etcd;
    map([
        ("crt", opt(etcd.crt.as_ref())),
        ("key", opt(etcd.key.as_ref())),
    ])
}

fn doc<const N: usize>(kind: &str, entries: [(&str, Value); N]) -> Value {
    let mut m = Mapping::new();
    m.insert(s("apiVersion"), s("v1alpha1"));
    m.insert(s("kind"), s(kind));
    for (k, v) in entries {
        m.insert(Value::from(k), v);
    }
    Value::Mapping(m)
}

/// etcd's encryption at rest, as Talos v1.14 writes it from the bundle's
/// secretbox (or aescbc) secret.
fn etcd_encryption(bundle: &SecretsBundle) -> Value {
    let (provider, secret) = match (
        &bundle.secrets.secretboxencryptionsecret,
        &bundle.secrets.aescbcencryptionsecret,
    ) {
        (Some(sb), _) => ("secretbox", sb.as_str()),
        (None, Some(aes)) => ("aescbc", aes.as_str()),
        (None, None) => ("secretbox", ""),
    };
    doc(
        "KubeEtcdEncryptionConfig",
        [(
            "config",
            map([
                ("apiVersion", s("apiserver.config.k8s.io/v1")),
                ("kind", s("EncryptionConfiguration")),
                (
                    "resources",
                    Value::Sequence(vec![map([
                        ("resources", list(&["secrets"])),
                        (
                            "providers",
                            Value::Sequence(vec![
                                map([(
                                    provider,
                                    map([(
                                        "keys",
                                        Value::Sequence(vec![map([
                                            ("name", s("key2")),
                                            ("secret", s(secret)),
                                        ])]),
                                    )]),
                                )]),
                                map([("identity", Value::Mapping(Mapping::new()))]),
                            ]),
                        ),
                    ])]),
                ),
            ]),
        )],
    )
}

fn multidoc_shape(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Value> {
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
fn multidoc_v1alpha1(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Value {
    let cp = input.control_plane;
    let mut machine = Mapping::new();
    machine.insert(s("type"), machine_type(cp));
    machine.insert(s("token"), s(&bundle.trustdinfo.token));
    machine.insert(s("ca"), os_ca(bundle, cp));
    machine.insert(s("certSANs"), Value::Sequence(vec![]));
    machine.insert(
        s("features"),
        map([("diskQuotaSupport", Value::from(true))]),
    );
    let mut cluster = Mapping::new();
    cluster.insert(s("token"), s(&bundle.secrets.bootstraptoken));
    if cp {
        cluster.insert(s("etcd"), map([("ca", etcd_ca(bundle))]));
    }
    map([
        ("version", s("v1alpha1")),
        ("debug", Value::from(false)),
        ("persist", Value::from(true)),
        ("machine", Value::Mapping(machine)),
        ("cluster", Value::Mapping(cluster)),
    ])
}

/// Discovery, DNS, hostname, install and the cluster's name and endpoint.
fn machine_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Value> {
    vec![
        doc(
            "DiscoveryServiceConfig",
            [
                ("name", s("default")),
                ("endpoint", s("https://discovery.talos.dev/")),
            ],
        ),
        doc(
            "DiscoveryIdentityConfig",
            [
                ("clusterID", s(&bundle.cluster.id)),
                ("clusterSecret", s(&bundle.cluster.secret)),
            ],
        ),
        doc(
            "ResolverConfig",
            [(
                "hostDNS",
                map([
                    ("enabled", Value::from(true)),
                    ("forwardKubeDNSToHost", Value::from(true)),
                ]),
            )],
        ),
        hostname_doc(),
        doc(
            "UnattendedInstallConfig",
            [
                (
                    "installer",
                    map([("image", image(INSTALLER_REPOSITORY, input.talos_version))]),
                ),
                (
                    "provisioning",
                    map([
                        (
                            "diskSelector",
                            map([(
                                "match",
                                s(&format!("disk.dev_path == \"{}\"", input.install_disk)),
                            )]),
                        ),
                        ("wipe", Value::from(false)),
                    ]),
                ),
            ],
        ),
        doc(
            "KubeClusterConfig",
            [
                ("clusterName", s(input.cluster_name)),
                ("endpoint", s(input.endpoint)),
            ],
        ),
    ]
}

/// What every node runs Kubernetes with: its labels and taints (a control
/// plane's), the kubelet, the network, the API server's CA, KubePrism.
fn kubernetes_node_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Value> {
    let certs = &bundle.certs;
    let mut docs = Vec::new();
    if input.control_plane {
        let mut labels = Mapping::new();
        labels.insert(s("node-role.kubernetes.io/control-plane"), s(""));
        labels.insert(
            s("node.kubernetes.io/exclude-from-external-load-balancers"),
            s(""),
        );
        docs.push(doc(
            "KubeNodeConfig",
            [
                ("labels", Value::Mapping(labels)),
                (
                    "taints",
                    map([("node-role.kubernetes.io/control-plane", s("NoSchedule"))]),
                ),
            ],
        ));
    }
    docs.push(doc(
        "KubeletConfig",
        [
            ("image", kubelet_image(input)),
            ("defaultRuntimeSeccompProfileEnabled", Value::from(true)),
        ],
    ));
    docs.push(doc(
        "KubeNetworkConfig",
        [
            ("dnsDomain", s("cluster.local")),
            ("podSubnets", list(&[DEFAULT_POD_SUBNET])),
            ("serviceSubnets", list(&[DEFAULT_SERVICE_SUBNET])),
        ],
    ));
    let api_server_ca = if input.control_plane {
        (
            "issuingCA",
            map([
                ("cert", pem(certs.k8s.crt.as_ref())),
                ("key", pem(certs.k8s.key.as_ref())),
            ]),
        )
    } else {
        (
            "acceptedCAs",
            Value::Sequence(vec![pem(certs.k8s.crt.as_ref())]),
        )
    };
    docs.push(doc("KubeAPIServerCAConfig", [api_server_ca]));
    docs.push(doc("KubePrismConfig", [("port", Value::from(7445))]));
    docs
}

/// A control plane's own documents: the aggregator's CA, the authorizers,
/// etcd's encryption, the service account, the components, CoreDNS.
fn control_plane_docs(bundle: &SecretsBundle, input: &BaseInput<'_>) -> Vec<Value> {
    let certs = &bundle.certs;
    let k8s = input.kubernetes_version;
    let sans: Vec<&str> = endpoint_host(input.endpoint).into_iter().collect();
    vec![
        doc(
            "KubeAggregatorCAConfig",
            [(
                "issuingCA",
                map([
                    ("cert", pem(certs.k8saggregator.crt.as_ref())),
                    ("key", pem(certs.k8saggregator.key.as_ref())),
                ]),
            )],
        ),
        doc(
            "KubeAuthorizerConfig",
            [("name", s("node")), ("type", s("Node"))],
        ),
        doc(
            "KubeAuthorizerConfig",
            [("name", s("rbac")), ("type", s("RBAC"))],
        ),
        etcd_encryption(bundle),
        doc(
            "KubeServiceAccountConfig",
            [(
                "issuer",
                map([
                    ("privateKey", pem(certs.k8sserviceaccount.key.as_ref())),
                    ("issuerURL", s(input.endpoint)),
                ]),
            )],
        ),
        doc(
            "KubeAPIServerConfig",
            [
                ("image", image("registry.k8s.io/kube-apiserver", k8s)),
                ("certExtraSANs", list(&sans)),
            ],
        ),
        doc(
            "KubeControllerManagerConfig",
            [(
                "image",
                image("registry.k8s.io/kube-controller-manager", k8s),
            )],
        ),
        doc(
            "KubeSchedulerConfig",
            [("image", image("registry.k8s.io/kube-scheduler", k8s))],
        ),
        doc(
            "KubeProxyConfig",
            [("image", image("registry.k8s.io/kube-proxy", k8s))],
        ),
        doc("KubeCoreDNSConfig", [("enabled", Value::from(true))]),
    ]
}
