//! The controller's errors. Each names what failed, on which object or node,
//! and what to do; [`Error::metric_label`] gives the label counted in
//! `ichor_reconcile_errors_total`.

use std::time::Duration;

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}: {source}; check the API server and the controller's RBAC")]
    Kube {
        /// What was being done, naming the object.
        what: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// An object could not be read as its type (one bad object; the others go on).
    #[error(
        "{kind} {namespace}/{name} cannot be read: {reason}; fix the object (kubectl edit) or delete it — the other objects keep reconciling"
    )]
    Malformed {
        kind: &'static str,
        namespace: String,
        name: String,
        reason: String,
    },
    /// A TalosMachine names a TalosCluster that does not exist.
    #[error(
        "TalosMachine {namespace}/{machine} refers to TalosCluster {cluster}, which does not exist in {namespace}; create it or fix spec.clusterRef (recreate the machine: the field is immutable)"
    )]
    ClusterNotFound {
        namespace: String,
        machine: String,
        cluster: String,
    },
    /// The secrets bundle of a cluster is missing or unusable.
    #[error(
        "the secrets bundle of TalosCluster {namespace}/{cluster} (Secret {secret}, key {key}) is unusable: {reason}; recreate the Secret from the bundle file (ichor adopt writes it)"
    )]
    Bundle {
        namespace: String,
        cluster: String,
        secret: String,
        key: String,
        reason: String,
    },
    /// A call to a node's Talos API failed.
    #[error(
        "TalosMachine {namespace}/{machine}: the Talos API of node {address} failed: {source}; check that the node is up and spec.address is right"
    )]
    Talos {
        namespace: String,
        machine: String,
        address: String,
        #[source]
        source: Box<ichor_talos_client::Error>,
    },
    /// The node's live config could not be parsed.
    #[error(
        "TalosMachine {namespace}/{machine}: the live config of node {address} cannot be read: {reason}; check the node with talosctl get machineconfig"
    )]
    LiveConfig {
        namespace: String,
        machine: String,
        address: String,
        reason: String,
    },
    /// A reconcile panicked on this object: a defect in Ichor, caught at the
    /// reconcile's boundary so that one object cannot stop the process.
    #[error(
        "{kind} {namespace}/{name}: the reconcile stopped on a defect in Ichor ({message}); the other objects keep reconciling — report it with the controller's version"
    )]
    Panicked {
        kind: &'static str,
        namespace: String,
        name: String,
        /// The panic's text, its quoted values redacted.
        message: String,
    },
    /// Rendering or comparing failed.
    #[error(transparent)]
    Render(#[from] ichor_render::Error),
    /// Reading Ichor's Cilium release or its DaemonSet failed.
    #[error("TalosCluster {namespace}/{cluster}: the CNI hand-over check failed: {source}")]
    Cilium {
        namespace: String,
        cluster: String,
        #[source]
        source: Box<ichor_cilium::Error>,
    },
    /// A listener (health, metrics, webhook) could not start.
    #[error(
        "the {what} server on {addr} failed: {reason}; choose another address or free the port"
    )]
    Serve {
        what: &'static str,
        addr: String,
        reason: String,
    },
    /// The webhook's serving certificate is unusable.
    #[error(
        "the webhook serving certificate (Secret {namespace}/{secret}) is unusable: {reason}; the chart or the install manifest creates it — recreate it"
    )]
    WebhookCert {
        namespace: String,
        secret: String,
        reason: String,
    },
    /// Leadership was lost (the Lease could not be renewed in time).
    #[error(
        "lost the leader Lease {namespace}/{name}: not renewed within {within:?} ({reason}); the controller stops so that it never acts as a second leader — it will be restarted"
    )]
    LostLeadership {
        namespace: String,
        name: String,
        within: Duration,
        reason: String,
    },
    /// The kube client could not be created.
    #[error(
        "cannot create the Kubernetes client: {0}; run in a pod with a service account, or set KUBECONFIG"
    )]
    Client(String),
}

impl Error {
    /// A short label for metrics and Event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Malformed { .. } => "malformed",
            Error::ClusterNotFound { .. } => "cluster_not_found",
            Error::Bundle { .. } => "bundle",
            Error::Talos { .. } => "talos",
            Error::LiveConfig { .. } => "live_config",
            Error::Panicked { .. } => "panic",
            Error::Render(_) => "render",
            Error::Cilium { .. } => "cilium",
            Error::Serve { .. } => "serve",
            Error::WebhookCert { .. } => "webhook_cert",
            Error::LostLeadership { .. } => "leadership",
            Error::Client(_) => "client",
        }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
