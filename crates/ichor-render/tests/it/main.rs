//! The integration tests of `ichor-render`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod adr;
mod common;
mod leak;
mod props;
mod render;
mod talosctl_validate;
