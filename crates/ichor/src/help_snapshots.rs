//! Snapshots of every command's `--help` (insta): a change to what the CLI
//! says about itself is a visible diff. Regenerate with
//! `INSTA_UPDATE=always cargo test -p ichor --bin ichor help_snapshots`
//! and review the `.snap` files.

use clap::CommandFactory as _;

use crate::args::Cli;

/// Every command path, the root first.
const COMMANDS: &[&[&str]] = &[
    &[],
    &["adopt"],
    &["reclaim"],
    &["init"],
    &["controller"],
    &["cluster"],
    &["cluster", "status"],
    &["secrets"],
    &["secrets", "recover"],
    &["cni"],
    &["cni", "bootstrap"],
    &["cni", "helm"],
    &["cni", "helm", "apply"],
    &["upgrade"],
    &["upgrade", "talos"],
    &["upgrade", "kubernetes"],
    &["upgrade", "ichor"],
    &["reboot"],
    &["install"],
    &["operation"],
    &["operation", "list"],
    &["operation", "status"],
    &["operation", "cancel"],
    &["backup"],
    &["backup", "now"],
    &["backup", "list"],
    &["backup", "show"],
    &["recover"],
    &["ui"],
    &["machine"],
    &["machine", "list"],
    &["machine", "add"],
    &["machine", "remove"],
    &["machine", "replace"],
    &["machine", "history"],
    &["machine", "diff"],
    &["machine", "rollback"],
    &["completion"],
    &["man-pages"],
];

/// The long help of the command at `path`, 100 columns wide, without the
/// values of environment variables (they differ between machines).
fn long_help(path: &[&str]) -> String {
    let mut root = Cli::command()
        .term_width(100)
        .mut_args(|a| a.hide_env_values(true));
    root.build();
    let mut cmd = &mut root;
    for name in path {
        cmd = cmd
            .find_subcommand_mut(name)
            .unwrap_or_else(|| panic!("no command {name} in {path:?}"));
    }
    let mut owned = cmd.clone().mut_args(|a| a.hide_env_values(true));
    owned.render_long_help().to_string()
}

#[test]
fn every_command_help_is_snapshotted() {
    for path in COMMANDS {
        let name = if path.is_empty() {
            "ichor".to_string()
        } else {
            format!("ichor-{}", path.join("-"))
        };
        insta::assert_snapshot!(name, long_help(path));
    }
}

#[test]
fn help_examples_stay_one_command_a_line() {
    let help = long_help(&["adopt"]);
    assert!(
        help.contains(
            "\n  ichor adopt --cluster lab --recover-secrets --recover-from 10.5.0.2 --tunnel geneve --yes\n"
        ),
        "{help}"
    );
    let help = long_help(&["init"]);
    assert!(
        help.contains("\n  ichor init lab --endpoint https://10.5.0.2:6443 --control-plane 10.5.0.2 --worker 10.5.0.3\n"),
        "{help}"
    );
    let help = long_help(&["secrets", "recover"]);
    assert!(
        help.contains("\n  ichor secrets recover --from-config cp.yaml -o secrets.yaml"),
        "{help}"
    );
}
