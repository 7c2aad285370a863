//! Drift: the per-path comparison of a node's live config with its desired
//! config, each difference classified by [`crate::classes`].

use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{DriftClass, DriftEntry};
use std::borrow::Borrow;

use ichor_talos::config::lookup;
use ichor_talos::config::{CowMapping, MachineConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_yaml_ng::{Mapping, Value};

use crate::Error;
use crate::classes;
use crate::path::{ConfigPath, document_path, document_paths, is_v1alpha1, kind_of};
use crate::redact::Redactor;
use crate::render::same_value;

/// Longest value text kept in a drift entry (status must stay small).
pub const MAX_VALUE_LEN: usize = 1024;

/// The drift of one machine: every path where live and desired differ, sorted by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drift {
    /// The differences, sorted by path.
    pub entries: Vec<DriftEntry>,
}

impl Drift {
    /// The highest class present (C > B > A), `None` when nothing differs.
    pub fn max_class(&self) -> Option<DriftClass> {
        self.entries.iter().map(|e| e.class).max()
    }

    /// Entries of one class.
    pub fn of_class(&self, class: DriftClass) -> impl Iterator<Item = &DriftEntry> {
        self.entries.iter().filter(move |e| e.class == class)
    }

    /// Whether Ichor may apply the desired config on its own: some class B
    /// drift and no class C (the hold is the caller's to check).
    pub fn is_applicable(&self) -> bool {
        self.max_class() == Some(DriftClass::B)
    }

    /// Whether nothing needs doing (no drift, or only class A).
    pub fn is_clean(&self) -> bool {
        self.max_class().is_none_or(|c| c == DriftClass::A)
    }

    /// One sentence for people: how many paths differ, and for class C which and why.
    pub fn summary(&self) -> String {
        let count = |c| self.of_class(c).count();
        let (b, c) = (count(DriftClass::B), count(DriftClass::C));
        if b == 0 && c == 0 {
            return "the node runs the desired config".to_owned();
        }
        let mut s = format!(
            "{} path(s) differ: {b} class B (applied without a reboot when the machine is not held), {c} class C",
            b + c
        );
        if c > 0 {
            let list: Vec<String> = self
                .of_class(DriftClass::C)
                .map(|e| format!("{} ({})", e.path, e.reason.as_deref().unwrap_or("unknown")))
                .collect();
            s.push_str(&format!(
                ". Ichor will not apply class C on its own, so nothing is applied to this machine: {}. Change the TalosCluster, TalosMachine or its patches to match the node, or make the change by hand",
                list.join("; ")
            ));
        }
        s
    }

    /// The `Drifted` condition of a TalosMachine for this drift.
    pub fn condition(&self, observed_generation: Option<i64>, now: Time) -> Condition {
        let (status, reason) = match self.max_class() {
            None | Some(DriftClass::A) => (Status::False, reasons::NO_DRIFT),
            Some(DriftClass::B) => (Status::True, reasons::SAFE_DRIFT),
            Some(DriftClass::C) => (Status::True, reasons::UNSAFE_DRIFT),
        };
        conditions::new(
            types::DRIFTED,
            status,
            reason,
            self.summary(),
            observed_generation,
            now,
        )
    }
}

/// Compares live and desired config per path. A subtree present on one side
/// only is one entry at its root; keyed lists (items with a `name`) compare
/// item by item; other lists compare as a whole.
pub fn compare(live: &MachineConfig, desired: &MachineConfig) -> Result<Drift, Error> {
    compare_redacted(live, desired, &Redactor::default())
}

/// [`compare`] with other redaction rules (tests prove with it that the leak
/// test can fail).
pub fn compare_redacted(
    live: &MachineConfig,
    desired: &MachineConfig,
    redactor: &Redactor<'_>,
) -> Result<Drift, Error> {
    let live = live.to_mappings().map_err(|source| Error::Serialise {
        what: "live",
        source,
    })?;
    let desired = desired.to_mappings().map_err(|source| Error::Serialise {
        what: "desired",
        source,
    })?;
    Ok(compare_documents(&live, &desired, redactor))
}

