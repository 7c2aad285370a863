//! What the benches share: where criterion keeps its estimates, reading a
//! mean back, and the figures each bench leaves for `make bench`'s table
//! (`target/bench-figures/<bench>.json`, read by `tools/bench-table.py`).
//!
//! A figure row has the columns of the table in `docs/benchmarks.md`:
//! `figure | goal | measured | peer | ratio | verdict`.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// The cargo target folder of the running bench binary
/// (`<target>/<profile>/deps/<bench>-<hash>`).
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("the bench knows its own path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Where criterion writes its estimates: `<target>/criterion`.
pub fn criterion_dir() -> PathBuf {
    target_dir().join("criterion")
}

/// The mean time in nanoseconds criterion measured for `group/id` in this
/// run (its `new/estimates.json`); `None` when that bench did not run
/// (a filter on the command line left it out).
pub fn mean_ns(group: &str, id: &str) -> Option<f64> {
    let file = criterion_dir()
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(file).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

/// One row of the benchmark table.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub figure: String,
    pub goal: String,
    pub measured: String,
    pub peer: String,
    pub ratio: String,
    /// `pass`, `short`, or `-` for a figure without a goal.
    pub verdict: String,
}

impl Figure {
    /// A figure measured against a peer, with a goal of `goal_ratio`× the
    /// peer's speed: `ratio` is the peer's time over ours.
    pub fn against_peer(
        figure: impl Into<String>,
        ours_ns: f64,
        peer_ns: f64,
        peer_name: &str,
        goal_ratio: f64,
    ) -> Figure {
        let ratio = peer_ns / ours_ns;
        Figure {
            figure: figure.into(),
            goal: format!("≥ {goal_ratio}× {peer_name}"),
            measured: duration(ours_ns),
            peer: format!("{} ({peer_name})", duration(peer_ns)),
            ratio: format!("{ratio:.1}×"),
            verdict: verdict(ratio >= goal_ratio),
        }
    }

    /// A figure without a peer, judged by `met`.
    pub fn alone(
        figure: impl Into<String>,
        goal: impl Into<String>,
        measured: impl Into<String>,
        met: Option<bool>,
    ) -> Figure {
        Figure {
            figure: figure.into(),
            goal: goal.into(),
            measured: measured.into(),
            peer: "-".into(),
            ratio: "-".into(),
            verdict: met.map_or_else(|| "-".into(), verdict),
        }
    }
}

fn verdict(met: bool) -> String {
    if met { "pass" } else { "short" }.into()
}

/// A duration in nanoseconds, in the unit that reads best.
pub fn duration(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Writes this bench's rows to `<target>/bench-figures/<bench>.json` and
/// prints them; `make bench` gathers every file into one table.
// A bench's figures are its output (called from bench binaries only).
#[allow(clippy::print_stdout)]
pub fn record(bench: &str, figures: &[Figure]) {
    let dir = target_dir().join("bench-figures");
    std::fs::create_dir_all(&dir).expect("create the bench-figures folder");
    let file = dir.join(format!("{bench}.json"));
    std::fs::write(
        &file,
        serde_json::to_vec_pretty(figures).expect("figures serialise"),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    println!("\n{bench}: figure | goal | measured | peer | ratio | verdict");
    for f in figures {
        println!(
            "  {} | {} | {} | {} | {} | {}",
            f.figure, f.goal, f.measured, f.peer, f.ratio, f.verdict
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_against_a_peer_is_judged_by_the_ratio_of_times() {
        let f = Figure::against_peer("parse", 100.0, 400.0, "Go", 3.0);
        assert_eq!(f.ratio, "4.0×");
        assert_eq!(f.verdict, "pass");
        let f = Figure::against_peer("parse", 200.0, 400.0, "Go", 3.0);
        assert_eq!(f.verdict, "short");
        assert_eq!(duration(1_500.0), "1.5 µs");
        assert_eq!(duration(2_500_000.0), "2.50 ms");
    }
}
