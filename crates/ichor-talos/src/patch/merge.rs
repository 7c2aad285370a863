//! How a patch value merges into a config value: mappings key by key,
//! lists appended, replaced or keyed by path, and the bookkeeping that lets
//! a patch be reapplied once (ADR 0016).

use serde_yaml_ng::{Mapping, Value};

use super::delete::is_delete_value;
use super::{Application, PATCH_KEY};

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
pub(super) struct Merger {
    how: Application,
    /// Per list (named by its document, keys and keyed items, as
    /// [`list_item_ident`] names an item), the patch's items.
    accounted: std::collections::HashMap<String, Vec<Value>>,
}

impl Merger {
    pub(super) fn new(how: Application) -> Self {
        Self {
            how,
            accounted: std::collections::HashMap::new(),
        }
    }

    /// Merges a patch mapping into a config mapping. `path` is the rule path
    /// (document kind, then keys; see [`list_rule`]); `ident` names this very
    /// mapping, a keyed list item by its key (for [`Merger::accounted`]).
    pub(super) fn mapping(
        &mut self,
        target: &mut Mapping,
        patch: &Mapping,
        path: &[&str],
        ident: &str,
    ) {
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
    pub(super) fn fresh_document(
        &mut self,
        patch: &Mapping,
        path_root: &str,
        ident: &str,
    ) -> Mapping {
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
