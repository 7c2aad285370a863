//! Connecting to apid: endpoints as talosctl reads them, TCP + TLS to the
//! first endpoint that answers, and the constructors of [`TalosClient`]
//! for each kind of TLS (mutual, maintenance, pinned maintenance).

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tonic::transport::Endpoint;

use crate::error::Error;
use crate::tls::{self, ClientIdentity};

use super::{APID_PORT, ClientOptions, TalosClient};

/// Splits `host[:port]` (IPv6 in brackets when a port is given) and adds apid's port.
fn parse_endpoint(endpoint: &str) -> Result<(String, u16), Error> {
    let invalid = |reason: &str| Error::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = endpoint.trim();
    // URL-style endpoints are reduced to an address, as talosctl does.
    let without_scheme = match trimmed.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.trim_end_matches('/');
            if scheme == "https" && !rest.contains(':') {
                return Ok((rest.to_string(), 443));
            }
            rest
        }
        None => trimmed,
    };
    if without_scheme.is_empty() {
        return Err(invalid("empty"));
    }
    if let Ok(ip) = without_scheme.parse::<IpAddr>() {
        return Ok((ip.to_string(), APID_PORT));
    }
    if let Some(rest) = without_scheme.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| invalid("unclosed '['"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| invalid("bad port"))?,
            None if after.is_empty() => APID_PORT,
            None => return Err(invalid("junk after ']'")),
        };
        return Ok((host.to_string(), port));
    }
    match without_scheme.rsplit_once(':') {
        Some((host, port)) => {
            let port = port.parse().map_err(|_| invalid("bad port"))?;
            if host.is_empty() {
                return Err(invalid("empty host"));
            }
            Ok((host.to_string(), port))
        }
        None => Ok((without_scheme.to_string(), APID_PORT)),
    }
}

type TlsIo = TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

async fn connect_one(
    config: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
) -> std::io::Result<TlsIo> {
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    let server_name = ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await?;
    Ok(TokioIo::new(tls))
}

/// Connects to the first endpoint that completes TCP + TLS, starting from the
/// one that worked last (talosctl spreads over endpoints the same way: any
/// control-plane endpoint can forward to any node).
fn connector(
    config: Arc<rustls::ClientConfig>,
    targets: Arc<Vec<(String, u16)>>,
    attempt_timeout: Duration,
) -> impl tower::Service<
    http::Uri,
    Response = TlsIo,
    Error = std::io::Error,
    Future = impl Future<Output = Result<TlsIo, std::io::Error>> + Send,
> + Clone
+ Send
+ 'static {
    let last_good = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tower::service_fn(move |_uri: http::Uri| {
        let config = Arc::clone(&config);
        let targets = Arc::clone(&targets);
        let last_good = Arc::clone(&last_good);
        async move {
            use std::sync::atomic::Ordering;
            let n = targets.len();
            let start = last_good.load(Ordering::Relaxed) % n.max(1);
            let mut last_err = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no endpoint");
            for k in 0..n {
                let i = (start + k) % n;
                let (host, port) = &targets[i];
                match tokio::time::timeout(
                    attempt_timeout,
                    connect_one(Arc::clone(&config), host, *port),
                )
                .await
                {
                    Ok(Ok(io)) => {
                        last_good.store(i, Ordering::Relaxed);
                        return Ok(io);
                    }
                    Ok(Err(e)) => {
                        last_err = if n == 1 {
                            e
                        } else {
                            std::io::Error::new(e.kind(), format!("{host}:{port}: {e}"))
                        };
                    }
                    Err(_) => {
                        last_err = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("{host}:{port}: no TLS connection within {attempt_timeout:?}"),
                        );
                    }
                }
            }
            Err(last_err)
        }
    })
}

/// The fingerprint of the certificate the server at `endpoint` presents,
/// read with one TLS handshake that sends no request and no client
/// certificate: what a maintenance node's console shows, to be compared and
/// then pinned ([`TalosClient::maintenance_pinned`]).
pub async fn server_fingerprint(
    endpoint: &str,
    timeout: Duration,
) -> Result<tls::CertFingerprint, Error> {
    let (host, port) = parse_endpoint(endpoint)?;
    let seen = Arc::new(std::sync::Mutex::new(None));
    let config = Arc::new(tls::recording_maintenance_client_config(Arc::clone(&seen))?);
    let handshake = |source| Error::Handshake {
        endpoint: endpoint.to_string(),
        source,
    };
    match tokio::time::timeout(timeout, connect_one(config, &host, port)).await {
        Err(_) => Err(Error::Timeout {
            node: endpoint.to_string(),
            call: "TLS handshake".to_string(),
            timeout,
        }),
        Ok(Err(e)) => Err(handshake(e)),
        Ok(Ok(_)) => seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| handshake(std::io::Error::other("the server sent no certificate"))),
    }
}

