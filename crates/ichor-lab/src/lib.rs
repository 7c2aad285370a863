//! The local lab: a whole stand-in cluster on one machine.
//!
//! - a real kube-apiserver and etcd (the test control plane of `ichor-testenv`);
//! - N emulated Talos nodes (`ichor-talemu`), each on its own loopback address
//!   and port 50000, configured from the real Talos fixtures and trusting the
//!   cluster's own OS CA (so a bundle recovered from a node works against it);
//! - a Node object per node, NotReady with the kubelet's network-plugin message,
//!   each with a pod CIDR;
//! - the node simulator ([`simulator`]), which stands in for the kubelets, the
//!   scheduler and Cilium's operator — and says so.
//!
//! What the lab is not: no container runs, no packet moves. It tells the truth
//! about the API objects and the Talos API, nothing else.

pub mod pods;
pub mod simulator;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_talos::config::MachineConfig;
use ichor_talos::patch::ConfigPatch;
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The CNI the lab's cluster starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabCni {
    /// `cni.name: none` and nothing applied: the no-CNI case of spec 1.1.
    None,
    /// Talos's flannel (`cni.name: flannel`, a `kube-flannel` DaemonSet).
    Flannel,
    /// Calico applied by hand on `cni.name: none`.
    Calico,
    /// Cilium applied by hand on `cni.name: none`, without an Ichor record.
    Cilium,
}

/// How the lab's cluster looks.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Nodes; the first is the control plane.
    pub nodes: usize,
    pub talos_version: String,
    pub cni: LabCni,
    pub kube_proxy: bool,
    pub kube_prism: bool,
    /// Give every Node a `spec.podCIDR`.
    pub pod_cidrs: bool,
    /// Where the lab writes its kubeconfig, talosconfig and bundle.
    pub state_dir: PathBuf,
    /// The `ichor` binary that stands in for Ichor's image when the
    /// controller starts an ichor-cni Job (`None`: Jobs never run).
    pub ichor_bin: Option<PathBuf>,
}

