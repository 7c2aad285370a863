//! What the end-to-end tests of the `ichor` binary share: a lab, Ichor's
//! controller as a local process, and the real binaries run against them.

#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use ichor_lab::{Lab, LabOptions};
use ichor_testenv::Tool;

pub const NS: &str = "ichor-system";
/// Ichor's controller image, which the ichor-cni Job runs (the lab runs it as
/// the local `ichor` binary).
pub const CONTROLLER_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller:v0.1.0";

/// A lab with two nodes (shaped by the test), and what runs against it.
pub struct LabHarness {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
    controller: Option<Child>,
}

impl Drop for LabHarness {
    fn drop(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl LabHarness {
    pub async fn up(shape: impl FnOnce(&mut LabOptions)) -> LabHarness {
        let dir = tempfile::tempdir().unwrap();
        let mut options = LabOptions::new(dir.path().join("lab"));
        options.nodes = 2;
        // The lab runs the controller's ichor-cni Jobs with this binary.
        options.ichor_bin = Some(env!("CARGO_BIN_EXE_ichor").into());
        shape(&mut options);
        let lab = Lab::up(options).await.expect("the lab starts");
        LabHarness {
            lab,
            dir,
            controller: None,
        }
    }

    /// Ichor's controller as a local process (`deployed_by`: installer or helm),
    /// logging to the lab's state folder.
    pub fn start_controller(&mut self, deployed_by: &str) {
        let log = std::fs::File::create(self.lab.state_dir().join("controller.log")).unwrap();
        let child = ichor_testenv::command_dying_with_parent(env!("CARGO_BIN_EXE_ichor"))
            .args([
                "controller",
                "--deployed-by",
                deployed_by,
                "--no-leader-election",
                "--resync",
                "10s",
                "--cni-job-image",
                CONTROLLER_IMAGE,
                "--kubeconfig",
            ])
            .arg(&self.lab.kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.controller = Some(child);
    }

    /// The real `ichor`, with no terminal.
    pub fn ichor(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
        cmd.env("NO_COLOR", "1").stdin(Stdio::null());
        cmd
    }

    /// The Cilium chart the lab gives Ichor: the real chart from the tools
    /// cache, or the stand-in where the tools cache lacks it.
    pub fn cilium_chart(&self) -> &Path {
        self.lab.options.cilium_chart.path()
    }

    /// `ichor adopt --yes` against the lab with the lab's Cilium chart.
    pub fn adopt(&self, extra: &[&str]) -> Command {
        self.adopt_with(&self.lab.talosconfig, &self.lab.kubeconfig, extra)
    }

    /// The same with another talosconfig or kubeconfig (bad-input cases).
    pub fn adopt_with(&self, talosconfig: &Path, kubeconfig: &Path, extra: &[&str]) -> Command {
        let mut cmd = self.ichor();
        cmd.args(["adopt", "--cluster", "lab", "--yes", "--talosconfig"])
            .arg(talosconfig)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--secrets-bundle")
            .arg(&self.lab.bundle)
            .arg("--helm")
            .arg(Tool::Helm4.path())
            .arg("--cilium-chart")
            .arg(self.cilium_chart())
            .args(extra);
        cmd
    }

    /// The real helm against the lab, with homes of its own.
    pub fn helm(&self, tool: Tool, args: &[&str]) -> Output {
        let home = self.dir.path().join(format!("helm-home-{tool:?}"));
        Command::new(tool.path())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.lab.kubeconfig)
            .output()
            .expect("run helm")
    }

    pub async fn client(&self) -> kube::Client {
        self.lab.client().await
    }

    /// The logs the lab's processes wrote (the controller's, the Jobs'), for
    /// a failing assertion's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(self.lab.state_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                out.push_str(&format!("--- {}\n", path.display()));
                out.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
            }
        }
        out
    }
}

/// A command's stdout and stderr together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command to its end.
pub fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run the command")
}
