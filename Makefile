# The commands a newcomer types. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
CARGO ?= cargo
# A CI run builds once from nothing: incremental data would only cost disk
# (tens of GB over a full test build) and time.
ifneq ($(CI),)
export CARGO_INCREMENTAL := 0
endif

.PHONY: test checks-and-build standalone deny testbin fmt-check clippy test-build cargo-test cargo-test-cli cargo-test-rest lab fuzz bench bench-scale

## test: check that nothing reaches outside the repository and the dependency graph's licences, bans and sources, fmt, clippy and build every test while the upstream tools build if missing, then run every test
# Two lanes, then the tests: the tools (Go builds, module and package
# downloads) beside the Rust lane (checks in order, failing fast, then the
# test build). On a cold machine their network waits and single-threaded
# links overlap instead of adding up; warm, testbin takes a second.
test:
	@$(MAKE) --no-print-directory -j2 testbin checks-and-build
	@$(MAKE) --no-print-directory cargo-test

checks-and-build:
	@for step in standalone deny fmt-check clippy test-build; do $(MAKE) --no-print-directory $$step || exit 1; done

## standalone: fail when any file reads or cites a path outside the repository, or cites an issue number
standalone:
	@bash tools/check-standalone.sh

## deny: cargo-deny against deny.toml — licences, bans (wildcards; duplicate versions reported), sources (crates.io only); installs the pinned cargo-deny into the cache once per machine. Advisories are not checked (no reachable registry serves the RustSec database)
deny:
	@bash tools/deny.sh

## testbin: build kube-apiserver, etcd, etcdutl, etcdctl, helm v3/v4, talosctl, crane, age, age-keygen, versitygw (an S3 server), the machinery peer and the SSA prune peer, and fetch the real Cilium chart, into the cache (once per machine); install Debian's chromium and chromium-driver for the UI's browser test
testbin:
	@bash tools/testbin.sh
	@bash tools/browser.sh

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## test-build: build every test binary without running it (what cargo-test then runs)
test-build:
	$(CARGO) test --workspace --locked --no-run

# Two lanes of two test threads: the CLI crate's lab suite (about half of
# all test time) beside every other crate's tests. Most of a lab test's time
# is spent waiting on bounded timers and API watches, not on the CPU, so two
# cores carry four such tests; cargo releases its build lock before running
# tests, so the lanes do not wait on each other. Their lines interleave as
# tests finish, each marked with its lane (make's --output-sync would hold a
# lane's output until it ends).
# The CLI crate's lab modules named here run in the other lane, after its
# own tests, so that the lanes end together: the CLI lane skips exactly the
# names the other lane selects (libtest matches both by substring).
CLI_LAB_TESTS_IN_REST_LANE = membership_lab_e2e gates_lab_e2e

cargo-test:
	@$(MAKE) --no-print-directory -j2 cargo-test-cli cargo-test-rest

cargo-test-cli:
	set -o pipefail; $(CARGO) test -p ichor --locked --no-fail-fast -- --test-threads=2 $(addprefix --skip ,$(CLI_LAB_TESTS_IN_REST_LANE)) 2>&1 | sed -u 's/^/[cli] /'

cargo-test-rest:
	set -o pipefail; { \
	  failed=0; \
	  $(CARGO) test --workspace --exclude ichor --locked --no-fail-fast -- --test-threads=2 || failed=1; \
	  $(CARGO) test -p ichor --test it --locked --no-fail-fast -- --test-threads=2 $(CLI_LAB_TESTS_IN_REST_LANE) || failed=1; \
	  exit $$failed; \
	} 2>&1 | sed -u 's/^/[rest] /'

## fuzz: FUZZ_CASES=N — the property-based fuzz targets with N cases each (CI runs 256)
# The parsers fed by users and nodes (R8.4): machine config round trip,
# patches, talosconfig, secrets bundle, Helm records, the webhooks. A failing
# case is shrunk and printed; it becomes a named regression test.
FUZZ_CASES ?= 20000
# package/test binary/name filter: each crate's fuzz module in its test binary.
FUZZ_TARGETS = ichor-talos/it/fuzz_parsers:: ichor-helm/it/fuzz_record:: ichor-controller/it/fuzz_webhook::
# Optimised: a long run does far more cases per minute (FUZZ_PROFILE= for a debug build).
FUZZ_PROFILE ?= --release
fuzz:
	@set -e; for target in $(FUZZ_TARGETS); do \
	  IFS=/ read -r pkg bin filter <<< "$$target"; \
	  echo "fuzz: $$pkg --test $$bin $$filter"; \
	  PROPTEST_CASES=$(FUZZ_CASES) PROPTEST_MAX_SHRINK_ITERS=100000 $(CARGO) test --locked $(FUZZ_PROFILE) -p $$pkg --test $$bin $$filter -- --test-threads=2; \
	done