impl TalosClient {
    /// A client for `endpoint` (`host`, `host:port`, `[v6]:port`; port 50000
    /// when absent) with mutual TLS. Connects lazily: connection failures
    /// surface on the first call, named by node and call.
    pub fn new(
        endpoint: &str,
        identity: &ClientIdentity,
        options: ClientOptions,
    ) -> Result<Self, Error> {
        let config = tls::client_config(identity)?;
        Self::with_tls(endpoint, config, options)
    }

    /// A maintenance-mode client (talosctl `--insecure`): the server
    /// certificate is not verified and no client certificate is sent.
    pub fn maintenance(endpoint: &str, options: ClientOptions) -> Result<Self, Error> {
        let config = tls::maintenance_client_config()?;
        Self::with_tls(endpoint, config, options)
    }

    /// A maintenance-mode client that accepts only a server certificate whose
    /// fingerprint is one of `pins` (talosctl `--insecure --cert-fingerprint`):
    /// against another certificate every call fails in the TLS handshake,
    /// before anything is sent.
    pub fn maintenance_pinned(
        endpoint: &str,
        pins: &[tls::CertFingerprint],
        options: ClientOptions,
    ) -> Result<Self, Error> {
        let config = tls::pinned_maintenance_client_config(pins)?;
        Self::with_tls(endpoint, config, options)
    }

    /// A client with a caller-made rustls configuration (ALPN `h2` is enforced).
    pub fn with_tls(
        endpoint: &str,
        config: rustls::ClientConfig,
        options: ClientOptions,
    ) -> Result<Self, Error> {
        Self::with_tls_endpoints(&[endpoint.to_string()], config, options)
    }

    /// A mutual-TLS client over several endpoints (a talosconfig context's
    /// `endpoints`): each connection goes to the first endpoint that answers,
    /// starting from the one that worked last.
    pub fn with_endpoints(
        endpoints: &[String],
        identity: &ClientIdentity,
        options: ClientOptions,
    ) -> Result<Self, Error> {
        let config = tls::client_config(identity)?;
        Self::with_tls_endpoints(endpoints, config, options)
    }

    /// [`Self::with_endpoints`] with a caller-made rustls configuration.
    pub fn with_tls_endpoints(
        endpoints: &[String],
        mut config: rustls::ClientConfig,
        options: ClientOptions,
    ) -> Result<Self, Error> {
        let targets = endpoints
            .iter()
            .map(|e| parse_endpoint(e))
            .collect::<Result<Vec<_>, _>>()?;
        let Some((host, port)) = targets.first().cloned() else {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoint given".to_string(),
            });
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let show = |h: &str, p: u16| {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        };
        let label = targets
            .iter()
            .map(|(h, p)| show(h, *p))
            .collect::<Vec<_>>()
            .join(",");
        // The URI only names the channel: the connector picks the endpoint.
        let uri = format!("http://{}", show(&host, port));
        let config = Arc::new(config);
        let attempts = u32::try_from(targets.len()).unwrap_or(u32::MAX);
        let channel = Endpoint::from_shared(uri)
            .map_err(|e| Error::InvalidEndpoint {
                endpoint: label.clone(),
                reason: e.to_string(),
            })?
            .connect_timeout(options.connect_timeout.saturating_mul(attempts))
            .timeout(options.call_timeout)
            .connect_with_connector_lazy(connector(
                Arc::clone(&config),
                Arc::new(targets),
                options.connect_timeout,
            ));
        Ok(Self {
            endpoint: label,
            channel,
            tls: config,
            host,
            port,
            options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_apid_port() {
        assert_eq!(
            parse_endpoint("10.0.0.1").unwrap(),
            ("10.0.0.1".into(), 50000)
        );
        assert_eq!(
            parse_endpoint("10.0.0.1:123").unwrap(),
            ("10.0.0.1".into(), 123)
        );
        assert_eq!(parse_endpoint("node-1").unwrap(), ("node-1".into(), 50000));
        assert_eq!(
            parse_endpoint("fd00::1").unwrap(),
            ("fd00::1".into(), 50000)
        );
        assert_eq!(
            parse_endpoint("[fd00::1]:7").unwrap(),
            ("fd00::1".into(), 7)
        );
        assert_eq!(
            parse_endpoint("https://cp.example").unwrap(),
            ("cp.example".into(), 443)
        );
        assert_eq!(
            parse_endpoint("https://cp.example:6443").unwrap(),
            ("cp.example".into(), 6443)
        );
        assert!(parse_endpoint("").is_err());
        assert!(parse_endpoint("host:notaport").is_err());
    }
}
