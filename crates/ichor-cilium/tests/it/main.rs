//! The integration tests of `ichor-cilium`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod cilium;
mod real_chart;
