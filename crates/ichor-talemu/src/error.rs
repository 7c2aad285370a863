//! Errors of the emulator.

/// An emulator error (setup, certificates, listening).
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("TLS material: {0}")]
    TlsMaterial(#[from] ichor_talos_client::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid machine config for node {node}: {reason}")]
    Config { node: String, reason: String },
    #[error("invalid Talos version {version:?}: expected vMAJOR.MINOR.PATCH")]
    Version { version: String },
    #[error("private key: {0}")]
    Key(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}
