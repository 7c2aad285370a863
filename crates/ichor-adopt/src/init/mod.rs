//! `ichor init`'s decisions, as pure functions: what the nodes answered in
//! maintenance mode and what the operator asked → every refusal at once, or
//! the plan (printed before consent) and what init will write: the
//! TalosCluster and TalosMachines, built in memory, and each node's config,
//! rendered by the controller's own render (`ichor_render::render`) from a
//! base made of the secrets bundle, with Ichor's Cilium as an inline manifest
//! on the control planes. The controller's first reconcile renders the same
//! objects over the config the node then runs and finds no drift (R10.2).

pub mod base;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ichor_api::endpoint::{Endpoint, EndpointProblem};
use ichor_api::{
    ClusterNetwork, ClusterRef, CniPreset, CniSpec, KubeProxyMode, MachinePatch, MachineRole,
    SecretsRef, TalosCluster, TalosClusterSpec, TalosMachine, TalosMachineSpec, Tunnel,
};
use ichor_render::{RenderInput, render};
use ichor_talos::config::MachineConfig;
use ichor_talos::patch::ConfigPatch;
use ichor_talos::secrets::SecretsBundle;
use serde::Serialize;

use crate::classify::Refusal;
use crate::plan::CLUSTER_LABEL;
use crate::preconditions::MIN_TALOS;
pub use base::{BaseInput, ConfigShape, base_config, endpoint_host};
use ichor_talos::support;
use ichor_talos::version::Version;

pub use ichor_api::INITIALIZED_ANNOTATION;

/// What a node answered to the read-only inspection over the insecure API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAnswer {
    /// In maintenance mode: no config yet.
    Maintenance {
        /// The hostname it reports (its TalosMachine's name).
        hostname: String,
        /// Talos version tag (`v1.13.9`).
        talos_version: String,
        /// Its disks' device paths (`/dev/sda`), as Talos lists them.
        disks: Vec<String>,
    },
    /// Configured by an earlier run of this init (it answers the cluster's
    /// own credentials): planned again as it was, and not applied again.
    Initialized {
        hostname: String,
        talos_version: String,
        disks: Vec<String>,
    },
    /// It already runs a config (the insecure API refused, or its stage is not maintenance).
    Configured { detail: String },
    /// Nothing answered.
    Unreachable { error: String },
}

/// One address given on the command line and what answered there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProbe {
    pub address: String,
    pub answer: NodeAnswer,
}

/// A `--config-patch @FILE`: its name (the file) and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchFile {
    pub name: String,
    pub text: String,
}

/// What the operator asked init for.
#[derive(Debug, Clone, Default)]
pub struct InitRequest {
    pub cluster: String,
    pub endpoint: String,
    pub control_planes: Vec<String>,
    pub workers: Vec<String>,
    /// `--talos-version`: the version contract the configs are written for
    /// (default: the lowest version the nodes run).
    pub talos_version: Option<String>,
    /// `--kubernetes-version` (default: the newest the Talos version supports).
    pub kubernetes_version: Option<String>,
    pub tunnel: Tunnel,
    pub kube_proxy: KubeProxyMode,
    pub patches: Vec<PatchFile>,
    /// Where the bundle comes from, for the plan's text (`generated`, or the file).
    pub secrets_source: String,
}

/// One machine init will create (not held: init writes what it describes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedNode {
    pub name: String,
    pub address: String,
    pub role: String,
    pub talos_version: String,
    pub install_disk: String,
    /// The fingerprint of the certificate its maintenance API presented
    /// (Talos's format, as the node's console shows it): init sends the
    /// node its config only over a connection that presents this one.
    /// `None` for a node an earlier run of this init configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_fingerprint: Option<String>,
}

