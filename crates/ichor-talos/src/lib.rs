//! Talos Linux building blocks for Ichor: typed machine config documents,
//! config patches, the secrets bundle and the talosconfig client file.
//!
//! This crate is a pure library: it does no network I/O and knows nothing
//! about Kubernetes. File access is limited to reading and writing the
//! operator's own files (bundle, talosconfig) when asked to.

pub mod bootstrap_inventory;
pub mod config;
pub mod patch;
pub mod pem;
pub mod redact;
pub mod secrets;
pub mod talosconfig;

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

#[cfg(test)]
pub(crate) mod test_support;
