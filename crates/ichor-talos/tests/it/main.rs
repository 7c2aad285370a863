//! The integration tests of `ichor-talos`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod bad_input;
mod fuzz_parsers;
mod talosctl;
mod talosctl_bundle;
mod talosctl_patch_diff;
