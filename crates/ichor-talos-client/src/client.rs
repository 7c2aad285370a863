//! The Talos API client: one gRPC channel to an endpoint (apid), calls aimed at
//! a node with the `node` metadata (one node per call), a timeout on every
//! call, and bounded concurrency across nodes.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use hyper_util::rt::TokioIo;
use prost::Message;
use rustls::pki_types::ServerName;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, status_message, transport_hint};
use crate::proto::common;
use crate::proto::cosi::resource as cosi;
use crate::proto::cosi::resource::state_client::StateClient;
use crate::proto::ichor::specs;
use crate::proto::machine;
use crate::proto::machine::image_service_client::ImageServiceClient;
use crate::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use crate::proto::machine::machine_service_client::MachineServiceClient;

/// talosctl's `--namespace system` store: `{CRI, NS_SYSTEM}`.
const SYSTEM_CONTAINERD: common::ContainerdInstance = common::ContainerdInstance {
    driver: common::ContainerDriver::Cri as i32,
    namespace: common::ContainerdNamespace::NsSystem as i32,
};

/// One etcd member as `EtcdMemberList` reports it. `name` is empty for a
/// member that has not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
}
use crate::resources::{self, Kind};
use crate::tls::{self, ClientIdentity};

/// apid's port, added to endpoints given without one.
pub const APID_PORT: u16 = 50000;
/// talosctl's receive limit (32 MiB).
pub const MAX_MESSAGE_SIZE: usize = 32 * 1024 * 1024;

/// Client tuning: per-call timeout and how many nodes are called at once.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Bound on every call (connection included); for Watch, on the setup
    /// up to the server's "ready" message.
    pub call_timeout: Duration,
    /// Bound on establishing the TCP + TLS connection.
    pub connect_timeout: Duration,
    /// How many nodes [`TalosClient::on_nodes`] calls concurrently.
    pub concurrency: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            concurrency: 8,
        }
    }
}

/// A Talos API client bound to one endpoint. Cheap to clone (the channel is shared).
#[derive(Clone)]
pub struct TalosClient {
    endpoint: String,
    channel: Channel,
    /// For diagnosing refused handshakes: the TLS config, host and port.
    tls: Arc<rustls::ClientConfig>,
    host: String,
    port: u16,
    options: ClientOptions,
}

impl std::fmt::Debug for TalosClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalosClient")
            .field("endpoint", &self.endpoint)
            .field("options", &self.options)
            .finish()
    }
}

/// How ApplyConfiguration applies a config (`ApplyConfigurationRequest.Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Persist, then reboot (refused by Talos v1.14+ on configured nodes).
    Reboot,
    /// Let the node choose (no-reboot when possible).
    Auto,
    /// Apply live; refused when a reboot would be needed.
    NoReboot,
    /// Persist only; applied at the next reboot.
    Staged,
    /// Apply live and revert after the try timeout.
    Try,
}

impl ApplyMode {
    fn to_proto(self) -> machine::apply_configuration_request::Mode {
        use machine::apply_configuration_request::Mode;
        match self {
            ApplyMode::Reboot => Mode::Reboot,
            ApplyMode::Auto => Mode::Auto,
            ApplyMode::NoReboot => Mode::NoReboot,
            ApplyMode::Staged => Mode::Staged,
            ApplyMode::Try => Mode::Try,
        }
    }

    fn from_proto(value: i32) -> Option<Self> {
        use machine::apply_configuration_request::Mode;
        Some(match Mode::try_from(value).ok()? {
            Mode::Reboot => ApplyMode::Reboot,
            Mode::Auto => ApplyMode::Auto,
            Mode::NoReboot => ApplyMode::NoReboot,
            Mode::Staged => ApplyMode::Staged,
            Mode::Try => ApplyMode::Try,
        })
    }
}

/// An ApplyConfiguration request.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    /// The whole multi-document machine config.
    pub data: Vec<u8>,
    pub mode: ApplyMode,
    /// Ask what would happen; nothing is applied.
    pub dry_run: bool,
    /// Revert delay for [`ApplyMode::Try`] (the node's default, 1m, when `None`).
    pub try_timeout: Option<Duration>,
}

