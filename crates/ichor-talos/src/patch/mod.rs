//! Config patches as Talos applies them: strategic merge and JSON 6902.
//! The rules, with the Talos sources they were read from, are in
//! `docs/adr/0009-config-patch-merge-rules.md`; a differential test against
//! the real `talosctl machineconfig patch` checks them
//! (`tests/talosctl_patch_diff.rs`).
//!
//! Strategic merge, in short:
//! * each patch document is merged into the config document with the same
//!   `apiVersion`, `kind` and `name` (the `v1alpha1` patch document, which has
//!   no `kind`, into the `v1alpha1` document); a patch document with no match
//!   is appended;
//! * the documents apply in their order, and several may name one config
//!   document, as Talos v1.14 allows (v1.13 refuses such a patch; Ichor
//!   gives v1.14's result on every line, ADR 0009): each merges into what
//!   the ones before it left, a document an earlier one appended included;
//! * every `$patch: delete` of a patch document is taken out of it and
//!   applied before what is left is merged; the deletes aimed at the
//!   `v1alpha1` document, from all the patch's documents, apply before any
//!   document merges (Talos's order on both lines). A delete at the top of
//!   a document removes the document (refused for `v1alpha1`); as the value
//!   of a key it removes the key; in a list item it removes the first item
//!   of that list whose value for the item's first other key is equal
//!   (refused when there is none, or when the list is inside a list item);
//! * mappings merge key by key, patch values win; a `null` patch value
//!   changes nothing; `extraArgs` mappings are replaced key by key;
//! * lists are appended, except the replaced ones (`podSubnets`,
//!   `serviceSubnets`, ...) and the keyed ones, whose items merge into the
//!   item with the same key (`machine.network.interfaces` by `interface` or
//!   `deviceSelector`, their `vlans` by `vlanId`,
//!   `cluster.apiServer.admissionControl` by `name`,
//!   `ExtensionServiceConfig.configFiles` by `mountPath`);
//! * `cluster.apiServer.auditPolicy` and a few free-form sections of
//!   multi-document kinds are replaced whole.
//!
//! JSON 6902 patches apply to the `v1alpha1` document of a config that has
//! only that document; Talos refuses them on multi-document configs, and so
//! does this module.
//!
//! [`ConfigPatch::apply`] is Talos's merge; [`ConfigPatch::reapply`] is the
//! render's, for a config that may already carry the patch's effect: it adds
//! no list item the list already holds and takes a delete whose target is
//! gone as done (`docs/adr/0016-patches-are-reapplied-once.md`).

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use crate::config::{ConfigError, CowMapping, MachineConfig, parse_yaml_documents};

mod delete;
mod json6902;
mod merge;
mod strategic;

pub use delete::DeleteError;
pub use json6902::apply_json6902;
use json6902::{apply_json6902_in, json6902_documents};
pub use strategic::apply_strategic_merge;
use strategic::{apply_strategic_merge_in, merge_documents};

const PATCH_KEY: &str = "$patch";
const DELETE: &str = "delete";

