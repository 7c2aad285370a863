//! Machine-config parse and serialise per fixture, on criterion, side by
//! side with Talos's own Go machinery on the same files in the same run
//! (the tools cache's `machinery-peer codec-bench`: configloader, then the
//! encoder Talos uses for `talosctl get mc -o yaml`). No timing assertions:
//! it prints figures and leaves the rows of `make bench`'s table.
//!
//! Run: `cargo bench -p ichor-talos --bench config` (needs `make testbin`).

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use criterion::Criterion;
use ichor_talos::config::MachineConfig;
use ichor_testenv::Tool;
use ichor_testenv::bench::{Figure, criterion_dir, mean_ns, record};

/// Loads and encodes per file the Go peer runs (about a second per file).
const GO_ITERATIONS: u32 = 300;
/// The config-codec goal (docs/benchmarks.md): parse + serialise at least this many times faster than Go.
const GOAL_RATIO: f64 = 3.0;

fn fixtures() -> Vec<(String, PathBuf)> {
    let dir = ichor_testenv::fixtures::talos_dir();
    let mut files = Vec::new();
    for shape in ["stability-v1.12", "stability-v1.14"] {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(shape))
            .expect("fixtures directory")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        for path in names {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let id = format!("{}-{stem}", shape.trim_start_matches("stability-"));
            files.push((id, path));
        }
    }
    files
}

#[derive(serde::Deserialize)]
struct GoFigures {
    file: PathBuf,
    parse_ns: f64,
    encode_ns: f64,
}

fn go_peer(files: &[(String, PathBuf)]) -> Vec<GoFigures> {
    let out = Command::new(Tool::MachineryPeer.path())
        .args(["codec-bench", "--iterations", &GO_ITERATIONS.to_string()])
        .args(files.iter().map(|(_, p)| p))
        .output()
        .expect("machinery-peer runs");
    assert!(
        out.status.success(),
        "machinery-peer codec-bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("machinery-peer prints JSON figures")
}

fn main() {
    let files = fixtures();
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let texts: Vec<String> = files
        .iter()
        .map(|(_, p)| std::fs::read_to_string(p).expect("read fixture"))
        .collect();
    let mut parse = c.benchmark_group("config-parse");
    for ((id, _), text) in files.iter().zip(&texts) {
        parse.bench_function(id.as_str(), |b| {
            b.iter(|| MachineConfig::parse(std::hint::black_box(text)).expect("parse"))
        });
    }
    parse.finish();
    let mut serialise = c.benchmark_group("config-serialise");
    for ((id, _), text) in files.iter().zip(&texts) {
        let cfg = MachineConfig::parse(text).expect("parse");
        serialise.bench_function(id.as_str(), |b| {
            b.iter(|| std::hint::black_box(&cfg).to_yaml().expect("serialise"))
        });
    }
    serialise.finish();
    c.final_summary();

    if !Tool::MachineryPeer.is_built() {
        // the module proxy does not serve Talos's v1.14 machinery: without
        // its source (ICHOR_TALOS_MACHINERY_SRC) there is no Go side
        println!(
            "machinery-peer is not built (see tools/testbin.sh): the side-by-side rows with Talos's machinery are left out"
        );
        record("config", &[]);
        return;
    }
    let go = go_peer(&files);
    println!(
        "\n{:<34} {:>7} {:>11} {:>11} {:>11} {:>11} {:>7}",
        "fixture", "bytes", "Rust parse", "Rust ser.", "Go parse", "Go encode", "ratio"
    );
    let mut figures = Vec::new();
    for shape in ["v1.12", "v1.14"] {
        let (mut ours, mut theirs) = (0.0, 0.0);
        for ((id, path), g) in files.iter().zip(&go) {
            assert_eq!(path, &g.file, "the peer answers in file order");
            if !id.starts_with(shape) {
                continue;
            }
            let (Some(parse), Some(ser)) =
                (mean_ns("config-parse", id), mean_ns("config-serialise", id))
            else {
                // a name filter left this fixture out
                continue;
            };
            println!(
                "{id:<34} {:>7} {:>11} {:>11} {:>11} {:>11} {:>6.1}×",
                std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
                ichor_testenv::bench::duration(parse),
                ichor_testenv::bench::duration(ser),
                ichor_testenv::bench::duration(g.parse_ns),
                ichor_testenv::bench::duration(g.encode_ns),
                (g.parse_ns + g.encode_ns) / (parse + ser)
            );
            ours += parse + ser;
            theirs += g.parse_ns + g.encode_ns;
        }
        if ours > 0.0 {
            figures.push(Figure::against_peer(
                format!("config parse + serialise, the 4 {shape} fixtures (sum)"),
                ours,
                theirs,
                &format!("Talos machinery {}", Tool::MachineryPeer.version()),
                GOAL_RATIO,
            ));
        }
    }
    record("config", &figures);
}