/// What init will do, as printed before consent (no secret in it).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitPlan {
    pub cluster: String,
    pub namespace: String,
    pub endpoint: String,
    pub talos_version: String,
    pub kubernetes_version: String,
    pub config_shape: ConfigShape,
    pub tunnel: Tunnel,
    pub kube_proxy: KubeProxyMode,
    pub pod_subnets: Vec<String>,
    pub service_subnets: Vec<String>,
    pub secrets: String,
    pub patches: Vec<String>,
    /// The first control plane: the one etcd is bootstrapped on.
    pub bootstrap_node: String,
    pub nodes: Vec<PlannedNode>,
}

/// What init writes, built in memory before anything is written. Holds
/// secrets (the configs): never printed, never logged.
#[derive(Clone)]
pub struct InitWrites {
    pub cluster: TalosCluster,
    pub machines: Vec<TalosMachine>,
    /// Each node's rendered config, by address, in the order of `machines`.
    pub configs: Vec<(String, String)>,
}

impl std::fmt::Debug for InitWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitWrites")
            .field("cluster", &self.cluster.metadata.name)
            .field("machines", &self.machines.len())
            .finish_non_exhaustive()
    }
}

/// The name of the Secret that holds the cluster's bundle.
pub fn secrets_name(cluster: &str) -> String {
    format!("{cluster}-talos-secrets")
}

/// The phases init runs, in order, as the plan names them.
pub const PHASES: &[&str] = &[
    "write the secrets bundle and talosconfig (0600) to the output directory",
    "apply each node's config over the insecure maintenance API",
    "bootstrap etcd on the first control plane",
    "fetch the kubeconfig through the Talos API (0600)",
    "wait for the Kubernetes API (10 minutes at most)",
    "install Ichor (install manifest, IchorInstallation)",
    "wait for Ichor's webhooks (30 minutes at most)",
    "write the bundle Secret, the TalosCluster and the TalosMachines",
    "hand Cilium over to Ichor's Helm release (done by the controller)",
];

impl InitPlan {
    /// The plan's first line.
    pub fn summary(&self) -> String {
        format!(
            "ichor init will create cluster {} ({}): {} control plane(s), {} worker(s), Talos {} ({} config), Kubernetes {}, Cilium inline (tunnel {}, kube-proxy {})",
            self.cluster,
            self.endpoint,
            self.nodes
                .iter()
                .filter(|n| n.role == "controlplane")
                .count(),
            self.nodes.iter().filter(|n| n.role == "worker").count(),
            self.talos_version,
            self.config_shape.as_str(),
            self.kubernetes_version,
            self.tunnel.as_str(),
            self.kube_proxy.as_str(),
        )
    }

    /// The whole plan as printed before consent.
    pub fn text(&self) -> String {
        let mut out = vec![self.summary()];
        out.push(format!("secrets bundle: {}", self.secrets));
        if !self.patches.is_empty() {
            out.push(format!(
                "config patches, on every node: {}",
                self.patches.join(", ")
            ));
        }
        out.push(format!(
            "TalosCluster {}/{}: pods {}, services {}",
            self.namespace,
            self.cluster,
            self.pod_subnets.join(","),
            self.service_subnets.join(","),
        ));
        for n in &self.nodes {
            out.push(format!(
                "TalosMachine {} ({}, {}, Talos {}): install to {}{}",
                n.name,
                n.role,
                n.address,
                n.talos_version,
                n.install_disk,
                if n.address == self.bootstrap_node {
                    ", bootstraps etcd"
                } else {
                    ""
                }
            ));
            if let Some(fp) = &n.cert_fingerprint {
                out.push(format!("  certificate fingerprint {fp}"));
            }
        }
        if self.nodes.iter().any(|n| n.cert_fingerprint.is_some()) {
            out.push(
                "compare each certificate fingerprint with the one the node's console shows (or pin it with --cert-fingerprint ADDRESS=FINGERPRINT); init sends each config only to the certificate shown".to_string(),
            );
        }
        out.push("phases:".to_string());
        for (i, p) in PHASES.iter().enumerate() {
            out.push(format!("  {}. {p}", i + 1));
        }
        out.join("\n")
    }
}

fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Why an `--endpoint` is not a URL of the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointFault {
    NotHttps,
    /// What is wrong with the address after `https://` (the one endpoint
    /// parser's words).
    Address(EndpointProblem),
}

impl fmt::Display for EndpointFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointFault::NotHttps => f.write_str("it must start with https://"),
            EndpointFault::Address(EndpointProblem::NotAHost) => {
                f.write_str("it must be only a scheme, host and port")
            }
            EndpointFault::Address(EndpointProblem::Empty) => f.write_str("it has no host"),
            EndpointFault::Address(EndpointProblem::NoPort) => f.write_str("it has no port"),
            EndpointFault::Address(problem) => write!(f, "its address {problem}"),
        }
    }
}

/// An `--endpoint` init cannot write into the configs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--endpoint {endpoint:?} is not a URL of the Kubernetes API: {fault}; give it as https://HOST:6443"
)]
pub struct EndpointError {
    pub endpoint: String,
    pub fault: EndpointFault,
}

/// `https://HOST:PORT[/]` with a port, or why not.
pub fn check_endpoint(endpoint: &str) -> Result<(), EndpointError> {
    let why = |fault| EndpointError {
        endpoint: endpoint.to_string(),
        fault,
    };
    if !endpoint.starts_with("https://") {
        return Err(why(EndpointFault::NotHttps));
    }
    Endpoint::parse_https_url_with_port(endpoint)
        .map(drop)
        .map_err(|e| why(EndpointFault::Address(e.problem)))
}

/// The disk Talos installs to: the first disk the node lists.
fn install_disk(disks: &[String]) -> Option<String> {
    let mut sorted: Vec<&String> = disks.iter().collect();
    sorted.sort();
    sorted.first().map(|d| (*d).clone())
}

fn version_key(v: &str) -> Option<Version> {
    Version::parse(v).ok()
}

/// The release line of a version (`(1, 14)`), none for a text that is no
/// release version.
fn release_line(v: &str) -> Option<(u64, u64)> {
    Version::parse(v).ok().map(|v| v.major_minor())
}

/// A node init configures, as its answer and the request name it.
#[derive(Debug, Clone)]
struct InitNode {
    address: String,
    role: MachineRole,
    hostname: String,
    talos_version: String,
    install_disk: String,
}

/// The nodes' answers and the request → the plan and what init writes, or
/// every reason to refuse, with nothing written. `bundle` is the cluster's
/// secrets (generated or `--with-secrets`); `cilium_manifest` is Ichor's
/// pinned Cilium chart rendered with the Helm release's values function.
pub fn plan(
    request: &InitRequest,
    probes: &[NodeProbe],
    bundle: &SecretsBundle,
    cilium_manifest: &str,
) -> Result<(InitPlan, InitWrites), Vec<Refusal>> {
    let mut refusals = request_refusals(request);
    let nodes = inspected_nodes(request, probes, &mut refusals);
    refusals.extend(duplicate_hostnames(&nodes));
    let patches = checked_patches(&request.patches, &mut refusals);
    let (talos_version, kubernetes_version) = versions(request, &nodes, &mut refusals);
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let shape = Version::parse(&talos_version)
        .map(|v| ConfigShape::for_version(&v))
        .unwrap_or(ConfigShape::Legacy);

    let cluster = talos_cluster(request, &talos_version, &kubernetes_version);
    let mut machines = Vec::new();
    let mut configs = Vec::new();
    let mut planned = Vec::new();
    for node in &nodes {
        // The TalosMachine carries the `--config-patch` files, so they stay
        // the machine's own after init: the controller reapplies them over
        // the live config, which already holds their effect, and finds no
        // drift (ADR 0016: an appended item is not appended again).
        let mut machine = init_machine(&request.cluster, &node.hostname, &node.address, node.role);
        machine.spec.patches = patches.clone();
        let base = BaseInput {
            shape,
            control_plane: node.role == MachineRole::Controlplane,
            cluster_name: &request.cluster,
            endpoint: &request.endpoint,
            kubernetes_version: &kubernetes_version,
            talos_version: &talos_version,
            install_disk: &node.install_disk,
        };
        let rendered = node_config(bundle, &base, &cluster, &machine, node, cilium_manifest)
            .map_err(|r| vec![r])?;
        configs.push((node.address.clone(), rendered));
        planned.push(planned_node(node));
        machines.push(machine);
    }
    let plan = InitPlan {
        cluster: request.cluster.clone(),
        namespace: ichor_api::SYSTEM_NAMESPACE.to_string(),
        endpoint: request.endpoint.clone(),
        talos_version,
        kubernetes_version,
        config_shape: shape,
        tunnel: request.tunnel,
        kube_proxy: request.kube_proxy,
        pod_subnets: cluster.spec.network.pod_subnets.clone(),
        service_subnets: cluster.spec.network.service_subnets.clone(),
        secrets: request.secrets_source.clone(),
        patches: request.patches.iter().map(|p| p.name.clone()).collect(),
        bootstrap_node: request.control_planes.first().cloned().unwrap_or_default(),
        nodes: planned,
    };
    let writes = InitWrites {
        cluster,
        machines,
        configs,
    };
    Ok((plan, writes))
}

