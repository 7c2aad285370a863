//! Typed Talos machine configuration: a multi-document YAML file.
//!
//! A [`MachineConfig`] is an ordered list of [`Document`]s. The legacy
//! `v1alpha1` document and the documents Ichor reads or renders are typed;
//! every other document is kept as [`OtherDocument`] (its YAML mapping,
//! unchanged). Every typed struct carries a flattened `extra` map holding the
//! fields Ichor does not model, so parse → serialise loses nothing.
//!
//! Serialisation is deterministic: typed fields first, in declaration order,
//! then the unknown fields in the order they were read. A second round trip
//! is byte-identical to the first.
//!
//! [`MachineConfig::facts`] answers, in one place and whatever the shape
//! (v1.12/v1.13 `v1alpha1`-only or v1.14 multi-document), what adopt needs.

mod cow;
mod document;
mod facts;
pub mod host;
pub mod kube;
mod scalar;
pub mod v1alpha1;

use std::borrow::Borrow;
use std::path::Path;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

pub use cow::CowMapping;
pub use document::{Document, DocumentKind, OtherDocument};
pub use facts::{
    CniName, ConfigFacts, ConfigShape, DEFAULT_DNS_DOMAIN, DEFAULT_POD_SUBNET,
    DEFAULT_SERVICE_SUBNET, InlineManifestFact, KubePrismFact, MachineType,
};
pub use host::*;
pub use kube::*;
pub use v1alpha1::{DEFAULT_KUBEPRISM_PORT, V1Alpha1Config};

/// Fields of a document that Ichor does not model, kept in input order.
pub type Extra = indexmap::IndexMap<String, Value>;

/// Errors of the `config` module.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read machine config file {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document is not valid YAML.
    #[error("{origin}: document #{index} is not valid YAML")]
    Yaml {
        /// Where the text came from (a file path, or a description).
        origin: String,
        /// 1-based position of the document in the file.
        index: usize,
        /// The YAML error.
        source: serde_yaml_ng::Error,
    },
    /// A document is YAML but not a mapping.
    #[error(
        "{origin}: document #{index} is a YAML {found}, but every Talos config document is a mapping; remove or fix that document"
    )]
    NotAMapping {
        /// Where the text came from.
        origin: String,
        /// 1-based position of the document.
        index: usize,
        /// What was found instead (`sequence`, `string`, ...).
        found: &'static str,
    },
    /// A known document kind has a field of the wrong type.
    #[error(
        "{origin}: document #{index} (kind {kind}) does not have the shape Talos expects: {detail}; fix that field"
    )]
    Shape {
        /// Where the text came from.
        origin: String,
        /// 1-based position of the document.
        index: usize,
        /// The document kind (`v1alpha1` for the legacy document).
        kind: String,
        /// The decoding error, with the values it quotes redacted (a
        /// config's values may be secrets).
        detail: String,
    },
    /// A `talosctl get machineconfig -o yaml` output holds several nodes' configs.
    #[error(
        "{origin} holds {count} MachineConfig resources (one per node); save one node's config, for example with `talosctl -n <ip> get machineconfig -o yaml`"
    )]
    SeveralResources {
        /// Where the text came from.
        origin: String,
        /// How many resources it holds.
        count: usize,
    },
    /// Serialising a document failed (a bug: typed documents always serialise).
    #[error("cannot serialise document #{index} (kind {kind}) to YAML")]
    Serialise {
        /// 1-based position of the document.
        index: usize,
        /// The document kind.
        kind: String,
        /// The YAML error.
        source: serde_yaml_ng::Error,
    },
}

impl ConfigError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Self::Read { .. } => Some("check the path and its permissions".into()),
            Self::Yaml { .. } => Some("fix the YAML syntax of that document".into()),
            Self::Serialise { .. } => Some("this is a bug in ichor-talos; please report it".into()),
            _ => None,
        }
    }
}

/// A whole Talos machine configuration: an ordered list of documents.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MachineConfig {
    /// The documents, in file order.
    pub documents: Vec<Document>,
}

