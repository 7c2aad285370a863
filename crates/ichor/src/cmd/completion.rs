//! `ichor completion SHELL` (clap_complete) and `ichor man-pages --out-dir`
//! (clap_mangen): both read the command line's own definition, so they
//! never fall behind it.

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::args::{Cli, CompletionArgs, ManPagesArgs, ShellArg};
use crate::printer;

/// The completion script of `shell`, as text.
pub fn script_text(shell: ShellArg) -> anyhow::Result<String> {
    let shell = match shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
        ShellArg::Powershell => Shell::PowerShell,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ichor", &mut out);
    String::from_utf8(out).context("the completion script is not UTF-8")
}

pub fn script(args: CompletionArgs) -> anyhow::Result<()> {
    let text = script_text(args.shell)?;
    printer::data(text.trim_end_matches('\n'));
    Ok(())
}

pub fn man_pages(args: ManPagesArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    let count = write_pages(&cmd, &args.out_dir)?;
    printer::step(&format!(
        "{count} man pages written to {}",
        args.out_dir.display()
    ));
    Ok(())
}

/// The page of `cmd` (named after its path, `ichor-machine-add.1`, as the
/// built command's display name says) and of each of its commands; none
/// for clap's own `help` commands, which only repeat the others.
fn write_pages(cmd: &clap::Command, dir: &std::path::Path) -> anyhow::Result<usize> {
    // The footer names the program, not the command's last word.
    let man =
        clap_mangen::Man::new(cmd.clone()).source(concat!("ichor v", env!("CARGO_PKG_VERSION")));
    man.generate_to(dir)
        .with_context(|| format!("cannot write {}", dir.join(man.get_filename()).display()))?;
    let mut count = 1;
    for sub in cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help" && !s.is_hide_set())
    {
        count += write_pages(sub, dir)?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R17.20 (every shell's script names every subcommand)
    #[test]
    fn every_shell_gets_a_script_naming_the_commands() {
        for shell in [
            ShellArg::Bash,
            ShellArg::Zsh,
            ShellArg::Fish,
            ShellArg::Powershell,
        ] {
            let text = script_text(shell).unwrap();
            for word in ["adopt", "machine", "completion", "tunnel"] {
                assert!(text.contains(word), "{shell:?} script lacks {word}");
            }
            // PowerShell's script completes names, not values.
            if shell != ShellArg::Powershell {
                assert!(
                    text.contains("geneve"),
                    "{shell:?} script lacks --tunnel's values"
                );
            }
        }
    }

    /// Covers: R17.21 (a page per command)
    #[test]
    fn man_pages_cover_every_visible_command() {
        let dir = tempfile::tempdir().unwrap();
        man_pages(ManPagesArgs {
            out_dir: dir.path().join("man1"),
        })
        .unwrap();
        let names: Vec<String> = std::fs::read_dir(dir.path().join("man1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        for page in [
            "ichor.1",
            "ichor-adopt.1",
            "ichor-machine-add.1",
            "ichor-completion.1",
        ] {
            assert!(names.iter().any(|n| n == page), "{page} in {names:?}");
        }
        let root = std::fs::read_to_string(dir.path().join("man1/ichor.1")).unwrap();
        assert!(root.contains(".TH ichor 1"), "{root}");
        assert!(!names.iter().any(|n| n.contains("-help")), "{names:?}");
        let add = std::fs::read_to_string(dir.path().join("man1/ichor-machine-add.1")).unwrap();
        assert!(add.contains(".TH ichor-machine-add 1  \"ichor v"), "{add}");
        assert!(add.contains("ichor machine add"), "{add}");
    }
}
