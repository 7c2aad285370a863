//! The local lab: a whole stand-in cluster on one machine.
//!
//! - a real kube-apiserver and etcd (the test control plane of `ichor-testenv`)
//!   with the cluster's own Kubernetes CA, which the nodes name as where the
//!   cluster's Kubernetes API answers (so the kubeconfig they hand out works);
//! - N emulated Talos nodes (`ichor-talemu`), each on its own loopback address
//!   and port 50000, configured from the real Talos fixtures and trusting the
//!   cluster's own OS CA (so a bundle recovered from a node works against it);
//! - a Node object per node, NotReady with the kubelet's network-plugin message,
//!   each with a pod CIDR; the first [`LabOptions::control_planes`] nodes are
//!   control planes (one etcd member each, as the emulator lists them), the
//!   rest workers;
//! - the node simulator ([`simulator`]), which stands in for the kubelets, the
//!   scheduler and Cilium's operator — and says so;
//! - room to grow ([`grow`]): a node added to the running lab boots in
//!   maintenance mode, and its Node registers once a config is applied to
//!   it; the control planes share one etcd membership whose changes the
//!   emulator logs.
//!
//! What the lab is not: no container runs, no packet moves. It tells the truth
//! about the API objects and the Talos API, nothing else.

pub mod bootstrap_manifests;
pub mod cilium_on_talos;
pub mod components;
pub mod control;
pub mod daemonsets;
pub mod disruption;
pub mod etcd_loss;
pub mod grow;
pub mod init;
mod nodes;
pub mod pods;
pub mod readiness;
mod seed;
pub mod simulator;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, Pki};
use ichor_talos::config::MachineConfig;
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_testenv::TestEnv;

pub use grow::{AddedNode, NewNode, NodeRole};
pub use nodes::node_configs;
pub(crate) use nodes::{node_names, register_nodes, wait_nodes_ready};
pub(crate) use seed::seed_cni;

/// The CNI the lab's cluster starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabCni {
    /// `cni.name: none` and nothing applied: the no-CNI case of R1.1a.
    None,
    /// Talos's flannel (`cni.name: flannel`, a `kube-flannel` DaemonSet).
    Flannel,
    /// Calico applied by hand on `cni.name: none`.
    Calico,
    /// Cilium applied by hand on `cni.name: none`, without an Ichor record.
    Cilium,
}

/// The machine-config shape the lab's nodes run, from the real Talos
/// fixtures: each reports the Talos version that writes that shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabShape {
    /// One `v1alpha1` document holding the Kubernetes settings, as Talos
    /// v1.12 and v1.13 write it (fixtures `stability-v1.12`); the nodes
    /// report `TALOS_VERSION` of `tools/versions.env` (the v1.13 that
    /// talosctl is built at).
    #[default]
    V1alpha1,
    /// Talos v1.14's multi-document shape, Kubernetes settings in `Kube*`
    /// documents (fixtures `stability-v1.14`); the nodes report v1.14.0.
    Multidoc,
}

impl LabShape {
    /// The fixture folder of this shape.
    pub fn fixtures(self) -> &'static str {
        match self {
            LabShape::V1alpha1 => "stability-v1.12",
            LabShape::Multidoc => "stability-v1.14",
        }
    }

    /// The shape's name, as `--shape` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LabShape::V1alpha1 => "v1alpha1",
            LabShape::Multidoc => "multidoc",
        }
    }

    /// The Talos version nodes of this shape report.
    pub fn talos_version(self) -> String {
        match self {
            LabShape::V1alpha1 => ichor_testenv::Tool::Talosctl.version(),
            LabShape::Multidoc => "v1.14.0".into(),
        }
    }
}

/// A shape the lab does not know (`--shape`).
#[derive(Debug, thiserror::Error)]
#[error("unknown shape {0:?}: use v1alpha1 or multidoc")]
pub struct UnknownShape(pub String);

