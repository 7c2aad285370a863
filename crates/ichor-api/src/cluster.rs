//! `TalosCluster`: one Talos cluster that Ichor manages.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a Talos cluster: where its API is, which versions it
/// runs, its pod and service networks, and how its CNI is managed.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosCluster",
    doc = "A Talos cluster managed by Ichor: endpoint, versions, networks, CNI; status carries Ready and CNIHandover.",
    plural = "talosclusters",
    singular = "taloscluster",
    shortname = "tc",
    category = "ichor",
    namespaced,
    status = "TalosClusterStatus",
    derive = "PartialEq",
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".spec.endpoint"),
    printcolumn(name = "Talos", type_ = "string", json_path = ".spec.talosVersion"),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".spec.kubernetesVersion"
    ),
    printcolumn(name = "CNI", type_ = "string", json_path = ".spec.cni.preset"),
    printcolumn(
        name = "Handover",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"CNIHandover\")].status"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterSpec {
    /// The Kubernetes API endpoint of the cluster, as in Talos's
    /// cluster.controlPlane.endpoint (for example https://10.0.0.10:6443).
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("spec.endpoint must be an https:// URL, for example https://10.0.0.10:6443"))]
    pub endpoint: String,
    /// The Talos version the nodes run (for example v1.12.1).
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+.*$')").message("spec.talosVersion must look like v1.12.1"))]
    pub talos_version: String,
    /// The Kubernetes version the cluster runs (for example v1.34.1).
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+.*$')").message("spec.kubernetesVersion must look like v1.34.1"))]
    pub kubernetes_version: String,
    /// Pod and service subnets. Read from the nodes on adopt; empty means
    /// "whatever the nodes run".
    #[serde(default)]
    pub network: ClusterNetwork,
    /// How the cluster's CNI is managed.
    #[serde(default)]
    pub cni: CniSpec,
    /// The Secret (in the TalosCluster's namespace) holding the Talos secrets bundle.
    pub secrets_ref: SecretsRef,
    /// Encrypted backups off the cluster: where, to whom, when, how long.
    /// Without it, Ichor takes no backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::backup::BackupSpec>,
    /// When this cluster's operations may start a machine, unless an
    /// operation sets its own `spec.maintenanceWindows`. Empty: any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub maintenance_windows: Vec<crate::window::MaintenanceWindow>,
    /// The Alertmanager this cluster's operations silence their nodes in
    /// while they work, unless an operation sets its own
    /// `spec.alertmanager`. Unset: no silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<crate::operation::AlertmanagerSilence>,
    /// How Ichor applies class B changes to this cluster's nodes (a
    /// machine's own `applyMode` wins): noReboot (the default), or try
    /// (Talos reverts the change after `tryTimeout` unless Ichor confirms
    /// it once the node's health checks pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_mode: Option<crate::apply::ApplyMode>,
    /// How long a try-mode apply runs unconfirmed before Talos reverts it
    /// (`45s`, `2m`; 1s to 10m). Unset: 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new(crate::apply::TRY_TIMEOUT_RULE).message("tryTimeout must be a duration from 1s to 10m, such as 45s, 2m or 1m30s"))]
    pub try_timeout: Option<String>,
    /// How many revisions each of this cluster's machines keeps, in its
    /// status and in its history Secret (1 to 50; the Secret also stays
    /// under its size bound, dropping the oldest first). Unset: 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub revisions_kept: Option<u32>,
}

/// Pod and service networks of the cluster (CIDRs).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// Pod subnets (cluster.network.podSubnets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_subnets: Vec<String>,
    /// Service subnets (cluster.network.serviceSubnets).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_subnets: Vec<String>,
}

/// The CNI of the cluster. With preset `cilium` Ichor owns Cilium as its Helm
/// release; with `unmanaged` the CNI is the user's and Ichor leaves the CNI
/// paths of the machine config as the nodes have them.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.preset == 'unmanaged' || !has(self.unmanaged)").message("spec.cni.unmanaged is only allowed with preset unmanaged; remove it or set preset: unmanaged"))]
#[x_kube(validation = Rule::new("self.preset == 'cilium' || !has(self.cilium)").message("spec.cni.cilium is only allowed with preset cilium; remove it or set preset: cilium"))]
#[serde(rename_all = "camelCase")]
pub struct CniSpec {
    /// cilium: Ichor installs and owns Cilium. unmanaged: the CNI is the user's.
    #[serde(default)]
    pub preset: CniPreset,
    /// Cilium's tunnel protocol. Immutable once set.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.cni.tunnel is immutable once set: changing the tunnel protocol of a running cluster breaks pod traffic between nodes; create the cluster again to change it"))]
    pub tunnel: Tunnel,
    /// enabled: Talos runs kube-proxy. replaced: Cilium replaces kube-proxy
    /// (kubeProxyReplacement=true) and Talos's kube-proxy is disabled.
    #[serde(default)]
    pub kube_proxy: KubeProxyMode,
    /// Cilium settings (preset cilium only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cilium: Option<CiliumSpec>,
    /// Settings for a CNI Ichor does not manage (preset unmanaged only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<UnmanagedCni>,
}

/// Cilium settings of the cilium preset.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
// The rule is built from the owned-keys table (crate::cilium::OWNED_PATHS).
#[x_kube(validation = crate::cilium::owned_keys_rule())]
#[serde(rename_all = "camelCase")]
pub struct CiliumSpec {
    /// Cilium Helm chart values merged over Ichor's defaults (free-form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::cilium_values")]
    pub values: Option<serde_json::Value>,
}

