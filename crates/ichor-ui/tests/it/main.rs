//! The integration tests of `ichor-ui`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod browser_e2e;
mod chart_rbac;
mod common;
mod handlers;
mod history;
mod tls;
