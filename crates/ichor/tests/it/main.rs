//! The integration tests of `ichor`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod adopt_e2e;
mod backup_lab_e2e;
mod cilium_on_talos_e2e;
mod cni_e2e;
mod common;
mod completion_cli;
mod gates_lab_e2e;
mod health_e2e;
mod helm_e2e;
mod history_cli;
mod history_lab_e2e;
mod image;
mod init_bad_input_e2e;
mod init_lab_e2e;
mod lab_pods_e2e;
mod least_privilege_e2e;
mod machine_cli;
mod membership_lab_e2e;
mod observability_lab_e2e;
mod operation_cli;
mod operations_lab_e2e;
mod reclaim_e2e;
mod recover_cli;
mod recover_emu_e2e;
mod recover_lab_e2e;
mod recover_restore_e2e;
mod shapes_e2e;
mod try_lab_e2e;
mod ui_cli;
mod ui_lab_e2e;
mod upgrade_lab_e2e;
