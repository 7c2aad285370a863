//! Parse + serialise throughput per fixture (a bench binary, no timing assertions).
//!
//! Run: `cargo bench -p ichor-talos --bench config`. Prints, per fixture,
//! the mean time of one parse and one serialise and the throughput in MiB/s.

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::time::{Duration, Instant};

use ichor_talos::config::MachineConfig;

fn time<F: FnMut()>(mut f: F) -> Duration {
    // warm up, then run for at least 300 ms
    for _ in 0..10 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(300) {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/talos");
    let mut files = Vec::new();
    for sub in ["stability-v1.12", "stability-v1.14"] {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(sub))
            .expect("fixtures directory")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        files.extend(names);
    }
    println!(
        "{:<48} {:>8} {:>12} {:>12} {:>10}",
        "fixture", "bytes", "parse", "serialise", "MiB/s"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read fixture");
        let cfg = MachineConfig::parse(&text).expect("parse");
        let parse = time(|| {
            std::hint::black_box(MachineConfig::parse(std::hint::black_box(&text)).expect("parse"));
        });
        let ser = time(|| {
            std::hint::black_box(cfg.to_yaml().expect("serialise"));
        });
        let mibs = text.len() as f64 / (parse + ser).as_secs_f64() / (1024.0 * 1024.0);
        let name = f.strip_prefix(&dir).unwrap_or(&f).display().to_string();
        println!(
            "{name:<48} {:>8} {:>12?} {:>12?} {mibs:>10.1}",
            text.len(),
            parse,
            ser
        );
    }
}