/// What is wrong with the request itself: the cluster name, the endpoint,
/// the control planes, an address given twice.
fn request_refusals(request: &InitRequest) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    if !valid_cluster_name(&request.cluster) {
        refusals.push(Refusal::new(format!(
            "cluster name {:?} is not a valid name: use lower-case letters, digits and '-', at most 63 characters",
            request.cluster
        )));
    }
    if let Err(e) = check_endpoint(&request.endpoint) {
        refusals.push(Refusal::new(e.to_string()));
    }
    if request.control_planes.is_empty() {
        refusals.push(Refusal::new(
            "no control plane given: name at least one with --control-plane IP",
        ));
    }
    let mut seen = BTreeSet::new();
    for address in request.control_planes.iter().chain(&request.workers) {
        if !seen.insert(address.as_str()) {
            refusals.push(Refusal::new(format!(
                "node {address} is given twice: each address may appear once, under --control-plane or --worker"
            )));
        }
    }
    refusals
}

/// Each address once, control planes first, with what it answered: the
/// nodes init can configure, and a refusal for each it cannot.
fn inspected_nodes(
    request: &InitRequest,
    probes: &[NodeProbe],
    refusals: &mut Vec<Refusal>,
) -> Vec<InitNode> {
    let answers: BTreeMap<&str, &NodeAnswer> = probes
        .iter()
        .map(|p| (p.address.as_str(), &p.answer))
        .collect();
    let mut nodes = Vec::new();
    let mut checked = BTreeSet::new();
    let roles = request
        .control_planes
        .iter()
        .map(|a| (a, MachineRole::Controlplane))
        .chain(request.workers.iter().map(|a| (a, MachineRole::Worker)));
    for (address, role) in roles {
        if !checked.insert(address.as_str()) {
            continue;
        }
        let (node, refused) = judge_answer(address, role, answers.get(address.as_str()).copied());
        refusals.extend(refused);
        nodes.extend(node);
    }
    nodes
}

