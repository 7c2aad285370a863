#!/usr/bin/env python3
"""Figures of the code's shape, for the notes on refactors.

Counts, in non-test Rust code under crates/: functions longer than 80 and
100 lines, files longer than 800 lines, thiserror variants whose message
repeats their source (a `{source}`/`{0}` placeholder on a field that
`source()` also returns), functions returning `Result<_, String>`, and the
integration-test binaries (top-level files in each crate's tests/).

Usage: python3 tools/code-shape.py [--list]
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LIST = "--list" in sys.argv


def rust_files():
    for base, dirs, files in os.walk(os.path.join(ROOT, "crates")):
        dirs[:] = [d for d in dirs if d not in ("target", "tests", "benches", "fuzz")]
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(base, f)


def strip_tests(text):
    """The file without its `#[cfg(test)] mod … { … }` blocks."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def functions(text):
    """(name, lines) of every fn with a body."""
    for m in re.finditer(r"\bfn\s+(\w+)[^;{]*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        yield m.group(1), text[m.start() : j].count("\n") + 1


VARIANT = re.compile(r"#\[error\((?P<msg>(?:[^()]|\([^()]*\))*)\)\]\s*(?P<body>\w+\s*(\{[^}]*\}|\([^)]*\))?)", re.S)


def repeating(text):
    for m in VARIANT.finditer(text):
        msg, body = m.group("msg"), m.group("body")
        transparent = "transparent" in msg
        if transparent:
            continue
        if "{source}" in msg and re.search(r"\bsource\s*:", body):
            yield body.split()[0]
        elif re.search(r"\{0\}", msg) and re.search(r"#\[(from|source)\]", body):
            yield body.split()[0]
        else:
            for f in re.findall(r"#\[(?:from|source)\]\s*(\w+)\s*:", body):
                if "{" + f + "}" in msg:
                    yield body.split()[0]


def main():
    long80, long100, big, rep, stringly = [], [], [], [], []
    for path in rust_files():
        rel = os.path.relpath(path, ROOT)
        text = strip_tests(open(path, encoding="utf-8").read())
        lines = text.count("\n")
        if lines > 800:
            big.append((lines, rel))
        for name, n in functions(text):
            if n > 80:
                long80.append((n, f"{rel}:{name}"))
            if n > 100:
                long100.append((n, f"{rel}:{name}"))
        rep += [f"{rel}:{v}" for v in repeating(text)]
        stringly += [rel for _ in re.finditer(r"->\s*Result<[^>]*,\s*String>", text)]
    binaries = []
    for crate in sorted(os.listdir(os.path.join(ROOT, "crates"))):
        tests = os.path.join(ROOT, "crates", crate, "tests")
        if os.path.isdir(tests):
            binaries += [f"{crate}/{f}" for f in os.listdir(tests) if f.endswith(".rs")]
            binaries += [f"{crate}/{d}" for d in os.listdir(tests) if os.path.isfile(os.path.join(tests, d, "main.rs"))]
    print(f"functions over 80 lines: {len(long80)} (over 100: {len(long100)})")
    print(f"files over 800 lines (tests excluded): {len(big)}")
    print(f"error variants repeating their source: {len(rep)}")
    print(f"functions returning Result<_, String>: {len(stringly)}")
    print(f"integration-test binaries: {len(binaries)}")
    if LIST:
        for n, f in sorted(long80, reverse=True):
            print(f"  fn {n:4} {f}")
        for n, f in sorted(big, reverse=True):
            print(f"  file {n:5} {f}")
        for v in rep:
            print(f"  repeats {v}")


if __name__ == "__main__":
    main()
