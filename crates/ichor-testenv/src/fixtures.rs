//! The files the tests and the lab read: the real Talos files kept under
//! `testdata/talos/` (their origin and licence in its `SOURCES.md`), and
//! ichor-render's `cni.name: none` configs made from them.
use std::path::PathBuf;

use crate::tools::repo_root;

/// `testdata/talos/` of this repository.
pub fn talos_dir() -> PathBuf {
    repo_root().join("testdata/talos")
}

/// One Talos fixture's path, `rel` under `testdata/talos/`.
pub fn talos_path(rel: &str) -> PathBuf {
    talos_dir().join(rel)
}

/// One Talos fixture as text.
pub fn talos(rel: &str) -> String {
    read(&talos_path(rel))
}

/// One Talos fixture's bytes.
pub fn talos_bytes(rel: &str) -> Vec<u8> {
    talos(rel).into_bytes()
}

/// ichor-render's fixtures folder: the stability configs with `cni.name:
/// none` (how they were made in its `README.md`).
pub fn cni_none_dir() -> PathBuf {
    repo_root().join("crates/ichor-render/tests/fixtures")
}

/// One `cni.name: none` fixture as text, `rel` under [`cni_none_dir`].
pub fn cni_none(rel: &str) -> String {
    read(&cni_none_dir().join(rel))
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
}

/// Every `.yaml` fixture under `testdata/talos/`, as paths relative to it, sorted.
pub fn all_talos_yaml() -> Vec<String> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading fixtures folder {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|x| x == "yaml") {
                let rel = path.strip_prefix(base).expect("under the fixtures folder");
                out.push(rel.display().to_string());
            }
        }
    }
    let base = talos_dir();
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixtures_are_inside_the_repository() {
        let dir = talos_dir().canonicalize().expect("testdata/talos exists");
        let root = repo_root().canonicalize().expect("the repository root");
        assert!(
            dir.starts_with(&root),
            "{} is outside {}",
            dir.display(),
            root.display()
        );
        assert!(all_talos_yaml().contains(&"stability-secrets.yaml".to_owned()));
        assert!(cni_none("v1.12-cni-none-worker.yaml").contains("name: none"));
    }
}
