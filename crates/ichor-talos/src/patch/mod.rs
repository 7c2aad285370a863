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
    #[error("patch {origin}: {reason}")]
    Delete {
        /// Where the patch came from.
        origin: String,
        /// What is wrong and what to do.
        reason: String,
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
        let whole = extract_deletes_from_mapping(&mut rest, &mut Vec::new(), false, &mut deletes)
            .unwrap_or(false);
        !deletes.is_empty() || !(whole || is_empty_patch_document(&rest))
    });
    if !docs.is_empty() && !holds_something {
        return Err(PatchError::NothingToMerge {
            origin: origin.to_string(),
        });
    }
    Ok(())
}

/// Applies strategic merge patch documents (see the module docs for the rules).
pub fn apply_strategic_merge(
    config: &MachineConfig,
    patch_docs: &[Mapping],
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    apply_strategic_merge_in(config, patch_docs, origin, Application::Talos)
}

fn apply_strategic_merge_in(
    config: &MachineConfig,
    patch_docs: &[Mapping],
    origin: &str,
    how: Application,
) -> Result<MachineConfig, PatchError> {
    let docs = config.to_mappings().map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })?;
    let mut cows: Vec<CowMapping<'_>> = docs.into_iter().map(CowMapping::Owned).collect();
    merge_documents(&mut cows, patch_docs, origin, how)?;
    let docs = cows.into_iter().map(CowMapping::into_owned).collect();
    MachineConfig::from_mappings(docs, origin).map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })
}

/// One patch document, read: the document it applies to, its deletes
/// (taken out, as Talos's loader takes them out) and what is left to merge.
struct PatchDocument {
    id: DocId,
    deletes: Vec<Delete>,
    /// What is left once the deletes are out; `None` when nothing is.
    rest: Option<Mapping>,
}

impl PatchDocument {
    fn read(patch: &Mapping, origin: &str) -> Result<Self, PatchError> {
        let id = DocId::of(patch);
        if id == DocId::Unmatched {
            return Err(PatchError::UnknownDocument {
                origin: origin.to_string(),
            });
        }
        let mut rest = patch.clone();
        let mut deletes = Vec::new();
        let whole = extract_deletes_from_mapping(&mut rest, &mut Vec::new(), false, &mut deletes)
            .map_err(|reason| PatchError::Delete {
            origin: origin.to_string(),
            reason,
        })?;
        let rest = (!whole && !is_empty_patch_document(&rest)).then_some(rest);
        Ok(Self { id, deletes, rest })
    }
}

/// The strategic merge of [`apply_strategic_merge`] on the config's mappings.
///
/// The patch's documents apply in their order, and several of them may
/// name one config document (Talos v1.14; ADR 0009): each merges into what
/// the documents before it left, a document one of them appended included.
/// Every delete aimed at the `v1alpha1` document applies first, before any
/// of the patch's documents merges (Talos hands them out in that order, on
/// both lines); the deletes of any other document apply just before what is
/// left of that document merges.
fn merge_documents(
    docs: &mut Vec<CowMapping<'_>>,
    patch_docs: &[Mapping],
    origin: &str,
    how: Application,
) -> Result<(), PatchError> {
    let read = patch_docs
        .iter()
        .map(|p| PatchDocument::read(p, origin))
        .collect::<Result<Vec<_>, _>>()?;
    let delete_all = |docs: &mut Vec<CowMapping<'_>>, doc: &PatchDocument| {
        doc.deletes.iter().try_for_each(|delete| {
            apply_delete(docs, &doc.id, delete, how).map_err(|reason| PatchError::Delete {
                origin: origin.to_string(),
                reason,
            })
        })
    };
    for doc in read.iter().filter(|d| d.id == DocId::V1Alpha1) {
        delete_all(docs, doc)?;
    }
    let mut merger = Merger::new(how);
    for doc in &read {
        if doc.id != DocId::V1Alpha1 {
            delete_all(docs, doc)?;
        }
        let Some(rest) = &doc.rest else { continue };
        let path_root = doc.id.path_root();
        let ident = doc.id.describe();
        match docs.iter_mut().find(|d| DocId::of(d) == doc.id) {
            Some(target) => merger.mapping(target, rest, &[path_root.as_str()], &ident),
            None => {
                let fresh = CowMapping::Owned(merger.fresh_document(rest, &path_root, &ident));
                // Talos keeps the v1alpha1 document first in every config
                if doc.id == DocId::V1Alpha1 {
                    docs.insert(0, fresh);
                } else {
                    docs.push(fresh);
                }
            }
        }
    }
    Ok(())
}

