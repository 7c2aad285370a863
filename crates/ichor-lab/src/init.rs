//! The lab for `ichor init`: fresh nodes in maintenance mode (the insecure
//! API, port 50000, each on its own loopback address), and no Kubernetes
//! yet. When a control plane is bootstrapped, the lab starts the real
//! kube-apiserver and etcd for that cluster, with the cluster's own
//! Kubernetes CA and service-account key taken from the node's config, on
//! the port of the cluster's endpoint — so the kubeconfig the node serves
//! through the Talos API works against it, as on a real cluster. Then the
//! Node objects and the node simulator come up, as kubelets would.
//!
//! Talos's bootstrap-manifest apply (the inline Cilium) is played through
//! [`InitLabOptions::bootstrap_manifests`], called with the API server's
//! client and the bootstrapped control plane's config once the API server
//! answers; [`talos_bootstrap_manifests`] is the lab's play of it
//! ([`crate::bootstrap_manifests`]). Without it the inline manifests are not
//! applied, no pod network comes up, and Ichor's pods stay Pending.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ichor_talemu::{Disk, Emulator, EmulatorOptions, NodeSpec};
use ichor_talos::config::MachineConfig;
use ichor_talos::secrets::SecretsBundle;
use ichor_testenv::{ClusterIdentity, TestCa, TestEnv};

use crate::{CiliumChart, LabError, LabOptions, LabShape, pods, simulator};

/// Plays Talos's bootstrap-manifest apply: the API server's client and the
/// bootstrapped control plane's config (its inline manifests).
pub type BootstrapManifests = Arc<
    dyn Fn(
            kube::Client,
            Vec<u8>,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<(), crate::bootstrap_manifests::Error>>
                    + Send,
            >,
        > + Send
        + Sync,
>;

/// Talos's bootstrap-manifest apply as the lab plays it
/// ([`crate::bootstrap_manifests::apply`]): what
/// [`InitLabOptions::bootstrap_manifests`] takes for a lab that brings the
/// inline Cilium up, as a Talos 1.13+ control plane does at boot.
pub fn talos_bootstrap_manifests() -> BootstrapManifests {
    Arc::new(|client, config| {
        Box::pin(async move {
            let config = MachineConfig::parse(&String::from_utf8_lossy(&config))?;
            let played = crate::bootstrap_manifests::apply(&client, &config).await?;
            tracing::info!(
                "lab: Talos's bootstrap-manifest apply created {} objects, found {}",
                played.created.len(),
                played.found.len()
            );
            Ok(())
        })
    })
}

/// How the init lab looks.
#[derive(Clone)]
pub struct InitLabOptions {
    pub control_planes: usize,
    pub workers: usize,
    /// The Talos version the fresh nodes run.
    pub talos_version: String,
    /// Where the lab keeps its files (the pod network's socket).
    pub state_dir: PathBuf,
    /// The `ichor` binary Ichor's pods run as (`None`: they never start).
    pub ichor_bin: Option<PathBuf>,
    pub cilium_chart: CiliumChart,
    /// Talos's bootstrap-manifest apply, played once the API server answers
    /// (`None`: the inline manifests are not applied).
    pub bootstrap_manifests: Option<BootstrapManifests>,
}

impl std::fmt::Debug for InitLabOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitLabOptions")
            .field("control_planes", &self.control_planes)
            .field("workers", &self.workers)
            .field("talos_version", &self.talos_version)
            .field("bootstrap_manifests", &self.bootstrap_manifests.is_some())
            .finish_non_exhaustive()
    }
}

impl InitLabOptions {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        InitLabOptions {
            control_planes: 1,
            workers: 2,
            talos_version: LabShape::V1alpha1.talos_version(),
            state_dir: state_dir.into(),
            ichor_bin: None,
            cilium_chart: CiliumChart::detect(),
            bootstrap_manifests: None,
        }
    }
}

/// The Kubernetes side, once a control plane is bootstrapped.
pub struct Bootstrapped {
    pub env: TestEnv,
    pub client: kube::Client,
    _simulator: Option<tokio::task::JoinHandle<()>>,
}

