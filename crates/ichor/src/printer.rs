//! All output goes through here: data on stdout, progress and errors on
//! stderr, plain lines when stderr is not a terminal.

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

/// An error and its causes, one per line.
pub fn error(e: &anyhow::Error) {
    eprintln!("error: {e}");
    for cause in e.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
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
