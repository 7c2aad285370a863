//! `$patch: delete`: taking the deletes out of a patch document, as
//! Talos's loader does, and applying them to the config's documents.

use serde_yaml_ng::{Mapping, Value};

use super::strategic::DocId;
use super::{Application, DELETE, PATCH_KEY};
use crate::config::CowMapping;

/// Why a `$patch: delete` is refused, as Talos refuses it, or cannot be
/// applied to the config; each names the path it is on.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// A delete item of a list without a key that selects the item.
    #[error("a `$patch: delete` item of the list {list} has no key to select the item by")]
    NoSelector {
        /// The list, as dotted keys.
        list: String,
    },
    /// A delete item that selects by a value that is not a scalar.
    #[error(
        "a `$patch: delete` item of the list {list} selects by `{key}`, whose value is not a scalar"
    )]
    SelectorNotScalar {
        /// The list, as dotted keys.
        list: String,
        /// The selecting key.
        key: String,
    },
    /// A delete of an item of a list inside a list item.
    #[error(
        "`$patch: delete` on an item of {list}, a list inside a list item, is not supported by Talos"
    )]
    ListInItem {
        /// The list, as dotted keys.
        list: String,
    },
    /// A delete of a key inside a list item.
    #[error(
        "`$patch: delete` on {path} deletes an inner key of a list item, which Talos does not support"
    )]
    KeyInItem {
        /// The deleted key, as dotted keys.
        path: String,
    },
    /// A delete of the whole `v1alpha1` document.
    #[error(
        "`$patch: delete` at the top of the v1alpha1 document would delete the whole legacy document, which Talos refuses"
    )]
    V1Alpha1Document,
    /// A delete under a mapping the config does not have.
    #[error("`$patch: delete` on {path}: the config has no {missing}")]
    NoParent {
        /// The deleted key, as dotted keys.
        path: String,
        /// The first of its parents the config lacks.
        missing: String,
    },
    /// A delete of an item of a list the config does not have.
    #[error(
        "`$patch: delete` of the item with {key}: {value} in {list}: the config has no such list"
    )]
    NoList {
        /// The list, as dotted keys.
        list: String,
        /// The selecting key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A delete of an item the list does not hold.
    #[error(
        "`$patch: delete` of the item with {key}: {value} in {list}: the list has no such item"
    )]
    NoItem {
        /// The list, as dotted keys.
        list: String,
        /// The selecting key.
        key: String,
        /// Its value.
        value: String,
    },
}

impl DeleteError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> String {
        match self {
            Self::NoSelector { .. } => "add the key that names the item (for example `name:`)",
            Self::SelectorNotScalar { .. } => "select the item by a string key",
            Self::ListInItem { .. } => "delete the outer item or rewrite the list",
            Self::KeyInItem { .. } => {
                "delete the whole item (`$patch: delete` beside its key) instead"
            }
            Self::V1Alpha1Document => "delete the keys under it instead",
            Self::NoParent { .. } | Self::NoList { .. } | Self::NoItem { .. } => {
                "remove that delete from the patch"
            }
        }
        .to_string()
    }
}

pub(super) fn is_delete(m: &Mapping) -> bool {
    m.get(PATCH_KEY).and_then(Value::as_str) == Some(DELETE)
}

pub(super) fn is_delete_value(v: &Value) -> bool {
    v.as_mapping().is_some_and(is_delete)
}

/// One `$patch: delete` taken out of a patch document.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Delete {
    /// Keys from the document root to the deleted key, or to the list whose
    /// item is deleted; empty for the whole document.
    path: Vec<String>,
    /// For a list item: the item's first key and its value, which select the item.
    item: Option<(String, String)>,
}

/// One step of the path walked while taking deletes out: a mapping key or a list item.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
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
pub(super) fn extract_deletes_from_mapping(
    m: &mut Mapping,
    path: &mut Vec<Step>,
    in_list: bool,
    out: &mut Vec<Delete>,
) -> Result<bool, DeleteError> {
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
                    .ok_or_else(|| DeleteError::NoSelector { list: dotted(path) })?;
                let sel_value =
                    scalar_text(sel_value).ok_or_else(|| DeleteError::SelectorNotScalar {
                        list: dotted(path),
                        key: sel_key.clone(),
                    })?;
                if path[..path.len() - 1].contains(&Step::Item) {
                    return Err(DeleteError::ListInItem { list: dotted(path) });
                }
                out.push(Delete {
                    path: keys_of(path),
                    item: Some((sel_key, sel_value)),
                });
            } else {
                if path.contains(&Step::Item) {
                    return Err(DeleteError::KeyInItem { path: dotted(path) });
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
) -> Result<bool, DeleteError> {
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
pub(super) fn is_empty_patch_document(m: &Mapping) -> bool {
    m.iter().all(|(k, v)| {
        matches!(k.as_str(), Some("version" | "kind" | "name"))
            && !matches!(v, Value::Mapping(_) | Value::Sequence(_))
    })
}

pub(super) fn apply_delete(
    docs: &mut Vec<CowMapping<'_>>,
    id: &DocId,
    delete: &Delete,
    how: Application,
) -> Result<(), DeleteError> {
    // Reapplied, a delete whose target is already gone has its effect.
    let gone_is_done = how == Application::Reapply;
    let Some(index) = docs.iter().position(|d| DocId::of(d) == *id) else {
        // Deleting from a document the config does not have changes nothing.
        return Ok(());
    };
    if delete.path.is_empty() {
        if *id == DocId::V1Alpha1 {
            return Err(DeleteError::V1Alpha1Document);
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
                return Err(DeleteError::NoParent {
                    path: delete.path.join("."),
                    missing: parents[..=depth].join("."),
                });
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
                    return Err(DeleteError::NoList {
                        list: delete.path.join("."),
                        key: key.clone(),
                        value: value.clone(),
                    });
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
                None => Err(DeleteError::NoItem {
                    list: delete.path.join("."),
                    key: key.clone(),
                    value: value.clone(),
                }),
            }
        }
    }
}
