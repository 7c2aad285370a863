//! The real `talosctl` (from the tools cache) against emulated nodes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_talemu::{ClientCertSpec, Emulator};
use ichor_testenv::Tool;

/// What one talosctl run printed.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={}\n--- stdout\n{}\n--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

/// talosctl with an admin talosconfig of the emulator, through node 0's endpoint.
pub struct Talosctl {
    config: PathBuf,
    endpoint: String,
    home: PathBuf,
}

impl Talosctl {
    pub fn admin(emu: &Emulator, dir: &Path) -> Talosctl {
        let config = dir.join("talosconfig");
        std::fs::write(
            &config,
            emu.talosconfig("talemu", &ClientCertSpec::admin()).unwrap(),
        )
        .unwrap();
        Talosctl {
            config,
            endpoint: emu.endpoint(0),
            home: dir.to_path_buf(),
        }
    }

    /// `talosctl -n NODES -e <endpoint> ARGS…`, bounded.
    pub async fn on(&self, nodes: &str, args: &[&str]) -> Run {
        let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
        cmd.arg("--talosconfig")
            .arg(&self.config)
            .args(["-n", nodes, "-e", &self.endpoint])
            .args(args);
        run(cmd, &self.home).await
    }
}

/// `talosctl -n <endpoint> ARGS…` without a talosconfig (maintenance mode).
pub async fn insecure(emu: &Emulator, i: usize, home: &Path, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
    cmd.args(["-n", &emu.endpoint(i)]).args(args);
    run(cmd, home).await
}

async fn run(mut cmd: tokio::process::Command, home: &Path) -> Run {
    cmd.env_remove("TALOSCONFIG")
        .env("HOME", home)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("talosctl answered within 60s")
        .expect("talosctl runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The line of `text` that contains every one of `words` (panics when none does).
pub fn line_with<'a>(text: &'a str, words: &[&str]) -> &'a str {
    text.lines()
        .find(|l| words.iter().all(|w| l.contains(w)))
        .unwrap_or_else(|| panic!("no line with {words:?} in:\n{text}"))
}
