//! The Talos API client: one gRPC channel to an endpoint (apid), calls aimed at
//! a node with the `node` metadata (one node per call), a timeout on every
//! call, and bounded concurrency across nodes.
//!
//! `connect` makes the client (endpoints, TCP + TLS), `call` runs one call
//! and names its failure, `stream` reads what servers stream; the API
//! families are `machine`, `upgrade`, `etcd_members`, `cosi` and `reads`
//! (the typed resources Ichor reads).

mod call;
mod connect;
mod cosi;
mod etcd_members;
mod machine;
mod membership;
mod reads;
mod stream;
mod upgrade;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tonic::transport::Channel;

use crate::error::Error;

pub use connect::server_fingerprint;
pub use cosi::{CosiResource, WatchEvent, WatchEventType};
pub use etcd_members::EtcdMember;
pub use machine::{ApplyMode, ApplyRequest, ApplyResult, NodeVersion};
pub use membership::ResetRequest;
pub use reads::MachineType;

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

impl TalosClient {
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