impl LabOptions {
    pub fn new(state_dir: impl Into<PathBuf>) -> LabOptions {
        LabOptions {
            nodes: 3,
            talos_version: "v1.13.9".into(),
            cni: LabCni::None,
            kube_proxy: true,
            kube_prism: true,
            pod_cidrs: true,
            state_dir: state_dir.into(),
            ichor_bin: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("the lab's control plane: {0}")]
    ControlPlane(#[from] ichor_testenv::Error),
    #[error("the lab's Talos nodes: {0}")]
    Emulator(#[from] ichor_talemu::EmuError),
    #[error("the lab's machine configs: {0}")]
    Config(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registering the lab's nodes in Kubernetes: {0}")]
    Kube(#[from] kube::Error),
}

/// A running lab. Dropping it stops everything it started.
pub struct Lab {
    pub env: TestEnv,
    pub emulator: Emulator,
    pub options: LabOptions,
    pub addresses: Vec<IpAddr>,
    pub hostnames: Vec<String>,
    pub kubeconfig: PathBuf,
    pub talosconfig: PathBuf,
    pub bundle: PathBuf,
    simulator: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(s) = self.simulator.take() {
            s.abort();
        }
    }
}

/// The fixtures the nodes' configs are made from (real Talos files).
fn fixture(name: &str) -> PathBuf {
    ichor_testenv::tools::shared_dir()
        .join("fixtures/talos/stability-v1.12")
        .join(name)
}

impl Lab {
    /// Starts the control plane, the nodes and the simulator.
    pub async fn up(options: LabOptions) -> Result<Lab, LabError> {
        std::fs::create_dir_all(&options.state_dir).map_err(|source| LabError::Write {
            path: options.state_dir.clone(),
            source,
        })?;
        // A loopback /24 of its own, so labs (and tests) can run side by side.
        let net: u8 = rand::random_range(16..=250);
        let sub: u8 = rand::random_range(1..=250);
        let addresses: Vec<IpAddr> = (0..options.nodes)
            .map(|i| IpAddr::V4(Ipv4Addr::new(127, net, sub, 10 + i as u8)))
            .collect();
        let hostnames: Vec<String> = (0..options.nodes)
            .map(|i| {
                if i == 0 {
                    "lab-cp-1".to_string()
                } else {
                    format!("lab-worker-{i}")
                }
            })
            .collect();

        let configs = node_configs(&options, &addresses)?;
        let bundle = SecretsBundle::from_machine_config(
            &MachineConfig::parse(&configs[0]).map_err(|e| LabError::Config(e.to_string()))?,
            "the lab's control-plane config",
        )
        .map_err(|e| LabError::Config(e.to_string()))?;
        let (ca, key) = bundle
            .os_ca_pem()
            .ok_or_else(|| LabError::Config("the fixture's bundle has no OS CA".into()))?;
        let key = ichor_talos::pem::relabel(&key, "PRIVATE KEY").unwrap_or(key);
        let pki = Pki::from_pem(&ca, &key)?;

        let specs = hostnames
            .iter()
            .zip(&addresses)
            .zip(&configs)
            .map(|((h, a), c)| {
                NodeSpec::new(h.clone(), c.clone().into_bytes())
                    .with_address(*a)
                    .with_port(50000)
                    .with_version(options.talos_version.clone())
            })
            .collect();
        let emulator = Emulator::start_with(
            specs,
            EmulatorOptions {
                pki: Some(pki),
                ..Default::default()
            },
        )
        .await?;
        // The API server reaches Ichor's pods through the lab's pod network.
        let socket = options.state_dir.join("pod-network.sock");
        let network = pods::PodNetwork::bind(&socket).map_err(|source| LabError::Write {
            path: socket.clone(),
            source,
        })?;
        let env = TestEnv::start_with_cluster_egress(Some(network.socket()))?;

        let write = |name: &str, text: &str| -> Result<PathBuf, LabError> {
            let path = options.state_dir.join(name);
            std::fs::write(&path, text).map_err(|source| LabError::Write {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        };
        let kubeconfig = write(
            "kubeconfig",
            &std::fs::read_to_string(env.kubeconfig_path()).map_err(|source| LabError::Write {
                path: env.kubeconfig_path().into(),
                source,
            })?,
        )?;
        let endpoints = vec![addresses[0].to_string()];
        let nodes: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        let tc = Talosconfig::generate(
            &bundle,
            "lab",
            &endpoints,
            &nodes,
            Role::Admin,
            std::time::Duration::from_secs(86400),
        )
        .map_err(|e| LabError::Config(e.to_string()))?;
        let talosconfig = options.state_dir.join("talosconfig");
        tc.write_file(&talosconfig)
            .map_err(|e| LabError::Config(e.to_string()))?;
        let bundle_path = options.state_dir.join("secrets.yaml");
        bundle
            .write_file(&bundle_path)
            .map_err(|e| LabError::Config(e.to_string()))?;

        let client = env.client().await;
        register_nodes(&client, &hostnames, &addresses, &options).await?;
        seed_cni(&client, &options).await?;
        let runner = options.ichor_bin.clone().map(|ichor| pods::ProcessRunner {
            ichor,
            helm: ichor_testenv::Tool::Helm4.path(),
            cilium_chart: ichor_testenv::tools::repo_root().join("dist/cilium-standin"),
            server: env.server_url().to_string(),
            ca_pem: env.ca().cert_pem(),
            state_dir: options.state_dir.clone(),
            network,
        });
        let simulator = Some(simulator::spawn(client, runner));
        Ok(Lab {
            env,
            emulator,
            options,
            addresses,
            hostnames,
            kubeconfig,
            talosconfig,
            bundle: bundle_path,
            simulator,
        })
    }

    pub async fn client(&self) -> kube::Client {
        self.env.client().await
    }

    /// Shell lines that point kubectl, talosctl and ichor at the lab: the
    /// kubeconfig, the talosconfig, the secrets bundle, the helm `ichor`
    /// runs and the Cilium chart it installs; then the adopt to run.
    pub fn env_lines(&self) -> String {
        format!(
            "export KUBECONFIG={}\nexport TALOSCONFIG={}\nexport ICHOR_LAB_BUNDLE={}\n\
             # ichor finds helm and the Cilium chart through these (or --helm, --cilium-chart)\n\
             export ICHOR_HELM={}\nexport ICHOR_CILIUM_CHART={}\n\
             # then: ichor adopt --cluster lab --kubeconfig \"$KUBECONFIG\" --talosconfig \"$TALOSCONFIG\" --secrets-bundle \"$ICHOR_LAB_BUNDLE\"\n",
            self.kubeconfig.display(),
            self.talosconfig.display(),
            self.bundle.display(),
            ichor_testenv::Tool::Helm4.path().display(),
            ichor_testenv::tools::repo_root()
                .join("dist/cilium-standin")
                .display(),
        )
    }

    pub fn state_dir(&self) -> &Path {
        &self.options.state_dir
    }
}

/// Each node's machine config: the real fixture, patched to the lab's shape.
pub fn node_configs(options: &LabOptions, addresses: &[IpAddr]) -> Result<Vec<String>, LabError> {
    let read = |name: &str| {
        std::fs::read_to_string(fixture(name))
            .map_err(|e| LabError::Config(format!("{}: {e}", fixture(name).display())))
    };
    let cp = read("base-controlplane.yaml")?;
    let worker = read("base-worker.yaml")?;
    let cni = match options.cni {
        LabCni::Flannel => "flannel",
        _ => "none",
    };
    let patch = format!(
        "machine:\n  features:\n    kubePrism:\n      enabled: {}\n      port: 7445\ncluster:\n  controlPlane:\n    endpoint: https://{}:6443\n  clusterName: lab\n  network:\n    cni:\n      name: {cni}\n  proxy:\n    disabled: {}\n",
        options.kube_prism, addresses[0], !options.kube_proxy
    );
    let patch = ConfigPatch::parse(&patch, "the lab's patch")
        .map_err(|e| LabError::Config(e.to_string()))?;
    (0..options.nodes)
        .map(|i| {
            let base = if i == 0 { &cp } else { &worker };
            let config = MachineConfig::parse(base).map_err(|e| LabError::Config(e.to_string()))?;
            let patched = patch
                .apply(&config, "the lab's patch")
                .map_err(|e| LabError::Config(e.to_string()))?;
            patched
                .to_yaml()
                .map_err(|e| LabError::Config(e.to_string()))
        })
        .collect()
}

async fn register_nodes(
    client: &kube::Client,
    hostnames: &[String],
    addresses: &[IpAddr],
    options: &LabOptions,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    for (i, (name, address)) in hostnames.iter().zip(addresses).enumerate() {
        let role_label = if i == 0 {
            "node-role.kubernetes.io/control-plane"
        } else {
            "node-role.kubernetes.io/worker"
        };
        let mut spec =
            json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]});
        if options.pod_cidrs {
            spec["podCIDR"] = json!(format!("10.244.{i}.0/24"));
            spec["podCIDRs"] = json!([format!("10.244.{i}.0/24")]);
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, role_label: ""},
                "annotations": {"ichor.maesh.dev/simulated": "a lab node: its kubelet is the lab's node simulator"}},
            "spec": spec,
        }))
        .expect("node");
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": address.to_string()}, {"type": "Hostname", "address": name}],
                "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                    "message": simulator::NO_CNI_MESSAGE, "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
        )
        .await?;
    }
    Ok(())
}