## bench: the benchmarks (release profile, criterion), then one table of figure, goal, measured, peer, ratio and verdict (not part of make test)
# Each bench leaves its rows in target/bench-figures/<bench>.json; the table
# gathers them (docs/benchmarks.md). Figures are printed, never asserted. One
# cargo command for all: the release build is shared (one feature set).
# The process start of `ichor --version` is measured by hyperfine (Debian's
# package) on the release binary (tools/bench-startup.py).
BENCHES = -p ichor-talos --bench config -p ichor-render --bench render -p ichor-cilium --bench values -p ichor-helm --bench records -p ichor-adopt-run --bench inspection -p ichor-ui --bench machines_page -p ichor-backup --bench take
bench: testbin
	rm -rf target/bench-figures
	$(CARGO) bench --locked $(BENCHES)
	$(CARGO) build --locked --release -p ichor --bin ichor
	python3 tools/bench-startup.py target/release/ichor target/bench-figures
	@echo; python3 tools/bench-table.py target/bench-figures

## bench-scale: BENCH_SIZES=1000/10,5000/50 — the controller at scale, each part in its own process (release; prints a table)
# The controller (`ichor controller`) and the emulated nodes (`ichor-talemu
# serve`) run as release binaries; the bench drives them against the test
# control plane. Not part of `make test`: minutes, and it measures time.
BENCH_SIZES ?= 1000/10,5000/50
bench-scale: testbin
	$(CARGO) build --locked --release -p ichor --bin ichor -p ichor-talemu --bin ichor-talemu
	ICHOR_BENCH_SIZES=$(BENCH_SIZES) $(CARGO) bench --locked -p ichor-controller --bench convergence

## lab: the local lab — `ichor adopt` end to end against emulated Talos nodes
lab: testbin
	$(CARGO) build --locked -p ichor -p ichor-lab
	./target/debug/ichor-lab demo

.PHONY: dist release images

## dist: regenerate every generated file (dist/crds, dist/install.yaml, the chart's generated templates) from the Rust sources
dist:
	$(CARGO) run --locked -p ichor-dist --bin distgen

