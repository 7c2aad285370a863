//! Ichor's render and drift: pure functions, no I/O.
//!
//! - [`render`] — a node's desired config: its live config as the base, the
//!   paths Ichor owns from the TalosCluster and TalosMachine (endpoint,
//!   subnets, Kubernetes version, the CNI rules of R1.6 in [`cni`]), then
//!   the machine's patches.
//! - [`drift::compare`] — live vs desired, per path, each difference
//!   classified A, B or C by the one table in [`classes`]
//!   (`docs/adr/0004-drift-classes.md`).

pub mod classes;
pub mod cni;
pub mod drift;
pub mod path;
pub mod redact;
mod render;

pub use cni::{CniInput, INLINE_CNI_NAME, KUBEPRISM_PORT};
pub use drift::{Drift, compare};
pub use path::{ConfigPath, Segment};
pub use render::{
    ComponentStep, MachineRender, RenderInput, Rendered, component_step, config_digest, render,
    render_machine, render_machine_from, render_stepwise, retag,
};

/// What can go wrong in a render or a drift comparison.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config could not be turned into YAML (a bug).
    #[error(
        "the {what} machine config cannot be serialised; this is a bug in ichor-talos or ichor-render, please report it"
    )]
    Serialise {
        /// `live` or `desired`.
        what: &'static str,
        /// Why.
        source: ichor_talos::config::ConfigError,
    },
    /// A patch of the machine cannot be read or applied.
    #[error(
        "TalosMachine {machine}: patch {patch:?} cannot be applied; fix that entry of spec.patches"
    )]
    Patch {
        /// The TalosMachine.
        machine: String,
        /// The patch's name.
        patch: String,
        /// Why (boxed: the patch error is large).
        source: Box<ichor_talos::patch::PatchError>,
    },
    /// Ichor's own paths made the config invalid (a bug, or a live config Talos would not accept either).
    #[error(
        "TalosMachine {machine}: the rendered config is not a valid Talos config; check the node's live config, and report this if it is valid"
    )]
    Rendered {
        /// The TalosMachine.
        machine: String,
        /// Why.
        source: ichor_talos::config::ConfigError,
    },
}