impl std::str::FromStr for LabShape {
    type Err = UnknownShape;
    fn from_str(s: &str) -> Result<Self, UnknownShape> {
        match s {
            "v1alpha1" => Ok(LabShape::V1alpha1),
            "multidoc" => Ok(LabShape::Multidoc),
            o => Err(UnknownShape(o.into())),
        }
    }
}

/// Whether the chart folder is the stand-in (its version says so).
fn is_standin(chart: &Path) -> bool {
    std::fs::read_to_string(chart.join("Chart.yaml")).is_ok_and(|t| {
        t.lines()
            .any(|l| l.starts_with("version:") && l.contains("standin"))
    })
}

/// How the lab's cluster looks.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Nodes, control planes first: the first `control_planes` of them are
    /// control planes, the rest workers.
    pub nodes: usize,
    /// How many of the nodes are control planes (default 1). Each runs the
    /// control-plane config and is an etcd member; every control plane's
    /// Talos API lists all of them (EtcdMemberList), as a real cluster's do.
    /// The lab's one kube-apiserver stands in for all of them.
    pub control_planes: usize,
    /// Play the kubelet's side of Talos's Kubernetes components: a mirror
    /// pod per control-plane component on each control plane, with the image
    /// that node's Talos API reports, and each Node's kubelet version from
    /// its kubelet image — so that a kubernetes-upgrade has something to
    /// wait for. Off by default (the pods would show in every lab).
    pub components: bool,
    /// The machine-config shape of the nodes.
    pub shape: LabShape,
    /// The Talos version the nodes report (by default the shape's).
    pub talos_version: String,
    /// The Kubernetes version the nodes' configs and kubelets carry: the
    /// real API server's (`KUBERNETES_VERSION` of `tools/versions.env`).
    pub kubernetes_version: String,
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
    /// The Cilium chart Ichor installs in the lab: the real chart from the
    /// tools cache when `tools/testbin.sh` fetched it, else the stand-in
    /// `dist/cilium-standin` (see [`CiliumChart`]).
    pub cilium_chart: CiliumChart,
    /// `ICHOR_LOG` for Ichor's pods and Jobs (a tracing filter such as
    /// `debug`), so a test can capture all they log; `None`: their default.
    pub ichor_log: Option<String>,
}

/// Which Cilium chart the lab gives Ichor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CiliumChart {
    /// The real chart folder (from Cilium's Go module, via the tools cache).
    Real(PathBuf),
    /// `dist/cilium-standin`: not Cilium; used only when the real chart is
    /// not in the tools cache.
    Standin(PathBuf),
}

impl CiliumChart {
    /// The real chart when the tools cache holds it, else the stand-in.
    pub fn detect() -> CiliumChart {
        match ichor_testenv::tools::cilium_chart() {
            // ICHOR_CILIUM_CHART may name the stand-in itself.
            Some(p) if is_standin(&p) => CiliumChart::Standin(p),
            Some(p) => CiliumChart::Real(p),
            None => {
                CiliumChart::Standin(ichor_testenv::tools::repo_root().join("dist/cilium-standin"))
            }
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            CiliumChart::Real(p) | CiliumChart::Standin(p) => p,
        }
    }

    pub fn is_real(&self) -> bool {
        matches!(self, CiliumChart::Real(_))
    }

    /// One line naming the chart, for the lab's output.
    pub fn describe(&self) -> String {
        match self {
            CiliumChart::Real(p) => format!("the real Cilium chart at {}", p.display()),
            CiliumChart::Standin(p) => format!(
                "the STAND-IN Cilium chart at {} (not Cilium: the real chart is not in the tools cache; run tools/testbin.sh to fetch it)",
                p.display()
            ),
        }
    }
}

impl LabOptions {
    /// Switches the nodes to `shape` and the Talos version it reports.
    pub fn with_shape(mut self, shape: LabShape) -> LabOptions {
        self.shape = shape;
        self.talos_version = shape.talos_version();
        self
    }