/// [`compare`] over documents already turned into mappings.
pub fn compare_documents<L: Borrow<Mapping>, D: Borrow<Mapping>>(
    live: &[L],
    desired: &[D],
    redactor: &Redactor<'_>,
) -> Drift {
    let live_paths = document_paths(live);
    let desired_paths = document_paths(desired);
    let mut entries = Vec::new();
    for (path, d) in desired_paths.iter().zip(desired) {
        let l = live_paths
            .iter()
            .position(|p| p == path)
            .map(|i| live[i].borrow());
        diff_mapping(path, l, Some(d.borrow()), &mut entries, redactor);
    }
    for (path, l) in live_paths.iter().zip(live) {
        if !desired_paths.contains(path) {
            diff_mapping(path, Some(l.borrow()), None, &mut entries, redactor);
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Drift { entries }
}

/// [`compare_documents`] of a render's documents, which start as the live
/// ones: when the render kept every document in its place (the same kind
/// and name at each position, no path twice), a document it never wrote
/// to is the live one and is not walked, and only the others are compared.
/// Otherwise every document is compared. Both ways give the same drift (a
/// test holds them equal).
pub fn compare_edited(
    live: &[Mapping],
    desired: &[CowMapping<'_>],
    redactor: &Redactor<'_>,
) -> Drift {
    if !same_places(live, desired) {
        return compare_documents(live, desired, redactor);
    }
    let mut entries = Vec::new();
    for (i, (l, d)) in live.iter().zip(desired).enumerate() {
        if d.is_unwritten(l) {
            continue;
        }
        let path = document_path(desired, i);
        diff_mapping(&path, Some(l), Some(d), &mut entries, redactor);
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Drift { entries }
}

/// Whether each desired document has the place of the live one at its
/// position (the same kind and name, or both `v1alpha1`) and no document
/// path is there twice, so that documents pair by position as
/// [`compare_documents`] pairs them by path.
fn same_places(live: &[Mapping], desired: &[CowMapping<'_>]) -> bool {
    fn id(m: &Mapping) -> (bool, Option<&str>, Option<&str>) {
        let kind = kind_of(m);
        (
            kind.is_none() && is_v1alpha1(m),
            kind,
            lookup(m, "name").and_then(Value::as_str),
        )
    }
    if live.len() != desired.len() {
        return false;
    }
    let mut named: Vec<(bool, Option<&str>, Option<&str>)> = Vec::new();
    for (l, d) in live.iter().zip(desired) {
        let lid = id(l);
        if !d.is_unwritten(l) && id(d) != lid {
            return false;
        }
        // A v1alpha1 document or a named one has a path of its own; two
        // with one path (or a name that reads like an unnamed document's
        // `#n`) pair by path, not by position.
        let (v1, _, name) = lid;
        if v1 || name.is_some() {
            if name.is_some_and(|n| n.starts_with('#')) || named.contains(&lid) {
                return false;
            }
            named.push(lid);
        }
    }
    true
}

fn diff_mapping(
    path: &ConfigPath,
    live: Option<&Mapping>,
    desired: Option<&Mapping>,
    out: &mut Vec<DriftEntry>,
    redactor: &Redactor<'_>,
) {
    match (live, desired) {
        (Some(l), Some(d)) => {
            // A desired mapping starts as the live one, so a key is nearly
            // always at the same place in both: looked up only when not.
            let mut live_in_order = l.iter();
            let mut found = 0;
            for (k, dv) in d {
                let lv = match live_in_order.next() {
                    Some((lk, lv)) if lk == k => Some(lv),
                    _ => get_key(l, k),
                };
                found += usize::from(lv.is_some());
                // most of a config is equal: skip it before building its path
                if lv.is_some_and(|lv| equal(lv, dv)) {
                    continue;
                }
                diff(&path.key(&key_text(k)), lv, Some(dv), out, redactor);
            }
            // Keys are unique: when every live key was found, none is gone.
            if found < l.len() {
                for (k, lv) in l {
                    if get_key(d, k).is_none() {
                        diff(&path.key(&key_text(k)), Some(lv), None, out, redactor);
                    }
                }
            }
        }
        (l, d) => {
            let lv = l.cloned().map(Value::Mapping);
            let dv = d.cloned().map(Value::Mapping);
            push(path, lv.as_ref(), dv.as_ref(), out, redactor);
        }
    }
}

/// The value of a key ([`lookup`] for a string key).
fn get_key<'m>(m: &'m Mapping, k: &Value) -> Option<&'m Value> {
    match k {
        Value::String(k) => lookup(m, k),
        k => m.get(k),
    }
}

fn diff(
    path: &ConfigPath,
    live: Option<&Value>,
    desired: Option<&Value>,
    out: &mut Vec<DriftEntry>,
    redactor: &Redactor<'_>,
) {
    match (live, desired) {
        (Some(l), Some(d)) if equal(l, d) => return,
        (None, None) => return,
        _ => {}
    }
    match (live, desired) {
        (Some(Value::Mapping(l)), Some(Value::Mapping(d))) => {
            diff_mapping(path, Some(l), Some(d), out, redactor)
        }
        (l, d) if keyed_or_absent(l) && keyed_or_absent(d) => {
            let empty = Vec::new();
            let l = l.and_then(Value::as_sequence).unwrap_or(&empty);
            let d = d.and_then(Value::as_sequence).unwrap_or(&empty);
            for di in d {
                let name = item_name(di);
                let li = l.iter().find(|x| item_name(x) == name);
                diff(&path.item(name), li, Some(di), out, redactor);
            }
            for li in l {
                let name = item_name(li);
                if !d.iter().any(|x| item_name(x) == name) {
                    diff(&path.item(name), Some(li), None, out, redactor);
                }
            }
        }
        _ => push(path, live, desired, out, redactor),
    }
}

/// YAML's equality (keys in any order), answered first by the cheaper walk
/// in order, which holds for nearly all of a config.
fn equal(a: &Value, b: &Value) -> bool {
    same_value(a, b) || a == b
}

fn push(
    path: &ConfigPath,
    live: Option<&Value>,
    desired: Option<&Value>,
    out: &mut Vec<DriftEntry>,
    redactor: &Redactor<'_>,
) {
    let (class, reason) = classes::classify(path, live, desired);
    let show = |v: Option<&Value>| v.map(|v| value_text(&redactor.redact(path, v)));
    out.push(DriftEntry {
        path: path.to_string(),
        class,
        live: show(live),
        desired: show(desired),
        reason: Some(reason.to_owned()),
    });
}

/// A keyed list, or nothing (so a keyed list added or removed as a whole is
/// still reported item by item); at least one side is a list.
fn keyed_or_absent(v: Option<&Value>) -> bool {
    match v {
        None => true,
        Some(Value::Sequence(s)) => keyed(s),
        Some(_) => false,
    }
}

/// A list is keyed when every item is a mapping with a distinct string `name`.
fn keyed(items: &[Value]) -> bool {
    let names: Vec<&str> = items
        .iter()
        .filter_map(|i| lookup(i.as_mapping()?, "name")?.as_str())
        .collect();
    !items.is_empty()
        && names.len() == items.len()
        && names
            .iter()
            .enumerate()
            .all(|(i, n)| !names[..i].contains(n))
}

fn item_name(v: &Value) -> &str {
    v.as_mapping()
        .and_then(|m| lookup(m, "name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => value_text(other),
    }
}

/// A value as text: scalars as they are, the rest as YAML.
pub(crate) fn value_text_full(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => "null".to_owned(),
        other => serde_yaml_ng::to_string(other)
            .unwrap_or_default()
            .trim_end()
            .to_owned(),
    }
}

/// A value as drift shows it: [`value_text_full`], long values cut. Callers
/// redact first ([`Redactor::redact`]).
pub fn value_text(v: &Value) -> String {
    let text = value_text_full(v);
    if text.len() <= MAX_VALUE_LEN {
        return text;
    }
    let mut cut = MAX_VALUE_LEN;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..cut], text.len())
}

#[cfg(test)]
mod tests {
    use super::{compare_documents, compare_edited};
    use crate::redact::Redactor;
    use ichor_talos::config::CowMapping;
    use serde_yaml_ng::Mapping;

    /// A change a render makes to its documents.
    type Edit = dyn Fn(&mut Vec<CowMapping<'_>>);

    fn docs(text: &str) -> Vec<Mapping> {
        text.split("---\n")
            .map(|d| serde_yaml_ng::from_str(d).expect("yaml"))
            .collect()
    }

    /// The drift of a render's documents, compared by position where the
    /// render kept every document in its place and by path where it did not
    /// (a document removed, added, renamed, or two with one path), is the
    /// drift of every document compared by path.
    /// Covers: R1.6 (a node that differs is reported as drift, path by path)
    #[test]
    fn edited_documents_drift_as_all_documents_do() {
        let live = docs(
            "machine: {type: worker, nodeLabels: {a: b}}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: n1\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: k:1\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nsize: 1GB\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data2\nsize: 2GB\n",
        );
        let edits: Vec<Box<Edit>> = vec![
            Box::new(|_| {}),
            Box::new(|d| {
                d[0].insert("debug".into(), true.into());
            }),
            Box::new(|d| {
                d[2].insert("image".into(), "k:2".into());
                d[1].insert("hostname".into(), "n2".into());
            }),
            Box::new(|d| {
                d.remove(1);
            }),
            Box::new(|d| {
                d[1].insert("kind".into(), "HostnameConfigV2".into());
            }),
            Box::new(|d| {
                d[3].insert("name".into(), "other".into());
            }),
            // two documents with one path
            Box::new(|d| {
                d[4].insert("name".into(), "data".into());
                d[4].insert("size".into(), "3GB".into());
            }),
            Box::new(|d| {
                d.push(CowMapping::Owned(
                    docs("apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: n3\n").remove(0),
                ));
            }),
        ];
        // The same config with two documents of one path (Talos refuses
        // such a config; the drift still says what differs as by path).
        let twice: Vec<Mapping> = live[..4]
            .iter()
            .cloned()
            .chain(docs(
                "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nsize: 2GB\n",
            ))
            .collect();
        for live in [&live, &twice] {
            for (i, edit) in edits.iter().enumerate() {
                let mut desired = CowMapping::borrow_all(live);
                edit(&mut desired);
                let redactor = Redactor::default();
                assert_eq!(
                    compare_edited(live, &desired, &redactor),
                    compare_documents(live, &desired, &redactor),
                    "edit #{i}"
                );
            }
        }
    }
}
