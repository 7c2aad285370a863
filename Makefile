# The commands a newcomer types. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test testbin fmt-check clippy cargo-test lab crds

## test: build the upstream tools if missing, then fmt, clippy and every test
test: testbin fmt-check clippy cargo-test

## testbin: build kube-apiserver, etcd, helm v3/v4 and talosctl into the cache (once per machine)
testbin:
	@bash tools/testbin.sh

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# One test thread per binary keeps two cores from being swamped by parallel
# helm and apiserver work; each test binary starts its own control plane.
cargo-test:
	$(CARGO) test --workspace --locked --no-fail-fast -- --test-threads=2

## lab: the local lab — `ichor adopt` end to end against emulated Talos nodes
lab: testbin
	$(CARGO) build --locked -p ichor -p ichor-lab
	./target/debug/ichor-lab demo
