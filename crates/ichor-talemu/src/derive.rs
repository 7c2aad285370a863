//! What an emulated node derives from its machine config: the facts its COSI
//! resources show. Reads both shapes: v1.12/v1.13 (everything in the v1alpha1
//! document) and v1.14 (Kubernetes settings in their own documents).

use serde_yaml_ng::Value;

/// The machine type of a config (`machine.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineType {
    Unknown,
    Init,
    ControlPlane,
    Worker,
}

impl MachineType {
    /// The enum number of `MachineTypeSpec.machine_type`.
    pub fn proto(self) -> i32 {
        match self {
            MachineType::Unknown => 0,
            MachineType::Init => 1,
            MachineType::ControlPlane => 2,
            MachineType::Worker => 3,
        }
    }

    /// The YAML form (`controlplane`, `worker`, `init`, `unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            MachineType::Unknown => "unknown",
            MachineType::Init => "init",
            MachineType::ControlPlane => "controlplane",
            MachineType::Worker => "worker",
        }
    }

    /// Control plane (or init) node.
    pub fn is_control_plane(self) -> bool {
        matches!(self, MachineType::ControlPlane | MachineType::Init)
    }
}

/// The facts of a machine config the emulator shows as resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFacts {
    pub machine_type: MachineType,
    /// A static hostname from the config, if it sets one.
    pub hostname: Option<String>,
    /// KubePrism's port when enabled.
    pub kubeprism_port: Option<u16>,
    /// `flannel`, `custom` or `none`.
    pub cni_name: String,
    pub proxy_enabled: bool,
    pub proxy_image: String,
    /// The images of kube-apiserver, kube-controller-manager, kube-scheduler
    /// and the kubelet (`cluster.*.image`, `machine.kubelet.image` or their
    /// `Kube*Config` documents); empty when the config leaves them out.
    pub apiserver_image: String,
    pub controller_manager_image: String,
    pub scheduler_image: String,
    pub kubelet_image: String,
    pub coredns_enabled: bool,
    pub pod_subnets: Vec<String>,
    pub service_subnets: Vec<String>,
    pub dns_domain: String,
    /// `cluster.controlPlane.endpoint` (or `KubeClusterConfig.endpoint`).
    pub control_plane_endpoint: Option<String>,
    pub cluster_id: String,
    pub cluster_name: String,
    /// The config has a Kubernetes network section (v1alpha1 `cluster.network` or `KubeNetworkConfig`).
    pub has_kubernetes_network: bool,
}

/// Why a config change cannot be applied without a reboot by Talos
/// v1.12/v1.13's rule, as Talos words it (the node answers with it).
#[derive(Debug, thiserror::Error)]
pub enum ImmediateError {
    /// A config is not YAML: the parser's words.
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("current config is not v1alpha1")]
    CurrentNotV1alpha1,
    #[error("new config is not v1alpha1")]
    NewNotV1alpha1,
    #[error("this config change can't be applied in immediate mode\ndiff:\n{diff}")]
    NeedsReboot {
        /// The unified diff of the v1alpha1 documents past what applies live.
        diff: String,
    },
}

/// Splits a multi-document YAML into its documents (empty documents dropped).
pub fn documents(bytes: &[u8]) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    use serde::Deserialize as _;
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_slice(bytes) {
        let value = Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// True for the v1alpha1 document (has `machine`, `cluster`, `debug` or `persist`, and no `kind`).
pub fn is_v1alpha1(doc: &Value) -> bool {
    doc.get("kind").is_none()
        && ["machine", "cluster", "debug", "persist"]
            .iter()
            .any(|k| doc.get(k).is_some())
}

fn kind_of(doc: &Value) -> Option<&str> {
    doc.get("kind").and_then(Value::as_str)
}

fn path<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(v, |v, k| v.get(k))
}

fn str_at(v: &Value, keys: &[&str]) -> Option<String> {
    path(v, keys).and_then(Value::as_str).map(str::to_string)
}

fn bool_at(v: &Value, keys: &[&str]) -> Option<bool> {
    path(v, keys).and_then(Value::as_bool)
}

fn strings_at(v: &Value, keys: &[&str]) -> Option<Vec<String>> {
    path(v, keys).and_then(Value::as_sequence).map(|s| {
        s.iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    })
}

