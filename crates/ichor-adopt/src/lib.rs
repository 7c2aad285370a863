//! `ichor adopt`'s decisions, as pure functions over what the inspection read.
//!
//! The inspection (reading nodes through the Talos API and the Kubernetes side,
//! in `ichor-adopt-run`) produces an [`Inspection`]; everything adopt decides
//! from it lives here and does no I/O — this crate has no Kubernetes client,
//! no async runtime and no network — so each rule of the spec is a unit test:
//!
//! - [`classify::classify_cni`] — spec 1.1 and the rows of ADR 0103's table
//!   (the CNI DaemonSets are recognised by `ichor_api::cni`, the one detector
//!   the controller uses too);
//! - [`classify::decide_mode`] — which path adopt takes, or the refusal;
//! - [`preconditions::check`] — spec 1.3, before consent;
//! - [`plan::plan`] — all of the above, Ichor's presence and `--cilium-values`,
//!   judged before consent, into the [`Plan`] adopt prints;
//! - [`gate::include_cilium_policies`] — spec 2.1, the one policy decision;
//! - [`waits`] — spec decision 3: what a bounded wait says every 30 s, and
//!   when it fails early;
//! - [`install`] — the installer path's objects, as data (`dist/` is
//!   generated from them);
//! - [`reclaim`] — `ichor reclaim`'s plan: the way out, with nothing
//!   written to a node.
//! - [`init`] — `ichor init`'s refusals, plan and rendered configs.

pub mod classify;
pub mod gate;
pub mod init;
pub mod inspection;
pub mod install;
pub mod plan;
pub mod preconditions;
pub mod reclaim;
pub mod waits;

pub use classify::{AdoptMode, CniClassification, Refusal, classify_cni, decide_mode};
pub use gate::{PolicyGate, include_cilium_policies};
pub use inspection::{
    CiliumRecord, CniKind, CniWorkload, Inspection, KubeInspection, KubeNode, TalosNode,
};
pub use plan::Plan;
