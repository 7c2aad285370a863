//! `ichor adopt`'s and `ichor init`'s I/O ([`init`] for init): the inspection (Talos nodes through the Talos API,
//! the Kubernetes side, Ichor's presence) and the write phases of R1.5a–f.
//!
//! Everything adopt decides is a pure function of `ichor-adopt` (no client,
//! no runtime there); this crate reads, asks the operator, and writes. Each
//! write phase is one function in [`phases`], named as its entry of
//! [`Outcome::phases`], and idempotent, so a rerun after a failure or a kill
//! finishes the job. Waits go through `ichor_helm::wait::wait_until`, creates
//! through `ichor_helm::objects`, record queries through `ichor_helm::storage`.
//!
//! `ichor reclaim`, the way out, lives in [`reclaim`] on the same primitives:
//! its plan is `ichor_adopt::reclaim`'s, and it has no Talos client at all.

mod error;
pub mod ichor;
pub mod init;
pub mod inspect;
pub mod phases;
pub mod reclaim;

pub use error::AdoptError;
pub use ichor::{FIELD_MANAGER, apply_objects, install_ichor};
pub use phases::{AdoptOptions, Operator, Outcome, SecretsSource, adopt, plan};
