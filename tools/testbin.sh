#!/usr/bin/env bash
# Builds the upstream tools that Ichor's tests talk to (kube-apiserver, etcd,
# etcdutl, etcdctl, helm v3 and v4, talosctl, crane, age, age-keygen, versitygw, Talos's config machinery and go-kubernetes's SSA prune behind small mains) from their published Go modules, and copies the
# real Cilium chart out of Cilium's published Go module, into a cache outside
# the clone keyed by tool and version, so every clone on a machine reuses them. Prints the directory of each tool on the last lines as
# ICHOR_<TOOL>=path. Warm runs finish in well under a second.
#
#   tools/testbin.sh            build what is missing, print the paths
#   tools/testbin.sh --env      print only `export ICHOR_...=` lines (for eval)
#
# Cache root: $ICHOR_TESTBIN_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/ichor/testbin.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache=${ICHOR_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ichor/testbin}
mode=${1:-build}
mkdir -p "$cache"

log() { [ "$mode" = "--env" ] && echo "$*" >&2 || echo "$*"; }

# One build at a time per machine: two clones building the same tool would race.
exec 9>"$cache/.lock"
if ! flock -n 9; then
  log "testbin: another build holds $cache/.lock; waiting for it"
  flock 9
fi

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# upstream_replaces MODULE VERSION LOCALMAP [OVERRIDES]
# Prints a go.mod replace block equal to the module's own replaces, with each
# local path (./staging/src/k8s.io/api, ./pkg/machinery, ../api) rewritten to
# the published module at the version LOCALMAP's python expression gives, and
# each OVERRIDES entry (old=new@version, space-separated) replacing its module.
upstream_replaces() {
  local module=$1 version=$2 localmap=$3 overrides=${4:-} gomod
  gomod=$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  gomod_replaces "$gomod" "$localmap" "$overrides"
}

# gomod_replaces GOMOD LOCALMAP [OVERRIDES]: upstream_replaces for a go.mod file.
gomod_replaces() {
  local gomod=$1 localmap=$2 overrides=${3:-}
  go mod edit -json "$gomod" | OVERRIDES="$overrides" python3 -c '
import json, os, sys
d = json.load(sys.stdin)
overrides = dict(o.split("=", 1) for o in os.environ["OVERRIDES"].split())
def localmap(old, new):
    return '"$localmap"'
lines = []
for r in d.get("Replace") or []:
    old, new_path, new_version = r["Old"]["Path"], r["New"]["Path"], r["New"].get("Version")
    if old in overrides:
        continue
    if new_path.startswith("."):
        lines.append("\t%s => %s %s" % (old, old, localmap(old, new_path)))
    else:
        lines.append("\t%s => %s %s" % (old, new_path, new_version))
for old, new in overrides.items():
    path, version = new.split("@")
    lines.append("\t%s => %s %s" % (old, path, version))
print("replace (\n" + "\n".join(lines) + "\n)" if lines else "")
'
}

# build TOOL VERSION PACKAGE MODULE REPLACES LDFLAGS [MAIN_CALL]
# PACKAGE is a main package, or with MAIN_CALL a library package whose
# function MAIN_CALL (for example etcdmain.Main(os.Args)) a generated main calls.
build() {
  local tool=$1 version=$2 pkg=$3 module=$4 replaces=$5 ldflags=$6 main_call=${7:-} binary=$1
  local dir="$cache/$tool-$version"
  if [ -x "$dir/$binary" ] && [ "${rebuild:-}" != "$tool-$version" ]; then
    log "testbin: $tool $version cached at $dir"
    return
  fi
  local start work
  start=$(date +%s)
  work=$(mktemp -d "$cache/.build-$tool.XXXXXX")
  log "testbin: building $tool $version from $module (first time on this machine; this takes minutes)"
  cat > "$work/go.mod" <<MOD
module ichor.local/testbin/$tool

go 1.26.0

require $module $version

$replaces
MOD
  (
    cd "$work"
    log "testbin:   resolving modules for $tool"
    go get "$pkg@$version" >/dev/null 2>"$work/get.log" || { tail -n 30 "$work/get.log" >&2; exit 1; }
    target=$pkg
    if [ -n "$main_call" ]; then
      printf 'package main\n\nimport (\n\t"os"\n\n\t"%s"\n)\n\nfunc main() { %s }\n' "$pkg" "$main_call" > main.go
      target=.
    else
      # Keep the package a requirement of the wrapper when tidying.
      printf '//go:build tools\n\npackage main\n\nimport _ "%s"\n' "$pkg" > tools.go
    fi
    go mod tidy >/dev/null 2>"$work/tidy.log" || { tail -n 30 "$work/tidy.log" >&2; exit 1; }
    log "testbin:   compiling $tool"
    go build -trimpath -ldflags "-s -w $ldflags" -o "$work/out/$binary" "$target"
  ) || { log "testbin: building $tool $version failed (work dir kept: $work)"; exit 1; }
  mkdir -p "$dir"
  mv "$work/out/$binary" "$dir/$binary.tmp" && mv "$dir/$binary.tmp" "$dir/$binary"
  rm -rf "$work"
  log "testbin: built $tool $version in $(( $(date +%s) - start ))s -> $dir/$binary"
}

