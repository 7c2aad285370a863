//! The controller's errors. Each names what failed, on which object or node,
//! and what to do; its source says why, and is never repeated in the
//! message. Wherever an error becomes text for a person (a condition, an
//! Event, a log line) it is read whole, with
//! [`ichor_api::error_text::chain`]. [`Error::metric_label`] gives the label
//! counted in `ichor_reconcile_errors_total`.

use std::time::Duration;

/// Everything that can go wrong in the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{what}")]
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
        "the secrets bundle of TalosCluster {namespace}/{cluster} (Secret {secret}, key {key}) is unusable; recreate the Secret from the bundle file (ichor adopt writes it)"
    )]
    Bundle {
        namespace: String,
        cluster: String,
        secret: String,
        key: String,
        #[source]
        source: Box<BundleError>,
    },
    /// A call to a node's Talos API failed.
    #[error(
        "TalosMachine {namespace}/{machine}: the Talos API of node {address} failed; check that the node is up and spec.address is right"
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
        "TalosMachine {namespace}/{machine}: the live config of node {address} cannot be read; check the node with talosctl get machineconfig"
    )]
    LiveConfig {
        namespace: String,
        machine: String,
        address: String,
        #[source]
        source: Box<LiveConfigError>,
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
    #[error("TalosCluster {namespace}/{cluster}: the CNI hand-over check failed")]
    Cilium {
        namespace: String,
        cluster: String,
        #[source]
        source: Box<ichor_cilium::Error>,
    },
    /// A listener (health, metrics, webhook) could not start.
    #[error("the {what} server on {addr} failed; choose another address or free the port")]
    Serve {
        what: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The webhook's serving certificate is unusable.
    #[error(
        "the webhook serving certificate (Secret {namespace}/{secret}) is unusable; the chart or the install manifest creates it — recreate it"
    )]
    WebhookCert {
        namespace: String,
        secret: String,
        #[source]
        source: Box<WebhookCertError>,
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
        "cannot create the Kubernetes client; run in a pod with a service account, or set KUBECONFIG"
    )]
    Client(#[source] kube::Error),
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

    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Error::Kube { .. } => Some("check the API server and the controller's RBAC".into()),
            _ => None,
        }
    }
}

/// Why a cluster's secrets bundle is unusable. The bundle's own errors are
/// carried as text with their quoted values redacted: the value a parser
/// chokes on in a bundle can be a key.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("the Secret does not exist")]
    NoSecret,
    #[error("the Secret has no key {key}")]
    NoKey { key: String },
    #[error("the bundle is not UTF-8 text")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("the bundle cannot be read")]
    Read(#[source] ichor_talos::redact::Redacted),
    #[error("certs.os.crt or certs.os.key is missing or not base64")]
    NoOsCa,
    #[error("no client certificate can be made from the bundle's OS CA")]
    Certificate(#[source] ichor_talos::redact::Redacted),
}

impl BundleError {
    /// `error` and its causes as one cause, its quoted values redacted.
    pub(crate) fn redacted(
        error: &(dyn std::error::Error + 'static),
    ) -> ichor_talos::redact::Redacted {
        ichor_talos::redact::Redacted::of(&ichor_api::error_text::chain(error))
    }
}

/// Why a node's live config cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveConfigError {
    #[error("the config is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    #[error(transparent)]
    Config(#[from] ichor_talos::config::ConfigError),
}

/// Why the webhook's serving certificate Secret is unusable.
#[derive(Debug, thiserror::Error)]
pub enum WebhookCertError {
    #[error("the Secret does not exist")]
    NoSecret,
    #[error("the Secret has no {0}")]
    NoKey(&'static str),
    #[error("tls.crt is not PEM certificates")]
    CertificatePem(#[source] rustls::pki_types::pem::Error),
    #[error("tls.crt holds no certificate")]
    NoCertificate,
    #[error("tls.key is not a PEM private key")]
    KeyPem(#[source] rustls::pki_types::pem::Error),
    #[error("the TLS protocol versions cannot be set")]
    Versions(#[source] rustls::Error),
    #[error("the certificate and key do not make a TLS identity")]
    Identity(#[source] rustls::Error),
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::error_text::chain;

    /// A TalosMachine whose node failed a call says why in its Ready
    /// condition and its Event: their text is the error's chain, and the
    /// message alone names only what failed.
    #[test]
    fn the_text_a_person_reads_keeps_the_node_s_reason() {
        let e = Error::Talos {
            namespace: "prod".into(),
            machine: "w1".into(),
            address: "10.0.0.1".into(),
            source: Box::new(ichor_talos_client::Error::Timeout {
                node: "10.0.0.1".into(),
                call: "Version".into(),
                timeout: Duration::from_secs(10),
            }),
        };
        assert!(!e.to_string().contains("no answer"), "{e}");
        assert_eq!(
            chain(&e),
            "TalosMachine prod/w1: the Talos API of node 10.0.0.1 failed; check that the node is up and spec.address is right: node 10.0.0.1: Version: no answer within 10s"
        );
    }
}
