//! Test helpers: the shared fixtures.
use std::path::PathBuf;

/// `/work/shared/fixtures/talos`, found from the crate directory.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/talos")
        .canonicalize()
        .expect("shared fixtures directory exists next to the repository")
}

/// Reads one fixture file as text.
pub fn fixture(rel: &str) -> String {
    let p = fixtures_dir().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Every `.yaml` fixture, relative paths, sorted.
pub fn all_yaml_fixtures() -> Vec<String> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read fixtures dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                out.push(
                    p.strip_prefix(base)
                        .expect("under base")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    let base = fixtures_dir();
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out.sort();
    out
}
