//! Ichor's controller, run by `ichor controller`.
//!
//! - [`machine`]: the TalosMachine reconciler — reads each node's live config
//!   through the Talos API (credentials minted in memory from the cluster's
//!   bundle Secret), renders the desired config, writes the drift per path
//!   with its class to `status`, and applies class B drift in no-reboot mode
//!   when the machine is not held. Class C is never applied. `spec` is never
//!   written.
//! - [`cluster`]: the TalosCluster reconciler — aggregates Ready from the
//!   machines, sets `status.cni.detected` (R2.2) and the CNI hand-over
//!   (R1.5e, `CNIHandover`, with [`cni_job`] and [`bootstrap_inventory`]).
//! - [`operation`]: the TalosOperation reconciler — plans first, then
//!   upgrades or reboots machine by machine, each step a pure transition:
//!   control planes one at a time with etcd checked, drains through the
//!   Eviction API, holds respected, resumable from status.
//! - [`installation`]: the IchorInstallation singleton, created once when
//!   deployed by Helm (R5.2), tolerated absent otherwise (R4.3f).
//! - [`leader`]: leader election with a `coordination.k8s.io` Lease.
//! - [`http`]: `/healthz`, `/readyz`, `/metrics` ([`metrics`]).
//! - [`webhook`]: admission webhooks for TalosCluster (axum + rustls).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ichor_controller::Error> {
//! let config = ichor_controller::Config::default();
//! ichor_controller::run(config).await
//! # }
//! ```
//!
//! Each reconciler is read → decide → write: every decision is a pure
//! function in `ichor-reconcile` (ADR 0017); the folders here read, carry
//! out what was decided, and write status and Events through what they
//! share in [`pipeline`] (the reconcile boundary, the status write, Events,
//! the shared stores).

pub mod backoff;
pub mod backup;
pub mod changed_by;
pub mod cluster;
pub mod credentials;
mod error;
pub mod http;
pub mod installation;
pub mod leader;
pub mod machine;
pub mod membership;
pub mod metrics;
pub mod operation;
pub mod pipeline;
pub mod webhook;

/// The operation decisions under their former name (the CLI reads
/// `step_after` here).
pub use ichor_reconcile::operation as operation_decide;

/// The hand-over's I/O, under the names other crates use.
pub use cluster::{bootstrap_inventory, cni_job};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};

pub use error::{BundleError, Error, LiveConfigError, Result, WebhookCertError};
pub use metrics::Metrics;

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "ichor-controller";

/// How long running reconciles may take to finish once shutdown starts.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Drives a controller's stream until it ends, or for at most
/// [`SHUTDOWN_GRACE`] once `stop` completes: kube-runtime's graceful shutdown
/// never finishes when the stop comes before the first list.
pub(crate) async fn drive_until_stopped(
    kind: &str,
    drive: impl Future<Output = ()>,
    stop: impl Future<Output = ()>,
) {
    tokio::select! {
        () = drive => {}
        () = async {
            stop.await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("the {kind} controller did not stop within {SHUTDOWN_GRACE:?}; leaving it"),
    }
}

/// Who deployed Ichor (the CLI's `--deployed-by`; the chart sets `helm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeployedBy {
    /// The install manifest of `ichor adopt` / `ichor init` (the installer).
    #[default]
    Installer,
    /// A Helm release of the `ichor` chart.
    Helm,
}

/// A `--deployed-by` that is neither `installer` nor `helm`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown --deployed-by {0:?}: use installer or helm")]
pub struct UnknownDeployedBy(pub String);

impl std::str::FromStr for DeployedBy {
    type Err = UnknownDeployedBy;
    fn from_str(s: &str) -> Result<Self, UnknownDeployedBy> {
        match s {
            "installer" => Ok(DeployedBy::Installer),
            "helm" => Ok(DeployedBy::Helm),
            o => Err(UnknownDeployedBy(o.to_owned())),
        }
    }
}

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// The Lease's name, in [`Config::system_namespace`].
    pub lease_name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a challenger waits, by its own clock, after it last saw the
    /// Lease change before it may take it.
    pub lease_duration: Duration,
    /// How long the leader may go without a successful renewal, counted from
    /// the start of its last successful attempt, before it stops leading
    /// (and stops every write). Shorter than `lease_duration`, so the old
    /// leader has stopped before any challenger can take over.
    pub renew_deadline: Duration,
    /// How often the leader renews, and a challenger tries.
    pub renew_interval: Duration,
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            lease_name: "ichor-controller".into(),
            identity: std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "ichor-controller".into()),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_interval: Duration::from_secs(2),
        }
    }
}

