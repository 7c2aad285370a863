//! The integration tests of `ichor-adopt-run`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod init_guards;
mod no_pod_network;
