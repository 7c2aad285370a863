//! Serving: HTTPS by default (rustls), with the certificate from files (a
//! mounted Secret) that are read again when they change, so a rotated
//! certificate is served without a restart; or, without files, a self-signed
//! certificate made at start (with a warning). Plain HTTP only on an opt-in,
//! deprecated second port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum_server::tls_rustls::RustlsConfig;

/// How often the certificate files are checked for a new certificate.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The certificate and key files (PEM), as a kubernetes.io/tls Secret mounts them.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA bundle that issued the certificate, served after it (the chain).
    pub ca: Option<PathBuf>,
}

/// What can go wrong serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "cannot read the UI's TLS certificate {cert} and key {key}; mount the Secret (tls.crt and tls.key) there, or leave --tls-cert unset for a self-signed certificate"
    )]
    Certificate {
        cert: PathBuf,
        key: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make a self-signed certificate for the UI")]
    SelfSigned(#[from] rcgen::Error),
    #[error("the UI cannot listen on {addr}; choose another port with --listen")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "--lab-anonymous-read needs every listener on a loopback address, but {addr} is not: anonymous access is for the local lab only"
    )]
    AnonymousOffLoopback { addr: SocketAddr },
}

/// A self-signed certificate and key (PEM) for `names`.
pub fn self_signed(names: &[String]) -> Result<(String, String), rcgen::Error> {
    let made = rcgen::generate_simple_self_signed(names.to_vec())?;
    Ok((made.cert.pem(), made.signing_key.serialize_pem()))
}

async fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), ServeError> {
    let read = |p: PathBuf| async move { tokio::fs::read(&p).await };
    let cert = read(files.cert.clone()).await;
    let key = read(files.key.clone()).await;
    let ca = match &files.ca {
        Some(p) => read(p.clone()).await.map(Some),
        None => Ok(None),
    };
    match (cert, key, ca) {
        (Ok(mut c), Ok(k), Ok(ca)) => {
            if let Some(ca) = ca {
                c.push(b'\n');
                c.extend_from_slice(&ca);
            }
            Ok((c, k))
        }
        (Err(source), _, _) | (_, Err(source), _) | (_, _, Err(source)) => {
            Err(ServeError::Certificate {
                cert: files.cert.clone(),
                key: files.key.clone(),
                source,
            })
        }
    }
}

/// The rustls config of the HTTPS listener; with files, a task reloads it
/// whenever their content changes.
pub async fn rustls_config(tls: Option<&TlsFiles>) -> Result<RustlsConfig, ServeError> {
    // Several crates bring rustls providers; the UI uses ring, like the rest of Ichor.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(files) = tls else {
        tracing::warn!(
            "no TLS certificate given (--tls-cert/--tls-key): serving HTTPS with a self-signed certificate made now; browsers will warn. Mount a certificate Secret for real use"
        );
        let (cert, key) = self_signed(&["localhost".into(), "127.0.0.1".into(), "::1".into()])?;
        return RustlsConfig::from_pem(cert.into_bytes(), key.into_bytes())
            .await
            .map_err(|source| ServeError::Certificate {
                cert: "(self-signed)".into(),
                key: "(self-signed)".into(),
                source,
            });
    };
    let (cert, key) = read_pair(files).await?;
    let config = RustlsConfig::from_pem(cert.clone(), key.clone())
        .await
        .map_err(|source| ServeError::Certificate {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    let reloading = config.clone();
    let files = files.clone();
    tokio::spawn(async move {
        let mut current = (cert, key);
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            let Ok(next) = read_pair(&files).await else {
                continue;
            };
            if next == current {
                continue;
            }
            match reloading
                .reload_from_pem(next.0.clone(), next.1.clone())
                .await
            {
                Ok(()) => {
                    tracing::info!(cert = %files.cert.display(), "serving the rotated TLS certificate");
                    current = next;
                }
                // Half-written files during a Secret update: try again next round.
                Err(e) => {
                    tracing::warn!(cert = %files.cert.display(), error = %ichor_api::error_text::chain(&e), "the new TLS certificate cannot be used yet")
                }
            }
        }
    });
    Ok(config)
}

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct Listeners {
    /// The HTTPS address (port 8443 by default).
    pub https: SocketAddr,
    pub tls: Option<TlsFiles>,
    /// The deprecated plain-HTTP address, when opted in.
    pub plaintext: Option<SocketAddr>,
}

impl Listeners {
    /// Every address served.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        std::iter::once(self.https).chain(self.plaintext).collect()
    }
}

/// Checks the lab's anonymous mode is only on loopback.
pub fn check_anonymous(listeners: &Listeners) -> Result<(), ServeError> {
    match listeners
        .addresses()
        .into_iter()
        .find(|a| !a.ip().is_loopback())
    {
        Some(addr) => Err(ServeError::AnonymousOffLoopback { addr }),
        None => Ok(()),
    }
}

/// Serves `app` until an error.
pub async fn serve(app: Router, listeners: Listeners) -> Result<(), ServeError> {
    let config = rustls_config(listeners.tls.as_ref()).await?;
    let https = listeners.https;
    let std_listener = std::net::TcpListener::bind(https).map_err(|source| ServeError::Listen {
        addr: https,
        source,
    })?;
    let _ = std_listener.set_nonblocking(true);
    tracing::info!("Ichor UI on https://{https}");
    let tls_server = axum_server::from_tcp_rustls(std_listener, config)
        .map_err(|source| ServeError::Listen {
            addr: https,
            source,
        })?
        .serve(
            app.clone()
                .into_make_service_with_connect_info::<SocketAddr>(),
        );
    let plain = async {
        let Some(addr) = listeners.plaintext else {
            return std::future::pending::<Result<(), ServeError>>().await;
        };
        tracing::warn!(
            "plain HTTP on {addr} is deprecated (ichorUI.plaintextPort): tokens and pages cross the network unencrypted, and browsers drop the Secure session cookie; use HTTPS on the UI port"
        );
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { addr, source })?;
        // Marked, so its session cookie has the name browsers keep over http.
        let plain_app = app.clone().layer(axum::Extension(crate::server::Plaintext));
        axum::serve(
            listener,
            plain_app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .map_err(|source| ServeError::Listen { addr, source })
    };
    tokio::select! {
        r = tls_server => r.map_err(|source| ServeError::Listen { addr: https, source }),
        r = plain => r,
    }
}

/// A path helper for tests and the CLI: the pair of files in one folder.
pub fn files_in(dir: &Path) -> TlsFiles {
    TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca: None,
    }
}
