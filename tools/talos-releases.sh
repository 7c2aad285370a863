#!/usr/bin/env bash
# Refreshes Ichor's table of Talos releases and their upgrade rules
# (crates/ichor-reconcile/src/operation/path/releases.rs) from Talos's own
# compatibility package, pkg/machinery/compatibility/talosNNN/*.go: for each
# release line, the oldest Talos it upgrades from (MinimumHostUpgradeVersion),
# the version a downgrade must start below (MaximumHostDowngradeVersion), the
# denied host versions and the Kubernetes range. The newest patch of each
# line (the hop an upgrade path goes through) comes from the release tags.
#
#   tools/talos-releases.sh --git TALOS_GIT_DIR [--rev REV]
#       a clone of github.com/siderolabs/talos: the compatibility package at
#       REV (default: the machinery version tools/versions.env pins) and the
#       newest vX.Y.Z tag of each line
#   tools/talos-releases.sh --source MACHINERY_DIR vX.Y.Z...
#       the module github.com/siderolabs/talos/pkg/machinery unpacked (for
#       example `go mod download -json ...@VERSION`'s Dir, or
#       $ICHOR_TALOS_MACHINERY_SRC), and the newest patch of each line given
#       as arguments (the Go module proxy refuses to list Talos's versions)
#
# --check: exit 1 when the table in the repository differs from what it would
# write (nothing written).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
out="$here/../crates/ichor-reconcile/src/operation/path/releases.rs"

git_dir="" rev="pkg/machinery/$TALOS_MACHINERY_VERSION" source_dir="" check=0
newest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --git) git_dir=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    --source) source_dir=$2; shift 2 ;;
    --check) check=1; shift ;;
    v[0-9]*) newest+=("$1"); shift ;;
    *) echo "talos-releases: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

# compat_files: prints "LINE<TAB>go source" for each talosNNN package, one
# file per record, NUL-separated.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$git_dir" ]; then
  # The tag pkg/machinery/vX is Talos's own for the module; fall back to vX.
  if ! git -C "$git_dir" rev-parse -q --verify "$rev^{commit}" >/dev/null; then
    rev=${rev#pkg/machinery/}
  fi
  git -C "$git_dir" rev-parse -q --verify "$rev^{commit}" >/dev/null ||
    { echo "talos-releases: $git_dir has no revision $rev" >&2; exit 1; }
  from="github.com/siderolabs/talos pkg/machinery/compatibility at $rev"
  for pkg in $(git -C "$git_dir" ls-tree --name-only "$rev" pkg/machinery/compatibility/ | grep -E '/talos[0-9]+$'); do
    name=${pkg##*/}
    git -C "$git_dir" show "$rev:$pkg/$name.go" >"$work/$name.go"
  done
  if [ ${#newest[@]} -eq 0 ]; then
    mapfile -t newest < <(git -C "$git_dir" tag --list 'v[0-9]*' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' |
      sort -V | awk -F. '{line=$1"."$2; last[line]=$0} END {for (l in last) print last[l]}' | sort -V)
  fi
elif [ -n "$source_dir" ]; then
  compat="$source_dir/compatibility"
  [ -d "$compat" ] || compat="$source_dir/pkg/machinery/compatibility"
  [ -d "$compat" ] || { echo "talos-releases: no compatibility/ under $source_dir" >&2; exit 1; }
  from="github.com/siderolabs/talos/pkg/machinery compatibility from $(basename "$source_dir")"
  for d in "$compat"/talos[0-9]*; do
    name=${d##*/}
    cat "$d"/*.go >"$work/$name.go"
  done
else
  echo "talos-releases: give --git TALOS_GIT_DIR or --source MACHINERY_DIR (see the header of $0)" >&2
  exit 2
fi

printf '%s\n' "${newest[@]}" >"$work/newest"

python3 - "$work" "$from" >"$work/releases.rs" <<'PY'
import glob, os, re, sys

work, source = sys.argv[1], sys.argv[2]
newest = {}
for v in open(os.path.join(work, "newest")).read().split():
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", v)
    if not m:
        sys.exit(f"talos-releases: {v} is not a release version vX.Y.Z")
    line = (int(m[1]), int(m[2]))
    newest[line] = max(newest.get(line, v), v, key=lambda s: tuple(map(int, s[1:].split("."))))

def version(text, var):
    m = re.search(var + r'\s*=\s*semver\.MustParse\("(\d+)\.(\d+)\.(\d+)"\)', text)
    if not m:
        sys.exit(f"talos-releases: no {var} in the compatibility source")
    return tuple(int(x) for x in m.groups())

rows = []
for path in glob.glob(os.path.join(work, "talos*.go")):
    text = open(path).read()
    m = re.search(r"MajorMinor\s*=\s*\[2\]uint64\{(\d+),\s*(\d+)\}", text)
    if not m:
        continue
    line = (int(m[1]), int(m[2]))
    denied_block = re.search(r"DeniedHostUpgradeVersions\s*=\s*\[\]semver\.Version\{(.*?)\n\}", text, re.S)
    denied = []
    if denied_block:
        denied = [tuple(int(x) for x in d) for d in
                  re.findall(r'MustParse\("(\d+)\.(\d+)\.(\d+)"\)', denied_block[1])]
    rows.append((line, version(text, "MinimumHostUpgradeVersion"),
                 version(text, "MaximumHostDowngradeVersion"), denied,
                 version(text, "MinimumKubernetesVersion"), version(text, "MaximumKubernetesVersion")))
rows.sort()

def t(v):
    return "(" + ", ".join(str(x) for x in v) + ")"

print("// Generated by tools/talos-releases.sh: do not edit, run the script.")
print("//! Talos's release lines and their upgrade rules, as Talos's own")
print("//! compatibility package states them, and the newest patch of each line")
print("//! (from its release tags).")
print()
print("use super::Release;")
print()
print("/// Where the table was read from.")
print('pub const SOURCE: &str = "%s";' % source)
print()
print("/// Every release line the compatibility package knows, oldest first.")
print("pub const RELEASES: &[Release] = &[")
for line, low, below, denied, kmin, kmax in rows:
    n = newest.get(line)
    print("    Release {")
    print(f"        line: {t(line)},")
    shown = 'Some("%s")' % n if n else "None"
    print(f"        newest: {shown},")
    print(f"        upgrades_from: {t(low)},")
    print(f"        downgrades_from_below: {t(below)},")
    print(f"        denied: &[{', '.join(t(d) for d in denied)}],")
    print(f"        kubernetes: ({t(kmin)}, {t(kmax)}),")
    print("    },")
print("];")
PY

# As cargo fmt writes it, so the table stays as the script wrote it.
rustfmt --edition 2024 "$work/releases.rs"

if [ "$check" = 1 ]; then
  if ! diff -u "$out" "$work/releases.rs"; then
    echo "talos-releases: $out is not what the compatibility source says (run without --check)" >&2
    exit 1
  fi
  exit 0
fi
mkdir -p "$(dirname "$out")"
cp "$work/releases.rs" "$out"
echo "talos-releases: wrote $out from $from"
