//! Config history, decided without I/O: who changed a spec (the admission
//! webhook's stamp), the next revision of a machine, and the bounded record
//! of each revision's inputs kept in the machine's history Secret
//! (docs/adr/0022-config-history.md).

pub mod actor;
pub mod diff;
pub mod record;
pub mod rollback;
pub mod store;
