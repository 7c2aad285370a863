//! HTTPS by default: the certificate from files is served, and a rotated one
//! is served without a restart; without files a self-signed one is made; the
//! deprecated plain-HTTP port answers only when opted in.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ichor_ui::{Listeners, TlsFiles};
use rustls::pki_types::{CertificateDer, ServerName};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A certificate for localhost: (cert PEM, key PEM, cert DER).
fn cert() -> (String, String, CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    (
        made.cert.pem(),
        made.signing_key.serialize_pem(),
        made.cert.der().clone(),
    )
}

/// Whether a TLS handshake with the server succeeds when only `trusted` is trusted.
async fn serves(port: u16, trusted: &CertificateDer<'static>) -> bool {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .is_ok()
}

/// Polls `f` until it is true; a bound that turns a hang into a failure
/// (the reload period is 10 s).
async fn wait_until<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let (bound, every) = (Duration::from_secs(60), Duration::from_millis(100));
    ichor_testenv::wait::until(what, bound, every, f)
        .await
        .unwrap();
}

fn app() -> Router {
    Router::new().route("/healthz", get(|| async { "ok" }))
}

/// Covers: R12.1 (TLS from a Secret's files, rotated without restart), R5.3 ichorUI.tls
#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let files = ichor_ui::tls::files_in(dir.path());
    let (first_pem, first_key, first_der) = cert();
    std::fs::write(&files.cert, &first_pem).unwrap();
    std::fs::write(&files.key, &first_key).unwrap();
    let port = free_port();
    let listeners = Listeners {
        https: format!("127.0.0.1:{port}").parse().unwrap(),
        tls: Some(files.clone()),
        plaintext: None,
    };
    let server = tokio::spawn(ichor_ui::tls::serve(app(), listeners));
    wait_until("the first certificate", || serves(port, &first_der)).await;

    // The Secret is updated in place (as the kubelet does): the new
    // certificate is served by the same process.
    let (second_pem, second_key, second_der) = cert();
    assert!(!serves(port, &second_der).await);
    std::fs::write(&files.key, &second_key).unwrap();
    std::fs::write(&files.cert, &second_pem).unwrap();
    wait_until("the rotated certificate", || serves(port, &second_der)).await;
    assert!(
        !serves(port, &first_der).await,
        "the old certificate is gone"
    );
    assert!(!server.is_finished(), "the server kept running");
    server.abort();
}

/// Covers: R12.1 (a self-signed certificate without files; plaintext only when opted in)
#[tokio::test]
async fn self_signed_by_default_and_plaintext_only_when_asked() {
    let port = free_port();
    let plain = free_port();
    let listeners = Listeners {
        https: format!("127.0.0.1:{port}").parse().unwrap(),
        tls: None,
        plaintext: Some(format!("127.0.0.1:{plain}").parse().unwrap()),
    };
    let server = tokio::spawn(ichor_ui::tls::serve(app(), listeners));
    // A handshake happens (the certificate is its own, so an unrelated
    // trust store refuses it: it is not a fixed certificate shipped in the binary).
    let (_, _, unrelated) = cert();
    wait_until("the HTTPS listener", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    assert!(!serves(port, &unrelated).await);
    wait_until("the plain-HTTP listener", || async {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", plain)).await else {
            return false;
        };
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.starts_with("HTTP/1.1 200") && out.ends_with("ok")
    })
    .await;
    server.abort();

    // Missing files: the error names them and says what to do.
    let dir = tempfile::tempdir().unwrap();
    let listeners = Listeners {
        https: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        tls: Some(TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: None,
        }),
        plaintext: None,
    };
    let err = ichor_ui::tls::serve(app(), listeners).await.unwrap_err();
    assert!(err.to_string().contains("tls.crt"), "{err}");
    assert!(err.to_string().contains("mount the Secret"), "{err}");
}
