//! Talos Linux building blocks for Ichor: typed machine config documents,
//! config patches, the secrets bundle and the talosconfig client file.
//!
//! This crate is a pure library: it does no network I/O and knows nothing
//! about Kubernetes. File access is limited to reading and writing the
//! operator's own files (bundle, talosconfig) when asked to.

pub mod config;
pub mod patch;
pub mod pem;
pub mod secrets;
pub mod talosconfig;

#[cfg(test)]
pub(crate) mod test_support {
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
}

/// Writes a file readable by its owner only (0600 on Unix), replacing it.
pub(crate) fn write_private_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(bytes)?;
    f.sync_all()
}
