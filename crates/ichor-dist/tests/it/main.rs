//! The integration tests of `ichor-dist`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod chart;
mod monitoring;
mod promtool;
mod release;
mod schema;
mod stale;
