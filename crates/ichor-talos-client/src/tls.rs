//! TLS material for the Talos API: the OS CA, the client certificate and its
//! key (Ed25519 under Talos's `ED25519 PRIVATE KEY` PEM label), turned into a
//! rustls client configuration with ALPN `h2` (grpc-go servers refuse TLS
//! connections without ALPN).

use std::sync::Arc;

use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::TlsError;

/// The PEM label Talos (siderolabs/crypto) writes Ed25519 PKCS#8 keys under.
pub const TALOS_ED25519_KEY_LABEL: &str = "ED25519 PRIVATE KEY";

/// What a mutual-TLS connection to apid needs: the CA that signed the node's
/// server certificate, and the client certificate and key (all PEM).
#[derive(Clone)]
pub struct ClientIdentity {
    ca_pem: Vec<u8>,
    crt_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("crt_pem", &format_args!("{} bytes", self.crt_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl ClientIdentity {
    /// From PEM bytes: the CA certificate(s), the client certificate and its key.
    pub fn from_pem(
        ca_pem: impl Into<Vec<u8>>,
        crt_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            crt_pem: crt_pem.into(),
            key_pem: key_pem.into(),
        }
    }

    /// From a talosconfig context's `ca`, `crt` and `key` values (standard
    /// base64 of the PEM bytes).
    pub fn from_talosconfig_base64(ca: &str, crt: &str, key: &str) -> Result<Self, TlsError> {
        let decode = |what: &'static str, v: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .map_err(|source| TlsError::Base64 { what, source })
        };
        Ok(Self::from_pem(
            decode("CA (ca)", ca)?,
            decode("client certificate (crt)", crt)?,
            decode("client key (key)", key)?,
        ))
    }

    /// The CA PEM.
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }
}

/// Parses every certificate of a PEM bundle.
pub fn parse_certificates(
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { what });
    }
    Ok(certs)
}

/// Parses a private key PEM, accepting Talos's `ED25519 PRIVATE KEY` label
/// (its body is plain PKCS#8, so it is re-labelled `PRIVATE KEY` first).
pub fn parse_private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    let text = String::from_utf8_lossy(pem);
    let relabelled = text.replace(TALOS_ED25519_KEY_LABEL, "PRIVATE KEY");
    PrivateKeyDer::from_pem_slice(relabelled.as_bytes()).map_err(|e| TlsError::Pem {
        what: "private key",
        reason: e.to_string(),
    })
}

/// The crypto provider the client uses (ring), independent of any process default.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration for mutual TLS to apid, with ALPN `h2` and
/// hostname verification against the endpoint (as talosctl does).
pub fn client_config(identity: &ClientIdentity) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in parse_certificates(&identity.ca_pem, "CA")? {
        roots.add(cert).map_err(TlsError::Ca)?;
    }
    let certs = parse_certificates(&identity.crt_pem, "client certificate")?;
    let key = parse_private_key(&identity.key_pem)?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(TlsError::ClientAuth)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A rustls client configuration for Talos maintenance mode: the server
/// certificate is not checked and no client certificate is sent (talosctl
/// `--insecure`). Use only for machines that have no configuration yet.
pub fn maintenance_client_config() -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert { provider }))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Accepts any server certificate but still checks the handshake signatures.
#[derive(Debug)]
struct AcceptAnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ed25519_pair() -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "os:admin");
        let cert = params.self_signed(&key).unwrap();
        (
            cert.pem(),
            key.serialize_pem()
                .replace("PRIVATE KEY", TALOS_ED25519_KEY_LABEL),
        )
    }

    #[test]
    fn talos_ed25519_label_is_accepted() {
        let (_, key) = ed25519_pair();
        assert!(key.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
        let parsed = parse_private_key(key.as_bytes()).unwrap();
        assert!(matches!(parsed, PrivateKeyDer::Pkcs8(_)));
    }

    #[test]
    fn client_config_has_alpn_h2() {
        let (cert, key) = ed25519_pair();
        let identity = ClientIdentity::from_pem(cert.clone(), cert, key);
        let config = client_config(&identity).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
        let insecure = maintenance_client_config().unwrap();
        assert_eq!(insecure.alpn_protocols, vec![b"h2".to_vec()]);
    }

    #[test]
    fn talosconfig_base64_round_trip_and_errors() {
        use base64::Engine as _;
        let (cert, key) = ed25519_pair();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let id =
            ClientIdentity::from_talosconfig_base64(&b64(&cert), &b64(&cert), &b64(&key)).unwrap();
        assert_eq!(id.ca_pem(), cert.as_bytes());
        let err =
            ClientIdentity::from_talosconfig_base64("!!", &b64(&cert), &b64(&key)).unwrap_err();
        assert!(err.to_string().contains("CA (ca)"), "{err}");
    }

    #[test]
    fn missing_ca_is_a_clear_error() {
        let (cert, key) = ed25519_pair();
        let identity = ClientIdentity::from_pem("not a pem", cert, key);
        let err = client_config(&identity).unwrap_err();
        assert_eq!(err.to_string(), "no certificate found in the CA PEM");
        // The key never shows in Debug output.
        assert!(format!("{identity:?}").contains("<redacted>"));
    }
}