/// Applies a JSON 6902 patch to a config holding only the `v1alpha1` document.
pub fn apply_json6902(
    config: &MachineConfig,
    patch: &json_patch::Patch,
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    apply_json6902_in(config, patch, origin, Application::Talos)
}

fn apply_json6902_in(
    config: &MachineConfig,
    patch: &json_patch::Patch,
    origin: &str,
    how: Application,
) -> Result<MachineConfig, PatchError> {
    let docs = config.to_mappings().map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })?;
    let mut cows: Vec<CowMapping<'_>> = docs.into_iter().map(CowMapping::Owned).collect();
    json6902_documents(&mut cows, patch, origin, how)?;
    let docs = cows.into_iter().map(CowMapping::into_owned).collect();
    MachineConfig::from_mappings(docs, origin).map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })
}

/// The JSON 6902 patch of [`apply_json6902`] on the config's mappings.
fn json6902_documents(
    docs: &mut [CowMapping<'_>],
    patch: &json_patch::Patch,
    origin: &str,
    how: Application,
) -> Result<(), PatchError> {
    if docs.len() != 1 {
        return Err(PatchError::Json6902Multidoc {
            origin: origin.to_string(),
            documents: docs.len(),
        });
    }
    let conv = |e: &dyn std::fmt::Display| PatchError::JsonConversion {
        origin: origin.to_string(),
        reason: e.to_string(),
    };
    let mut json = serde_json::to_value(&*docs[0]).map_err(|e| conv(&e))?;
    let mut held = HeldItems::default();
    for op in &patch.0 {
        if how == Application::Reapply && held.already_applied(&json, op) {
            continue;
        }
        let op = talos_json6902_operation(&json, op);
        json_patch::patch(&mut json, std::slice::from_ref(&op)).map_err(|source| {
            PatchError::Json6902Apply {
                origin: origin.to_string(),
                source,
            }
        })?;
    }
    let back = serde_yaml_ng::to_value(json).map_err(|e| conv(&e))?;
    let Value::Mapping(m) = back else {
        return Err(conv(&"the patched document is no longer a mapping"));
    };
    docs[0] = CowMapping::Owned(m);
    Ok(())
}

/// The operation as Talos's JSON patch library applies it: a `replace` of a
/// key missing from an existing object adds the key (RFC 6902 says it should
/// fail; Talos's library accepts it).
fn talos_json6902_operation(
    doc: &serde_json::Value,
    op: &json_patch::PatchOperation,
) -> json_patch::PatchOperation {
    if let json_patch::PatchOperation::Replace(r) = op {
        let path = r.path.as_str();
        let parent_is_object = path
            .rsplit_once('/')
            .and_then(|(parent, _)| doc.pointer(parent))
            .is_some_and(serde_json::Value::is_object);
        if doc.pointer(path).is_none() && parent_is_object {
            return json_patch::PatchOperation::Add(json_patch::AddOperation {
                path: r.path.clone(),
                value: r.value.clone(),
            });
        }
    }
    op.clone()
}

/// The items each list held when a reapplied JSON 6902 patch first touched
/// it; each counts once, so a patch adding the same item twice keeps both.
#[derive(Default)]
struct HeldItems(Vec<(String, Vec<serde_json::Value>)>);

impl HeldItems {
    /// Whether an operation's effect is already in the document, so applying
    /// it again would change what it changed once more: an `add` into a list
    /// that held the value (appended with `-` or inserted at an index), and
    /// a `remove` of a path that is already gone.
    fn already_applied(
        &mut self,
        doc: &serde_json::Value,
        op: &json_patch::PatchOperation,
    ) -> bool {
        match op {
            json_patch::PatchOperation::Add(a) => {
                let Some((parent, _)) = a.path.as_str().rsplit_once('/') else {
                    return false;
                };
                let Some(list) = doc.pointer(parent).and_then(serde_json::Value::as_array) else {
                    return false;
                };
                let i = match self.0.iter().position(|(p, _)| p == parent) {
                    Some(i) => i,
                    None => {
                        self.0.push((parent.to_owned(), list.clone()));
                        self.0.len() - 1
                    }
                };
                let items = &mut self.0[i].1;
                match items.iter().position(|v| *v == a.value) {
                    Some(j) => {
                        items.swap_remove(j);
                        true
                    }
                    None => false,
                }
            }
            json_patch::PatchOperation::Remove(r) => doc.pointer(r.path.as_str()).is_none(),
            _ => false,
        }
    }
}

/// How a document is matched: (apiVersion, kind, name) for multi-document
/// kinds, the legacy `v1alpha1` document by its keys; a document with neither
/// never matches anything.
#[derive(Debug, PartialEq, Eq)]
enum DocId {
    V1Alpha1,
    Kind {
        api_version: Option<String>,
        kind: String,
        name: Option<String>,
    },
    Unmatched,
}

impl DocId {
    fn of(m: &Mapping) -> Self {
        let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
        match s("kind") {
            Some(kind) => Self::Kind {
                api_version: s("apiVersion"),
                kind,
                name: s("name"),
            },
            None if crate::config::is_v1alpha1_mapping(m) => Self::V1Alpha1,
            None => Self::Unmatched,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::V1Alpha1 => "the v1alpha1 document".to_string(),
            Self::Kind {
                api_version,
                kind,
                name,
            } => format!(
                "{}/{kind}{}",
                api_version.as_deref().unwrap_or(""),
                name.as_deref().map(|n| format!("/{n}")).unwrap_or_default()
            ),
            Self::Unmatched => "a document without kind".to_string(),
        }
    }

    fn path_root(&self) -> String {
        match self {
            Self::Kind { kind, .. } => kind.clone(),
            _ => String::new(),
        }
    }
}

fn is_delete(m: &Mapping) -> bool {
    m.get(PATCH_KEY).and_then(Value::as_str) == Some(DELETE)
}

fn is_delete_value(v: &Value) -> bool {
    v.as_mapping().is_some_and(is_delete)
}

/// One `$patch: delete` taken out of a patch document.
#[derive(Debug, Clone, PartialEq)]
struct Delete {
    /// Keys from the document root to the deleted key, or to the list whose
    /// item is deleted; empty for the whole document.
    path: Vec<String>,
    /// For a list item: the item's first key and its value, which select the item.
    item: Option<(String, String)>,
}

/// One step of the path walked while taking deletes out: a mapping key or a list item.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Item,
}