/// Derives the facts of a config. `multidoc_kubernetes` selects the v1.14
/// reading of a v1alpha1 document without `cluster.network` (no flannel).
pub fn facts(bytes: &[u8], multidoc_kubernetes: bool) -> Result<ConfigFacts, serde_yaml_ng::Error> {
    let docs = documents(bytes)?;
    let config = Config::of(&docs);
    let v1 = config.v1;
    let network = path(v1, &["cluster", "network"]);
    let kube_network = config.by_kind("KubeNetworkConfig");
    let images = images_of(&config);
    let (proxy_enabled, proxy_image) = proxy_of(&config);
    let (pod_subnets, service_subnets, dns_domain) = network_of(&config);
    Ok(ConfigFacts {
        machine_type: machine_type_of(v1),
        hostname: config.str_of(
            "HostnameConfig",
            &["hostname"],
            &["machine", "network", "hostname"],
        ),
        kubeprism_port: kubeprism_port_of(v1, config.by_kind("KubePrismConfig")),
        cni_name: cni_name_of(
            v1,
            config.by_kind("KubeFlannelCNIConfig").is_some(),
            network.is_some(),
            multidoc_kubernetes,
        ),
        proxy_enabled,
        proxy_image,
        apiserver_image: images.apiserver,
        controller_manager_image: images.controller_manager,
        scheduler_image: images.scheduler,
        kubelet_image: images.kubelet,
        coredns_enabled: match config.by_kind("KubeCoreDNSConfig") {
            Some(d) => bool_at(d, &["enabled"]).unwrap_or(true),
            None => bool_at(v1, &["cluster", "coreDNS", "disabled"]) != Some(true),
        },
        pod_subnets,
        service_subnets,
        dns_domain,
        control_plane_endpoint: config.str_of(
            "KubeClusterConfig",
            &["endpoint"],
            &["cluster", "controlPlane", "endpoint"],
        ),
        cluster_id: config
            .str_of(
                "DiscoveryIdentityConfig",
                &["clusterID"],
                &["cluster", "id"],
            )
            .unwrap_or_default(),
        cluster_name: config
            .str_of(
                "KubeClusterConfig",
                &["clusterName"],
                &["cluster", "clusterName"],
            )
            .unwrap_or_default(),
        has_kubernetes_network: kube_network.is_some()
            || network.is_some()
            || (!multidoc_kubernetes && v1.get("cluster").is_some()),
    })
}

/// The documents of a config: its v1alpha1 document (null when it has
/// none) and the others by kind.
struct Config<'a> {
    docs: &'a [Value],
    v1: &'a Value,
}

impl<'a> Config<'a> {
    fn of(docs: &'a [Value]) -> Self {
        static NULL: Value = Value::Null;
        let v1 = docs.iter().find(|d| is_v1alpha1(d)).unwrap_or(&NULL);
        Config { docs, v1 }
    }

    fn by_kind(&self, kind: &str) -> Option<&'a Value> {
        self.docs.iter().find(|d| kind_of(d) == Some(kind))
    }

    /// A setting of a document of `kind` when the config has one, else the
    /// v1alpha1 document's.
    fn str_of(&self, kind: &str, keys: &[&str], v1_keys: &[&str]) -> Option<String> {
        self.by_kind(kind)
            .and_then(|d| str_at(d, keys))
            .or_else(|| str_at(self.v1, v1_keys))
    }
}

/// The images of the Kubernetes components a config names (empty when it
/// leaves one out).
struct Images {
    apiserver: String,
    controller_manager: String,
    scheduler: String,
    kubelet: String,
}

fn images_of(config: &Config<'_>) -> Images {
    let image_of =
        |kind: &str, v1_keys: &[&str]| config.str_of(kind, &["image"], v1_keys).unwrap_or_default();
    Images {
        apiserver: image_of("KubeAPIServerConfig", &["cluster", "apiServer", "image"]),
        controller_manager: image_of(
            "KubeControllerManagerConfig",
            &["cluster", "controllerManager", "image"],
        ),
        scheduler: image_of("KubeSchedulerConfig", &["cluster", "scheduler", "image"]),
        kubelet: image_of("KubeletConfig", &["machine", "kubelet", "image"]),
    }
}

/// Whether kube-proxy runs, and its image.
fn proxy_of(config: &Config<'_>) -> (bool, String) {
    let enabled = match config.by_kind("KubeProxyConfig") {
        Some(d) => bool_at(d, &["enabled"]).unwrap_or(true),
        None => bool_at(config.v1, &["cluster", "proxy", "disabled"]) != Some(true),
    };
    let image = config
        .str_of(
            "KubeProxyConfig",
            &["image"],
            &["cluster", "proxy", "image"],
        )
        .unwrap_or_default();
    (enabled, image)
}