/// A running init lab.
pub struct InitLab {
    pub emulator: Arc<Emulator>,
    pub addresses: Vec<IpAddr>,
    pub hostnames: Vec<String>,
    /// `https://127.0.0.1:PORT`: what `ichor init --endpoint` takes; the API
    /// server listens there once the cluster is bootstrapped.
    pub endpoint: String,
    pub options: InitLabOptions,
    kubernetes: Arc<Mutex<Option<Arc<Bootstrapped>>>>,
    failure: Arc<Mutex<Option<String>>>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for InitLab {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl InitLab {
    /// Starts the fresh nodes; the Kubernetes side starts at bootstrap.
    pub async fn up(options: InitLabOptions) -> Result<InitLab, LabError> {
        std::fs::create_dir_all(&options.state_dir).map_err(|source| LabError::Write {
            path: options.state_dir.clone(),
            source,
        })?;
        let count = options.control_planes + options.workers;
        let net: u8 = rand::random_range(16..=250);
        let sub: u8 = rand::random_range(1..=250);
        let addresses: Vec<IpAddr> = (0..count)
            .map(|i| IpAddr::V4(Ipv4Addr::new(127, net, sub, 10 + i as u8)))
            .collect();
        let hostnames: Vec<String> = (0..count)
            .map(|i| {
                if i < options.control_planes {
                    format!("init-cp-{}", i + 1)
                } else {
                    format!("init-worker-{}", i + 1 - options.control_planes)
                }
            })
            .collect();
        let specs = hostnames
            .iter()
            .zip(&addresses)
            .map(|(h, a)| {
                NodeSpec::maintenance(h.clone())
                    .with_address(*a)
                    .with_port(50000)
                    .with_version(options.talos_version.clone())
                    .with_disks(vec![Disk::new("/dev/vda", 21_474_836_480)])
            })
            .collect();
        let emulator = Arc::new(
            Emulator::start_with(
                specs,
                EmulatorOptions {
                    serve_config_ca: true,
                    ..EmulatorOptions::default()
                },
            )
            .await?,
        );
        let port = ichor_testenv::free_port();
        let endpoint = format!("https://127.0.0.1:{port}");
        let kubernetes = Arc::new(Mutex::new(None));
        let failure = Arc::new(Mutex::new(None));
        let watcher = tokio::spawn(start_kubernetes_at_bootstrap(
            Arc::clone(&emulator),
            options.clone(),
            hostnames.clone(),
            addresses.clone(),
            port,
            Arc::clone(&kubernetes),
            Arc::clone(&failure),
        ));
        Ok(InitLab {
            emulator,
            addresses,
            hostnames,
            endpoint,
            options,
            kubernetes,
            failure,
            watcher,
        })
    }

    /// The control planes' addresses.
    pub fn control_planes(&self) -> Vec<String> {
        self.addresses[..self.options.control_planes]
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The workers' addresses.
    pub fn workers(&self) -> Vec<String> {
        self.addresses[self.options.control_planes..]
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The Kubernetes side, once a control plane was bootstrapped.
    pub fn kubernetes(&self) -> Option<Arc<Bootstrapped>> {
        self.kubernetes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Why the Kubernetes side could not start, if it could not.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Waits for the first bootstrap, then starts the cluster's control plane.
async fn start_kubernetes_at_bootstrap(
    emulator: Arc<Emulator>,
    options: InitLabOptions,
    hostnames: Vec<String>,
    addresses: Vec<IpAddr>,
    port: u16,
    kubernetes: Arc<Mutex<Option<Arc<Bootstrapped>>>>,
    failure: Arc<Mutex<Option<String>>>,
) {
    let mut bootstraps = emulator.bootstraps();
    let node = match (0..addresses.len()).find(|i| emulator.bootstrapped(*i)) {
        Some(i) => i,
        None => match bootstraps.recv().await {
            Ok(i) => i,
            Err(_) => return,
        },
    };
    match start_kubernetes(&emulator, node, &options, &hostnames, &addresses, port).await {
        Ok(k) => *kubernetes.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(k)),
        Err(e) => {
            let said = ichor_api::error_text::chain(&e);
            tracing::error!(error = %said, "lab: the cluster's control plane did not start");
            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(said);
        }
    }
}

/// The cluster's Kubernetes CA and service-account key, as its control
/// plane's config holds them (either config shape).
pub fn cluster_identity(config: &[u8], port: u16) -> Result<ClusterIdentity, LabError> {
    let cfg = MachineConfig::parse_live(
        &String::from_utf8_lossy(config),
        "the control plane's config",
    )?;
    let bundle = SecretsBundle::from_machine_config(&cfg, "the control plane's config")?;
    let unb64 = |v: &Option<String>, what: &str| {
        v.as_deref()
            .and_then(ichor_talos::pem::unb64)
            .ok_or_else(|| LabError::Config(format!("the control plane's config has no {what}")))
    };
    let ca_cert = unb64(&bundle.certs.k8s.crt, "Kubernetes CA certificate")?;
    let ca_key = unb64(&bundle.certs.k8s.key, "Kubernetes CA key")?;
    let ca_key = ichor_talos::pem::p256_sec1_to_pkcs8(&ca_key)
        .ok_or_else(|| LabError::Config("the Kubernetes CA key is not PEM".into()))?;
    let ca = TestCa::from_pem(&ca_cert, &ca_key)
        .map_err(|e| LabError::Config(ichor_api::error_text::chain(&e)))?;
    let sa_key = unb64(&bundle.certs.k8sserviceaccount.key, "service-account key")?;
    Ok(ClusterIdentity {
        ca,
        service_account_public_pem: sa_key.clone(),
        service_account_key_pem: sa_key,
        port,
    })
}

async fn start_kubernetes(
    emulator: &Emulator,
    node: usize,
    options: &InitLabOptions,
    hostnames: &[String],
    addresses: &[IpAddr],
    port: u16,
) -> Result<Bootstrapped, LabError> {
    let config = emulator
        .active_config(node)
        .ok_or_else(|| LabError::Config("the bootstrapped node has no config".into()))?;
    let identity = cluster_identity(&config, port)?;
    let facts = MachineConfig::parse_live(
        &String::from_utf8_lossy(&config),
        "the control plane's config",
    )?
    .facts();
    let socket = options.state_dir.join("pod-network.sock");
    let network = pods::PodNetwork::bind(&socket).map_err(|source| LabError::Write {
        path: socket.clone(),
        source,
    })?;
    let proxy = network.socket().to_path_buf();
    let env =
        tokio::task::spawn_blocking(move || TestEnv::start_for_cluster(identity, Some(&proxy)))
            .await
            .map_err(LabError::ControlPlaneTask)??;
    emulator.serve_etcd_at(env.etcd_url());
    crate::etcd_loss::install_restore(emulator, &env);
    let client = env.client().await;
    let mut lab_options = LabOptions::new(&options.state_dir);
    lab_options.nodes = addresses.len();
    lab_options.talos_version = options.talos_version.clone();
    lab_options.cni = crate::LabCni::None;
    // Talos deploys kube-proxy itself (one of its own bootstrap manifests,
    // which the lab does not play) unless the config disables it; the
    // DaemonSet stands for it, and Cilium's agent is judged against it.
    lab_options.kube_proxy = facts.kube_proxy_enabled.unwrap_or(true);
    crate::register_nodes(&client, hostnames, addresses, &lab_options).await?;
    crate::seed_cni(&client, &lab_options).await?;
    let runner = options.ichor_bin.clone().map(|ichor| pods::ProcessRunner {
        ichor,
        helm: ichor_testenv::Tool::Helm4.path(),
        cilium_chart: options.cilium_chart.path().to_path_buf(),
        server: env.server_url().to_string(),
        ca_pem: env.ca().cert_pem(),
        state_dir: options.state_dir.clone(),
        network,
        ichor_log: None,
    });
    let simulator = Some(simulator::spawn(
        client.clone(),
        runner,
        Some(emulator.active_configs()),
    ));
    if let Some(apply) = &options.bootstrap_manifests {
        apply(client.clone(), config).await?;
    }
    Ok(Bootstrapped {
        env,
        client,
        _simulator: simulator,
    })
}