/// Errors of the `patch` module.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch text is not valid YAML or not a list of patch documents.
    #[error("cannot read patch {origin}")]
    Parse {
        /// Where the patch came from.
        origin: String,
        /// Why it did not parse.
        source: ConfigError,
    },
    /// The patch is a YAML/JSON list but not a valid JSON 6902 operation list.
    #[error(
        "patch {origin} is a list, so it was read as a JSON 6902 patch, but it is not one: {reason}; write each item as {{op, path, value}} or use a strategic merge patch"
    )]
    Json6902Shape {
        /// Where the patch came from.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// A strategic merge patch document that is neither `v1alpha1` nor has a `kind`.
    #[error(
        "strategic merge patch {origin} has a document with neither `kind` nor any v1alpha1 key (version, machine, cluster, debug, persist); give it `apiVersion` and `kind`, or put it under `machine:`/`cluster:`"
    )]
    UnknownDocument {
        /// Where the patch came from.
        origin: String,
    },
    /// JSON 6902 on a multi-document config.
    #[error(
        "JSON 6902 patch {origin} cannot be applied: the config has {documents} documents and Talos applies JSON patches only to a config holding just the v1alpha1 document; write it as a strategic merge patch instead"
    )]
    Json6902Multidoc {
        /// Where the patch came from.
        origin: String,
        /// How many documents the config has.
        documents: usize,
    },
    /// A JSON 6902 operation failed (missing path, failed test, ...).
    #[error("JSON 6902 patch {origin} failed")]
    Json6902Apply {
        /// Where the patch came from.
        origin: String,
        /// The failing operation.
        source: json_patch::PatchError,
    },
    /// Converting between YAML and JSON failed (for example a non-string key).
    #[error(
        "patch {origin}: the config cannot be converted to JSON for a JSON 6902 patch: {reason}; use a strategic merge patch"
    )]
    JsonConversion {
        /// Where the patch came from.
        origin: String,
        /// What failed.
        reason: String,
    },
    /// A strategic merge patch whose documents hold nothing to merge or delete.
    #[error(
        "patch {origin} holds nothing to merge (only version, kind or name); Talos refuses it: add the fields to set, or remove the patch"
    )]
    NothingToMerge {
        /// Where the patch came from.
        origin: String,
    },
    /// A `$patch: delete` that Talos would refuse, or whose target is missing.
    #[error("patch {origin}: a `$patch: delete` cannot be applied")]
    Delete {
        /// Where the patch came from.
        origin: String,
        /// What is wrong, naming the path.
        source: DeleteError,
    },
    /// The patched config is no longer a valid config (a typed field got the wrong type).
    #[error("patch {origin} produced an invalid config")]
    Result {
        /// Where the patch came from.
        origin: String,
        /// The decoding error.
        source: ConfigError,
    },
}

impl PatchError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Self::Json6902Apply { .. } => {
                Some("check the operation's path against the config".into())
            }
            Self::Result { .. } => Some("fix the patch".into()),
            Self::Delete { source, .. } => Some(source.help()),
            _ => None,
        }
    }
}

/// A parsed config patch.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigPatch {
    /// Strategic merge: patch documents, in order.
    StrategicMerge(Vec<Mapping>),
    /// RFC 6902 JSON patch.
    Json6902(json_patch::Patch),
}