/// The admission webhook server.
#[derive(Debug, Clone)]
pub struct WebhookServer {
    /// Where to listen (the chart uses 0.0.0.0:9443).
    pub addr: SocketAddr,
    /// The `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) in
    /// [`Config::system_namespace`] holding the serving certificate.
    pub cert_secret: String,
    /// How often the Secret is read again for a renewed certificate.
    pub reload: Duration,
}

impl WebhookServer {
    /// The chart's defaults: 0.0.0.0:9443, Secret `ichor-webhook-tls`, reload every minute.
    pub fn new(addr: SocketAddr) -> Self {
        WebhookServer {
            addr,
            cert_secret: "ichor-webhook-tls".into(),
            reload: Duration::from_secs(60),
        }
    }
}

/// How the controller runs. The CLI's `ichor controller` fills this from its flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// Watch only this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// Where Ichor runs: the IchorInstallation, the Lease, the webhook certificate.
    pub system_namespace: String,
    /// Who deployed Ichor (`--deployed-by`).
    pub deployed_by: DeployedBy,
    /// Ichor's version (written to an IchorInstallation created under Helm).
    pub version: String,
    /// Where Ichor's Cilium release record lives (`ichor-system`).
    pub cilium_storage_namespace: String,
    /// Where Ichor's Cilium objects live (`kube-system`).
    pub cilium_release_namespace: String,
    /// The image the ichor-cni Job runs (`None`: no Job is started, and a
    /// release off the effective values waits for `ichor cni helm apply`).
    pub cni_job_image: Option<String>,
    /// The Talos API port used when `spec.address` has none.
    pub talos_port: u16,
    /// Bound on every Talos API call.
    pub talos_call_timeout: Duration,
    /// How often a reconciled object is looked at again (drift appears on
    /// nodes without any Kubernetes event).
    pub resync: Duration,
    /// Retry delay after a reconcile's first failure; it doubles with each
    /// failure in a row of the same object (±20%), up to
    /// `error_requeue_max`, and a success resets it.
    pub error_requeue: Duration,
    /// The longest wait between two attempts of a failing object.
    pub error_requeue_max: Duration,
    /// How many TalosMachines are reconciled at once (each is a Talos API
    /// conversation with one node).
    pub machine_concurrency: u16,
    /// Health and metrics server (`None`: not served).
    pub http_addr: Option<SocketAddr>,
    /// Admission webhook server (`None`: not served).
    pub webhook: Option<WebhookServer>,
    /// Leader election (`None`: act as the only replica).
    pub leader_election: Option<LeaderElection>,
    /// The Node this controller runs on (`NODE_NAME` from the downward API):
    /// a TalosOperation acts on it last.
    pub node_name: Option<String>,
    /// The bounds of a TalosOperation's waits.
    pub operation_bounds: operation::OperationBounds,
    /// The claim mounted for volume backup destinations (`None`: none; a
    /// cluster naming one is told what to set).
    pub backup_volume: Option<backup::volume::BackupVolume>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            system_namespace: ichor_api::SYSTEM_NAMESPACE.into(),
            deployed_by: DeployedBy::Installer,
            version: concat!("v", env!("CARGO_PKG_VERSION")).into(),
            cilium_storage_namespace: ichor_cilium::STORAGE_NAMESPACE.into(),
            cilium_release_namespace: ichor_cilium::RELEASE_NAMESPACE.into(),
            cni_job_image: None,
            talos_port: ichor_api::endpoint::TALOS_API_PORT,
            talos_call_timeout: Duration::from_secs(30),
            resync: Duration::from_secs(300),
            error_requeue: Duration::from_secs(15),
            error_requeue_max: Duration::from_secs(600),
            machine_concurrency: 256,
            http_addr: None,
            webhook: None,
            leader_election: Some(LeaderElection::default()),
            node_name: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
            operation_bounds: operation::OperationBounds::default(),
            backup_volume: None,
        }
    }
}

/// What the reconcilers share.
pub struct Context {
    pub client: kube::Client,
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub credentials: credentials::Cache,
    pub(crate) recent_successes: machine::RecentSuccesses,
    /// Where `now` comes from (the system clock; a test may set another).
    pub clock: pipeline::Clock,
    /// Every watched TalosMachine, as the TalosCluster controller's watch
    /// saw it (the cluster reconcile reads its machines here, not with a list).
    pub(crate) machines: pipeline::Shared<DeserializeGuard<ichor_api::TalosMachine>>,
    /// Every watched TalosCluster, as the TalosMachine controller's watch
    /// saw it (the machine reconcile reads its cluster here).
    pub(crate) clusters: pipeline::Shared<DeserializeGuard<ichor_api::TalosCluster>>,
    /// Every Node's metadata (the node count of the effective values).
    pub(crate) nodes: pipeline::Shared<PartialObjectMeta<Node>>,
    /// Keeps a cluster's reconciles apart while its machines converge.
    pub(crate) cluster_spacing: pipeline::Spacing,
    /// Failed reconciles in a row, per object: the back-off's count.
    pub(crate) failures: backoff::FailureCounts,
}

