//! talosconfig
