//! Shared helpers of the emulator tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub mod talosctl;

/// The real Talos files in `testdata/talos/`.
pub fn fixtures_dir() -> PathBuf {
    ichor_testenv::fixtures::talos_dir()
}

/// A fixture's bytes.
pub fn fixture(rel: &str) -> Vec<u8> {
    let path = fixtures_dir().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
}

/// The v1.12-shape control-plane fixture.
pub fn cp_v112() -> Vec<u8> {
    fixture("stability-v1.12/base-controlplane.yaml")
}

/// The v1.12-shape worker fixture.
pub fn worker_v112() -> Vec<u8> {
    fixture("stability-v1.12/base-worker.yaml")
}

/// The v1.14-shape control-plane fixture.
pub fn cp_v114() -> Vec<u8> {
    fixture("stability-v1.14/base-controlplane.yaml")
}

/// Replaces the first occurrence of `from` in a config (panics when absent).
pub fn edit(config: &[u8], from: &str, to: &str) -> Vec<u8> {
    let text = String::from_utf8(config.to_vec()).unwrap();
    assert!(text.contains(from), "{from:?} not in the config");
    text.replacen(from, to, 1).into_bytes()
}