    pub fn new(state_dir: impl Into<PathBuf>) -> LabOptions {
        LabOptions {
            nodes: 3,
            control_planes: 1,
            components: false,
            shape: LabShape::V1alpha1,
            talos_version: LabShape::V1alpha1.talos_version(),
            kubernetes_version: ichor_testenv::Tool::KubeApiserver.version(),
            cni: LabCni::None,
            kube_proxy: true,
            kube_prism: true,
            pod_cidrs: true,
            state_dir: state_dir.into(),
            ichor_bin: None,
            cilium_chart: CiliumChart::detect(),
            ichor_log: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("the lab's control plane")]
    ControlPlane(#[from] ichor_testenv::Error),
    #[error("the task starting the lab's control plane failed")]
    ControlPlaneTask(#[source] tokio::task::JoinError),
    #[error("the lab's Talos nodes")]
    Emulator(#[from] ichor_talemu::EmuError),
    #[error("the lab's machine configs: {0}")]
    Config(String),
    #[error("the lab's machine configs")]
    MachineConfig(#[from] ichor_talos::config::ConfigError),
    #[error("the lab's machine config patch")]
    Patch(#[from] ichor_talos::patch::PatchError),
    #[error("the lab's secrets bundle")]
    Secrets(#[from] ichor_talos::secrets::SecretsError),
    #[error("the lab's talosconfig")]
    Talosconfig(#[from] ichor_talos::talosconfig::TalosconfigError),
    #[error("Talos's bootstrap manifests, as the lab plays them")]
    BootstrapManifests(#[from] crate::bootstrap_manifests::Error),
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering the lab's nodes in Kubernetes")]
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
    components: Option<tokio::task::JoinHandle<()>>,
    /// The kubelets registering Nodes as configs are applied ([`grow`]).
    kubelets: tokio::task::JoinHandle<()>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.kubelets.abort();
        if let Some(s) = self.simulator.take() {
            s.abort();
        }
        if let Some(s) = self.components.take() {
            s.abort();
        }
    }
}

/// The cluster's bundle, recovered from the control plane's config, and the
/// emulator's PKI from its OS CA (so the nodes trust the cluster's own CA).
fn cluster_pki(control_plane_config: &str) -> Result<(SecretsBundle, Pki), LabError> {
    let bundle = SecretsBundle::from_machine_config(
        &MachineConfig::parse(control_plane_config)?,
        "the lab's control-plane config",
    )?;
    let (ca, key) = bundle
        .os_ca_pem()
        .ok_or_else(|| LabError::Config("the fixture's bundle has no OS CA".into()))?;
    let key = ichor_talos::pem::relabel(&key, "PRIVATE KEY").unwrap_or(key);
    let pki = Pki::from_pem(&ca, &key)?;
    Ok((bundle, pki))
}

/// What an operator of the lab holds, written to `state_dir`: the
/// kubeconfig, a talosconfig for every node, and the bundle.
fn write_operator_files(
    state_dir: &Path,
    env: &TestEnv,
    bundle: &SecretsBundle,
    addresses: &[IpAddr],
    control_planes: usize,
) -> Result<(PathBuf, PathBuf, PathBuf), LabError> {
    let kubeconfig = state_dir.join("kubeconfig");
    let text =
        std::fs::read_to_string(env.kubeconfig_path()).map_err(|source| LabError::Write {
            path: env.kubeconfig_path().into(),
            source,
        })?;
    std::fs::write(&kubeconfig, text).map_err(|source| LabError::Write {
        path: kubeconfig.clone(),
        source,
    })?;
    // Every control plane is an endpoint, as `talosctl gen config` writes it.
    let endpoints: Vec<String> = addresses[..control_planes]
        .iter()
        .map(ToString::to_string)
        .collect();
    let nodes: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    let tc = Talosconfig::generate(
        bundle,
        "lab",
        &endpoints,
        &nodes,
        Role::Admin,
        std::time::Duration::from_secs(86400),
    )?;
    let talosconfig = state_dir.join("talosconfig");
    tc.write_file(&talosconfig)?;
    let bundle_path = state_dir.join("secrets.yaml");
    bundle.write_file(&bundle_path)?;
    Ok((kubeconfig, talosconfig, bundle_path))
}

/// The state folder exists and the control planes are at least one and
/// no more than the nodes.
fn check_options(options: &LabOptions) -> Result<(), LabError> {
    std::fs::create_dir_all(&options.state_dir).map_err(|source| LabError::Write {
        path: options.state_dir.clone(),
        source,
    })?;
    if options.control_planes == 0 || options.control_planes > options.nodes {
        return Err(LabError::Config(format!(
            "{} control planes among {} nodes: give at least one control plane and no more than the nodes",
            options.control_planes, options.nodes
        )));
    }
    Ok(())
}

/// The emulated Talos nodes, one a loopback address on port 50000, each
/// with its config and trusting the cluster's OS CA (`pki`).
async fn start_nodes(
    options: &LabOptions,
    hostnames: &[String],
    addresses: &[IpAddr],
    configs: &[String],
    pki: Pki,
) -> Result<Emulator, LabError> {
    let specs = hostnames
        .iter()
        .zip(addresses)
        .zip(configs)
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
    Ok(emulator)
}

/// The API server, with the cluster's identity from the first control
/// plane's config, reaching Ichor's pods through the lab's pod network
/// (bound first: the API server's egress configuration names its socket);
/// the nodes name it as where the cluster's API answers.
fn start_control_plane(
    options: &LabOptions,
    control_plane_config: &str,
    emulator: &Emulator,
) -> Result<(TestEnv, pods::PodNetwork), LabError> {
    let socket = options.state_dir.join("pod-network.sock");
    let network = pods::PodNetwork::bind(&socket).map_err(|source| LabError::Write {
        path: socket.clone(),
        source,
    })?;
    // The cluster's own Kubernetes CA and service-account key, as on a
    // real cluster: the kubeconfig a control plane hands out through
    // the Talos API (`talosctl kubeconfig`, `talosctl health`) works
    // against the lab's API server, which the nodes name as where the
    // cluster's API answers (it stands in for the endpoint's).
    let identity =
        init::cluster_identity(control_plane_config.as_bytes(), ichor_testenv::free_port())?;
    let env = TestEnv::start_for_cluster(identity, Some(network.socket()))?;
    emulator.serve_kubernetes_at(env.server_url());
    emulator.serve_etcd_at(env.etcd_url());
    etcd_loss::install_restore(emulator, &env);
    Ok((env, network))
}

/// What the simulator runs Ichor's pods and Jobs with: the local `ichor`
/// binary, the helm and Cilium chart its image carries, the API server.
fn process_runner(
    options: &LabOptions,
    env: &TestEnv,
    ichor: PathBuf,
    network: pods::PodNetwork,
) -> pods::ProcessRunner {
    pods::ProcessRunner {
        ichor,
        helm: ichor_testenv::Tool::Helm4.path(),
        cilium_chart: options.cilium_chart.path().to_path_buf(),
        server: env.server_url().to_string(),
        ca_pem: env.ca().cert_pem(),
        state_dir: options.state_dir.clone(),
        network,
        ichor_log: options.ichor_log.clone(),
    }
}

/// Every node's kubelet side of the Kubernetes components
/// ([`components`]), when [`LabOptions::components`] asks for it.
fn spawn_components(
    client: &kube::Client,
    options: &LabOptions,
    hostnames: &[String],
    emulator: &Emulator,
) -> Result<Option<tokio::task::JoinHandle<()>>, LabError> {
    if !options.components {
        return Ok(None);
    }
    let nodes = (0..options.nodes)
        .map(|i| {
            Ok(components::LabKubelet {
                node: hostnames[i].clone(),
                control_plane: i < options.control_planes,
                talos: emulator.admin_client(i)?,
            })
        })
        .collect::<Result<Vec<_>, LabError>>()?;
    Ok(Some(components::spawn(client.clone(), nodes)))
}

impl Lab {
    /// Starts the control plane, the nodes and the simulator.
    pub async fn up(options: LabOptions) -> Result<Lab, LabError> {
        check_options(&options)?;
        let (addresses, hostnames) = node_names(options.nodes, options.control_planes);
        let configs = node_configs(&options, &addresses)?;
        let (bundle, pki) = cluster_pki(&configs[0])?;
        let emulator = start_nodes(&options, &hostnames, &addresses, &configs, pki).await?;
        let (env, network) = start_control_plane(&options, &configs[0], &emulator)?;
        let (kubeconfig, talosconfig, bundle_path) = write_operator_files(
            &options.state_dir,
            &env,
            &bundle,
            &addresses,
            options.control_planes,
        )?;

        let client = env.client().await;
        register_nodes(&client, &hostnames, &addresses, &options).await?;
        let admin = options
            .components
            .then(|| emulator.client_identity(&ichor_talemu::ClientCertSpec::admin()))
            .transpose()?;
        let kubelets = grow::spawn_kubelets(
            client.clone(),
            emulator.configured(),
            grow::Kubelets {
                options: options.clone(),
                admin,
            },
        );
        seed_cni(&client, &options).await?;
        let runner = options
            .ichor_bin
            .clone()
            .map(|ichor| process_runner(&options, &env, ichor, network));
        if !options.cilium_chart.is_real() {
            tracing::warn!("lab: Ichor installs {}", options.cilium_chart.describe());
        }
        let simulator = Some(simulator::spawn(
            client.clone(),
            runner,
            Some(emulator.active_configs()),
        ));
        let components = spawn_components(&client, &options, &hostnames, &emulator)?;
        if options.cni != LabCni::None {
            // A cluster that already runs a CNI starts with Ready nodes.
            wait_nodes_ready(&client, std::time::Duration::from_secs(60)).await?;
        }
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
            components,
            kubelets,
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
            // The chart the lab gives Ichor (the real one when cached).
            self.options.cilium_chart.path().display(),
        )
    }

    pub fn state_dir(&self) -> &Path {
        &self.options.state_dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_planes_come_first_and_are_named_so() {
        let (addresses, hostnames) = node_names(5, 3);
        assert_eq!(
            hostnames,
            [
                "lab-cp-1",
                "lab-cp-2",
                "lab-cp-3",
                "lab-worker-1",
                "lab-worker-2"
            ]
        );
        assert_eq!(addresses.len(), 5);
        // One control plane: the names every single-control-plane lab had.
        assert_eq!(
            node_names(3, 1).1,
            ["lab-cp-1", "lab-worker-1", "lab-worker-2"]
        );
    }

    #[test]
    fn the_api_server_takes_the_cluster_identity_of_either_shape() {
        for shape in [LabShape::V1alpha1, LabShape::Multidoc] {
            let options = LabOptions::new("unused").with_shape(shape);
            let (addresses, _) = node_names(3, 1);
            let configs = node_configs(&options, &addresses).unwrap();
            let identity = init::cluster_identity(configs[0].as_bytes(), 6443).unwrap();
            assert_eq!(identity.port, 6443, "{shape:?}");
            assert!(
                identity.service_account_key_pem.contains("PRIVATE KEY"),
                "{shape:?}"
            );
        }
    }

    #[test]
    fn the_stand_in_is_named_as_such() {
        let standin = ichor_testenv::tools::repo_root().join("dist/cilium-standin");
        assert!(is_standin(&standin));
        let c = CiliumChart::Standin(standin);
        assert!(!c.is_real());
        assert!(c.describe().contains("STAND-IN"), "{}", c.describe());
    }
}
