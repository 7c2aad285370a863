//! `ichor`: the operator's command. Each subcommand lives in `cmd/`; the
//! decisions they make live in the library crates.

mod args;
mod cmd;
mod connect;
#[cfg(test)]
mod help_snapshots;
mod hints;
mod printer;
mod settings;

use std::process::ExitCode;

/// The controller renders every machine's config, which builds and drops
/// many small YAML values: the system allocator was about a third of a
/// render's time (`docs/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

use args::{
    BackupCommand, Cli, ClusterCommand, CniCommand, CniHelmCommand, Command, MachineCommand,
    OperationCommand, SecretsCommand, UpgradeCommand,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    printer::init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            printer::error(&anyhow::anyhow!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Adopt(a) => cmd::adopt::run(a).await,
            Command::Reclaim(a) => cmd::reclaim::run(a).await,
            Command::Init(a) => cmd::init::run(a).await,
            Command::Controller(a) => cmd::controller::run(a).await,
            Command::Cluster(ClusterCommand::Status(a)) => cmd::status::run(a).await,
            Command::Secrets(SecretsCommand::Recover(a)) => cmd::secrets::recover(a),
            Command::Cni(CniCommand::Bootstrap(a)) => cmd::cni::bootstrap(a).await,
            Command::Cni(CniCommand::Helm(CniHelmCommand::Apply(a))) => {
                cmd::cni::helm_apply(a).await
            }
            Command::Upgrade(UpgradeCommand::Talos(a)) => cmd::operation::upgrade_talos(a).await,
            Command::Upgrade(UpgradeCommand::Kubernetes(a)) => {
                cmd::operation::upgrade_version(a, ichor_api::OperationKind::KubernetesUpgrade)
                    .await
            }
            Command::Upgrade(UpgradeCommand::Ichor(a)) => {
                cmd::operation::upgrade_version(a, ichor_api::OperationKind::Ichor).await
            }
            Command::Reboot(a) => cmd::operation::reboot(a).await,
            Command::Install(a) => cmd::install::run(a).await,
            Command::Operation(OperationCommand::List(a)) => cmd::operation::list(a).await,
            Command::Backup(BackupCommand::Now(a)) => cmd::backup::now(a).await,
            Command::Backup(BackupCommand::List(a)) => cmd::backup::list(a).await,
            Command::Backup(BackupCommand::Show(a)) => cmd::backup::show(a).await,
            Command::Recover(a) => cmd::recover::run(a).await,
            Command::Operation(OperationCommand::Status(a)) => cmd::operation::status(a).await,
            Command::Operation(OperationCommand::Cancel(a)) => cmd::operation::cancel(a).await,
            Command::Ui(a) => cmd::ui::run(a).await,
            Command::Machine(MachineCommand::List(a)) => cmd::machine::list(a).await,
            Command::Machine(MachineCommand::Add(a)) => cmd::machine::add(a).await,
            Command::Machine(MachineCommand::Remove(a)) => cmd::machine::remove(a).await,
            Command::Machine(MachineCommand::Replace(a)) => cmd::machine::replace(a).await,
            Command::Machine(MachineCommand::History(a)) => cmd::machine::history::list(a).await,
            Command::Machine(MachineCommand::Diff(a)) => cmd::machine::history::diff(a).await,
            Command::Machine(MachineCommand::Rollback(a)) => {
                cmd::machine::history::rollback(a).await
            }
            Command::Completion(a) => cmd::completion::script(a),
            Command::ManPages(a) => cmd::completion::man_pages(a),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            printer::error(&e);
            ExitCode::FAILURE
        }
    }
}
