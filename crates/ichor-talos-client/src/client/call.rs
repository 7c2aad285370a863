//! One call: its request (the `node` metadata, the timeout), its bound,
//! and its failure as an [`Error`] naming node and call — with the reason a
//! fresh TLS connection gives when the transport only says it was closed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::error::{Error, status_message, transport_hint};
use crate::proto::cosi::resource::state_client::StateClient;
use crate::proto::machine::image_service_client::ImageServiceClient;
use crate::proto::machine::lifecycle_service_client::LifecycleServiceClient;
use crate::proto::machine::machine_service_client::MachineServiceClient;

use super::{MAX_MESSAGE_SIZE, TalosClient};

impl TalosClient {
    pub(crate) fn node_label(&self, node: &str) -> String {
        if node.is_empty() {
            self.endpoint.clone()
        } else {
            node.to_string()
        }
    }

    pub(crate) fn request<T>(&self, node: &str, message: T) -> Result<tonic::Request<T>, Error> {
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
        use tracing::Instrument as _;
        // A child of the reconcile's span, which names the object.
        let span = tracing::debug_span!("talos", call, endpoint = %self.endpoint, node);
        async {
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
        .instrument(span)
        .await
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

    pub(super) fn state(&self) -> StateClient<Channel> {
        StateClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    pub(super) fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE)
    }

    pub(super) fn lifecycle(&self) -> LifecycleServiceClient<Channel> {
        LifecycleServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
    }
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