impl ApplyRequest {
    /// A request with the given config and mode, not a dry run.
    pub fn new(data: impl Into<Vec<u8>>, mode: ApplyMode) -> Self {
        Self {
            data: data.into(),
            mode,
            dry_run: false,
            try_timeout: None,
        }
    }
}

/// What the node answered to ApplyConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyResult {
    /// The mode the node actually used (AUTO comes back resolved).
    pub mode: Option<ApplyMode>,
    /// The node's explanation (for a dry run, its summary and config diff).
    pub mode_details: String,
    pub warnings: Vec<String>,
}

/// The version a node reports through `MachineService/Version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVersion {
    /// The Talos version tag, e.g. `v1.13.9`.
    pub tag: String,
    pub sha: String,
    pub arch: String,
    /// Platform name (e.g. `metal`), if the node knows it.
    pub platform: Option<String>,
    /// Platform mode (`metal`, `container`, …), if known.
    pub platform_mode: Option<String>,
    /// RBAC is reported only once the node has a machine config.
    pub rbac: bool,
}

/// A COSI resource as read from a node.
#[derive(Debug, Clone, PartialEq)]
pub struct CosiResource {
    pub namespace: String,
    pub r#type: String,
    pub id: String,
    /// Decimal counter, or `undefined`.
    pub version: String,
    pub phase: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The protobuf-encoded spec.
    pub proto_spec: Vec<u8>,
    /// The YAML-encoded spec.
    pub yaml_spec: String,
}

impl CosiResource {
    fn from_proto(r: cosi::Resource) -> Self {
        let md = r.metadata.unwrap_or_default();
        let spec = r.spec.unwrap_or_default();
        Self {
            namespace: md.namespace,
            r#type: md.r#type,
            id: md.id,
            version: md.version,
            phase: md.phase,
            labels: md.labels.into_iter().collect(),
            annotations: md.annotations.into_iter().collect(),
            proto_spec: spec.proto_spec,
            yaml_spec: spec.yaml_spec,
        }
    }

    /// Decodes the protobuf spec into a spec message of [`crate::proto::ichor::specs`].
    pub fn decode_spec<T: Message + Default>(&self) -> Result<T, prost::DecodeError> {
        T::decode(self.proto_spec.as_slice())
    }
}

/// The type of a COSI watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventType {
    Created,
    Updated,
    Destroyed,
    Bootstrapped,
    Errored,
    Noop,
}

/// One event of a COSI watch.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    pub event_type: WatchEventType,
    /// The resource (for DESTROYED a tombstone with metadata only).
    pub resource: Option<CosiResource>,
    /// The previous version on UPDATED.
    pub old: Option<CosiResource>,
    /// The error text of an ERRORED event.
    pub error: Option<String>,
}

/// The machine type of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineType {
    Unknown,
    Init,
    ControlPlane,
    Worker,
}

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

