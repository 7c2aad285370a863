//! Ichor's backups of a cluster: what a backup holds and where it goes.
//!
//! The pure parts (the etcd snapshot check, the manifest and object layout,
//! schedules and retention) take no I/O; encryption and the destinations
//! stream through bounded buffers, so a snapshot is never held whole in
//! memory or on disk.

pub mod crypt;
pub mod manifest;
pub mod recover;
pub mod restore;
pub mod retention;
pub mod schedule;
pub mod snapshot;
pub mod spec_check;
pub mod store;
pub mod take;
