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
pub mod private_file;
pub mod redact;
pub mod secrets;
pub mod support;
pub mod talosconfig;
pub mod version;

/// Writes a file readable by its owner only (0600), replacing it, through
/// the one private-file writer ([`private_file::write`]).
pub(crate) fn write_private_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    private_file::write(path, bytes).map_err(private_file::PrivateFileError::into_io)
}

#[cfg(test)]
pub(crate) mod test_support;