/// Opens a TLS connection and reads once: a server that refuses the client
/// certificate answers with an alert, which comes back as the error text.
/// `None` when the handshake holds (or nothing is learned within 2s).
async fn probe_tls(config: Arc<rustls::ClientConfig>, host: &str, port: u16) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let limit = Duration::from_secs(2);
    let tcp = tokio::time::timeout(limit, tokio::net::TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()?;
    let name = ServerName::try_from(host.to_string()).ok()?;
    let mut tls = match tokio::time::timeout(
        limit,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .ok()?
    {
        Ok(tls) => tls,
        Err(e) => return Some(e.to_string()),
    };
    let mut buf = [0u8; 256];
    match tokio::time::timeout(limit, tls.read(&mut buf)).await {
        Ok(Err(e)) => Some(e.to_string()),
        _ => None,
    }
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

    /// The endpoint(s) this client talks to (`host:port`, comma-separated when several).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// A copy with another per-call timeout.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.options.call_timeout = timeout;
        self
    }

    fn node_label(&self, node: &str) -> String {
        if node.is_empty() {
            self.endpoint.clone()
        } else {
            node.to_string()
        }
    }

    fn request<T>(&self, node: &str, message: T) -> Result<tonic::Request<T>, Error> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.options.call_timeout);
        if !node.is_empty() {
            let value = MetadataValue::try_from(node).map_err(|e| Error::InvalidNode {
                node: node.to_string(),
                reason: e.to_string(),
            })?;
            request.metadata_mut().insert("node", value);
        }
        Ok(request)
    }

    /// Runs one call under the timeout and maps its status to an [`Error`] naming node and call.
    pub(crate) async fn call<T, F>(&self, node: &str, call: &str, fut: F) -> Result<T, Error>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.options.call_timeout, fut).await {
            Err(_) => Err(Error::Timeout {
                node: self.node_label(node),
                call: call.to_string(),
                timeout: self.options.call_timeout,
            }),
            Ok(Err(status)) => Err(self.diagnosed_status_error(node, call, &status).await),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    /// Like [`Self::status_error`], but when the connection was closed without
    /// a reason (in TLS 1.3 a server refuses the client certificate after the
    /// client considers the handshake done, and the alert can be lost to the
    /// HTTP/2 layer), a fresh TLS connection is opened to read the reason.
    async fn diagnosed_status_error(
        &self,
        node: &str,
        call: &str,
        status: &tonic::Status,
    ) -> Error {
        let mut err = self.status_error(node, call, status);
        let raw = status_message(status);
        if (raw.contains("connection closed") || raw.contains("Connection reset"))
            && let Some(reason) = probe_tls(Arc::clone(&self.tls), &self.host, self.port).await
            && let Error::Status { message, .. } = &mut err
        {
            *message = match transport_hint(&reason) {
                Some(hint) => format!("{hint} ({reason})"),
                None => format!("{message}; a new TLS connection says: {reason}"),
            };
        }
        err
    }

    fn status_error(&self, node: &str, call: &str, status: &tonic::Status) -> Error {
        if status.code() == tonic::Code::Cancelled && status.message().contains("Timeout expired") {
            return Error::Timeout {
                node: self.node_label(node),
                call: call.to_string(),
                timeout: self.options.call_timeout,
            };
        }
        let raw = status_message(status);
        let message = match transport_hint(&raw) {
            Some(hint) if !raw.starts_with(hint) => format!("{hint} ({raw})"),
            _ => raw,
        };
        Error::Status {
            node: self.node_label(node),
            call: call.to_string(),
            code: status.code(),
            message,
        }
    }

    pub(crate) fn machine(&self) -> MachineServiceClient<Channel> {
        MachineServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn state(&self) -> StateClient<Channel> {
        StateClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn first<M>(
        &self,
        node: &str,
        call: &str,
        messages: Vec<M>,
        metadata: impl Fn(&M) -> Option<&crate::proto::common::Metadata>,
    ) -> Result<M, Error> {
        let first = messages
            .into_iter()
            .next()
            .ok_or_else(|| Error::EmptyResponse {
                node: self.node_label(node),
                call: call.to_string(),
            })?;
        if let Some(md) = metadata(&first)
            && !md.error.is_empty()
        {
            return Err(Error::NodeReported {
                node: self.node_label(node),
                call: call.to_string(),
                message: md.error.clone(),
            });
        }
        Ok(first)
    }

    /// `MachineService/Version`. `node` empty targets the endpoint itself.
    pub async fn version(&self, node: &str) -> Result<NodeVersion, Error> {
        let call = "Version";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().version(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        let v = m.version.unwrap_or_default();
        Ok(NodeVersion {
            tag: v.tag,
            sha: v.sha,
            arch: v.arch,
            platform: m.platform.as_ref().map(|p| p.name.clone()),
            platform_mode: m.platform.map(|p| p.mode),
            rbac: m.features.is_some_and(|f| f.rbac),
        })
    }

    /// `MachineService/Hostname`.
    pub async fn hostname(&self, node: &str) -> Result<String, Error> {
        let call = "Hostname";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().hostname(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.hostname)
    }

    /// `MachineService/ApplyConfiguration`.
    pub async fn apply_configuration(
        &self,
        node: &str,
        apply: &ApplyRequest,
    ) -> Result<ApplyResult, Error> {
        let call = if apply.dry_run {
            "ApplyConfiguration (dry run)"
        } else {
            "ApplyConfiguration"
        };
        let message = machine::ApplyConfigurationRequest {
            data: apply.data.clone(),
            mode: apply.mode.to_proto() as i32,
            dry_run: apply.dry_run,
            try_mode_timeout: apply.try_timeout.map(|d| prost_types::Duration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            }),
        };
        let request = self.request(node, message)?;
        let response = self
            .call(node, call, self.machine().apply_configuration(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(ApplyResult {
            mode: ApplyMode::from_proto(m.mode),
            mode_details: m.mode_details,
            warnings: m.warnings,
        })
    }

    /// `MachineService/Reboot`; returns the actor id of the reboot.
    pub async fn reboot(&self, node: &str) -> Result<String, Error> {
        let call = "Reboot";
        let request = self.request(node, machine::RebootRequest { mode: 0 })?;
        let response = self
            .call(node, call, self.machine().reboot(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.actor_id)
    }

    fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    fn lifecycle(&self) -> LifecycleServiceClient<Channel> {
        LifecycleServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// `ImageService/Pull` of an installer into the system containerd (the
    /// store `LifecycleService.Upgrade` reads it from, as talosctl's default
    /// `--namespace system`); returns the pulled image's name.
    pub async fn pull_installer(&self, node: &str, image: &str) -> Result<String, Error> {
        let call = format!("ImageService Pull {image}");
        let request = self.request(
            node,
            machine::ImageServicePullRequest {
                containerd: Some(SYSTEM_CONTAINERD),
                image_ref: image.to_string(),
            },
        )?;
        let mut images = self.images();
        let gather = async {
            let mut stream = images.pull(request).await?.into_inner();
            let mut name = None;
            while let Some(m) = stream.message().await? {
                if let Some(machine::image_service_pull_response::Response::Name(n)) = m.response {
                    name = Some(n);
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new(name))
        };
        self.call(node, &call, gather)
            .await?
            .ok_or_else(|| Error::EmptyResponse {
                node: self.node_label(node),
                call,
            })
    }

    /// `LifecycleService/Upgrade` (Talos >= 1.13): writes the installer to the
    /// other boot slot, no reboot. A non-zero exit code is an error (the
    /// server does not fail the call for it). Returns the progress messages.
    pub async fn lifecycle_upgrade(&self, node: &str, image: &str) -> Result<Vec<String>, Error> {
        let call = format!("LifecycleService Upgrade {image}");
        let request = self.request(
            node,
            machine::LifecycleServiceUpgradeRequest {
                containerd: Some(SYSTEM_CONTAINERD),
                source: Some(machine::InstallArtifactsSource {
                    image_name: image.to_string(),
                }),
            },
        )?;
        let mut lifecycle = self.lifecycle();
        let gather = async {
            let mut stream = lifecycle.upgrade(request).await?.into_inner();
            let mut lines = Vec::new();
            let mut exit = None;
            while let Some(m) = stream.message().await? {
                use machine::lifecycle_service_install_progress::Response as P;
                match m.progress.and_then(|p| p.response) {
                    Some(P::Message(line)) => lines.push(line),
                    Some(P::ExitCode(code)) => exit = Some(code),
                    None => {}
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new((lines, exit)))
        };
        let (lines, exit) = self.call(node, &call, gather).await?;
        match exit {
            Some(0) => Ok(lines),
            Some(code) => Err(Error::NodeReported {
                node: self.node_label(node),
                call,
                message: format!(
                    "the installer exited with code {code}: {}",
                    lines.last().map(String::as_str).unwrap_or("no message")
                ),
            }),
            None => Err(Error::EmptyResponse {
                node: self.node_label(node),
                call,
            }),
        }
    }

    /// The deprecated `MachineService/Upgrade` (Talos < 1.13): Talos pulls,
    /// checks etcd, writes the slot and reboots by itself. Returns the actor id.
    pub async fn legacy_upgrade(&self, node: &str, image: &str) -> Result<String, Error> {
        let call = format!("Upgrade {image}");
        let request = self.request(
            node,
            machine::UpgradeRequest {
                image: image.to_string(),
                // Talos has kept data on upgrade since 1.8; preserve also skips
                // the server's etcd check, which the caller has done itself.
                preserve: true,
                ..Default::default()
            },
        )?;
        #[allow(deprecated)]
        let response = self
            .call(node, &call, self.machine().upgrade(request))
            .await?;
        let m = self.first(node, &call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.actor_id)
    }

    /// The node's boot id (`Read` of `/proc/sys/kernel/random/boot_id`, as
    /// talosctl reads it to tell that a reboot happened).
    pub async fn boot_id(&self, node: &str) -> Result<String, Error> {
        let call = "Read boot_id";
        let request = self.request(
            node,
            machine::ReadRequest {
                path: "/proc/sys/kernel/random/boot_id".to_string(),
            },
        )?;
        let mut client = self.machine();
        let gather = async {
            let mut stream = client.read(request).await?.into_inner();
            let mut bytes = Vec::new();
            while let Some(m) = stream.message().await? {
                bytes.extend_from_slice(&m.bytes);
            }
            Ok::<_, tonic::Status>(tonic::Response::new(bytes))
        };
        let bytes = self.call(node, call, gather).await?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// `MachineService/EtcdMemberList` (fails when etcd has no leader).
    pub async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, Error> {
        let call = "EtcdMemberList";
        let request = self.request(node, machine::EtcdMemberListRequest { query_local: false })?;
        let response = self
            .call(node, call, self.machine().etcd_member_list(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.members
            .into_iter()
            .map(|m| EtcdMember {
                id: m.id,
                name: m.hostname,
                is_learner: m.is_learner,
            })
            .collect())
    }

    /// `MachineService/EtcdForfeitLeadership` on a control plane; returns the member named.
    pub async fn etcd_forfeit_leadership(&self, node: &str) -> Result<String, Error> {
        let call = "EtcdForfeitLeadership";
        let request = self.request(node, machine::EtcdForfeitLeadershipRequest {})?;
        let response = self
            .call(node, call, self.machine().etcd_forfeit_leadership(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.member)
    }

    /// `MachineService/Bootstrap` on a control plane: starts etcd as a new
    /// cluster. Returns `Ok(false)` when the node answers that etcd's data
    /// directory is not empty (`AlreadyExists`): the cluster was bootstrapped before.
    pub async fn bootstrap(&self, node: &str) -> Result<bool, Error> {
        let call = "Bootstrap";
        let request = self.request(
            node,
            machine::BootstrapRequest {
                recover_etcd: false,
                recover_skip_hash_check: false,
            },
        )?;
        match self
            .call(node, call, self.machine().bootstrap(request))
            .await
        {
            Ok(response) => {
                self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
                Ok(true)
            }
            Err(Error::Status {
                code: tonic::Code::AlreadyExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `MachineService/Kubeconfig` on a control plane: the admin kubeconfig
    /// the node generates, taken out of the `.tar.gz` it streams (one file,
    /// `kubeconfig`).
    pub async fn kubeconfig(&self, node: &str) -> Result<Vec<u8>, Error> {
        let call = "Kubeconfig";
        let request = self.request(node, ())?;
        let mut client = self.machine();
        let gather = async {
            let mut stream = client.kubeconfig(request).await?.into_inner();
            let mut bytes = Vec::new();
            while let Some(m) = stream.message().await? {
                bytes.extend_from_slice(&m.bytes);
            }
            Ok::<_, tonic::Status>(tonic::Response::new(bytes))
        };
        let archive = self.call(node, call, gather).await?;
        kubeconfig_from_archive(&archive).map_err(|reason| Error::Decode {
            node: self.node_label(node),
            call: call.to_string(),
            what: "the kubeconfig archive".to_string(),
            reason,
        })
    }

    /// The node's disks (`Disks.block.talos.dev`), ids with their specs;
    /// reader access is enough, so this works over the maintenance API.
    pub async fn disks(&self, node: &str) -> Result<Vec<(String, specs::DiskSpec)>, Error> {
        let items = self
            .cosi_list(node, resources::DISKS.namespace, resources::DISKS.r#type)
            .await?;
        items
            .into_iter()
            .map(|r| {
                let spec = r
                    .decode_spec::<specs::DiskSpec>()
                    .map_err(|e| Error::Decode {
                        node: self.node_label(node),
                        call: format!("COSI List {}", resources::DISKS.r#type),
                        what: "a disk spec".to_string(),
                        reason: e.to_string(),
                    })?;
                Ok((r.id.clone(), spec))
            })
            .collect()
    }

    /// The bootstrap manifests the node renders (`Manifests.kubernetes.talos.dev`,
    /// control planes only; none on a worker), by id in Talos's order (the id
    /// sorts them: `05-…` before `10-…`), each the objects of that manifest.
    pub async fn manifests(
        &self,
        node: &str,
    ) -> Result<Vec<(String, Vec<prost_types::Struct>)>, Error> {
        let mut items = self
            .cosi_list(
                node,
                resources::MANIFESTS.namespace,
                resources::MANIFESTS.r#type,
            )
            .await?;
        items.sort_by(|a, b| a.id.cmp(&b.id));
        items
            .into_iter()
            .map(|r| {
                let spec = r
                    .decode_spec::<specs::ManifestSpec>()
                    .map_err(|e| Error::Decode {
                        node: self.node_label(node),
                        call: format!("COSI List {}", resources::MANIFESTS.r#type),
                        what: format!("manifest {}", r.id),
                        reason: e.to_string(),
                    })?;
                let objects = spec.items.into_iter().filter_map(|i| i.object).collect();
                Ok((r.id.clone(), objects))
            })
            .collect()
    }

    /// The node's machine stage (`MachineStatuses.runtime.talos.dev`):
    /// `MAINTENANCE` for a node waiting for its first config.
    pub async fn machine_status(&self, node: &str) -> Result<specs::MachineStatusSpec, Error> {
        self.get_spec(node, resources::MACHINE_STATUS).await
    }

    /// `cosi.resource.State/Get`.
    pub async fn cosi_get(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
        id: &str,
    ) -> Result<CosiResource, Error> {
        let call = format!("COSI Get {type}/{id}");
        let request = self.request(
            node,
            cosi::GetRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                id: id.to_string(),
                options: Some(cosi::GetOptions {}),
            },
        )?;
        let response = self.call(node, &call, self.state().get(request)).await?;
        let resource = response.resource.ok_or_else(|| Error::EmptyResponse {
            node: self.node_label(node),
            call: call.clone(),
        })?;
        Ok(CosiResource::from_proto(resource))
    }

    /// `cosi.resource.State/List`: every resource of a type, gathered under the call timeout.
    pub async fn cosi_list(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
    ) -> Result<Vec<CosiResource>, Error> {
        let call = format!("COSI List {type}");
        let request = self.request(
            node,
            cosi::ListRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                options: Some(cosi::ListOptions::default()),
            },
        )?;
        let mut state = self.state();
        let gather = async {
            let mut stream = state.list(request).await?.into_inner();
            let mut items = Vec::new();
            while let Some(item) = stream.message().await? {
                if let Some(r) = item.resource {
                    items.push(CosiResource::from_proto(r));
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new(items))
        };
        self.call(node, &call, gather).await
    }

    /// `cosi.resource.State/Watch` of one resource (`id` given) or of a whole
    /// kind (`id` `None`, with the current items first, then BOOTSTRAPPED).
    /// The setup (up to the server's ready message) is bounded by the call
    /// timeout; the returned stream runs until the caller drops it.
    pub async fn cosi_watch(
        &self,
        node: &str,
        namespace: &str,
        r#type: &str,
        id: Option<&str>,
    ) -> Result<impl Stream<Item = Result<WatchEvent, Error>> + Send + 'static + use<>, Error> {
        let call = match id {
            Some(id) => format!("COSI Watch {type}/{id}"),
            None => format!("COSI Watch {type}"),
        };
        let mut request = self.request(
            node,
            cosi::WatchRequest {
                namespace: namespace.to_string(),
                r#type: r#type.to_string(),
                id: id.map(str::to_string),
                options: Some(cosi::WatchOptions {
                    bootstrap_contents: id.is_none(),
                    ..Default::default()
                }),
                api_version: 1,
            },
        )?;
        // The stream outlives the call timeout: only the setup is bounded here.
        request.set_timeout(Duration::from_secs(365 * 24 * 3600));
        let mut state = self.state();
        let setup = async {
            let mut stream = state.watch(request).await?.into_inner();
            // The first message is an empty "ready" signal.
            let _ready = stream.message().await?;
            Ok::<_, tonic::Status>(tonic::Response::new(stream))
        };
        let stream = self.call(node, &call, setup).await?;
        let node_label = self.node_label(node);
        let events = futures::stream::unfold(
            (stream, node_label, call, std::collections::VecDeque::new()),
            |(mut stream, node, call, mut pending)| async move {
                loop {
                    if let Some(ev) = pending.pop_front() {
                        return Some((Ok(ev), (stream, node, call, pending)));
                    }
                    match stream.message().await {
                        Ok(Some(resp)) => {
                            pending.extend(resp.event.into_iter().map(convert_event));
                        }
                        Ok(None) => return None,
                        Err(status) => {
                            let err = Error::Status {
                                node: node.clone(),
                                call: call.clone(),
                                code: status.code(),
                                message: status_message(&status),
                            };
                            return Some((Err(err), (stream, node, call, pending)));
                        }
                    }
                }
            },
        );
        Ok(events)
    }

    async fn get_kind(&self, node: &str, kind: Kind) -> Result<CosiResource, Error> {
        self.cosi_get(node, kind.namespace, kind.r#type, kind.id)
            .await
    }

    async fn get_spec<T: Message + Default>(&self, node: &str, kind: Kind) -> Result<T, Error> {
        let r = self.get_kind(node, kind).await?;
        r.decode_spec::<T>().map_err(|e| Error::Decode {
            node: self.node_label(node),
            call: format!("COSI Get {}/{}", kind.r#type, kind.id),
            what: "the resource spec".to_string(),
            reason: e.to_string(),
        })
    }

    async fn get_optional_spec<T: Message + Default>(
        &self,
        node: &str,
        kind: Kind,
    ) -> Result<Option<T>, Error> {
        match self.get_spec(node, kind).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The live machine config: the exact bytes the node runs (needs `os:admin`).
    pub async fn machine_config(&self, node: &str) -> Result<Vec<u8>, Error> {
        let spec: specs::MachineConfigSpec = self.get_spec(node, resources::MACHINE_CONFIG).await?;
        Ok(spec.yaml_marshalled)
    }

    /// The persisted machine config (what the node boots with next).
    pub async fn persistent_machine_config(&self, node: &str) -> Result<Vec<u8>, Error> {
        let kind = Kind {
            id: resources::MACHINE_CONFIG_PERSISTENT_ID,
            ..resources::MACHINE_CONFIG
        };
        let spec: specs::MachineConfigSpec = self.get_spec(node, kind).await?;
        Ok(spec.yaml_marshalled)
    }

    /// The node's machine type.
    pub async fn machine_type(&self, node: &str) -> Result<MachineType, Error> {
        let spec: specs::MachineTypeSpec = self.get_spec(node, resources::MACHINE_TYPE).await?;
        Ok(match specs::MachineType::try_from(spec.machine_type) {
            Ok(specs::MachineType::Init) => MachineType::Init,
            Ok(specs::MachineType::ControlPlane) => MachineType::ControlPlane,
            Ok(specs::MachineType::Worker) => MachineType::Worker,
            _ => MachineType::Unknown,
        })
    }

    /// The `Versions.runtime.talos.dev` resource.
    pub async fn version_resource(&self, node: &str) -> Result<specs::VersionSpec, Error> {
        self.get_spec(node, resources::VERSION).await
    }

    /// The Kubernetes node name.
    pub async fn nodename(&self, node: &str) -> Result<specs::NodenameSpec, Error> {
        self.get_spec(node, resources::NODENAME).await
    }

    /// KubePrism's configuration; `None` when KubePrism is disabled.
    pub async fn kubeprism_config(
        &self,
        node: &str,
    ) -> Result<Option<specs::KubePrismConfigSpec>, Error> {
        self.get_optional_spec(node, resources::KUBEPRISM_CONFIG)
            .await
    }

    /// KubePrism's status; `None` when KubePrism is disabled.
    pub async fn kubeprism_status(
        &self,
        node: &str,
    ) -> Result<Option<specs::KubePrismStatusesSpec>, Error> {
        self.get_optional_spec(node, resources::KUBEPRISM_STATUS)
            .await
    }

    /// The bootstrap manifests config; `None` on workers (and control-plane
    /// nodes without a Kubernetes network config).
    pub async fn bootstrap_manifests_config(
        &self,
        node: &str,
    ) -> Result<Option<specs::BootstrapManifestsConfigSpec>, Error> {
        self.get_optional_spec(node, resources::BOOTSTRAP_MANIFESTS_CONFIG)
            .await
    }

    /// The image a Kubernetes component runs with on the node, from the
    /// config resource Talos derives from the machine config
    /// (`APIServerConfigs`, `ControllerManagerConfigs`, `SchedulerConfigs`,
    /// `KubeletConfigs`; kube-proxy's from `BootstrapManifestsConfigs`).
    /// `None` when the node has no such component.
    pub async fn component_image(
        &self,
        node: &str,
        component: resources::KubernetesComponent,
    ) -> Result<Option<String>, Error> {
        Ok(match component {
            resources::KubernetesComponent::ApiServer => self
                .get_optional_spec::<specs::ApiServerConfigSpec>(node, resources::APISERVER_CONFIG)
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::ControllerManager => self
                .get_optional_spec::<specs::ControllerManagerConfigSpec>(
                    node,
                    resources::CONTROLLER_MANAGER_CONFIG,
                )
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::Scheduler => self
                .get_optional_spec::<specs::SchedulerConfigSpec>(node, resources::SCHEDULER_CONFIG)
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::KubeProxy => self
                .bootstrap_manifests_config(node)
                .await?
                .filter(|s| s.proxy_enabled)
                .map(|s| s.proxy_image),
            resources::KubernetesComponent::Kubelet => self
                .get_optional_spec::<specs::KubeletConfigSpec>(node, resources::KUBELET_CONFIG)
                .await?
                .map(|s| s.image),
        })
    }

    /// Runs `f` once per node, at most [`ClientOptions::concurrency`] at a
    /// time, and returns the results in the order of `nodes`.
    pub async fn on_nodes<T, F, Fut>(
        &self,
        nodes: &[String],
        f: F,
    ) -> Vec<(String, Result<T, Error>)>
    where
        F: Fn(TalosClient, String) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let limit = self.options.concurrency.max(1);
        futures::stream::iter(nodes.iter().cloned())
            .map(|node| {
                let fut = f(self.clone(), node.clone());
                async move { (node, fut.await) }
            })
            .buffered(limit)
            .collect()
            .await
    }
}

fn convert_event(e: cosi::Event) -> WatchEvent {
    let event_type = match cosi::EventType::try_from(e.event_type) {
        Ok(cosi::EventType::Created) => WatchEventType::Created,
        Ok(cosi::EventType::Updated) => WatchEventType::Updated,
        Ok(cosi::EventType::Destroyed) => WatchEventType::Destroyed,
        Ok(cosi::EventType::Bootstrapped) => WatchEventType::Bootstrapped,
        Ok(cosi::EventType::Errored) => WatchEventType::Errored,
        Ok(cosi::EventType::Noop) | Err(_) => WatchEventType::Noop,
    };
    WatchEvent {
        event_type,
        resource: e.resource.map(CosiResource::from_proto),
        old: e.old.map(CosiResource::from_proto),
        error: e.error,
    }
}

/// The `kubeconfig` file of the archive `MachineService/Kubeconfig` streams.
fn kubeconfig_from_archive(archive: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for entry in tar.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        if path == std::path::Path::new("kubeconfig") {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
            return Ok(bytes);
        }
    }
    Err("the archive holds no file named kubeconfig".to_string())
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
