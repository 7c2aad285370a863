//! Errors of the Talos API client. Every call error names the node and the call.

use std::time::Duration;

/// Errors building TLS material or a connection (before any call is made).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate found in the {what} PEM")]
    NoCertificate { what: &'static str },
    #[error("cannot parse the {what} PEM")]
    Pem {
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("cannot decode the base64 of the {what}")]
    Base64 {
        what: &'static str,
        #[source]
        source: base64::DecodeError,
    },
    #[error("CA certificate rejected")]
    Ca(#[source] rustls::Error),
    #[error("client certificate or key rejected")]
    ClientAuth(#[source] rustls::Error),
    #[error("cannot build the TLS configuration")]
    Config(#[source] rustls::Error),
    #[error(
        "{text:?} is not a certificate fingerprint: give the 44 characters of base64 the node's console shows"
    )]
    FingerprintText { text: String },
    #[error("the server's certificate cannot be parsed: {reason}")]
    Certificate { reason: String },
}

/// A client error. Call errors carry the node (`node`, the value of the `node`
/// gRPC metadata, or the endpoint when the call targets the endpoint itself)
/// and the call (`Version`, `COSI Get MachineConfigs.config.talos.dev/v1alpha1`, …).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid Talos endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("invalid node name {node:?}: {reason}")]
    InvalidNode { node: String, reason: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("node {node}: {call}: no answer within {timeout:?}")]
    Timeout {
        node: String,
        call: String,
        timeout: Duration,
    },
    #[error("node {node}: {call}: {code:?}: {message}")]
    Status {
        node: String,
        call: String,
        code: tonic::Code,
        message: String,
    },
    #[error("node {node}: {call}: the node reported an error: {message}")]
    NodeReported {
        node: String,
        call: String,
        message: String,
    },
    #[error("{endpoint}: no TLS handshake")]
    Handshake {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("node {node}: {call}: the response holds no message")]
    EmptyResponse { node: String, call: String },
    #[error("node {node}: {call}: cannot decode {what}: {reason}")]
    Decode {
        node: String,
        call: String,
        what: String,
        reason: String,
    },
    /// The data a client-streaming call uploads could not be read (the
    /// upload stopped there).
    #[error("node {node}: {call}: reading the data to upload failed")]
    Upload {
        node: String,
        call: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// The node the failed call targeted, if the error comes from a call.
    pub fn node(&self) -> Option<&str> {
        match self {
            Error::Timeout { node, .. }
            | Error::Status { node, .. }
            | Error::NodeReported { node, .. }
            | Error::EmptyResponse { node, .. }
            | Error::Decode { node, .. }
            | Error::Upload { node, .. } => Some(node),
            Error::InvalidNode { node, .. } => Some(node),
            Error::InvalidEndpoint { .. } | Error::Tls(_) | Error::Handshake { .. } => None,
        }
    }

    /// The call that failed, if the error comes from a call.
    pub fn call(&self) -> Option<&str> {
        match self {
            Error::Timeout { call, .. }
            | Error::Status { call, .. }
            | Error::NodeReported { call, .. }
            | Error::EmptyResponse { call, .. }
            | Error::Decode { call, .. }
            | Error::Upload { call, .. } => Some(call),
            _ => None,
        }
    }

    /// The gRPC status code, when the node (or the transport) answered with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the resource asked for does not exist (`NotFound`).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// True when the node refused the caller's role (`PermissionDenied`).
    pub fn is_permission_denied(&self) -> bool {
        self.code() == Some(tonic::Code::PermissionDenied)
    }
}

/// Flattens a tonic status, including its transport source (TLS handshake
/// failures, refused connections), into one readable message.
pub(crate) fn status_message(status: &tonic::Status) -> String {
    let mut message = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

/// A plain-words reading of the TLS and connection failures a transport
/// error carries, put before the raw text.
pub(crate) fn transport_hint(message: &str) -> Option<&'static str> {
    let has = |s: &str| message.contains(s);
    if has("invalid peer certificate") {
        return Some(if has("Expired") {
            "the node's certificate has expired"
        } else if has("NotValidForName") {
            "the node's certificate is not valid for the endpoint address"
        } else {
            "the node's certificate is not signed by the CA in use (wrong talosconfig or cluster?)"
        });
    }
    if has("fatal alert: CertificateExpired") {
        return Some("the node refused the client certificate: it has expired");
    }
    if has("fatal alert: CertificateRequired") {
        return Some("the node requires a client certificate");
    }
    if has("fatal alert: DecryptError")
        || has("fatal alert: BadCertificate")
        || has("fatal alert: UnknownCA")
        || has("fatal alert: CertificateUnknown")
        || has("fatal alert: UnsupportedCertificate")
    {
        return Some(
            "the node refused the client certificate (not signed by the node's CA, or its extended key usage is not exactly ClientAuth)",
        );
    }
    if has("connection closed") || has("Connection reset") {
        return Some(
            "the node closed the connection (a node refusing the client certificate does this too)",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::transport_hint;

    #[test]
    fn tls_failures_get_plain_words() {
        assert!(
            transport_hint("invalid peer certificate: BadSignature")
                .unwrap()
                .contains("not signed by the CA")
        );
        assert!(
            transport_hint("received fatal alert: CertificateExpired")
                .unwrap()
                .contains("expired")
        );
        assert!(
            transport_hint("received fatal alert: DecryptError")
                .unwrap()
                .contains("refused the client certificate")
        );
        assert_eq!(transport_hint("deadline exceeded"), None);
    }
}