impl MachineConfig {
    /// Parses a (multi-document) machine config. Empty documents are skipped.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_with_origin(text, "machine config")
    }

    /// Parses a machine config; `origin` (for example a file path) is named in errors.
    pub fn parse_with_origin(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let values = parse_yaml_documents(text, origin)?;
        let mut documents = Vec::with_capacity(values.len());
        for (i, value) in values.into_iter().enumerate() {
            documents.push(Document::from_mapping(value, origin, i + 1)?);
        }
        Ok(Self { documents })
    }

    /// Parses either a plain machine config or the output of
    /// `talosctl get machineconfig -o yaml` (a COSI resource whose `spec` is
    /// the config text), which is what operators usually save from a node.
    pub fn parse_live(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let docs = parse_yaml_documents(text, origin)?;
        let specs: Vec<&str> = docs
            .iter()
            .filter_map(machine_config_resource_spec)
            .collect();
        match specs.as_slice() {
            [] => Self::parse_with_origin(text, origin),
            [spec] => Self::parse_with_origin(spec, &format!("{origin} (resource spec)")),
            many => Err(ConfigError::SeveralResources {
                origin: origin.to_string(),
                count: many.len(),
            }),
        }
    }

    /// Reads a file with [`Self::parse_live`].
    pub fn from_file_live(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse_live(&text, &path.display().to_string())
    }

    /// Reads and parses a machine config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse_with_origin(&text, &path.display().to_string())
    }

    /// Serialises the config: documents separated by `---`, deterministic.
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        mappings_to_yaml(&self.to_mappings()?)
    }

    /// Every document as a YAML mapping, in order (what [`Self::to_yaml`] writes).
    pub fn to_mappings(&self) -> Result<Vec<Mapping>, ConfigError> {
        self.documents
            .iter()
            .enumerate()
            .map(|(i, d)| {
                d.to_mapping().map_err(|source| ConfigError::Serialise {
                    index: i + 1,
                    kind: d.kind_name().to_string(),
                    source,
                })
            })
            .collect()
    }

    /// Builds a config from YAML mappings (for example after a patch).
    pub fn from_mappings(mappings: Vec<Mapping>, origin: &str) -> Result<Self, ConfigError> {
        let mut documents = Vec::with_capacity(mappings.len());
        for (i, m) in mappings.into_iter().enumerate() {
            documents.push(Document::from_mapping(m, origin, i + 1)?);
        }
        Ok(Self { documents })
    }

    /// The legacy `v1alpha1` document, if present.
    pub fn v1alpha1(&self) -> Option<&V1Alpha1Config> {
        self.documents.iter().find_map(|d| match d {
            Document::V1Alpha1(v) => Some(v.as_ref()),
            _ => None,
        })
    }

    /// The legacy `v1alpha1` document, mutable, if present.
    pub fn v1alpha1_mut(&mut self) -> Option<&mut V1Alpha1Config> {
        self.documents.iter_mut().find_map(|d| match d {
            Document::V1Alpha1(v) => Some(v.as_mut()),
            _ => None,
        })
    }

    /// Documents of one kind, in order.
    pub fn documents_of(&self, kind: DocumentKind) -> impl Iterator<Item = &Document> {
        self.documents.iter().filter(move |d| d.kind() == kind)
    }

    /// Whether any document of this kind is present.
    pub fn has(&self, kind: DocumentKind) -> bool {
        self.documents.iter().any(|d| d.kind() == kind)
    }

    /// The first document whose `kind:` is `kind_name` (any document, typed or not).
    pub fn find_by_kind_name(&self, kind_name: &str) -> Option<&Document> {
        self.documents.iter().find(|d| d.kind_name() == kind_name)
    }

    /// Replaces the document with the same kind and name (the legacy document
    /// for [`Document::V1Alpha1`]), or appends it when there is none.
    pub fn upsert(&mut self, doc: Document) {
        let (kind, name) = (doc.kind_name().to_string(), doc.name());
        match self
            .documents
            .iter_mut()
            .find(|d| d.kind_name() == kind && d.name() == name)
        {
            Some(slot) => *slot = doc,
            None => self.documents.push(doc),
        }
    }

    /// Removes every document with this `kind:` (and `name`, when given);
    /// returns how many were removed.
    pub fn remove(&mut self, kind_name: &str, name: Option<&str>) -> usize {
        let before = self.documents.len();
        self.documents.retain(|d| {
            !(d.kind_name() == kind_name && (name.is_none() || d.name().as_deref() == name))
        });
        before - self.documents.len()
    }

    /// What adopt needs to know, whatever the shape. See [`ConfigFacts`].
    pub fn facts(&self) -> ConfigFacts {
        facts::compute(self)
    }
}

