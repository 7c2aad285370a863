//! The integration tests of `ichor-talemu`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod cli;
mod client;
mod common;
mod derive;
mod etcd_recover;
mod etcd_snapshot;
mod everyday;
mod interop;
mod maintenance;
mod membership;
mod never_in_production;
mod talosctl;
