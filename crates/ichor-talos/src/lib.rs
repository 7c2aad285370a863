//! Talos Linux building blocks for Ichor: typed machine config documents,
//! config patches, the secrets bundle and the talosconfig client file.
//!
//! This crate is a pure library: it does no network I/O and knows nothing
//! about Kubernetes. File access is limited to reading and writing the
//! operator's own files (bundle, talosconfig) when asked to.

pub mod config;
