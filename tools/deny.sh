#!/usr/bin/env bash
# Checks the workspace's dependency graph with cargo-deny against deny.toml:
# licences, bans (wildcard requirements, duplicate versions) and sources.
# cargo-deny itself (CARGO_DENY_VERSION in versions.env) is installed from
# crates.io once per machine into the tools cache, outside the clone, and
# reused after; a warm run starts checking at once.
#
#   tools/deny.sh               install cargo-deny if missing, then check
#   tools/deny.sh --why         the same, with the path to each duplicate crate
#   tools/deny.sh --install     only install it, print its path
#
# Advisories (the RustSec database) are not checked: that database is a git
# repository, and no package registry this project can reach serves it.
#
# Cache root: $ICHOR_TESTBIN_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/ichor/testbin.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${ICHOR_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ichor/testbin}
mode=${1:-check}
dir="$cache/cargo-deny-$CARGO_DENY_VERSION"
bin="$dir/bin/cargo-deny"
mkdir -p "$cache"

if [ ! -x "$bin" ]; then
  # One install at a time per machine; the second waits and then finds it.
  exec 9>"$cache/.lock-cargo-deny"
  if ! flock -n 9; then
    echo "deny: another install holds $cache/.lock-cargo-deny; waiting for it"
    flock 9
  fi
fi
if [ ! -x "$bin" ]; then
  start=$(date +%s)
  echo "deny: installing cargo-deny $CARGO_DENY_VERSION from crates.io into $dir (first time on this machine)"
  work=$(mktemp -d "$cache/.build-cargo-deny.XXXXXX")
  # The crate's own release profile asks for fat LTO and one codegen unit,
  # several times the build time on a small machine for a tool that runs for
  # seconds: plain optimised code is enough.
  (
    cd "$here/.."
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
      cargo install --locked --quiet --version "$CARGO_DENY_VERSION" \
      --root "$work/root" --target-dir "$work/target" cargo-deny
  ) || { echo "deny: installing cargo-deny $CARGO_DENY_VERSION failed (work dir kept: $work)" >&2; exit 1; }
  rm -rf "$dir"
  mv "$work/root" "$dir"
  rm -rf "$work"
  echo "deny: installed cargo-deny $CARGO_DENY_VERSION in $(( $(date +%s) - start ))s -> $bin"
fi

if [ "$mode" = "--install" ]; then
  echo "ICHOR_CARGO_DENY=$bin"
  exit 0
fi

# The duplicate versions are warnings; their inclusion graphs run to
# thousands of lines, shown only with --why.
graph=--hide-inclusion-graph
[ "$mode" = "--why" ] && graph=
cd "$here/.."
exec "$bin" --locked check $graph --show-stats licenses bans sources