/// The workloads a cluster with a CNI already runs (and kube-proxy, when on).
async fn seed_cni(client: &kube::Client, options: &LabOptions) -> Result<(), kube::Error> {
    let mut daemonsets = Vec::new();
    if options.kube_proxy {
        daemonsets.push((
            "kube-system",
            "kube-proxy",
            "registry.k8s.io/kube-proxy:v1.34.1",
        ));
    }
    match options.cni {
        LabCni::None => {}
        LabCni::Flannel => daemonsets.push((
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.26.7",
        )),
        LabCni::Calico => daemonsets.push((
            "calico-system",
            "calico-node",
            "docker.io/calico/node:v3.29.1",
        )),
        LabCni::Cilium => {
            daemonsets.push(("kube-system", "cilium", "quay.io/cilium/cilium:v1.18.5"))
        }
    }
    if options.cni == LabCni::Cilium {
        // Its operator registers Cilium's CRDs (the simulator plays that part).
        let operator: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "cilium-operator", "namespace": "kube-system"},
            // The labels Cilium's chart gives it (a takeover keeps the selector).
            "spec": {"replicas": 1, "selector": {"matchLabels": {"io.cilium/app": "operator", "name": "cilium-operator"}},
                "template": {"metadata": {"labels": {"io.cilium/app": "operator", "name": "cilium-operator"}},
                    "spec": {"hostNetwork": true, "containers": [{"name": "operator", "image": "quay.io/cilium/operator-generic:v1.18.5"}]}}}
        }))
        .expect("deployment");
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), "kube-system");
        match api.create(&PostParams::default(), &operator).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    for (ns, name, image) in daemonsets {
        ensure_namespace(client, ns).await?;
        let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns, "labels": {"k8s-app": name}},
            "spec": {"selector": {"matchLabels": {"k8s-app": name}},
                "template": {"metadata": {"labels": {"k8s-app": name}},
                    "spec": {"hostNetwork": true, "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": name, "image": image}]}}}
        }))
        .expect("daemonset");
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), ns);
        match api.create(&PostParams::default(), &ds).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .expect("ns");
    match Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