/// The pod subnets, service subnets and DNS domain, with Talos's defaults.
fn network_of(config: &Config<'_>) -> (Vec<String>, Vec<String>, String) {
    let kube_network = config.by_kind("KubeNetworkConfig");
    let from_net = |key: &str, default: &str| {
        kube_network
            .and_then(|d| strings_at(d, &[key]))
            .or_else(|| strings_at(config.v1, &["cluster", "network", key]))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec![default.to_string()])
    };
    let dns_domain = config
        .str_of(
            "KubeNetworkConfig",
            &["dnsDomain"],
            &["cluster", "network", "dnsDomain"],
        )
        .unwrap_or_else(|| "cluster.local".to_string());
    (
        from_net("podSubnets", "10.244.0.0/16"),
        from_net("serviceSubnets", "10.96.0.0/12"),
        dns_domain,
    )
}

fn machine_type_of(v1: &Value) -> MachineType {
    match str_at(v1, &["machine", "type"]).as_deref() {
        Some("controlplane") => MachineType::ControlPlane,
        Some("init") => MachineType::Init,
        Some("worker") => MachineType::Worker,
        _ => MachineType::Unknown,
    }
}

/// KubePrism's port: from a `KubePrismConfig` document when there is one
/// (enabled by its presence), else from v1alpha1 `machine.features.kubePrism`.
fn kubeprism_port_of(v1: &Value, kubeprism_config: Option<&Value>) -> Option<u16> {
    match kubeprism_config {
        Some(d) => Some(
            path(d, &["port"])
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(7445),
        ),
        None => {
            if bool_at(v1, &["machine", "features", "kubePrism", "enabled"]) == Some(true) {
                let port = path(v1, &["machine", "features", "kubePrism", "port"])
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p != 0)
                    .unwrap_or(7445);
                Some(port)
            } else {
                None
            }
        }
    }
}

/// The CNI's name: flannel when configured (or implied, before v1.14's
/// multi-document reading), `none` when a v1.14 config has no network.
fn cni_name_of(
    v1: &Value,
    has_flannel_config: bool,
    has_v1alpha1_network: bool,
    multidoc_kubernetes: bool,
) -> String {
    if has_flannel_config {
        "flannel".to_string()
    } else if let Some(name) = str_at(v1, &["cluster", "network", "cni", "name"]) {
        name
    } else if has_v1alpha1_network || !multidoc_kubernetes {
        "flannel".to_string()
    } else {
        "none".to_string()
    }
}

/// The parts of a v1alpha1 document Talos v1.12/v1.13 can change without a
/// reboot (`CanApplyImmediate`): everything else must be equal.
const IMMEDIATE_MACHINE_KEYS: &[&str] = &[
    "ca",
    "acceptedCAs",
    "time",
    "certSANs",
    "install",
    "network",
    "sysfs",
    "sysctls",
    "logging",
    "controlplane",
    "kubelet",
    "kernel",
    "registries",
    "pods",
    "seccompProfiles",
    "nodeAnnotations",
    "nodeLabels",
    "nodeTaints",
];
const IMMEDIATE_FEATURE_KEYS: &[&str] = &[
    "kubernetesTalosAPIAccess",
    "kubePrism",
    "hostDNS",
    "imageCache",
    "nodeAddressSortAlgorithm",
];

/// Whether `new` can replace `current` without a reboot, by Talos v1.13's
/// rule. `Err` carries the reason, as Talos words it.
pub fn can_apply_immediate(current: &[u8], new: &[u8]) -> Result<(), ImmediateError> {
    let cur_docs = documents(current)?;
    let new_docs = documents(new)?;
    let cur = cur_docs
        .into_iter()
        .find(is_v1alpha1)
        .ok_or(ImmediateError::CurrentNotV1alpha1)?;
    let mut new = new_docs
        .into_iter()
        .find(is_v1alpha1)
        .ok_or(ImmediateError::NewNotV1alpha1)?;
    let copy = |new: &mut Value, cur: &Value, keys: &[&str]| {
        let cur_v = path(cur, keys).cloned();
        let Some((last, parents)) = keys.split_last() else {
            return;
        };
        let Some(parent) = parents
            .iter()
            .try_fold(&mut *new, |v, k| v.get_mut(*k))
            .and_then(Value::as_mapping_mut)
        else {
            return;
        };
        match cur_v {
            Some(v) => {
                parent.insert(Value::from(*last), v);
            }
            None => {
                parent.remove(*last);
            }
        }
    };
    copy(&mut new, &cur, &["debug"]);
    copy(&mut new, &cur, &["cluster"]);
    if cur.get("machine").is_some() && new.get("machine").is_some() {
        for key in IMMEDIATE_MACHINE_KEYS {
            copy(&mut new, &cur, &["machine", key]);
        }
        if path(&cur, &["machine", "features"]).is_some()
            && path(&new, &["machine", "features"]).is_some()
        {
            for key in IMMEDIATE_FEATURE_KEYS {
                copy(&mut new, &cur, &["machine", "features", key]);
            }
        }
    }
    if new == cur {
        return Ok(());
    }
    let a = serde_yaml_ng::to_string(&cur).unwrap_or_default();
    let b = serde_yaml_ng::to_string(&new).unwrap_or_default();
    Err(ImmediateError::NeedsReboot {
        diff: crate::diff::unified(&a, &b),
    })
}

