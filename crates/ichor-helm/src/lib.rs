//! Helm-compatible release records and a release engine.
//!
//! Ichor owns Cilium as a Helm release whose record the real `helm` (v3 and
//! v4) can read. There is no Helm SDK in Rust, so this crate:
//!
//! - reads and writes records in Helm's Secret storage format
//!   ([`record`]: `sh.helm.release.v1.NAME.vN`, labels, `base64(gzip(json))`;
//!   [`storage`]: the Secrets in a storage namespace that may differ from the
//!   release namespace);
//! - renders charts with the real `helm` binary ([`render`]);
//! - installs, upgrades and rolls back with Helm's state machine, applying
//!   with server-side apply ([`engine`]).
//!
//! [`wait`] holds the one bounded, reporting wait, which the crates above
//! this one use too. It knows nothing about Cilium. Design: `docs/adr/0005-helm-release-engine.md`.

pub mod engine;
pub mod manifest;
pub mod objects;
pub mod record;
pub mod render;
pub mod secret_list;
pub mod storage;
pub mod wait;

pub use engine::{ApplyOptions, Engine, Error, Operation, ReleaseRequest, WaitReporter};
pub use record::{Info, Release, Status, StoredChart};
pub use render::{ChartRef, Renderer};
pub use storage::{SecretStorage, StoredRelease};
pub use wait::{Wait, WaitError, wait_until};
