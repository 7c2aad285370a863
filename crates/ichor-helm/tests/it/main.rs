//! The integration tests of `ichor-helm`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod common;
mod engine;
mod fuzz_record;
mod secret_list;
