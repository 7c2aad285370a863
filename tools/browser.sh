#!/usr/bin/env bash
# Installs the headless browser the UI's end-to-end test drives: Debian's
# `chromium` and `chromium-driver` packages (no browser download of its own; the
# Debian archive is a package registry this project can reach). Idempotent:
# a warm run only checks that both binaries answer `--version`. The .deb files
# are kept in a cache outside the clone so a reinstall needs no download.
#
#   tools/browser.sh          install what is missing, print the paths
#   tools/browser.sh --env    print only `export ICHOR_CHROMIUM=… ICHOR_CHROMEDRIVER=…`
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/ichor/browser/debs.
set -euo pipefail

mode=${1:-install}
cache=${ICHOR_BROWSER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ichor/browser}
mkdir -p "$cache/debs/partial"
log() { [ "$mode" = "--env" ] && echo "browser: $*" >&2 || echo "browser: $*"; }

# One install at a time per machine (apt takes its own lock too, but waiting
# here says why).
exec 9>"$cache/.lock"
if ! flock -n 9; then
  log "another install holds $cache/.lock; waiting for it"
  flock 9
fi

chromium=/usr/bin/chromium
driver=/usr/bin/chromedriver

have() { "$chromium" --version >/dev/null 2>&1 && "$driver" --version >/dev/null 2>&1; }

if ! have; then
  if [ "$(id -u)" != 0 ]; then
    log "chromium and chromium-driver are not installed and this is not root: run 'sudo apt-get install chromium chromium-driver'"
    exit 1
  fi
  start=$(date +%s)
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be missing on a fresh machine (apt-cache finds nothing then).
  if ! apt-cache show chromium-driver >/dev/null 2>&1; then
    log "apt-get update (the package lists are missing)"
    apt-get update -q
  fi
  log "downloading chromium and chromium-driver into $cache/debs"
  apt-get install -y -q --no-install-recommends --download-only \
    -o Dir::Cache::archives="$cache/debs" chromium chromium-driver
  log "installing"
  apt-get install -y -q --no-install-recommends \
    -o Dir::Cache::archives="$cache/debs" chromium chromium-driver
  log "installed in $(( $(date +%s) - start )) s"
fi

if [ "$mode" = "--env" ]; then
  echo "export ICHOR_CHROMIUM=$chromium ICHOR_CHROMEDRIVER=$driver"
else
  log "$("$chromium" --version 2>/dev/null)"
  echo "ICHOR_CHROMIUM=$chromium"
  echo "ICHOR_CHROMEDRIVER=$driver"
fi
