#!/usr/bin/env python3
"""Prints one markdown table of the figures the benches left in a folder
(target/bench-figures/<bench>.json, each a list of rows with the columns
figure, goal, measured, peer, ratio, verdict). Used by `make bench`.

    tools/bench-table.py [FOLDER]
"""
import json
import pathlib
import sys

# The benches in the order of docs/benchmarks.md; any other file follows.
ORDER = ["config", "render", "values", "records", "inspection", "take", "startup", "convergence"]
COLUMNS = ["figure", "goal", "measured", "peer", "ratio", "verdict"]

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/bench-figures")
files = sorted(folder.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
if not files:
    sys.exit(f"no figures in {folder}: run the benches first (make bench)")
print("| " + " | ".join(COLUMNS) + " |")
print("|" + "|".join("---" for _ in COLUMNS) + "|")
short = 0
for f in files:
    for row in json.loads(f.read_text()):
        short += row.get("verdict") == "short"
        print("| " + " | ".join(str(row.get(c, "-")).replace("|", "\\|") for c in COLUMNS) + " |")
print(f"\n{short} figure(s) short of their goal" if short else "\nevery figure with a goal meets it")