k8s_minor=${KUBERNETES_VERSION#v1.}; k8s_minor=${k8s_minor%%.*}
k8s_staging=v0.${KUBERNETES_VERSION#v1.}
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitTreeState=clean"

need_build() { [ ! -x "$cache/$1-$2/${3:-$1}" ]; }

if need_build kube-apiserver "$KUBERNETES_VERSION"; then
  build kube-apiserver "$KUBERNETES_VERSION" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes \
    "$(upstream_replaces k8s.io/kubernetes "$KUBERNETES_VERSION" "'$k8s_staging'")" "$k8s_ldflags"
else build kube-apiserver "$KUBERNETES_VERSION" - - - -; fi

if need_build etcd "$ETCD_VERSION"; then
  # etcd's server module has no main package of its own; ours calls etcdmain.Main.
  build etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3/etcdmain go.etcd.io/etcd/server/v3 \
    "$(upstream_replaces go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "'$ETCD_VERSION'")" "" "etcdmain.Main(os.Args)"
else build etcd "$ETCD_VERSION" - - - -; fi

# helm v3 renders (`helm template`, a client dry-run) for a default Kubernetes
# version that helm's own Makefile sets at link time from the client-go it
# requires; without it helm says v1.20.0 and refuses charts that need newer
# Kubernetes (Cilium's). helm v4 reads client-go's version from the build info.
helm_default_kube_version() {
  local d
  d=$(mktemp -d)
  mkdir -p "$d/probe/templates"
  printf 'apiVersion: v2\nname: probe\nversion: 0.1.0\n' > "$d/probe/Chart.yaml"
  printf 'kube: {{ .Capabilities.KubeVersion.Version }}\n' > "$d/probe/templates/v.yaml"
  HELM_CACHE_HOME="$d/home" HELM_CONFIG_HOME="$d/home" HELM_DATA_HOME="$d/home" \
    "$1" template probe "$d/probe" 2>/dev/null | sed -n 's/^kube: //p'
  rm -rf "$d"
}
helm3_kube_minor=$(go mod edit -json "$(go mod download -json "helm.sh/helm/v3@$HELM3_VERSION" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')" |
  python3 -c 'import json,sys; print(next(r["Version"] for r in json.load(sys.stdin)["Require"] if r["Path"] == "k8s.io/client-go").split(".")[1])')
helm3_dir="$cache/helm-$HELM3_VERSION"
if [ -x "$helm3_dir/helm" ] && [ "$(helm_default_kube_version "$helm3_dir/helm")" != "v1.$helm3_kube_minor.0" ]; then
  log "testbin: helm $HELM3_VERSION in the cache was linked without its default Kubernetes version; rebuilding it (the old binary stays until the new one replaces it)"
  rebuild="helm-$HELM3_VERSION"
fi
build helm "$HELM3_VERSION" helm.sh/helm/v3/cmd/helm helm.sh/helm/v3 "" \
  "-X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$helm3_kube_minor -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$helm3_kube_minor"
build helm "$HELM4_VERSION" helm.sh/helm/v4/cmd/helm helm.sh/helm/v4 "" \
  "-X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION"
# talosctl reads its version from embedded files of the published module.

if need_build talosctl "$TALOS_VERSION"; then
  build talosctl "$TALOS_VERSION" github.com/siderolabs/talos/cmd/talosctl github.com/siderolabs/talos \
    "$(upstream_replaces github.com/siderolabs/talos "$TALOS_VERSION" "'$TALOS_VERSION'" "$TALOS_OVERRIDES")" ""
else build talosctl "$TALOS_VERSION" - - - -; fi

build crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane github.com/google/go-containerregistry "" ""

# age and age-keygen: the reference age implementation, for the backup tests
# (a backup encrypted by Ichor decrypts with the real age, and the reverse).
# With empty Go caches on a shared 2-core machine: age 35 s (most of it the
# standard library), age-keygen 1 s after it.
build age "$AGE_VERSION" filippo.io/age/cmd/age filippo.io/age "" "-X main.Version=$AGE_VERSION"
build age-keygen "$AGE_VERSION" filippo.io/age/cmd/age-keygen filippo.io/age "" "-X main.Version=$AGE_VERSION"

# etcdutl and etcdctl at the etcd version above: the backup tests take real
# snapshots (etcdctl snapshot save) and check them (etcdutl snapshot status,
# restore). Both modules' own replaces point at etcd's sibling folders.
# With empty Go caches: etcdutl 87 s, etcdctl 6 s after it (shared deps).
if need_build etcdutl "$ETCD_VERSION"; then
  build etcdutl "$ETCD_VERSION" go.etcd.io/etcd/etcdutl/v3 go.etcd.io/etcd/etcdutl/v3 \
    "$(upstream_replaces go.etcd.io/etcd/etcdutl/v3 "$ETCD_VERSION" "'$ETCD_VERSION'")" ""
else build etcdutl "$ETCD_VERSION" - - - -; fi
if need_build etcdctl "$ETCD_VERSION"; then
  build etcdctl "$ETCD_VERSION" go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdctl/v3 \
    "$(upstream_replaces go.etcd.io/etcd/etcdctl/v3 "$ETCD_VERSION" "'$ETCD_VERSION'")" ""
else build etcdctl "$ETCD_VERSION" - - - -; fi

# versitygw: a real S3-compatible server (Versity's S3 gateway, Apache-2.0)
# over a plain folder (its posix backend), which the backup tests upload to:
# multipart uploads, ListMultipartUploads and AbortMultipartUpload included.
# Chosen over SeaweedFS for its build time (VERSITYGW_VERSION in versions.env).
build versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw/cmd/versitygw github.com/versity/versitygw "" \
  "-X main.Version=$VERSITYGW_VERSION"

# machinery-peer: Talos's own config machinery (the Go module
# github.com/siderolabs/talos/pkg/machinery) behind our small main
# (tools/machinery-peer/main.go): validate, patch and codec-bench with the
# v1.14 document kinds that the talosctl above does not read. The source of
# the main is part of the cache key (a stamp beside the binary), so editing it
# rebuilds the peer. When the module proxy refuses the pinned version,
# $ICHOR_TALOS_MACHINERY_SRC may name a folder holding that module's source
# (Talos's pkg/machinery at the tag pkg/machinery/$TALOS_MACHINERY_VERSION);
# without either the peer is not built: make test does not need it (the
# checks against it are behind the machinery-peer feature, make check-machinery).
peer_dir="$cache/machinery-peer-$TALOS_MACHINERY_VERSION"
peer_stamp=$({ cat "$here/machinery-peer/main.go"; echo "$TALOS_MACHINERY_VERSION $TALOS_MACHINERY_OVERRIDES"; } | sha256sum | cut -c1-16)
peer_module=github.com/siderolabs/talos/pkg/machinery
if [ -x "$peer_dir/machinery-peer" ] && [ "$(cat "$peer_dir/source.sha256" 2>/dev/null)" = "$peer_stamp" ]; then
  log "testbin: machinery-peer $TALOS_MACHINERY_VERSION cached at $peer_dir"
else
  start=$(date +%s)
  peer_gomod=""
  peer_src=""
  if peer_gomod=$(go mod download -json "$peer_module@$TALOS_MACHINERY_VERSION" 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' 2>/dev/null); then
    log "testbin: building machinery-peer from $peer_module $TALOS_MACHINERY_VERSION (first time on this machine; this takes minutes)"
  elif [ -n "${ICHOR_TALOS_MACHINERY_SRC:-}" ] && [ "$(go mod edit -json "$ICHOR_TALOS_MACHINERY_SRC/go.mod" 2>/dev/null |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["Module"]["Path"])' 2>/dev/null)" = "$peer_module" ]; then
    peer_src=$(cd "$ICHOR_TALOS_MACHINERY_SRC" && pwd)
    peer_gomod="$peer_src/go.mod"
    log "testbin: the module proxy refuses $peer_module@$TALOS_MACHINERY_VERSION; building machinery-peer from its source in $peer_src (ICHOR_TALOS_MACHINERY_SRC)"
  else
    peer_gomod=""
    log "testbin: machinery-peer NOT built: the Go module proxy refuses $peer_module@$TALOS_MACHINERY_VERSION and ICHOR_TALOS_MACHINERY_SRC does not name a folder holding that module (Talos's pkg/machinery at the tag pkg/machinery/$TALOS_MACHINERY_VERSION); make test does not need it; make check-machinery and the Go side of make bench do"
  fi
  if [ -n "$peer_gomod" ]; then
    work=$(mktemp -d "$cache/.build-machinery-peer.XXXXXX")
    replaces=$(gomod_replaces "$peer_gomod" "'$TALOS_MACHINERY_VERSION'" "$TALOS_MACHINERY_OVERRIDES")
    if [ -n "$peer_src" ]; then
      replaces="$replaces
replace $peer_module => $peer_src"
    fi
    cp "$here/machinery-peer/main.go" "$work/main.go"
    cat > "$work/go.mod" <<MOD
module ichor.local/testbin/machinery-peer

go 1.26.0

require $peer_module $TALOS_MACHINERY_VERSION

$replaces
MOD
    (
      cd "$work"
      log "testbin:   resolving modules for machinery-peer"
      go mod tidy >/dev/null 2>"$work/tidy.log" || { tail -n 30 "$work/tidy.log" >&2; exit 1; }
      log "testbin:   compiling machinery-peer"
      go build -trimpath -ldflags "-s -w" -o "$work/out/machinery-peer" .
    ) || { log "testbin: building machinery-peer failed (work dir kept: $work)"; exit 1; }
    mkdir -p "$peer_dir"
    mv "$work/out/machinery-peer" "$peer_dir/machinery-peer.tmp" && mv "$peer_dir/machinery-peer.tmp" "$peer_dir/machinery-peer"
    echo "$peer_stamp" > "$peer_dir/source.sha256"
    rm -rf "$work"
    log "testbin: built machinery-peer $TALOS_MACHINERY_VERSION in $(( $(date +%s) - start ))s -> $peer_dir/machinery-peer"
  fi
fi

# ssa-prune-peer: the manifests step of `talosctl upgrade-k8s` (Talos 1.13+),
# the inventory-backed server-side apply with prune of the Go module
# github.com/siderolabs/go-kubernetes (package kubernetes/ssa) behind our small
# main (tools/ssa-prune-peer/main.go): the real prune that R6.1's test runs
# against the test API server. As for machinery-peer, the main's source is part
# of the cache key. A build with empty Go caches took 287 s on a shared 2-core
# machine (10 s resolving modules, 277 s compiling); 118 s when the other
# tools' modules and packages were already cached.
ssa_dir="$cache/ssa-prune-peer-$GO_KUBERNETES_VERSION"
ssa_stamp=$({ cat "$here/ssa-prune-peer/main.go"; echo "$GO_KUBERNETES_VERSION"; } | sha256sum | cut -c1-16)
ssa_module=github.com/siderolabs/go-kubernetes
if [ -x "$ssa_dir/ssa-prune-peer" ] && [ "$(cat "$ssa_dir/source.sha256" 2>/dev/null)" = "$ssa_stamp" ]; then
  log "testbin: ssa-prune-peer $GO_KUBERNETES_VERSION cached at $ssa_dir"
else
  start=$(date +%s)
  log "testbin: building ssa-prune-peer from $ssa_module $GO_KUBERNETES_VERSION (first time on this machine; this takes minutes)"
  work=$(mktemp -d "$cache/.build-ssa-prune-peer.XXXXXX")
  cp "$here/ssa-prune-peer/main.go" "$work/main.go"
  cat > "$work/go.mod" <<MOD
module ichor.local/testbin/ssa-prune-peer

go 1.26.0

require $ssa_module $GO_KUBERNETES_VERSION
MOD
  (
    cd "$work"
    log "testbin:   resolving modules for ssa-prune-peer"
    go mod tidy >/dev/null 2>"$work/tidy.log" || { tail -n 30 "$work/tidy.log" >&2; exit 1; }
    log "testbin:   compiling ssa-prune-peer"
    go build -trimpath -ldflags "-s -w" -o "$work/out/ssa-prune-peer" .
  ) || { log "testbin: building ssa-prune-peer failed (work dir kept: $work)"; exit 1; }
  mkdir -p "$ssa_dir"
  mv "$work/out/ssa-prune-peer" "$ssa_dir/ssa-prune-peer.tmp" && mv "$ssa_dir/ssa-prune-peer.tmp" "$ssa_dir/ssa-prune-peer"
  echo "$ssa_stamp" > "$ssa_dir/source.sha256"
  rm -rf "$work"
  log "testbin: built ssa-prune-peer $GO_KUBERNETES_VERSION in $(( $(date +%s) - start ))s -> $ssa_dir/ssa-prune-peer"
fi

# The real Cilium chart: Cilium publishes no chart module of its own, but its
# Go module carries the chart's source folder (install/kubernetes/cilium).
# cilium-cli is not built: the Go module proxy answers 403 "not available" for
# every version of github.com/cilium/cilium-cli (see ADR 0008).
chart_dir="$cache/cilium-chart-$CILIUM_VERSION"
if [ -f "$chart_dir/Chart.yaml" ]; then
  log "testbin: cilium chart $CILIUM_VERSION cached at $chart_dir"
else
  start=$(date +%s)
  log "testbin: fetching the cilium chart $CILIUM_VERSION from the Go module github.com/cilium/cilium (first time on this machine)"
  module_chart=$(bash "$here/cilium-chart.sh")
  work=$(mktemp -d "$cache/.build-cilium-chart.XXXXXX")
  cp -R "$module_chart" "$work/chart"
  # The module cache is read-only; the copy is ours.
  chmod -R u+w "$work/chart"
  rm -rf "$chart_dir"
  mv "$work/chart" "$chart_dir"
  rm -rf "$work"
  log "testbin: fetched the cilium chart $CILIUM_VERSION in $(( $(date +%s) - start ))s -> $chart_dir"
fi

# go-peers: the reference implementations the tests compare with (cel-go,
# kstatus, gopher-lua), one binary behind tools/go-peers/*.go so their shared
# dependencies compile once. Every source file and the versions are part of
# the cache key.
peers_dir="$cache/go-peers"
peers_stamp=$({ cat "$here"/go-peers/*.go; echo "$CEL_GO_VERSION $CLI_UTILS_VERSION $GOPHER_LUA_VERSION"; } | sha256sum | cut -c1-16)
if [ -x "$peers_dir/go-peers" ] && [ "$(cat "$peers_dir/source.sha256" 2>/dev/null)" = "$peers_stamp" ]; then
  log "testbin: go-peers cached at $peers_dir"
else
  start=$(date +%s)
  log "testbin: building go-peers (cel-go $CEL_GO_VERSION, cli-utils $CLI_UTILS_VERSION, gopher-lua $GOPHER_LUA_VERSION)"
  work=$(mktemp -d "$cache/.build-go-peers.XXXXXX")
  cp "$here"/go-peers/*.go "$work/"
  cat > "$work/go.mod" <<MOD
module ichor.local/testbin/go-peers

go 1.26.0

require (
	cel.dev/cel-go $CEL_GO_VERSION
	sigs.k8s.io/cli-utils $CLI_UTILS_VERSION
	github.com/yuin/gopher-lua $GOPHER_LUA_VERSION
)
MOD
  (
    cd "$work"
    log "testbin:   resolving modules for go-peers"
    go mod tidy >/dev/null 2>"$work/tidy.log" || { tail -n 30 "$work/tidy.log" >&2; exit 1; }
    log "testbin:   compiling go-peers"
    go build -trimpath -ldflags "-s -w" -o "$work/out/go-peers" .
  ) || { log "testbin: building go-peers failed (work dir kept: $work)"; exit 1; }
  mkdir -p "$peers_dir"
  mv "$work/out/go-peers" "$peers_dir/go-peers.tmp" && mv "$peers_dir/go-peers.tmp" "$peers_dir/go-peers"
  echo "$peers_stamp" > "$peers_dir/source.sha256"
  rm -rf "$work"
  log "testbin: built go-peers in $(( $(date +%s) - start ))s -> $peers_dir/go-peers"
fi

# Prometheus (with promtool) and Alertmanager from Debian's packages: fetched
# with `apt-get download` (no root, nothing installed) and unpacked with
# dpkg-deb into the cache. Static Go binaries; a few seconds on a new machine.
debian_package() { # name version -> folder holding the unpacked package
  local name=$1 version=$2 dir="$cache/deb-$1-$2"
  if [ -d "$dir/usr/bin" ]; then
    log "testbin: $name $version (Debian) cached at $dir"
  else
    start=$(date +%s)
    log "testbin: fetching $name $version from Debian's packages"
    work=$(mktemp -d "$cache/.deb-$name.XXXXXX")
    if ! (cd "$work" && apt-get download "$name=$version" >"$work/apt.log" 2>&1); then
      # A machine whose package lists were never read: read them once.
      (apt-get update >/dev/null 2>&1 || sudo -n apt-get update >/dev/null 2>&1) || true
      (cd "$work" && apt-get download "$name=$version" >"$work/apt.log" 2>&1) ||
        { tail -n 20 "$work/apt.log" >&2; log "testbin: apt-get download $name=$version failed (work dir kept: $work)"; exit 1; }
    fi
    dpkg-deb -x "$work"/*.deb "$work/root"
    rm -rf "$dir"
    mv "$work/root" "$dir"
    rm -rf "$work"
    log "testbin: fetched $name $version in $(( $(date +%s) - start ))s -> $dir"
  fi
}
debian_package prometheus "$PROMETHEUS_DEB_VERSION"
debian_package prometheus-alertmanager "$ALERTMANAGER_DEB_VERSION"
# Debian's Alertmanager opens its default templates (default.tmpl,
# email.tmpl) in the absolute /usr/share/prometheus/alertmanager at every
# config load, before the config's own `templates:`, and no flag moves that
# folder: without root or a mount namespace a test cannot provide it. A copy
# of the binary names the folder relatively instead (a string of the same
# length, usr/share/prometheus/alertmanager/; nothing else changes), so run
# from the unpacked package's root it finds the package's own templates.
am_dir="$cache/deb-prometheus-alertmanager-$ALERTMANAGER_DEB_VERSION"
am_bin="$am_dir/usr/bin/prometheus-alertmanager"
am_relative="$am_bin.relative-share"
if [ ! -x "$am_relative" ]; then
  LC_ALL=C sed 's|/usr/share/prometheus/alertmanager|usr/share/prometheus/alertmanager/|g' "$am_bin" > "$am_relative.tmp"
  if [ "$(stat -c %s "$am_relative.tmp")" != "$(stat -c %s "$am_bin")" ] ||
    LC_ALL=C grep -qa /usr/share/prometheus/alertmanager "$am_relative.tmp" ||
    ! LC_ALL=C grep -qa usr/share/prometheus/alertmanager/ "$am_relative.tmp"; then
    rm -f "$am_relative.tmp"
    log "testbin: could not make $am_relative (the path to replace was not found as expected)"
    exit 1
  fi
  chmod +x "$am_relative.tmp" && mv "$am_relative.tmp" "$am_relative"
  log "testbin: made $am_relative (its templates folder relative to the package root)"
fi

# prometheus-operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule and
# the rest of monitoring.coreos.com/v1), which the chart's monitoring objects
# are applied against in the test API server: generated, as the operator's
# own Makefile does, by controller-gen (built here from
# sigs.k8s.io/controller-tools) from the Go types of the published module
# github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring (the
# root module, which holds the YAML, is not served). With the Kubernetes
# modules already in the Go caches the first run took 66 s on a shared 2-core
# machine, most of it compiling controller-gen; generating takes 2 s.
promop_dir="$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
promop_module=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
if [ -f "$promop_dir/monitoring.coreos.com_servicemonitors.yaml" ] && [ "$(cat "$promop_dir/controller-tools.version" 2>/dev/null)" = "$CONTROLLER_TOOLS_VERSION" ]; then
  log "testbin: prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION cached at $promop_dir"
else
  start=$(date +%s)
  log "testbin: generating the prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION with controller-gen $CONTROLLER_TOOLS_VERSION (first time on this machine)"
  work=$(mktemp -d "$cache/.build-prometheus-operator-crds.XXXXXX")
  cat > "$work/go.mod" <<MOD
module ichor.local/testbin/prometheus-operator-crds

go 1.26.0

require (
	$promop_module $PROMETHEUS_OPERATOR_VERSION
	sigs.k8s.io/controller-tools $CONTROLLER_TOOLS_VERSION
)
MOD
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/v1"\n\t_ "sigs.k8s.io/controller-tools/cmd/controller-gen"\n)\n' "$promop_module" > "$work/tools.go"
  (
    cd "$work"
    log "testbin:   resolving modules for controller-gen and $promop_module"
    go mod tidy >/dev/null 2>"$work/tidy.log" || { tail -n 30 "$work/tidy.log" >&2; exit 1; }
    log "testbin:   compiling controller-gen"
    go build -trimpath -ldflags "-s -w" -o "$work/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen
    log "testbin:   generating the CRDs"
    "$work/controller-gen" crd:crdVersions=v1 paths="$promop_module/v1" output:crd:dir="$work/out" >"$work/gen.log" 2>&1 ||
      { tail -n 30 "$work/gen.log" >&2; exit 1; }
    [ -f "$work/out/monitoring.coreos.com_servicemonitors.yaml" ] || { ls "$work/out" >&2; exit 1; }
  ) || { log "testbin: generating the prometheus-operator CRDs failed (work dir kept: $work)"; exit 1; }
  echo "$CONTROLLER_TOOLS_VERSION" > "$work/out/controller-tools.version"
  rm -rf "$promop_dir"
  mv "$work/out" "$promop_dir"
  rm -rf "$work"
  log "testbin: generated the prometheus-operator CRDs in $(( $(date +%s) - start ))s -> $promop_dir"
fi

emit() {
  if [ "$mode" = "--env" ]; then echo "export $1=$2"; else echo "$1=$2"; fi
}
emit ICHOR_KUBE_APISERVER "$cache/kube-apiserver-$KUBERNETES_VERSION/kube-apiserver"
emit ICHOR_ETCD "$cache/etcd-$ETCD_VERSION/etcd"
emit ICHOR_HELM3 "$cache/helm-$HELM3_VERSION/helm"
emit ICHOR_HELM4 "$cache/helm-$HELM4_VERSION/helm"
emit ICHOR_TALOSCTL "$cache/talosctl-$TALOS_VERSION/talosctl"
emit ICHOR_CRANE "$cache/crane-$CRANE_VERSION/crane"
emit ICHOR_AGE "$cache/age-$AGE_VERSION/age"
emit ICHOR_AGE_KEYGEN "$cache/age-keygen-$AGE_VERSION/age-keygen"
emit ICHOR_ETCDUTL "$cache/etcdutl-$ETCD_VERSION/etcdutl"
emit ICHOR_ETCDCTL "$cache/etcdctl-$ETCD_VERSION/etcdctl"
emit ICHOR_VERSITYGW "$cache/versitygw-$VERSITYGW_VERSION/versitygw"
emit ICHOR_MACHINERY_PEER "$peer_dir/machinery-peer"
emit ICHOR_SSA_PRUNE_PEER "$ssa_dir/ssa-prune-peer"
emit ICHOR_CILIUM_CHART "$chart_dir"
emit ICHOR_GO_PEERS "$peers_dir/go-peers"
emit ICHOR_PROMETHEUS "$cache/deb-prometheus-$PROMETHEUS_DEB_VERSION/usr/bin/prometheus"
emit ICHOR_PROMTOOL "$cache/deb-prometheus-$PROMETHEUS_DEB_VERSION/usr/bin/promtool"
emit ICHOR_ALERTMANAGER "$cache/deb-prometheus-alertmanager-$ALERTMANAGER_DEB_VERSION/usr/bin/prometheus-alertmanager"
emit ICHOR_PROMETHEUS_OPERATOR_CRDS "$promop_dir"