fn keys_of(path: &[Step]) -> Vec<String> {
    path.iter()
        .filter_map(|s| match s {
            Step::Key(k) => Some(k.clone()),
            Step::Item => None,
        })
        .collect()
}

fn dotted(path: &[Step]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Item => out.push_str("[]"),
        }
    }
    out
}

/// Takes every `$patch: delete` out of a mapping (as Talos's loader does),
/// recording it in `out`; returns whether the mapping itself is to be removed
/// (it holds `$patch: delete`, or it became empty because its contents were
/// deletes).
fn extract_deletes_from_mapping(
    m: &mut Mapping,
    path: &mut Vec<Step>,
    in_list: bool,
    out: &mut Vec<Delete>,
) -> Result<bool, String> {
    let keys: Vec<Value> = m.keys().cloned().collect();
    let mut removed_any = false;
    for k in keys {
        let key = k.as_str().map(str::to_string).unwrap_or_default();
        if key == PATCH_KEY && m.get(&k).and_then(Value::as_str) == Some(DELETE) {
            if in_list {
                let (sel_key, sel_value) = m
                    .iter()
                    .find(|(k, _)| k.as_str() != Some(PATCH_KEY))
                    .map(|(k, v)| (k.as_str().unwrap_or_default().to_string(), v))
                    .ok_or_else(|| {
                        format!(
                            "a `$patch: delete` item of the list {} has no key to select the item by; add the key that names it (for example `name:`)",
                            dotted(path)
                        )
                    })?;
                let sel_value = scalar_text(sel_value).ok_or_else(|| {
                    format!(
                        "a `$patch: delete` item of the list {} selects by `{sel_key}`, whose value is not a scalar; select the item by a string key",
                        dotted(path)
                    )
                })?;
                if path[..path.len() - 1].contains(&Step::Item) {
                    return Err(format!(
                        "`$patch: delete` on an item of {}, a list inside a list item, is not supported by Talos; delete the outer item or rewrite the list",
                        dotted(path)
                    ));
                }
                out.push(Delete {
                    path: keys_of(path),
                    item: Some((sel_key, sel_value)),
                });
            } else {
                if path.contains(&Step::Item) {
                    return Err(format!(
                        "`$patch: delete` on {} deletes an inner key of a list item, which Talos does not support; delete the whole item (`$patch: delete` beside its key) instead",
                        dotted(path)
                    ));
                }
                out.push(Delete {
                    path: keys_of(path),
                    item: None,
                });
            }
            return Ok(true);
        }
        let Some(v) = m.get_mut(&k) else { continue };
        path.push(Step::Key(key));
        let remove = extract_deletes_from_value(v, path, out)?;
        path.pop();
        if remove {
            m.shift_remove(&k);
            removed_any = true;
        }
    }
    Ok(removed_any && m.is_empty())
}

