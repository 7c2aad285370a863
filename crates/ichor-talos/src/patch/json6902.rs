//! JSON 6902 patches, as Talos applies them: only to a config holding just
//! the `v1alpha1` document, a `replace` of a missing key adding it.

use serde_yaml_ng::Value;

use super::{Application, PatchError};
use crate::config::{CowMapping, MachineConfig};

/// Applies a JSON 6902 patch to a config holding only the `v1alpha1` document.
pub fn apply_json6902(
    config: &MachineConfig,
    patch: &json_patch::Patch,
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    apply_json6902_in(config, patch, origin, Application::Talos)
}

pub(super) fn apply_json6902_in(
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
pub(super) fn json6902_documents(
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
