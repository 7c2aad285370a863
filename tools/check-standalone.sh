#!/usr/bin/env bash
# The repository stands alone: no code, test, bench, script or document reads
# or cites a path outside it, and comments cite requirement IDs (docs/requirements.md)
# rather than tracker numbers. Run first by `make test`, before anything is built.
set -euo pipefail
cd "$(dirname "$0")/.."

paths=(crates tools Makefile .ci .github dist docs README.md)
found=0
report() {
    echo "check-standalone: $1" >&2
    echo "$2" >&2
    found=1
}

# A path that climbs out of a crate past the repository root, or names the
# folder a working copy may happen to have beside it.
if hits=$(grep -rnE --binary-files=without-match \
    '\.\./\.\./\.\./|\.\./shared\b|shared/(facts|spec|fixtures|design)\b' \
    "${paths[@]}" --exclude=check-standalone.sh); then
    report "these lines reach outside the repository; use testdata/ or say it here" "$hits"
fi

# Tracker numbers mean nothing to a reader of the repository alone.
if hits=$(grep -rniE --binary-files=without-match '\bissues? #?[0-9]+\b' \
    "${paths[@]}" --exclude=check-standalone.sh); then
    report "these lines cite an issue number; name the requirement (docs/requirements.md) or say what it is" "$hits"
fi

# Every requirement ID cited resolves to docs/requirements.md.
if [[ -f docs/requirements.md ]]; then
    missing=$(grep -rhoE --binary-files=without-match '\bR[0-9]+\.[0-9]+[a-z]?\b' \
        crates tools docs README.md --exclude=requirements.md | sort -u |
        while read -r id; do grep -qE "\*\*${id//./\\.}\*\*" docs/requirements.md || echo "$id"; done)
    if [[ -n "$missing" ]]; then
        report "these requirement IDs are cited but not in docs/requirements.md" "$missing"
    fi
else
    report "docs/requirements.md is missing" "(the IDs the tests name are defined there)"
fi

if [[ $found -ne 0 ]]; then
    exit 1
fi
echo "check-standalone: nothing reaches outside the repository"
