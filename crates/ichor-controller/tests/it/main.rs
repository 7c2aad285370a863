//! The integration tests of `ichor-controller`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod backup_health;
mod bad_input;
mod cluster;
mod common;
mod fan_out;
mod fuzz_webhook;
mod handover_inventory;
mod health_gates;
mod history;
mod hold_race;
mod http;
mod machines;
mod malformed;
mod membership;
mod operations;
mod spans;
mod try_mode;
mod upgrade_paths;
mod webhook;
mod windows;
