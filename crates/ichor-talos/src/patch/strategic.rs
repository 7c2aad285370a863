//! Strategic merge: which config document each patch document applies to,
//! and the order of its deletes and merges (the module docs of `patch`).

use serde_yaml_ng::{Mapping, Value};

use super::delete::{Delete, apply_delete, extract_deletes_from_mapping, is_empty_patch_document};
use super::merge::Merger;
use super::{Application, PatchError};
use crate::config::{CowMapping, MachineConfig};

/// Applies strategic merge patch documents (see the module docs for the rules).
pub fn apply_strategic_merge(
    config: &MachineConfig,
    patch_docs: &[Mapping],
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    apply_strategic_merge_in(config, patch_docs, origin, Application::Talos)
}

pub(super) fn apply_strategic_merge_in(
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
            .map_err(|source| PatchError::Delete {
            origin: origin.to_string(),
            source,
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
pub(super) fn merge_documents(
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
            apply_delete(docs, &doc.id, delete, how).map_err(|source| PatchError::Delete {
                origin: origin.to_string(),
                source,
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

/// How a document is matched: (apiVersion, kind, name) for multi-document
/// kinds, the legacy `v1alpha1` document by its keys; a document with neither
/// never matches anything.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DocId {
    V1Alpha1,
    Kind {
        api_version: Option<String>,
        kind: String,
        name: Option<String>,
    },
    Unmatched,
}

impl DocId {
    pub(super) fn of(m: &Mapping) -> Self {
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
