//! Connecting to apid: endpoints as talosctl reads them, TCP + TLS to the
//! first endpoint that answers, and the constructors of [`TalosClient`]
//! for each kind of TLS (mutual, maintenance, pinned maintenance).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use ichor_api::endpoint::Endpoint as Address;
use rustls::pki_types::ServerName;
use tonic::transport::Endpoint;

use crate::error::Error;
use crate::tls::{self, ClientIdentity};

use super::{APID_PORT, ClientOptions, TalosClient};

/// An endpoint as talosctl's `--endpoints` take it: `host`, `host:port`, an
/// IPv6 address bare or `[v6]:port` (apid's port when none is written), or
/// `https://host[:port][/]` (443 when none is written). Surrounding spaces
/// are dropped, as a talosconfig's YAML may leave them.
fn parse_endpoint(endpoint: &str) -> Result<Address, Error> {
    let text = endpoint.trim();
    let parsed = if text.starts_with("https://") {
        Address::parse_https_url(text, HTTPS_PORT)
    } else {
        Address::parse(text, APID_PORT)
    };
    parsed.map_err(|e| Error::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: e.problem.to_string(),
    })
}

/// The port of an `https://` endpoint that names none.
const HTTPS_PORT: u16 = 443;

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
    targets: Arc<Vec<Address>>,
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
                let Address { host, port } = &targets[i];
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
    let Address { host, port } = parse_endpoint(endpoint)?;
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
        let Some(first) = targets.first().cloned() else {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoint given".to_string(),
            });
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let label = targets
            .iter()
            .map(Address::to_string)
            .collect::<Vec<_>>()
            .join(",");
        // The URI only names the channel: the connector picks the endpoint.
        let uri = format!("http://{first}");
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
            host: first.host,
            port: first.port,
            options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::IpAddr;

    /// The reading before the one parser.
    fn old_parse_endpoint(endpoint: &str) -> Result<(String, u16), Error> {
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

    fn host_port(endpoint: &str) -> Result<(String, u16), Error> {
        parse_endpoint(endpoint).map(|a| (a.host, a.port))
    }

    #[test]
    fn endpoints_get_apid_port() {
        assert_eq!(host_port("10.0.0.1").unwrap(), ("10.0.0.1".into(), 50000));
        assert_eq!(host_port("10.0.0.1:123").unwrap(), ("10.0.0.1".into(), 123));
        assert_eq!(host_port("node-1").unwrap(), ("node-1".into(), 50000));
        assert_eq!(host_port("fd00::1").unwrap(), ("fd00::1".into(), 50000));
        assert_eq!(host_port("[fd00::1]:7").unwrap(), ("fd00::1".into(), 7));
        assert_eq!(
            host_port("https://cp.example").unwrap(),
            ("cp.example".into(), 443)
        );
        assert_eq!(
            host_port("https://cp.example:6443").unwrap(),
            ("cp.example".into(), 6443)
        );
        assert!(host_port("").is_err());
        assert!(host_port("host:notaport").is_err());
    }

    /// Endpoints near every rule: IPv4 and IPv6 (bare, bracketed, with a
    /// port), DNS names, `https://` URLs, other schemes, ports out of range,
    /// garbage with `:` `[` `]` `/` `@`, spaces around.
    fn endpoint_text() -> impl Strategy<Value = String> {
        let host = prop_oneof![
            any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
            "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,3}",
            "[a-zA-Z0-9.:\\[\\]/@ _-]{0,16}",
            Just(String::new()),
        ];
        let port = prop_oneof![
            Just(String::new()),
            (0u32..=70000).prop_map(|p| format!(":{p}")),
            "(:[0-9a-z+:]{0,7})",
        ];
        let scheme = prop_oneof![Just(""), Just("https://"), Just("http://"), Just(" "),];
        let tail = prop_oneof![Just(""), Just("/"), Just("//"), Just("/v1"), Just(" ")];
        prop_oneof![
            (scheme, host, port, tail).prop_map(|(s, h, p, t)| format!("{s}{h}{p}{t}")),
            any::<String>(),
        ]
    }

    /// Two hosts name the same: equal, or the same IP address written two
    /// ways (the old reading wrote a bare IP address in its short form).
    fn same_host(a: &str, b: &str) -> bool {
        a == b
            || a.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| b.parse::<std::net::IpAddr>() == Ok(ip))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// What the one parser reads, the old reading read the same (but
        /// an `https://` URL of an IPv6 address without a port: the URL's
        /// port 443, where the old reading took the address's `:` for a
        /// port written and gave apid's); what only the old reading took
        /// was no address:
        /// a scheme other than https, a path, port 0, a host with `:`
        /// outside brackets, text around brackets, no host name.
        #[test]
        fn the_one_parser_reads_an_endpoint_as_the_client_did(text in endpoint_text()) {
            let old = old_parse_endpoint(&text);
            match parse_endpoint(&text) {
                Ok(new) => {
                    let (host, port) = old.expect("what the one parser reads, the old one read");
                    prop_assert!(same_host(&new.host, &host), "{text:?}: {new} {host}");
                    let trimmed = text.trim();
                    let authority = trimmed.trim_start_matches("https://").trim_end_matches('/');
                    let v6_url_without_port = trimmed.starts_with("https://")
                        && (authority.parse::<std::net::Ipv6Addr>().is_ok()
                            || authority.ends_with(']'));
                    if v6_url_without_port {
                        prop_assert_eq!((port, new.port), (APID_PORT, HTTPS_PORT), "{:?}", text);
                    } else {
                        prop_assert_eq!(new.port, port, "{:?}", text);
                    }
                }
                Err(Error::InvalidEndpoint { endpoint, reason }) => {
                    prop_assert_eq!(&endpoint, &text);
                    if old.is_ok() {
                        let garbage = [
                            "is empty",
                            "holds the character",
                            "is a URL, a path or holds user info, not a host",
                            "has no IPv6 address between [ and ]",
                            "has text after ]",
                            "is neither an IP address nor a DNS host name",
                        ];
                        // Port 0 however written ("0", "00", "+0"), a port
                        // with a sign (Rust's integer parse takes "+5"), or
                        // a port with a `:`.
                        let port_zero_or_colon = reason.starts_with("has port")
                            && (old.as_ref().is_ok_and(|(_, port)| *port == 0)
                                || reason[9..].starts_with("\"+")
                                || reason[9..].contains(':'));
                        let too_long = reason.contains(" bytes long, over ");
                        prop_assert!(
                            garbage.iter().any(|g| reason.starts_with(g))
                                || port_zero_or_colon
                                || too_long,
                            "{:?}: old {:?}, new {}", text, old, reason
                        );
                    }
                }
                Err(e) => prop_assert!(false, "{text:?}: {e}"),
            }
        }
    }
}