fn extract_deletes_from_value(
    v: &mut Value,
    path: &mut Vec<Step>,
    out: &mut Vec<Delete>,
) -> Result<bool, String> {
    match v {
        Value::Mapping(m) => extract_deletes_from_mapping(m, path, false, out),
        Value::Sequence(items) => {
            let mut removed_any = false;
            let mut i = 0;
            while i < items.len() {
                path.push(Step::Item);
                let remove = match &mut items[i] {
                    Value::Mapping(m) => extract_deletes_from_mapping(m, path, true, out)?,
                    other => extract_deletes_from_value(other, path, out)?,
                };
                path.pop();
                if remove {
                    items.remove(i);
                    removed_any = true;
                } else {
                    i += 1;
                }
            }
            Ok(removed_any && items.is_empty())
        }
        _ => Ok(false),
    }
}

/// A scalar as the text Talos compares when selecting a list item.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether what is left of a patch document after its deletes were taken
/// out holds nothing to merge (only `version`, `kind`, `name`), as Talos decides.
fn is_empty_patch_document(m: &Mapping) -> bool {
    m.iter().all(|(k, v)| {
        matches!(k.as_str(), Some("version" | "kind" | "name"))
            && !matches!(v, Value::Mapping(_) | Value::Sequence(_))
    })
}

