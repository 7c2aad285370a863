//! Config patches as Talos applies them: strategic merge and JSON 6902.
//!
//! Strategic merge (Talos's documented rules):
//! * each patch document is merged into the config document with the same
//!   `apiVersion`, `kind` and `name` (the `v1alpha1` patch document, which has
//!   no `kind`, into the `v1alpha1` document); a patch document with no match
//!   is appended;
//! * a patch document with `$patch: delete` at its top removes the matching
//!   document (nothing happens when there is none);
//! * mappings merge key by key, patch values win; a key whose patch value is
//!   a mapping holding `$patch: delete` is removed; a `null` patch value
//!   changes nothing;
//! * lists are appended, except: `cluster.network.podSubnets`,
//!   `cluster.network.serviceSubnets` and `KubeNetworkConfig`'s
//!   `podSubnets`/`serviceSubnets` are replaced; `cluster.apiServer.auditPolicy`
//!   is replaced; `machine.network.interfaces` items merge with the item of the
//!   same `interface` (or `deviceSelector`), their `vlans` with the same
//!   `vlanId`, and `ExtensionServiceConfig.configFiles` items replace the item
//!   of the same `mountPath`. In those keyed lists an item holding
//!   `$patch: delete` removes the matching item.
//!
//! JSON 6902 patches apply to the `v1alpha1` document of a config that has
//! only that document; Talos refuses them on multi-document configs, and so
//! does this module.

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use crate::config::{ConfigError, MachineConfig, parse_yaml_documents};

const PATCH_KEY: &str = "$patch";
const DELETE: &str = "delete";

/// Errors of the `patch` module.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch text is not valid YAML or not a list of patch documents.
    #[error("patch {origin}: {source}")]
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
    #[error(
        "JSON 6902 patch {origin} failed: {source}; check the operation's path against the config"
    )]
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
    /// The patched config is no longer a valid config (a typed field got the wrong type).
    #[error("patch {origin} produced an invalid config: {source}; fix the patch")]
    Result {
        /// Where the patch came from.
        origin: String,
        /// The decoding error.
        source: ConfigError,
    },
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
        Ok(Self::StrategicMerge(docs))
    }

    /// Applies the patch to a config, returning the patched config.
    pub fn apply(&self, config: &MachineConfig, origin: &str) -> Result<MachineConfig, PatchError> {
        match self {
            Self::StrategicMerge(docs) => apply_strategic_merge(config, docs, origin),
            Self::Json6902(p) => apply_json6902(config, p, origin),
        }
    }
}

/// Applies strategic merge patch documents (see the module docs for the rules).
pub fn apply_strategic_merge(
    config: &MachineConfig,
    patch_docs: &[Mapping],
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    let mut docs = config.to_mappings().map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })?;
    for patch in patch_docs {
        let id = DocId::of(patch);
        if id == DocId::Unmatched {
            return Err(PatchError::UnknownDocument {
                origin: origin.to_string(),
            });
        }
        if is_delete(patch) {
            docs.retain(|d| DocId::of(d) != id);
            continue;
        }
        let path_root = id.path_root();
        match docs.iter_mut().find(|d| DocId::of(d) == id) {
            Some(target) => merge_mapping(target, patch, &[path_root.as_str()]),
            None => {
                let mut fresh = Mapping::new();
                merge_mapping(&mut fresh, patch, &[path_root.as_str()]);
                docs.push(fresh);
            }
        }
    }
    MachineConfig::from_mappings(docs, origin).map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })
}

/// Applies a JSON 6902 patch to a config holding only the `v1alpha1` document.
pub fn apply_json6902(
    config: &MachineConfig,
    patch: &json_patch::Patch,
    origin: &str,
) -> Result<MachineConfig, PatchError> {
    let docs = config.to_mappings().map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })?;
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
    let mut json = serde_json::to_value(Value::Mapping(docs[0].clone())).map_err(|e| conv(&e))?;
    json_patch::patch(&mut json, patch).map_err(|source| PatchError::Json6902Apply {
        origin: origin.to_string(),
        source,
    })?;
    let back = serde_yaml_ng::to_value(json).map_err(|e| conv(&e))?;
    let Value::Mapping(m) = back else {
        return Err(conv(&"the patched document is no longer a mapping"));
    };
    MachineConfig::from_mappings(vec![m], origin).map_err(|source| PatchError::Result {
        origin: origin.to_string(),
        source,
    })
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

/// How the list at a path merges.
enum ListRule {
    Append,
    Replace,
    /// Items with equal values for one of these keys merge (or replace when `replace_item`).
    Keyed {
        keys: &'static [&'static str],
        replace_item: bool,
    },
}

fn list_rule(path: &[&str]) -> ListRule {
    match path {
        ["", "cluster", "network", "podSubnets" | "serviceSubnets"]
        | ["KubeNetworkConfig", "podSubnets" | "serviceSubnets"] => ListRule::Replace,
        ["", "machine", "network", "interfaces"] => ListRule::Keyed {
            keys: &["interface", "deviceSelector"],
            replace_item: false,
        },
        ["", "machine", "network", "interfaces", "vlans"] => ListRule::Keyed {
            keys: &["vlanId"],
            replace_item: false,
        },
        ["ExtensionServiceConfig", "configFiles"] => ListRule::Keyed {
            keys: &["mountPath"],
            replace_item: true,
        },
        _ => ListRule::Append,
    }
}

fn replaces_whole_value(path: &[&str]) -> bool {
    matches!(path, ["", "cluster", "apiServer", "auditPolicy"])
}

fn merge_mapping(target: &mut Mapping, patch: &Mapping, path: &[&str]) {
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
        match target.get_mut(key) {
            Some(tv) if !replaces_whole_value(&child) => merge_value(tv, pv, &child),
            _ => {
                target.insert(k.clone(), strip(pv));
            }
        }
    }
}

fn merge_value(target: &mut Value, patch: &Value, path: &[&str]) {
    match (target, patch) {
        (Value::Mapping(t), Value::Mapping(p)) => merge_mapping(t, p, path),
        (Value::Sequence(t), Value::Sequence(p)) => merge_list(t, p, path),
        (t, p) => *t = strip(p),
    }
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value], path: &[&str]) {
    match list_rule(path) {
        ListRule::Append => target.extend(patch.iter().filter(|v| !is_delete_value(v)).map(strip)),
        ListRule::Replace => *target = patch.iter().map(strip).collect(),
        ListRule::Keyed { keys, replace_item } => {
            for item in patch {
                let found = target.iter().position(|t| same_key(t, item, keys));
                match (found, is_delete_value(item)) {
                    (Some(i), true) => {
                        target.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) if replace_item => target[i] = strip(item),
                    (Some(i), false) => merge_value(&mut target[i], item, path),
                    (None, false) => target.push(strip(item)),
                }
            }
        }
    }
}

fn same_key(a: &Value, b: &Value, keys: &[&str]) -> bool {
    keys.iter().any(|k| match (a.get(*k), b.get(*k)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    })
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