impl ConfigPatch {
    /// Parses a patch the way talosctl reads `--config-patch` files: a YAML or
    /// JSON list is a JSON 6902 patch, anything else strategic merge documents.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PatchError> {
        let first = serde_yaml_ng::Deserializer::from_str(text)
            .next()
            .and_then(|d| Value::deserialize(d).ok());
        if let Some(Value::Sequence(seq)) = first {
            let json = serde_json::to_value(Value::Sequence(seq)).map_err(|e| {
                PatchError::Json6902Shape {
                    origin: origin.to_string(),
                    reason: e.to_string(),
                }
            })?;
            let patch: json_patch::Patch =
                serde_json::from_value(json).map_err(|e| PatchError::Json6902Shape {
                    origin: origin.to_string(),
                    reason: e.to_string(),
                })?;
            return Ok(Self::Json6902(patch));
        }
        let docs = parse_yaml_documents(text, origin).map_err(|source| PatchError::Parse {
            origin: origin.to_string(),
            source,
        })?;
        check_patch_documents(&docs, origin)?;
        Ok(Self::StrategicMerge(docs))
    }

    /// Applies the patch to a config, returning the patched config, exactly
    /// as `talosctl machineconfig patch` does.
    pub fn apply(&self, config: &MachineConfig, origin: &str) -> Result<MachineConfig, PatchError> {
        self.apply_in(config, origin, Application::Talos)
    }

    /// Applies the patch to a config that may already carry its effect
    /// (the render starts from the node's live config): what the patch
    /// would append or add to a list is not added again when the list
    /// already holds an equal item, and a delete whose target is already
    /// gone changes nothing. On a config without the patch's effect the
    /// result is that of [`ConfigPatch::apply`]; applied to its own result
    /// it changes nothing (ADR 0016).
    pub fn reapply(
        &self,
        config: &MachineConfig,
        origin: &str,
    ) -> Result<MachineConfig, PatchError> {
        self.apply_in(config, origin, Application::Reapply)
    }

    fn apply_in(
        &self,
        config: &MachineConfig,
        origin: &str,
        how: Application,
    ) -> Result<MachineConfig, PatchError> {
        match self {
            Self::StrategicMerge(docs) => apply_strategic_merge_in(config, docs, origin, how),
            Self::Json6902(p) => apply_json6902_in(config, p, origin, how),
        }
    }

    /// Applies the patch to a config's documents as YAML mappings, in place,
    /// without decoding the result (a caller applying several patches
    /// decodes once, at the end: [`MachineConfig::from_mappings`]). On an
    /// error the documents may be partly patched.
    pub fn apply_to_mappings(
        &self,
        docs: &mut Vec<Mapping>,
        origin: &str,
    ) -> Result<(), PatchError> {
        self.mappings_in(docs, origin, Application::Talos)
    }

    /// [`ConfigPatch::reapply`] on a config's documents as YAML mappings, in
    /// place, as [`ConfigPatch::apply_to_mappings`] does for `apply`.
    pub fn reapply_to_mappings(
        &self,
        docs: &mut Vec<Mapping>,
        origin: &str,
    ) -> Result<(), PatchError> {
        self.mappings_in(docs, origin, Application::Reapply)
    }

    /// [`ConfigPatch::reapply_to_mappings`] on documents borrowed from the
    /// live config: only a document the patch writes to is copied.
    pub fn reapply_to_documents(
        &self,
        docs: &mut Vec<CowMapping<'_>>,
        origin: &str,
    ) -> Result<(), PatchError> {
        self.documents_in(docs, origin, Application::Reapply)
    }

    fn mappings_in(
        &self,
        docs: &mut Vec<Mapping>,
        origin: &str,
        how: Application,
    ) -> Result<(), PatchError> {
        let mut cows: Vec<CowMapping<'_>> = docs.drain(..).map(CowMapping::Owned).collect();
        let result = self.documents_in(&mut cows, origin, how);
        docs.extend(cows.into_iter().map(CowMapping::into_owned));
        result
    }

    fn documents_in(
        &self,
        docs: &mut Vec<CowMapping<'_>>,
        origin: &str,
        how: Application,
    ) -> Result<(), PatchError> {
        match self {
            Self::StrategicMerge(patch) => merge_documents(docs, patch, origin, how),
            Self::Json6902(p) => json6902_documents(docs, p, origin, how),
        }
    }
}

/// How a patch is applied: as Talos does, or again over a config that may
/// already carry its effect (ADR 0016).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Application {
    Talos,
    Reapply,
}

/// Refuses what Talos refuses when it reads a strategic merge patch: a
/// patch that holds neither a delete nor anything to merge. Several
/// documents for one config document are accepted, as Talos v1.14 accepts
/// them (ADR 0009).
fn check_patch_documents(docs: &[Mapping], origin: &str) -> Result<(), PatchError> {
    let holds_something = docs.iter().any(|doc| {
        let mut rest = doc.clone();
        let mut deletes = Vec::new();
        // a refused delete is reported with its path when the patch is applied
        let whole =
            delete::extract_deletes_from_mapping(&mut rest, &mut Vec::new(), false, &mut deletes)
                .unwrap_or(false);
        !deletes.is_empty() || !(whole || delete::is_empty_patch_document(&rest))
    });
    if !docs.is_empty() && !holds_something {
        return Err(PatchError::NothingToMerge {
            origin: origin.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