fn apply_delete(
    docs: &mut Vec<CowMapping<'_>>,
    id: &DocId,
    delete: &Delete,
    how: Application,
) -> Result<(), String> {
    // Reapplied, a delete whose target is already gone has its effect.
    let gone_is_done = how == Application::Reapply;
    let Some(index) = docs.iter().position(|d| DocId::of(d) == *id) else {
        // Deleting from a document the config does not have changes nothing.
        return Ok(());
    };
    if delete.path.is_empty() {
        if *id == DocId::V1Alpha1 {
            return Err(
                "`$patch: delete` at the top of the v1alpha1 document would delete the whole legacy document, which Talos refuses; delete the keys under it instead"
                    .to_string(),
            );
        }
        docs.remove(index);
        return Ok(());
    }
    let (last, parents) = delete.path.split_last().expect("path is not empty");
    let mut node: &mut Mapping = &mut docs[index];
    for (depth, key) in parents.iter().enumerate() {
        node = match node.get_mut(key.as_str()) {
            Some(Value::Mapping(m)) => m,
            _ if gone_is_done => return Ok(()),
            _ => {
                return Err(format!(
                    "`$patch: delete` on {}: the config has no {}; remove that delete from the patch",
                    delete.path.join("."),
                    parents[..=depth].join(".")
                ));
            }
        };
    }
    match &delete.item {
        None => {
            node.shift_remove(last.as_str());
            Ok(())
        }
        Some((key, value)) => {
            let list = match node.get_mut(last.as_str()) {
                Some(Value::Sequence(list)) => list,
                _ if gone_is_done => return Ok(()),
                _ => {
                    return Err(format!(
                        "`$patch: delete` of the item with {key}: {value} in {}: the config has no such list; remove that delete from the patch",
                        delete.path.join(".")
                    ));
                }
            };
            let found = list.iter().position(|item| {
                item.get(key.as_str())
                    .and_then(Value::as_str)
                    .is_some_and(|v| v == value)
            });
            match found {
                Some(i) => {
                    list.remove(i);
                    Ok(())
                }
                None if gone_is_done => Ok(()),
                None => Err(format!(
                    "`$patch: delete` of the item with {key}: {value} in {}: the list has no such item; remove that delete from the patch",
                    delete.path.join(".")
                )),
            }
        }
    }
}

/// How the list at a path merges.
enum ListRule {
    Append,
    Replace,
    /// An item merges into the existing item whose value for the first of
    /// `keys` that the patch item has is equal; other items are appended.
    Keyed {
        keys: &'static [&'static str],
    },
}

fn list_rule(path: &[&str]) -> ListRule {
    match path {
        ["", "cluster", "network", "podSubnets" | "serviceSubnets"]
        | ["KubeNetworkConfig", "podSubnets" | "serviceSubnets"]
        | ["BGPConfig", .., "advertise" | "importRoutes" | "neighbors"]
        | ["NetworkRuleConfig", "portSelector", "ports"] => ListRule::Replace,
        ["", "machine", "network", "interfaces"] => ListRule::Keyed {
            keys: &["interface", "deviceSelector"],
        },
        ["", "machine", "network", "interfaces", "vlans"] => ListRule::Keyed { keys: &["vlanId"] },
        ["", "cluster", "apiServer", "admissionControl"] => ListRule::Keyed { keys: &["name"] },
        ["ExtensionServiceConfig", "configFiles"] => ListRule::Keyed {
            keys: &["mountPath"],
        },
        _ => ListRule::Append,
    }
}

/// Values that a patch replaces as a whole instead of merging into.
fn replaces_whole_value(path: &[&str]) -> bool {
    matches!(
        path,
        ["", "cluster", "apiServer", "auditPolicy"]
            | ["NetworkRuleConfig", "ingress"]
            | [
                "KubeAuditPolicyConfig"
                    | "KubeAuthenticationConfig"
                    | "KubeCredentialProviderConfig",
                "configuration"
            ]
            | ["KubeStaticPodConfig", "pod"]
            | ["BaseRuntimeSpecConfig", "overrides"]
    )
}

/// `extraArgs` mappings merge key by key, each patch value replacing the
/// existing one whole (a list-valued argument is not appended to).
fn is_args_map(path: &[&str]) -> bool {
    path.last() == Some(&"extraArgs")
}

