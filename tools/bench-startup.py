#!/usr/bin/env python3
"""`ichor --version` process start, measured by hyperfine (Debian's
`hyperfine` package), on the release binary; leaves the row of `make
bench`'s table in FOLDER/startup.json (goal under 20 ms, docs/benchmarks.md).

    tools/bench-startup.py [BINARY] [FOLDER]

No shell between hyperfine and the binary (`-N`): the figure is the
process's own start, exec to exit. Prints hyperfine's own summary too.
"""
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

GOAL_MS = 20.0
binary = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/release/ichor")
folder = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "target/bench-figures")
if not binary.exists():
    sys.exit(f"{binary} is missing: cargo build --release -p ichor --bin ichor")
if shutil.which("hyperfine") is None:
    sys.exit("hyperfine is missing: apt-get install hyperfine")

with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "hyperfine.json"
    subprocess.run(
        ["hyperfine", "-N", "--warmup", "20", "--runs", "200", "--export-json", str(out),
         f"{binary} --version"],
        check=True,
    )
    result = json.loads(out.read_text())["results"][0]

mean_ms = result["mean"] * 1000
median_ms = result["median"] * 1000
row = {
    "figure": "`ichor --version` process start (release binary, hyperfine -N, 200 runs)",
    "goal": "< 20 ms",
    "measured": f"{mean_ms:.1f} ms mean ({median_ms:.1f} ms median, "
                f"{result['min'] * 1000:.1f}–{result['max'] * 1000:.1f} ms)",
    "peer": "-",
    "ratio": "-",
    "verdict": "pass" if mean_ms < GOAL_MS else "short",
}
folder.mkdir(parents=True, exist_ok=True)
(folder / "startup.json").write_text(json.dumps([row], indent=2, ensure_ascii=False) + "\n")
print(f"ichor --version: {mean_ms:.1f} ms mean, {median_ms:.1f} ms median")
