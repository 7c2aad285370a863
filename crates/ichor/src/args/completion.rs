//! `ichor completion SHELL` and `ichor man-pages`: what `make release`
//! writes beside the binary.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// `ichor completion --help`'s examples.
const COMPLETION_EXAMPLES: &str = "\
Examples:
  source <(ichor completion bash)
  ichor completion bash > /etc/bash_completion.d/ichor
  ichor completion zsh > \"${fpath[1]}/_ichor\"
  ichor completion fish > ~/.config/fish/completions/ichor.fish
  ichor completion powershell | Out-String | Invoke-Expression";

/// A shell the completion script is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShellArg {
    Bash,
    Zsh,
    Fish,
    Powershell,
}

#[derive(Debug, Args)]
#[command(after_long_help = COMPLETION_EXAMPLES)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: ShellArg,
}

#[derive(Debug, Args)]
pub struct ManPagesArgs {
    /// The folder the pages are written to (ichor.1, ichor-adopt.1, …),
    /// created if missing.
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
}