/// The merge of one patch's documents into a config's documents.
///
/// Reapplied (ADR 0016), an item the patch appends to a list is taken as
/// already there when the list holds an equal item that the patch did not
/// put there or take as its own: `accounted` keeps, per list, the items the
/// patch appended or took as its own, across all the patch's documents, so
/// a patch whose documents append the same item twice keeps two copies, as
/// Talos does, and finds both on its own result.
struct Merger {
    how: Application,
    /// Per list (named by its document, keys and keyed items, as
    /// [`list_item_ident`] names an item), the patch's items.
    accounted: std::collections::HashMap<String, Vec<Value>>,
}

impl Merger {
    fn new(how: Application) -> Self {
        Self {
            how,
            accounted: std::collections::HashMap::new(),
        }
    }

    /// Merges a patch mapping into a config mapping. `path` is the rule path
    /// (document kind, then keys; see [`list_rule`]); `ident` names this very
    /// mapping, a keyed list item by its key (for [`Merger::accounted`]).
    fn mapping(&mut self, target: &mut Mapping, patch: &Mapping, path: &[&str], ident: &str) {
        for (k, pv) in patch {
            let Some(key) = k.as_str() else {
                target.insert(k.clone(), strip(pv));
                continue;
            };
            if key == PATCH_KEY {
                continue;
            }
            if is_delete_value(pv) {
                target.shift_remove(key);
                continue;
            }
            if pv.is_null() {
                continue;
            }
            let mut child: Vec<&str> = path.to_vec();
            child.push(key);
            let child_ident = format!("{ident}.{key}");
            match target.get_mut(key) {
                Some(Value::Mapping(t)) if is_args_map(&child) && pv.is_mapping() => {
                    for (ak, av) in pv.as_mapping().into_iter().flatten() {
                        t.insert(ak.clone(), strip(av));
                    }
                }
                Some(tv) if !tv.is_null() && !replaces_whole_value(&child) => {
                    self.value(tv, pv, &child, &child_ident)
                }
                _ => {
                    let fresh = match pv {
                        // Talos merges a keyed list into the empty list of a
                        // section the config has: the patch's items for one
                        // key fold into one (a section the config lacks is
                        // taken whole with what it holds, as Talos takes it)
                        Value::Sequence(items)
                            if matches!(list_rule(&child), ListRule::Keyed { .. }) =>
                        {
                            let mut list = Vec::new();
                            self.list(&mut list, items, &child, &child_ident);
                            Value::Sequence(list)
                        }
                        _ => {
                            let fresh = strip(pv);
                            self.account_fresh(&fresh, &child, &child_ident);
                            fresh
                        }
                    };
                    target.insert(k.clone(), fresh);
                }
            }
        }
    }

    /// A patch document for a config document the config does not have,
    /// taken whole (Talos appends a copy of it, merging nothing inside).
    fn fresh_document(&mut self, patch: &Mapping, path_root: &str, ident: &str) -> Mapping {
        // a null value says nothing (as when merged into a document)
        let kept: Mapping = patch
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let fresh = strip(&Value::Mapping(kept));
        self.account_fresh(&fresh, &[path_root], ident);
        match fresh {
            Value::Mapping(m) => m,
            _ => Mapping::new(),
        }
    }

    fn value(&mut self, target: &mut Value, patch: &Value, path: &[&str], ident: &str) {
        match (target, patch) {
            (Value::Mapping(t), Value::Mapping(p)) => self.mapping(t, p, path, ident),
            (Value::Sequence(t), Value::Sequence(p)) => self.list(t, p, path, ident),
            (t, p) => {
                let fresh = strip(p);
                self.account_fresh(&fresh, path, ident);
                *t = fresh;
            }
        }
    }