# What the images are built from: the workspace version, the commit and its
# time (so two builds of one commit give one digest), a static helm (the tools
# cache's helm v4: CGO off), and the pinned Cilium chart from its Go module.
WS_VERSION = v$(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)
IMAGE_SOURCE = $(shell sed -n 's/^repository = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)
IMAGE_HELM = $${ICHOR_TESTBIN_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/ichor/testbin}/helm-$$(sed -n 's/^HELM4_VERSION=//p' tools/versions.env)/helm
IMAGE_CHART = $$(bash tools/cilium-chart.sh)
IMAGES_DIR := bin/images
# Release binaries carry no build path (the clone's folder, cargo's home), so
# a build of the same commit anywhere gives the same bytes.
RELEASE_RUSTFLAGS = --remap-path-prefix=$(CURDIR)=/ichor --remap-path-prefix=$${CARGO_HOME:-$$HOME/.cargo}=/cargo
IMAGEGEN = ./target/release/imagegen --ichor target/release/ichor --helm "$(IMAGE_HELM)" --cilium-chart "$(IMAGE_CHART)" \
	--helm-version "$$(sed -n 's/^HELM4_VERSION=//p' tools/versions.env)" --cargo-manifest Cargo.toml \
	--revision "$$(git rev-parse HEAD)" --created "$$(git log -1 --format=%ct)" --source $(IMAGE_SOURCE)

## images: the controller and UI images (ichor-controller, ichor-ui) as OCI layouts and archives in bin/images/, each with its SBOM (<image>-<tag>.cdx.json, CycloneDX) beside it (no container daemon; same commit, same digests)
images: testbin
	RUSTFLAGS="$(RELEASE_RUSTFLAGS)" $(CARGO) build --locked --release -p ichor -p ichor-image
	$(IMAGEGEN) --version $(WS_VERSION) --out $(IMAGES_DIR)

# The helm that packages the chart: the one on PATH, else the tools cache's helm v4.
HELM ?= $(shell command -v helm 2>/dev/null || echo "$${ICHOR_TESTBIN_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/ichor/testbin}/helm-$$(sed -n 's/^HELM4_VERSION=//p' tools/versions.env)/helm")
RELEASE_DIR := bin/release

## release: VERSION=vX.Y.Z — the CLI with its completions and man pages, the install manifests (install.yaml, the UI's opt-in install-ui.yaml), the packaged chart and both images with their SBOMs in bin/release/
# The version comes from one place, [workspace.package] in Cargo.toml (and
# Chart.yaml follows it); VERSION must equal it, with its v. The chart's own
# version is VERSION without the v; appVersion and the image tags keep it.
release:
	@[ -n "$(VERSION)" ] || { echo "make release needs VERSION=vX.Y.Z, for example make release VERSION=v0.1.0" >&2; exit 1; }
	@ws="v$$(sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n1)"; \
	  [ "$$ws" = "$(VERSION)" ] || { echo "VERSION=$(VERSION) but the workspace version is $$ws: set version in [workspace.package] of Cargo.toml and version/appVersion in dist/chart/Chart.yaml to it first, then run make dist" >&2; exit 1; }
	@[ -x "$(HELM)" ] || command -v "$(HELM)" >/dev/null || { echo "no helm at $(HELM): install helm, pass HELM=/path/to/helm, or run make testbin" >&2; exit 1; }
	mkdir -p $(RELEASE_DIR)
	RUSTFLAGS="$(RELEASE_RUSTFLAGS)" $(CARGO) build --locked --release -p ichor -p ichor-dist -p ichor-image
	cp target/release/ichor $(RELEASE_DIR)/ichor
	@$(MAKE) --no-print-directory cli-files ICHOR=$(RELEASE_DIR)/ichor
	./target/release/distgen --version $(VERSION) --install-yaml $(RELEASE_DIR)/install.yaml --install-ui-yaml $(RELEASE_DIR)/install-ui.yaml
	"$(HELM)" lint --strict dist/chart --namespace ichor-system
	"$(HELM)" package dist/chart --version $(patsubst v%,%,$(VERSION)) --app-version $(VERSION) --destination $(RELEASE_DIR)
	@$(RELEASE_DIR)/ichor --version | grep -qx 'ichor $(VERSION)' || { echo "$(RELEASE_DIR)/ichor does not say it is $(VERSION)" >&2; exit 1; }
	$(IMAGEGEN) --version $(VERSION) --out $(RELEASE_DIR)
	@ls -l $(RELEASE_DIR)

.PHONY: cli-files

# The CLI whose completions and man pages cli-files writes.
ICHOR ?= target/release/ichor

## cli-files: ICHOR=path/to/ichor — its shell completions (bash, zsh, fish, PowerShell) into bin/release/completions/ and a man page per command into bin/release/man/man1/ (make release runs it)
cli-files:
	@[ -x "$(ICHOR)" ] || { echo "no ichor at $(ICHOR): build it (cargo build --release -p ichor) or pass ICHOR=/path/to/ichor" >&2; exit 1; }
	mkdir -p $(RELEASE_DIR)/completions
	"$(ICHOR)" completion bash > $(RELEASE_DIR)/completions/ichor.bash
	"$(ICHOR)" completion zsh > $(RELEASE_DIR)/completions/_ichor
	"$(ICHOR)" completion fish > $(RELEASE_DIR)/completions/ichor.fish
	"$(ICHOR)" completion powershell > $(RELEASE_DIR)/completions/ichor.ps1
	"$(ICHOR)" man-pages --out-dir $(RELEASE_DIR)/man/man1

.PHONY: fuzz-patch

## fuzz-patch: the patch differential test against the real talosctl, 5000 cases (set ICHOR_DIFF_CASES, ICHOR_DIFF_SEED to change)
fuzz-patch: testbin
	ICHOR_DIFF_CASES=$${ICHOR_DIFF_CASES:-5000} ICHOR_DIFF_SEED=$${ICHOR_DIFF_SEED:-17} \
	  $(CARGO) test --locked -p ichor-talos --test it -- --test-threads=2 --nocapture talosctl_patch_diff::generated_patches_agree_with_

.PHONY: check-machinery

## check-machinery: the checks against Talos's own v1.14 config machinery (every v1.14 render validated, patches compared; ICHOR_DIFF_MACHINERY_CASES, default 300). Not in `make test`: the module proxy does not serve that machinery, so the peer is built only where ICHOR_TALOS_MACHINERY_SRC names its source (tools/testbin.sh)
check-machinery: testbin
	$(CARGO) test --locked --features machinery-peer -p ichor-talos --test it talosctl_patch_diff::machinery_peer -- --test-threads=2 --nocapture
	$(CARGO) test --locked --features machinery-peer -p ichor-render --test it machinery_peer -- --test-threads=2 --nocapture
	$(CARGO) test --locked --features machinery-peer -p ichor-adopt --test init_talos_validate -- --test-threads=2 --nocapture
