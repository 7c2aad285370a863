//! The Talos API client of Ichor.
//!
//! The wire layer lives in its own crate so that the pure config crate
//! (`ichor-talos`) builds without tonic and protoc (ADR 0002).
//!
//! * [`TalosClient`]: one endpoint (apid), calls aimed at a node through the
//!   `node` gRPC metadata, a timeout on every call, bounded concurrency across
//!   nodes ([`TalosClient::on_nodes`]), and errors ([`Error`]) that name the
//!   node and the call.
//! * [`tls`]: mutual TLS with ALPN `h2`, Talos's `ED25519 PRIVATE KEY` keys,
//!   and the maintenance-mode configuration, unverified or pinned to a
//!   certificate fingerprint ([`CertFingerprint`]).
//! * [`resources`]: namespace/type/id of the COSI resources Ichor reads.
//! * [`proto`]: the generated types (from our own `.proto` files).

pub mod client;
pub mod error;
pub mod etcd;
pub mod proto;
pub mod resources;
pub mod tls;

pub use client::{
    APID_PORT, ApplyMode, ApplyRequest, ApplyResult, ClientOptions, CosiResource, EtcdMember,
    MachineType, NodeVersion, ResetRequest, TalosClient, WatchEvent, WatchEventType,
    server_fingerprint,
};
pub use error::{Error, TlsError};
pub use tls::{CertFingerprint, ClientIdentity};