/// One node's answer → the node, if init can configure it, and the
/// refusals it raises (a node on an old Talos is both: it is still named
/// in the hostname check).
fn judge_answer(
    address: &str,
    role: MachineRole,
    answer: Option<&NodeAnswer>,
) -> (Option<InitNode>, Vec<Refusal>) {
    let (hostname, talos_version, disks) = match answer {
        None => {
            return (
                None,
                vec![Refusal::new(format!(
                    "node {address} was not inspected (a bug in ichor, please report it)"
                ))],
            );
        }
        Some(NodeAnswer::Unreachable { error }) => {
            return (
                None,
                vec![Refusal::new(format!(
                    "node {address} is unreachable: {error}; check the address, and that the node booted Talos and listens on port 50000"
                ))],
            );
        }
        Some(NodeAnswer::Configured { detail }) => {
            return (
                None,
                vec![Refusal::new(format!(
                    "node {address} is not in maintenance mode ({detail}): ichor init only configures fresh nodes; adopt a running cluster with ichor adopt, or reset the node first (talosctl reset)"
                ))],
            );
        }
        Some(
            NodeAnswer::Maintenance {
                hostname,
                talos_version,
                disks,
            }
            | NodeAnswer::Initialized {
                hostname,
                talos_version,
                disks,
            },
        ) => (hostname, talos_version, disks),
    };
    let mut refusals = Vec::new();
    match release_line(talos_version) {
        Some(v) if v >= MIN_TALOS => {}
        _ => refusals.push(Refusal::new(format!(
            "node {address} runs Talos {talos_version}; ichor init needs Talos v{}.{} or later: boot it from a newer Talos image",
            MIN_TALOS.0, MIN_TALOS.1
        ))),
    }
    let Some(install_disk) = install_disk(disks) else {
        refusals.push(Refusal::new(format!(
            "node {address} lists no disk to install Talos to"
        )));
        return (None, refusals);
    };
    let node = InitNode {
        address: address.to_string(),
        role,
        hostname: hostname.clone(),
        talos_version: talos_version.clone(),
        install_disk,
    };
    (Some(node), refusals)
}

/// A refusal for each node whose hostname another node reports too.
fn duplicate_hostnames(nodes: &[InitNode]) -> Vec<Refusal> {
    let mut names = BTreeSet::new();
    nodes
        .iter()
        .filter(|n| !names.insert(n.hostname.as_str()))
        .map(|n| {
            Refusal::new(format!(
                "node {} reports hostname {}, as another node does: TalosMachine names must differ; give the nodes distinct hostnames",
                n.address, n.hostname
            ))
        })
        .collect()
}

/// The `--config-patch` files that parse, as the machines' patches; a
/// refusal for each that does not.
fn checked_patches(files: &[PatchFile], refusals: &mut Vec<Refusal>) -> Vec<MachinePatch> {
    let mut patches = Vec::new();
    for p in files {
        match ConfigPatch::parse(&p.text, &p.name) {
            Ok(_) => patches.push(MachinePatch {
                name: p.name.clone(),
                inline: p.text.clone(),
            }),
            Err(e) => refusals.push(Refusal::new(format!("--config-patch {}: {e}", p.name))),
        }
    }
    patches
}

/// The Talos version the configs are written for (asked, or the lowest the
/// nodes run) and the Kubernetes version (asked, or the Talos minor's
/// default in the support table); a refusal where either is not one init
/// writes configs for.
fn versions(
    request: &InitRequest,
    nodes: &[InitNode],
    refusals: &mut Vec<Refusal>,
) -> (String, String) {
    let talos_version = match &request.talos_version {
        Some(v) => v.clone(),
        None => nodes
            .iter()
            .map(|n| n.talos_version.clone())
            .min_by(|a, b| version_key(a).cmp(&version_key(b)))
            .unwrap_or_default(),
    };
    // init writes configs only for the minors the table gives a default for.
    let row = release_line(&talos_version)
        .and_then(support::of_minor)
        .filter(|row| row.init_default.is_some());
    if request.talos_version.is_some() && row.is_none() {
        refusals.push(Refusal::new(format!(
            "--talos-version {talos_version} is not one ichor init writes configs for: use v1.12, v1.13 or v1.14"
        )));
    }
    let kubernetes_version = match (&request.kubernetes_version, row) {
        (Some(k), Some(row)) => {
            if !release_line(k).is_some_and(|v| row.runs(v)) {
                let (low, high) = (row.lowest, row.highest);
                refusals.push(Refusal::new(format!(
                    "--kubernetes-version {k} is not supported by Talos {talos_version} (it runs Kubernetes v{}.{} to v{}.{})",
                    low.0, low.1, high.0, high.1
                )));
            }
            k.clone()
        }
        (Some(k), None) => k.clone(),
        (None, Some(row)) => row.init_default.unwrap_or_default().to_string(),
        (None, None) => String::new(),
    };
    (talos_version, kubernetes_version)
}

