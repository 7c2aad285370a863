//! Typed Talos machine configuration (multi-document YAML).
