//! TLS material for the Talos API: the OS CA, the client certificate and its
//! key (Ed25519 under Talos's `ED25519 PRIVATE KEY` PEM label), turned into a
//! rustls client configuration with ALPN `h2` (grpc-go servers refuse TLS
//! connections without ALPN).

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore,
    SignatureScheme,
};

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
        .map_err(|source| TlsError::Pem { what, source })?;
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
    PrivateKeyDer::from_pem_slice(relabelled.as_bytes()).map_err(|source| TlsError::Pem {
        what: "private key",
        source,
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
    insecure_config(None, None)
}

/// [`maintenance_client_config`] that accepts only a server certificate
/// whose fingerprint is one of `pins` (talosctl `--insecure
/// --cert-fingerprint`): another certificate fails the handshake, before
/// any request is sent.
pub fn pinned_maintenance_client_config(
    pins: &[CertFingerprint],
) -> Result<ClientConfig, TlsError> {
    insecure_config(Some(pins.to_vec()), None)
}

/// [`maintenance_client_config`] that records the fingerprint of the
/// certificate the server presents.
pub(crate) fn recording_maintenance_client_config(
    seen: Arc<Mutex<Option<CertFingerprint>>>,
) -> Result<ClientConfig, TlsError> {
    insecure_config(None, Some(seen))
}

fn insecure_config(
    pins: Option<Vec<CertFingerprint>>,
    seen: Option<Arc<Mutex<Option<CertFingerprint>>>>,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let verifier = MaintenanceServerCert {
        provider: provider.clone(),
        pins,
        seen,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The fingerprint of a Talos API server certificate as Talos prints it for
/// its maintenance API (the node's console: "server certificate
/// fingerprint") and as `talosctl --cert-fingerprint` takes it: the SHA-256
/// of the certificate's SubjectPublicKeyInfo, in standard base64
/// (siderolabs/crypto `x509.SPKIFingerprint`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CertFingerprint([u8; 32]);

impl CertFingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of_certificate(der: &[u8]) -> Result<Self, TlsError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::Certificate {
                reason: e.to_string(),
            })?;
        Ok(Self::of_public_key_info(cert.public_key().raw))
    }

    /// The fingerprint of a DER SubjectPublicKeyInfo.
    pub fn of_public_key_info(spki: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, spki);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        Self(out)
    }

    /// Parses the base64 text a node's console shows (44 characters).
    pub fn parse(text: &str) -> Result<Self, TlsError> {
        let bad = || TlsError::FingerprintText {
            text: text.to_string(),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| bad())?;
        Ok(Self(bytes.try_into().map_err(|_| bad())?))
    }
}

impl std::fmt::Display for CertFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&base64::engine::general_purpose::STANDARD.encode(self.0))
    }
}

impl std::fmt::Debug for CertFingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CertFingerprint({self})")
    }
}

impl std::str::FromStr for CertFingerprint {
    type Err = TlsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A server presented a certificate other than the pinned one(s).
#[derive(thiserror::Error)]
#[error(
    "the server presents certificate fingerprint {presented}, not {}",
    .expected.iter().map(ToString::to_string).collect::<Vec<_>>().join(" or ")
)]
pub struct FingerprintMismatch {
    pub presented: CertFingerprint,
    pub expected: Vec<CertFingerprint>,
}

// rustls shows a certificate error with `Debug`: the sentence, not the fields.
impl std::fmt::Debug for FingerprintMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The maintenance API's verifier: no chain is checked (the node's
/// certificate is self-signed), but the handshake signatures are, and with
/// pins only the pinned certificates pass.
#[derive(Debug)]
struct MaintenanceServerCert {
    provider: Arc<CryptoProvider>,
    /// Accept only these; any certificate when `None`.
    pins: Option<Vec<CertFingerprint>>,
    /// Where the presented certificate's fingerprint is recorded.
    seen: Option<Arc<Mutex<Option<CertFingerprint>>>>,
}

impl ServerCertVerifier for MaintenanceServerCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.pins.is_none() && self.seen.is_none() {
            return Ok(ServerCertVerified::assertion());
        }
        let presented = CertFingerprint::of_certificate(end_entity.as_ref())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if let Some(seen) = &self.seen {
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(presented);
        }
        match &self.pins {
            Some(pins) if !pins.contains(&presented) => Err(rustls::Error::InvalidCertificate(
                CertificateError::Other(OtherError(Arc::new(FingerprintMismatch {
                    presented,
                    expected: pins.clone(),
                }))),
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
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

    /// Talos's format: the SHA-256 of the certificate's public key info in
    /// standard base64, computed here from the key rcgen made, independently
    /// of the certificate parser.
    #[test]
    fn the_fingerprint_is_talos_spki_sha256_in_base64() {
        use base64::Engine as _;
        use rcgen::PublicKeyData as _;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["node".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let spki = key.subject_public_key_info();
        let expected = base64::engine::general_purpose::STANDARD
            .encode(ring::digest::digest(&ring::digest::SHA256, &spki));
        let fp = CertFingerprint::of_certificate(cert.der()).unwrap();
        assert_eq!(fp.to_string(), expected);
        assert_eq!(expected.len(), 44);
        assert_eq!(CertFingerprint::parse(&expected).unwrap(), fp);
        assert_eq!(
            format!(" {expected}\n").parse::<CertFingerprint>().unwrap(),
            fp
        );
        for bad in ["", "nope", "AAAA", &expected[..40]] {
            let err = CertFingerprint::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("not a certificate fingerprint"),
                "{err}"
            );
        }
        assert!(CertFingerprint::of_certificate(b"not a certificate").is_err());
    }

    /// Pinned, only the pinned certificate passes; the refusal names both
    /// fingerprints. Unpinned, any certificate passes.
    ///
    /// Covers: R10.1
    #[test]
    fn a_pinned_verifier_refuses_another_certificate() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["node".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = CertificateDer::from(cert.der().to_vec());
        let right = CertFingerprint::of_certificate(&der).unwrap();
        let wrong = CertFingerprint::of_public_key_info(b"another key");
        let verify = |pins: Option<Vec<CertFingerprint>>| {
            let seen = Arc::new(Mutex::new(None));
            let verifier = MaintenanceServerCert {
                provider: provider(),
                pins,
                seen: Some(Arc::clone(&seen)),
            };
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let result = verifier.verify_server_cert(&der, &[], &name, &[], UnixTime::now());
            (result, seen.lock().unwrap().take())
        };
        let (ok, seen) = verify(Some(vec![wrong, right]));
        assert!(ok.is_ok());
        assert_eq!(seen, Some(right));
        let (refused, _) = verify(Some(vec![wrong]));
        let text = refused.unwrap_err().to_string();
        assert!(
            text.contains(&format!(
                "presents certificate fingerprint {right}, not {wrong}"
            )),
            "{text}"
        );
        assert!(verify(None).0.is_ok());
        assert!(pinned_maintenance_client_config(&[right]).is_ok());
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
