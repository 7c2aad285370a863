//! The TLS listener of an emulated node: mutual TLS with apid's rules (ALPN
//! `h2`, client certificates required and verified against the CA, client
//! leaf EKU exactly `[ClientAuth]`), or the insecure maintenance-mode
//! listener while the node has no config.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DistinguishedName, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use ichor_talos_client::proto::cosi::resource::state_server::StateServer;
use ichor_talos_client::proto::machine::image_service_server::ImageServiceServer;
use ichor_talos_client::proto::machine::lifecycle_service_server::LifecycleServiceServer;
use ichor_talos_client::tls as ctls;

use crate::EmuError;
use crate::api::NodeApi;
use crate::api::router::{MachineRouter, NotEmulatedLayer};
use crate::pki::CertifiedKey;
use crate::wire::time::time_service_server::TimeServiceServer;

/// Wraps the WebPKI client verifier with apid's extra check: every
/// non-CA certificate of the chain has ExtKeyUsage exactly `[ClientAuth]`.
#[derive(Debug)]
struct ApidClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

fn eku_is_client_auth_only(der: &[u8]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    if cert.is_ca() {
        return true;
    }
    match cert.extended_key_usage() {
        Ok(Some(eku)) => {
            let e = eku.value;
            e.client_auth
                && !e.server_auth
                && !e.any
                && !e.code_signing
                && !e.email_protection
                && !e.time_stamping
                && !e.ocsp_signing
                && e.other.is_empty()
        }
        _ => false,
    }
}

impl ClientCertVerifier for ApidClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let chain = std::iter::once(end_entity).chain(intermediates.iter());
        for cert in chain {
            if !eku_is_client_auth_only(cert.as_ref()) {
                return Err(rustls::Error::General(
                    "certificate is missing the client auth extended key usage".to_string(),
                ));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// apid's server TLS configuration for a configured node.
pub(crate) fn mtls_config(ca_pem: &str, server: &CertifiedKey) -> Result<ServerConfig, EmuError> {
    let provider = ctls::provider();
    let mut roots = RootCertStore::empty();
    for cert in ctls::parse_certificates(ca_pem.as_bytes(), "CA")? {
        roots.add(cert)?;
    }
    let inner =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
    let verifier = Arc::new(ApidClientVerifier { inner });
    let certs = ctls::parse_certificates(server.cert_pem.as_bytes(), "server certificate")?;
    let key = ctls::parse_private_key(server.key_pem.as_bytes())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// The maintenance-mode TLS configuration: a self-signed certificate, no client certificate.
pub(crate) fn maintenance_config(server: &CertifiedKey) -> Result<ServerConfig, EmuError> {
    let provider = ctls::provider();
    let certs = ctls::parse_certificates(server.cert_pem.as_bytes(), "server certificate")?;
    let key = ctls::parse_private_key(server.key_pem.as_bytes())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Binds a node's listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, EmuError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| EmuError::Listen { addr, source })
}

/// Serves one node until `shutdown` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    api: NodeApi,
    mtls: Arc<ServerConfig>,
    maintenance: Arc<ServerConfig>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<
        Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::io::Error>,
    >(64);
    let node = api.cluster.nodes.get(api.me);
    let mut accept_shutdown = shutdown.clone();
    let acceptor_task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = accept_shutdown.changed() => return,
            };
            let Ok((tcp, _peer)) = accepted else {
                continue;
            };
            if node.is_down() {
                drop(tcp);
                continue;
            }
            let _ = tcp.set_nodelay(true);
            let config = if node.in_maintenance() {
                Arc::clone(&maintenance)
            } else {
                node.lock()
                    .mtls
                    .clone()
                    .unwrap_or_else(|| Arc::clone(&mtls))
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                match TlsAcceptor::from(config).accept(tcp).into_fallible().await {
                    Ok(tls) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Err((e, mut tcp)) => {
                        tracing::debug!(error = %ichor_api::error_text::chain(&e), "TLS handshake refused");
                        // Read what the client already sent before closing, so the
                        // close is a FIN, not a RST that would swallow the alert.
                        use tokio::io::AsyncReadExt as _;
                        let mut sink = [0u8; 4096];
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                            while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                        })
                        .await;
                    }
                }
            });
        }
    });
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let result = tonic::transport::Server::builder()
        .layer(NotEmulatedLayer)
        .add_service(MachineRouter::new(api.clone()))
        .add_service(ImageServiceServer::new(api.clone()))
        .add_service(LifecycleServiceServer::new(api.clone()))
        .add_service(TimeServiceServer::new(api.clone()))
        .add_service(StateServer::new(api))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.changed().await;
        })
        .await;
    if let Err(e) = result {
        tracing::warn!(error = %ichor_api::error_text::chain(&e), "emulated node server stopped");
    }
    acceptor_task.abort();
}
