//! `ichor adopt`'s decisions, as pure functions over what the inspection read.
//!
//! The inspection (reading nodes through the Talos API and the Kubernetes side,
//! in `ichor-adopt-run`) produces an [`Inspection`]; everything adopt decides
//! from it lives here and does no I/O — this crate has no Kubernetes client,
//! no async runtime and no network — so each rule of docs/requirements.md
//! that adopt decides is a unit test:
//!
//! - [`classify::classify_cni`] — R1.1a–b and R2.0: no CNI, Cilium with or
//!   without Ichor's record, another CNI, more than one
//!   (the CNI DaemonSets are recognised by `ichor_api::cni`, the one detector
//!   the controller uses too);
//! - [`classify::decide_mode`] — which path adopt takes, or the refusal;
//! - [`preconditions::check`] — R1.3a–e, before consent;
//! - [`plan::plan`] — all of the above, Ichor's presence and `--cilium-values`,
//!   judged before consent, into the [`Plan`] adopt prints;
//! - [`gate::include_cilium_policies`] — R2.1a–c, the one policy decision;
//! - [`waits`] — R3.1–R3.3: what a bounded wait says every 30 s, and
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