/// One node's config: the render of its TalosMachine over its base config,
/// with Ichor's Cilium inline on a control plane.
fn node_config(
    bundle: &SecretsBundle,
    base: &BaseInput<'_>,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    node: &InitNode,
    cilium_manifest: &str,
) -> Result<String, Refusal> {
    let address = &node.address;
    let origin = format!("the base config of {address}");
    let live = MachineConfig::from_mappings(base_config(bundle, base), &origin)
        .map_err(|e| Refusal::new(format!("{origin}: {e} (a bug in ichor, please report it)")))?;
    let mut input = RenderInput::from_objects(cluster, machine, &live);
    if node.role == MachineRole::Controlplane {
        input.inline_cni = Some(cilium_manifest);
    }
    render(&input)
        .and_then(|r| r.yaml())
        .map_err(|e| Refusal::new(format!("node {address}: {e}")))
}

/// A node as the plan shows it.
fn planned_node(node: &InitNode) -> PlannedNode {
    PlannedNode {
        name: node.hostname.clone(),
        address: node.address.clone(),
        role: match node.role {
            MachineRole::Controlplane => "controlplane",
            MachineRole::Worker => "worker",
        }
        .to_string(),
        talos_version: node.talos_version.clone(),
        install_disk: node.install_disk.clone(),
        cert_fingerprint: None,
    }
}

/// The TalosCluster init writes: preset cilium, the tunnel and kube-proxy
/// mode asked for, Talos's default subnets.
pub fn talos_cluster(
    request: &InitRequest,
    talos_version: &str,
    kubernetes_version: &str,
) -> TalosCluster {
    let mut cluster = TalosCluster::new(
        &request.cluster,
        TalosClusterSpec {
            endpoint: request.endpoint.clone(),
            talos_version: talos_version.to_string(),
            kubernetes_version: kubernetes_version.to_string(),
            network: ClusterNetwork {
                pod_subnets: vec![base::DEFAULT_POD_SUBNET.to_string()],
                service_subnets: vec![base::DEFAULT_SERVICE_SUBNET.to_string()],
            },
            cni: CniSpec {
                preset: CniPreset::Cilium,
                tunnel: request.tunnel,
                kube_proxy: request.kube_proxy,
                cilium: None,
                unmanaged: None,
            },
            secrets_ref: SecretsRef {
                name: secrets_name(&request.cluster),
                key: None,
            },
            backup: None,
            maintenance_windows: Vec::new(),
            alertmanager: None,
            apply_mode: None,
            try_timeout: None,
            revisions_kept: None,
        },
    );
    cluster.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.to_string());
    cluster.metadata.annotations = Some(BTreeMap::from([(
        INITIALIZED_ANNOTATION.to_string(),
        "true".to_string(),
    )]));
    cluster
}

/// A TalosMachine init writes: not held (init applies exactly what it describes).
pub fn init_machine(cluster: &str, name: &str, address: &str, role: MachineRole) -> TalosMachine {
    let mut m = TalosMachine::new(
        name,
        TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: cluster.to_string(),
            },
            role,
            address: address.to_string(),
            hold: false,
            patches: vec![],
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        },
    );
    m.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.to_string());
    m.metadata.labels = Some(BTreeMap::from([(
        CLUSTER_LABEL.to_string(),
        cluster.to_string(),
    )]));
    m
}

#[cfg(test)]
mod endpoint_parity;
#[cfg(test)]
mod tests;
