//! Errors of the emulator.

/// An emulator error (setup, certificates, listening).
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    #[error("cannot make a certificate or key")]
    Cert(#[from] rcgen::Error),
    #[error("cannot build the TLS configuration")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error(transparent)]
    TlsMaterial(#[from] ichor_talos_client::TlsError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid machine config for node {node}")]
    Config {
        node: String,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("cannot make a Talos API client for node {node}")]
    Client {
        node: String,
        #[source]
        source: ichor_talos_client::Error,
    },
    #[error("invalid Talos version for node {node}")]
    Version {
        node: String,
        #[source]
        source: ichor_talos::version::VersionError,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("cannot write YAML")]
    Yaml(#[from] serde_yaml_ng::Error),
}