impl Context {
    fn new(
        client: kube::Client,
        config: Config,
        metrics: Arc<Metrics>,
        machines: pipeline::Shared<DeserializeGuard<ichor_api::TalosMachine>>,
        clusters: pipeline::Shared<DeserializeGuard<ichor_api::TalosCluster>>,
        nodes: pipeline::Shared<PartialObjectMeta<Node>>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: config.leader_election.as_ref().map(|l| l.identity.clone()),
            },
        );
        Context {
            client,
            config,
            metrics,
            recorder,
            credentials: credentials::Cache::default(),
            recent_successes: machine::RecentSuccesses::default(),
            clock: pipeline::system_clock,
            machines,
            clusters,
            nodes,
            cluster_spacing: pipeline::Spacing::default(),
            failures: backoff::FailureCounts::default(),
        }
    }
}

/// Runs the controller with the in-cluster (or `KUBECONFIG`) client until
/// SIGTERM or Ctrl-C.
pub async fn run(config: Config) -> Result<()> {
    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    run_with(client, config, shutdown_signal()).await
}

/// Runs the controller with `client` until `shutdown` completes (or
/// leadership is lost, which is an error).
pub async fn run_with(
    client: kube::Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let metrics = Arc::new(Metrics::default());
    let shutdown = shutdown.shared();
    changed_by::learn_controller_user(&client).await;
    start_servers(&client, &config, &metrics, shutdown.clone()).await?;

    // Ready once the servers run: every replica serves the webhooks, the
    // leader alone reconciles (`ichor_leader` tells which one leads).
    metrics.set_ready(true);

    // Leadership first: nothing is written before this replica leads.
    let leadership = match &config.leader_election {
        Some(le) => {
            let elector =
                leader::Elector::new(client.clone(), &config.system_namespace, le.clone());
            tokio::select! {
                r = elector.acquire() => Some(r?),
                () = shutdown.clone() => return Ok(()),
            }
        }
        None => None,
    };
    metrics.set_leader(true);

    if let Err(e) = installation::ensure(&client, &config).await {
        tracing::error!(error = %ichor_api::error_text::chain(&e), "IchorInstallation");
    }

    // Each controller's watch of the other kind fills a store the other
    // reconcile reads: the store is written before the event triggers.
    let (machine_store, machine_writer) = pipeline::Shared::new();
    let (cluster_store, cluster_writer) = pipeline::Shared::new();
    let (node_store, node_writer) = pipeline::Shared::new();
    let ctx = Arc::new(Context::new(
        client,
        config,
        Arc::clone(&metrics),
        machine_store,
        cluster_store,
        node_store,
    ));
    metrics.read_objects_of(&ctx);
    let machines = machine::run(Arc::clone(&ctx), cluster_writer, shutdown.clone());
    let clusters = cluster::run(
        Arc::clone(&ctx),
        machine_writer,
        node_writer,
        shutdown.clone(),
    );
    let operations = operation::run(Arc::clone(&ctx), shutdown.clone());
    let backups = backup::run(Arc::clone(&ctx), shutdown.clone());
    let controllers = async {
        futures::join!(machines, clusters, operations, backups);
    };
    let result = match leadership {
        Some(mut held) => {
            let r = tokio::select! {
                () = controllers => Ok(()),
                e = held.lost() => Err(e),
            };
            if r.is_ok() {
                held.release().await;
            }
            r
        }
        None => {
            controllers.await;
            Ok(())
        }
    };
    metrics.set_ready(false);
    metrics.set_leader(false);
    result
}

/// Starts the health and metrics server and the webhook server, when
/// configured; they stop with `shutdown`.
async fn start_servers(
    client: &kube::Client,
    config: &Config,
    metrics: &Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Clone + Send + 'static,
) -> Result<()> {
    if let Some(addr) = config.http_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Serve {
                what: "health and metrics",
                addr: addr.to_string(),
                source,
            })?;
        let router = http::router(Arc::clone(metrics));
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(stop)
                .await;
        });
    }
    if let Some(wh) = config.webhook.clone() {
        // The certificate is read before anything else starts: a missing or
        // bad Secret is an error at once, not a webhook that never answers.
        webhook::load_tls(client, &config.system_namespace, &wh.cert_secret).await?;
        let listener = webhook::bind(wh.addr)?;
        let stop = shutdown.clone();
        let (c, ns) = (client.clone(), config.system_namespace.clone());
        tokio::spawn(async move {
            if let Err(e) =
                webhook::serve_from_secret(c, ns, wh.cert_secret, listener, wh.reload, stop).await
            {
                tracing::error!(error = %ichor_api::error_text::chain(&e), "the webhook server stopped");
            }
        });
    }

    Ok(())
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
