#!/usr/bin/env bash
# Prints the directory of the pinned Cilium chart (CILIUM_VERSION in
# versions.env). The chart ships inside Cilium's published Go module
# (install/kubernetes/cilium), so the Go module proxy serves it: it is
# downloaded once into the Go module cache and read from there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/cilium/cilium@v${CILIUM_VERSION#v}" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir","")) if not d.get("Error") else sys.exit("go mod download: "+d["Error"])')
chart="$dir/install/kubernetes/cilium"
[ -f "$chart/Chart.yaml" ] || { echo "no Chart.yaml in $chart" >&2; exit 1; }
echo "$chart"
