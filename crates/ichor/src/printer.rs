//! All output goes through here: data on stdout, progress and errors on
//! stderr, plain lines when stderr is not a terminal. The workspace denies
//! `print_stdout` and `print_stderr` everywhere else.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::IsTerminal as _;

pub fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // kube's client logs every refused request at ERROR; the caller
    // reports the refusal itself (adopt's webhook wait expects refusals).
    let filter = tracing_subscriber::EnvFilter::try_from_env("ICHOR_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},kube_client::client::builder=off"))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .try_init();
}

/// A step of a long command, on stderr.
pub fn step(line: &str) {
    eprintln!("{line}");
}

/// Data the command produces, on stdout.
pub fn data(text: &str) {
    println!("{text}");
}

/// An error and its causes, one per line (each once:
/// [`ichor_api::error_text::causes`]), then what can help.
pub fn error(e: &anyhow::Error) {
    eprint_lines(&error_lines(e));
}

/// The lines [`error`] prints.
pub fn error_lines(e: &anyhow::Error) -> Vec<String> {
    let said = ichor_api::error_text::causes(e.as_ref());
    let mut lines: Vec<String> = said
        .iter()
        .enumerate()
        .map(|(i, text)| match i {
            0 => format!("error: {text}"),
            _ => format!("  caused by: {text}"),
        })
        .collect();
    if let Some(help) = crate::hints::help_for(e) {
        lines.push(format!("help: {help}"));
    }
    lines
}

fn eprint_lines(lines: &[String]) {
    for line in lines {
        eprintln!("{line}");
    }
}

/// Cells as lines, each column as wide as its widest cell.
pub fn columns<const N: usize>(cells: &[[String; N]]) -> Vec<String> {
    let widths: Vec<usize> = (0..N)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    cells
        .iter()
        .map(|c| {
            let line: Vec<String> = c
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            line.join("  ").trim_end().to_string()
        })
        .collect()
}

/// A question on stderr, without a newline (the answer follows on the line).
pub fn ask(question: &str) {
    use std::io::Write as _;
    eprint!("{question}");
    let _ = std::io::stderr().flush();
}

/// A spinner while waiting on a terminal; plain lines otherwise.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    pub fn start(message: &str) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_message(message.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            Progress { bar: Some(bar) }
        } else {
            step(message);
            Progress { bar: None }
        }
    }

    /// A line that stays (reports while waiting).
    pub fn line(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => step(line),
        }
    }

    pub fn finish(self, message: &str) {
        match self.bar {
            Some(bar) => bar.finish_with_message(message.to_string()),
            None => step(message),
        }
    }
}

/// A progress bar per machine on a terminal (`--wait`); plain lines
/// otherwise, one each time a machine's words change.
pub struct Bars {
    multi: Option<indicatif::MultiProgress>,
    bars: std::collections::BTreeMap<String, (indicatif::ProgressBar, String)>,
}

impl Bars {
    pub fn new() -> Bars {
        Bars {
            multi: std::io::stderr()
                .is_terminal()
                .then(indicatif::MultiProgress::new),
            bars: std::collections::BTreeMap::new(),
        }
    }

    /// Shows one machine: `done` of `total` steps, and what it is doing.
    pub fn show(&mut self, machine: &str, total: u64, done: u64, words: &str) {
        if let Some(multi) = &self.multi {
            let (bar, _) = self.bars.entry(machine.to_string()).or_insert_with(|| {
                let bar = multi.add(indicatif::ProgressBar::new(total));
                bar.set_style(
                    indicatif::ProgressStyle::with_template("{bar:20} {pos}/{len} {msg}")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                (bar, String::new())
            });
            bar.set_length(total);
            bar.set_position(done);
            bar.set_message(words.to_string());
            return;
        }
        let entry = self
            .bars
            .entry(machine.to_string())
            .or_insert_with(|| (indicatif::ProgressBar::hidden(), String::new()));
        if entry.1 != words {
            entry.1 = words.to_string();
            step(&format!("[{done}/{total}] {words}"));
        }
    }

    pub fn finish(self) {
        for (bar, _) in self.bars.values() {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain a missing helm gives `ichor cni bootstrap`: the context,
    /// the release, the spawn and the OS's reason.
    fn missing_helm() -> anyhow::Error {
        let spawn = ichor_helm::render::RenderError::Spawn {
            helm: "/nowhere/helm".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        };
        let helm = ichor_helm::Error::Render {
            release: "cilium".into(),
            source: spawn,
        };
        anyhow::Error::new(ichor_cilium::Error::Helm(helm))
            .context("ichor cni bootstrap could not run helm")
    }

    #[test]
    fn each_cause_is_said_once_then_what_can_help() {
        let lines = error_lines(&missing_helm());
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert_eq!(
            lines[..4],
            [
                "error: ichor cni bootstrap could not run helm",
                "  caused by: Helm release cilium: rendering the chart failed",
                "  caused by: cannot run helm at /nowhere/helm",
                "  caused by: No such file or directory",
            ]
        );
        assert!(
            lines[4].starts_with("help: ") && lines[4].contains("ICHOR_HELM"),
            "{}",
            lines[4]
        );
        assert!(lines[4].contains("(now /nowhere/helm)"), "{}", lines[4]);
        let joined = lines.join("\n");
        assert_eq!(joined.matches("cannot run helm").count(), 1, "{joined}");
        assert_eq!(joined.matches("install helm").count(), 1, "{joined}");
    }

    /// An error whose advice is its [`ichor_api::error_text::Help`]: the
    /// help line says it once, and no cause line does.
    #[test]
    fn the_advice_of_an_error_is_printed_once_on_the_help_line() {
        let timeout = ichor_helm::render::RenderError::Timeout {
            command: "helm template cilium".into(),
            timeout: std::time::Duration::from_secs(300),
        };
        let helm = ichor_helm::Error::Render {
            release: "cilium".into(),
            source: timeout,
        };
        let e = anyhow::Error::new(ichor_cilium::Error::Helm(helm)).context("ichor cni bootstrap");
        let lines = error_lines(&e);
        assert_eq!(
            lines,
            [
                "error: ichor cni bootstrap",
                "  caused by: Helm release cilium: rendering the chart failed",
                "  caused by: `helm template cilium` did not finish within 300s",
                "help: check access to the chart source",
            ]
        );

        let read = ichor_talos::config::ConfigError::Read {
            path: "cp.yaml".into(),
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "Permission denied"),
        };
        let e = anyhow::Error::new(ichor_talos::secrets::SecretsError::Config(read))
            .context("ichor adopt could not recover the secrets bundle");
        let lines = error_lines(&e);
        let joined = lines.join("\n");
        assert_eq!(joined.matches("check the path").count(), 1, "{joined}");
        assert_eq!(
            lines.last().map(String::as_str),
            Some("help: check the path and its permissions"),
            "{joined}"
        );
        assert!(
            lines[..lines.len() - 1]
                .iter()
                .all(|l| !l.contains("check the path")),
            "{joined}"
        );
    }

    #[test]
    fn an_error_without_a_known_remedy_has_no_help_line() {
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_lines(&e), vec!["error: outer", "  caused by: inner"]);
    }
}
