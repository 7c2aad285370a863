//! The integration tests of `ichor-lab`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod cilium_handover_prune;
mod cilium_on_talos_real_chart;
mod grow;
mod talosctl_health;