/// Settings of the unmanaged preset.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnmanagedCni {
    /// What the Talos machine config says about the CNI: none (cni.name: none,
    /// the CNI was applied by hand), flannel (Talos's default) or custom (URLs).
    #[serde(default, rename = "talosCNI")]
    pub talos_cni: TalosCNI,
}

/// Where the Talos secrets bundle of a cluster is stored.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretsRef {
    /// Name of the Secret, in the TalosCluster's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key within the Secret holding the bundle YAML (default secrets.yaml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl SecretsRef {
    /// The key to read, `secrets.yaml` unless set.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or("secrets.yaml")
    }
}

/// How the CNI is managed: cilium (Ichor owns Cilium) or unmanaged (the user's).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CniPreset {
    #[default]
    Cilium,
    Unmanaged,
}

/// Cilium's tunnel protocol: vxlan (the default) or geneve.
///
/// The one vocabulary of the tunnel: the CRD, the webhook, the Cilium values
/// and the CLI's `--tunnel` all read these names ([`Tunnel::ALL`],
/// [`Tunnel::as_str`], `FromStr`). A new mode is a new variant here and its
/// name in `as_str` (and whatever Cilium value it maps to in `ichor-cilium`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tunnel {
    #[default]
    Vxlan,
    Geneve,
}

impl Tunnel {
    /// Every tunnel, in the order messages list them.
    pub const ALL: [Tunnel; 2] = [Tunnel::Vxlan, Tunnel::Geneve];

    /// The name in the API, the CLI and Cilium's `tunnelProtocol`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tunnel::Vxlan => "vxlan",
            Tunnel::Geneve => "geneve",
        }
    }
}

/// Whether kube-proxy runs (enabled) or Cilium replaces it (replaced).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KubeProxyMode {
    #[default]
    Enabled,
    Replaced,
}

impl KubeProxyMode {
    /// Every mode, in the order messages list them.
    pub const ALL: [KubeProxyMode; 2] = [KubeProxyMode::Enabled, KubeProxyMode::Replaced];

    /// The name in the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeProxyMode::Enabled => "enabled",
            KubeProxyMode::Replaced => "replaced",
        }
    }
}

/// `a or b`, `a, b or c`: the names of a vocabulary, for messages.
pub fn one_of(names: &[&str]) -> String {
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A name that is not one of a vocabulary's (a tunnel, a kube-proxy mode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}: use {known}")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    /// The names that exist, as a sentence (`vxlan, geneve or native`).
    pub known: String,
}

/// The member of `all` whose name is `s`, or an error naming the ones that
/// exist (`what` says which vocabulary).
fn parse_name<T: Copy>(
    s: &str,
    all: &[T],
    name: fn(T) -> &'static str,
    what: &'static str,
) -> Result<T, UnknownName> {
    all.iter().copied().find(|t| name(*t) == s).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|t| name(*t)).collect();
        UnknownName {
            what,
            given: s.to_string(),
            known: one_of(&names),
        }
    })
}

impl std::str::FromStr for Tunnel {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        parse_name(s, &Tunnel::ALL, Tunnel::as_str, "tunnel")
    }
}

impl std::str::FromStr for KubeProxyMode {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        parse_name(
            s,
            &KubeProxyMode::ALL,
            KubeProxyMode::as_str,
            "kube-proxy mode",
        )
    }
}

impl std::fmt::Display for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for KubeProxyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CNI setting of the Talos machine config for an unmanaged CNI: none, flannel or custom.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TalosCNI {
    #[default]
    None,
    Flannel,
    Custom,
}

/// The CNI found running in the cluster: none, cilium, flannel, calico, other or mixed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DetectedCni {
    None,
    Cilium,
    Flannel,
    Calico,
    Other,
    Mixed,
}

/// What Ichor observes about the cluster.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterStatus {
    /// Ready and CNIHandover, among others (see ichor_api::conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The CNI as detected in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniStatus>,
    /// The metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CNI as Ichor sees it in the cluster.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CniStatus {
    /// The CNI detected in the cluster (cilium from the moment Ichor's Cilium is installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected: Option<DetectedCni>,
    /// Ichor's Cilium release as its newest Helm record says (preset
    /// cilium; absent while there is no record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<CiliumReleaseStatus>,
    /// The ichor-cni Job's failures in a row for the values it is to bring
    /// the release to (absent once the release is there); the next attempt
    /// waits a back-off that doubles with each failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_failures: Option<CniJobFailures>,
}

/// Failures in a row of the ichor-cni Job for one values hash.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CniJobFailures {
    /// The values hash the failing Jobs were for.
    pub hash: String,
    /// How many Jobs failed in a row.
    pub count: u32,
    /// When the last one was seen failed.
    pub last_failure: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// The uid of the last failed Job (each failure is counted once).
    pub last_job_uid: String,
    /// Why the last one failed, as the Job said.
    pub message: String,
}

/// The newest revision of Ichor's Cilium release, read from its Helm record.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CiliumReleaseStatus {
    /// The release's name.
    pub name: String,
    /// The namespace its records are stored in.
    pub storage_namespace: String,
    /// The newest revision.
    pub revision: i64,
    /// Helm's status of that revision: deployed, failed, pending-install,
    /// pending-upgrade, pending-rollback, superseded, uninstalling or unknown.
    pub status: String,
    /// The chart version of that revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart_version: Option<String>,
    /// When Helm last deployed that revision (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_deployed: Option<String>,
    /// The newest deployed revision, when the newest revision is not
    /// deployed (a failed or pending upgrade leaves the previous one running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployed_revision: Option<i64>,
}
