//! The integration tests of `ichor-testenv`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod smoke;
mod teardown;