/// A certificate authority a config carries: certificate and key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CaPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CaPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never printed.
        f.debug_struct("CaPair").finish_non_exhaustive()
    }
}

fn base64_pem_at(v: &Value, keys: &[&str]) -> Option<String> {
    ichor_talos::pem::unb64(&str_at(v, keys)?).filter(|s| !s.trim().is_empty())
}

/// The etcd image a control-plane config names (`cluster.etcd.image`), if any.
pub fn etcd_image(bytes: &[u8]) -> Option<String> {
    let docs = documents(bytes).ok()?;
    let v1 = docs.iter().find(|d| is_v1alpha1(d))?;
    str_at(v1, &["cluster", "etcd", "image"]).filter(|s| !s.trim().is_empty())
}

/// The NTP servers a config names (`machine.time.servers`, or a
/// `TimeSyncConfig` document's `ntp.servers`); empty when it names none.
pub fn time_servers(bytes: &[u8]) -> Vec<String> {
    let Ok(docs) = documents(bytes) else {
        return Vec::new();
    };
    docs.iter()
        .find(|d| kind_of(d) == Some("TimeSyncConfig"))
        .and_then(|d| strings_at(d, &["ntp", "servers"]))
        .or_else(|| {
            let v1 = docs.iter().find(|d| is_v1alpha1(d))?;
            strings_at(v1, &["machine", "time", "servers"])
        })
        .unwrap_or_default()
}

/// The Talos API CA of a config (`machine.ca`, base64 PEM in the v1alpha1
/// document of both shapes), with its key when the config holds it.
pub fn os_ca(bytes: &[u8]) -> Option<CaPair> {
    let docs = documents(bytes).ok()?;
    let v1 = docs.iter().find(|d| is_v1alpha1(d))?;
    Some(CaPair {
        cert_pem: base64_pem_at(v1, &["machine", "ca", "crt"])?,
        key_pem: base64_pem_at(v1, &["machine", "ca", "key"])?,
    })
}

/// The Talos API CA certificate of a config (`machine.ca.crt`), which a
/// worker's config carries without its key.
pub fn os_ca_cert(bytes: &[u8]) -> Option<String> {
    let docs = documents(bytes).ok()?;
    let v1 = docs.iter().find(|d| is_v1alpha1(d))?;
    base64_pem_at(v1, &["machine", "ca", "crt"])
}

/// The Kubernetes API server's issuing CA of a control-plane config:
/// `KubeAPIServerCAConfig.issuingCA` (raw PEM, v1.14 shape) or v1alpha1
/// `cluster.ca` (base64 PEM).
pub fn kubernetes_ca(bytes: &[u8]) -> Option<CaPair> {
    let docs = documents(bytes).ok()?;
    if let Some(doc) = docs
        .iter()
        .find(|d| kind_of(d) == Some("KubeAPIServerCAConfig"))
    {
        let nonempty = |keys: &[&str]| str_at(doc, keys).filter(|s| !s.trim().is_empty());
        return Some(CaPair {
            cert_pem: nonempty(&["issuingCA", "cert"])?,
            key_pem: nonempty(&["issuingCA", "key"])?,
        });
    }
    let v1 = docs.iter().find(|d| is_v1alpha1(d))?;
    Some(CaPair {
        cert_pem: base64_pem_at(v1, &["cluster", "ca", "crt"])?,
        key_pem: base64_pem_at(v1, &["cluster", "ca", "key"])?,
    })
}