/// A machine config as read from its text, with its documents as YAML
/// mappings, as [`MachineConfig::to_mappings`] writes them.
///
/// A render starts from mappings; a reader that keeps them lets every
/// render of the same read start there. They are the typed config's own
/// (not the text's: Ichor writes the `v1alpha1` document's modelled keys
/// first, where Talos interleaves them), so a render from them is the
/// render from the typed config, key order, YAML and digest included.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConfig {
    /// The typed config.
    pub config: MachineConfig,
    /// `config.to_mappings()`.
    pub mappings: Vec<Mapping>,
}

impl ParsedConfig {
    /// [`MachineConfig::parse_with_origin`], with the mappings.
    pub fn parse_with_origin(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::from_config(MachineConfig::parse_with_origin(text, origin)?)
    }

    /// A typed config with its mappings.
    pub fn from_config(config: MachineConfig) -> Result<Self, ConfigError> {
        let mappings = config.to_mappings()?;
        Ok(Self { config, mappings })
    }
}

/// The YAML text of documents given as mappings, separated by `---` (what
/// [`MachineConfig::to_yaml`] writes, from [`MachineConfig::to_mappings`]).
pub fn mappings_to_yaml<M: Borrow<Mapping>>(mappings: &[M]) -> Result<String, ConfigError> {
    let mut out = String::new();
    for (i, mapping) in mappings.iter().enumerate() {
        let mapping = mapping.borrow();
        if i > 0 {
            out.push_str("---\n");
        }
        let text = serde_yaml_ng::to_string(mapping).map_err(|source| ConfigError::Serialise {
            index: i + 1,
            kind: mapping_kind_name(mapping).to_string(),
            source,
        })?;
        out.push_str(&text);
    }
    Ok(out)
}

/// The kind a mapping's document has, as [`Document::kind_name`] says it.
fn mapping_kind_name(m: &Mapping) -> &str {
    match m.get("kind").and_then(Value::as_str) {
        Some(kind) => kind,
        None if is_v1alpha1_mapping(m) => "v1alpha1",
        None => "<no kind>",
    }
}

/// Splits multi-document YAML into mappings, skipping empty documents.
pub(crate) fn parse_yaml_documents(text: &str, origin: &str) -> Result<Vec<Mapping>, ConfigError> {
    let mut out = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).map_err(|source| ConfigError::Yaml {
            origin: origin.to_string(),
            index: i + 1,
            source,
        })?;
        match value {
            Value::Null => {}
            Value::Mapping(m) => out.push(m),
            other => {
                return Err(ConfigError::NotAMapping {
                    origin: origin.to_string(),
                    index: i + 1,
                    found: value_kind(&other),
                });
            }
        }
    }
    Ok(out)
}

/// The COSI resource type of the machine config.
pub const MACHINE_CONFIG_RESOURCE_TYPE: &str = "MachineConfigs.config.talos.dev";

fn machine_config_resource_spec(m: &Mapping) -> Option<&str> {
    let meta = m.get("metadata")?;
    (meta.get("type")?.as_str()? == MACHINE_CONFIG_RESOURCE_TYPE).then_some(())?;
    m.get("spec")?.as_str()
}

/// Whether a mapping is the legacy `v1alpha1` document: no `kind`, and any
/// of `version`, `machine`, `cluster`, `debug`, `persist` (as Talos decides).
pub fn is_v1alpha1_mapping(m: &Mapping) -> bool {
    // A key whose value is null says nothing (`{version: null}` has no
    // field the v1alpha1 type would keep): such a document stays unknown,
    // so it reads back as it was written (a fuzzing finding, R8.4).
    lookup(m, "kind").is_none()
        && ["version", "machine", "cluster", "debug", "persist"]
            .iter()
            .any(|k| lookup(m, k).is_some_and(|v| !v.is_null()))
}

/// `m.get(key)`, found by comparing the keys in order when the mapping is
/// small: a config's documents and most of its mappings have a handful of
/// keys, and hashing the key (the mapping's own look-up) costs more than
/// comparing them.
pub fn lookup<'m>(m: &'m Mapping, key: &str) -> Option<&'m Value> {
    const SCAN_AT_MOST: usize = 12;
    if m.len() > SCAN_AT_MOST {
        return m.get(key);
    }
    m.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

pub(crate) fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "sequence",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

#[cfg(test)]
mod tests;