    fn list(&mut self, target: &mut Vec<Value>, patch: &[Value], path: &[&str], ident: &str) {
        let items = patch.iter().filter(|v| !is_delete_value(v));
        match list_rule(path) {
            ListRule::Append if self.how == Application::Reapply => {
                let accounted = self.accounted.entry(ident.to_string()).or_default();
                // the items the list holds that the patch neither appended
                // nor took as its own: each counts once
                let mut held: Vec<Value> = target.clone();
                for a in accounted.iter() {
                    if let Some(i) = held.iter().position(|h| h == a) {
                        held.swap_remove(i);
                    }
                }
                for item in items.map(strip) {
                    match held.iter().position(|h| *h == item) {
                        Some(i) => {
                            held.swap_remove(i);
                        }
                        None => target.push(item.clone()),
                    }
                    accounted.push(item);
                }
            }
            ListRule::Append => target.extend(items.map(strip)),
            ListRule::Replace => *target = patch.iter().map(strip).collect(),
            ListRule::Keyed { keys } => {
                for item in items {
                    match target.iter().position(|t| same_key(t, item, keys)) {
                        Some(i) => {
                            let item_ident = list_item_ident(ident, &target[i], keys);
                            self.value(&mut target[i], item, path, &item_ident);
                        }
                        None => {
                            let fresh = strip(item);
                            let item_ident = list_item_ident(ident, &fresh, keys);
                            self.account_fresh(&fresh, path, &item_ident);
                            target.push(fresh);
                        }
                    }
                }
            }
        }
    }

    /// Reapplied, a value the patch puts in whole: the items of the
    /// appended-to lists inside it are the patch's own.
    fn account_fresh(&mut self, v: &Value, path: &[&str], ident: &str) {
        if self.how != Application::Reapply {
            return;
        }
        match v {
            Value::Mapping(m) => {
                for (k, child) in m {
                    let Some(key) = k.as_str() else { continue };
                    let mut child_path = path.to_vec();
                    child_path.push(key);
                    self.account_fresh(child, &child_path, &format!("{ident}.{key}"));
                }
            }
            Value::Sequence(items) => match list_rule(path) {
                ListRule::Append => self
                    .accounted
                    .entry(ident.to_string())
                    .or_default()
                    .extend(items.iter().cloned()),
                ListRule::Keyed { keys } => {
                    for item in items {
                        self.account_fresh(item, path, &list_item_ident(ident, item, keys));
                    }
                }
                ListRule::Replace => {}
            },
            _ => {}
        }
    }
}

/// The name of a keyed list's item, for [`Merger::accounted`]: the list's
/// name and the item's value for the first key it has.
fn list_item_ident(list: &str, item: &Value, keys: &[&str]) -> String {
    let key = keys
        .iter()
        .find_map(|k| item.get(*k).filter(|v| !v.is_null()).map(|v| (k, v)));
    match key {
        Some((k, v)) => format!(
            "{list}[{k}={}]",
            serde_yaml_ng::to_string(v).unwrap_or_default().trim_end()
        ),
        None => format!("{list}[]"),
    }
}

/// Whether two list items are the same: the first of `keys` the patch item
/// has decides (Talos matches an interface by name before its selector).
fn same_key(existing: &Value, patch_item: &Value, keys: &[&str]) -> bool {
    let Some(key) = keys
        .iter()
        .find(|k| patch_item.get(**k).is_some_and(|v| !v.is_null() && v != ""))
    else {
        // no key at all: Talos compares the zero values, which only match
        // for the single-key lists
        return keys.len() == 1 && existing.get(keys[0]).is_none_or(Value::is_null);
    };
    existing.get(*key) == patch_item.get(*key)
}

/// A patch value without `$patch` directives (for values inserted as new).
fn strip(v: &Value) -> Value {
    match v {
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .filter(|(k, v)| k.as_str() != Some(PATCH_KEY) && !is_delete_value(v))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Sequence(s) => Value::Sequence(
            s.iter()
                .filter(|v| !is_delete_value(v))
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests;
