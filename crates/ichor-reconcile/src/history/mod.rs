//! Config history, decided without I/O: who changed a spec (the admission
//! webhook's stamp), the next revision of a machine, and the bounded record
//! of each revision's inputs kept in the machine's history Secret
//! (docs/adr/0022-config-history.md).

pub mod actor;
pub mod diff;
pub mod record;
pub mod rollback;
pub mod store;

/// A control plane's config as Talos generates one (the v1.14 stability
/// fixture), for the tests.
#[cfg(test)]
pub(crate) const CONTROL_PLANE_FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/talos/stability-v1.14/base-controlplane.yaml"
));
