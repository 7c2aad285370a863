//! Paths into a machine config, across documents.
//!
//! A path names one node of the config tree: the document, then mapping keys
//! and keyed list items. It is written the way people read configs:
//!
//! - `cluster.network.cni.name` — a key of the legacy `v1alpha1` document;
//! - `KubeProxyConfig.enabled` — a key of a multi-document kind;
//! - `KubeInlineManifestConfig[cilium].manifest` — a named document;
//! - `cluster.inlineManifests[cilium].contents` — a list item found by its `name`;
//! - `machine.nodeLabels["node.kubernetes.io/exclude"]` — a key with dots.

use std::borrow::Borrow;
use std::fmt;

use ichor_talos::config::CowMapping;
use ichor_talos::config::lookup;
use serde_yaml_ng::{Mapping, Value};

/// One step of a [`ConfigPath`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Segment {
    /// A mapping key (or, first, the kind of a multi-document kind).
    Key(String),
    /// A list item or a document, found by its `name` (`#2` for the second unnamed document of a kind).
    Item(String),
}

/// A path into a machine config (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigPath(pub Vec<Segment>);

impl ConfigPath {
    /// The path with one more key.
    pub fn key(&self, k: &str) -> ConfigPath {
        let mut v = self.0.clone();
        v.push(Segment::Key(k.to_owned()));
        ConfigPath(v)
    }

    /// The path with one more item.
    pub fn item(&self, name: &str) -> ConfigPath {
        let mut v = self.0.clone();
        v.push(Segment::Item(name.to_owned()));
        ConfigPath(v)
    }

    /// Whether this path is `pattern` or lies under it. `pattern` uses the
    /// display syntax; `*` matches any one key and `[*]` any one item. The
    /// empty pattern matches every path.
    pub fn is_under(&self, pattern: &str) -> bool {
        // Most patterns of a table differ in their first key: tell that
        // from the text, without reading the pattern step by step (the
        // redaction asks this for every value it shows).
        if let Some(Segment::Key(first)) = self.0.first()
            && !pattern.starts_with(['*', '[', '.'])
            && !pattern.is_empty()
        {
            match pattern.strip_prefix(first.as_str()) {
                Some(rest) if rest.is_empty() || rest.starts_with(['.', '[']) => {}
                _ => return false,
            }
        }
        self.matches_step_by_step(pattern)
    }

    /// [`Self::is_under`], reading the pattern step by step.
    fn matches_step_by_step(&self, pattern: &str) -> bool {
        let mut segments = self.0.iter();
        PatternSegments::new(pattern).all(|p| segments.next().is_some_and(|s| p.matches(s)))
    }

    /// Whether `pattern` lies under this path (this path is an ancestor of it, or equal).
    pub fn is_ancestor_of(&self, pattern: &str) -> bool {
        let mut pattern = PatternSegments::new(pattern);
        self.0
            .iter()
            .all(|s| pattern.next().is_some_and(|p| p.matches(s)))
    }
}

/// One step of a pattern, borrowed from its text: `*` matches any one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatternSegment<'a> {
    Key(&'a str),
    Item(&'a str),
}

impl PatternSegment<'_> {
    fn matches(self, s: &Segment) -> bool {
        match (self, s) {
            (PatternSegment::Key(p), Segment::Key(s))
            | (PatternSegment::Item(p), Segment::Item(s)) => p == "*" || p == s,
            _ => false,
        }
    }
}

/// The steps of a pattern in display syntax (no quoted keys needed in
/// patterns), without allocating: the drift classes and the redaction
/// match every changed path against tables of patterns.
struct PatternSegments<'a> {
    /// Tokens between dots still to read.
    tokens: std::str::Split<'a, char>,
    /// The rest of the current token: `[item]...`.
    items: &'a str,
}

impl<'a> PatternSegments<'a> {
    fn new(pattern: &'a str) -> Self {
        PatternSegments {
            tokens: pattern.split('.'),
            items: "",
        }
    }
}

impl<'a> Iterator for PatternSegments<'a> {
    type Item = PatternSegment<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(stripped) = self.items.strip_prefix('[') {
                let close = stripped.find(']').unwrap_or(stripped.len());
                self.items = stripped.get(close + 1..).unwrap_or("");
                return Some(PatternSegment::Item(&stripped[..close]));
            }
            let token = self.tokens.next()?;
            if token.is_empty() {
                continue;
            }
            match token.find('[') {
                Some(open) => {
                    self.items = &token[open..];
                    if open > 0 {
                        return Some(PatternSegment::Key(&token[..open]));
                    }
                }
                None => return Some(PatternSegment::Key(token)),
            }
        }
    }
}

impl fmt::Display for ConfigPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            // The root: the whole legacy document.
            return f.write_str("v1alpha1");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Segment::Key(k) if needs_quotes(k) => write!(f, "[{k:?}]")?,
                Segment::Key(k) if i == 0 => write!(f, "{k}")?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Item(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

fn needs_quotes(k: &str) -> bool {
    k.is_empty() || k.contains(['.', '[', ']', '"', ' '])
}

/// Whether a mapping is the legacy `v1alpha1` document, by the parser's own
/// rule (one rule for both crates).
pub(crate) fn is_v1alpha1(m: &Mapping) -> bool {
    ichor_talos::config::is_v1alpha1_mapping(m)
}

/// The `kind` of a multi-document kind.
pub(crate) fn kind_of(m: &Mapping) -> Option<&str> {
    lookup(m, "kind").and_then(Value::as_str)
}

/// The path of every document, in order: `[]` for `v1alpha1`, `Kind` or
/// `Kind[name]` for the others (`Kind[#n]` for the n-th unnamed one of a kind).
pub(crate) fn document_paths<M: Borrow<Mapping>>(docs: &[M]) -> Vec<ConfigPath> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    docs.iter()
        .map(|m| match own_path(m.borrow()) {
            Ok(path) => path,
            Err((base, kind)) => {
                let n = match seen.iter_mut().find(|(k, _)| *k == kind) {
                    Some((_, n)) => {
                        *n += 1;
                        *n
                    }
                    None => {
                        seen.push((kind, 1));
                        1
                    }
                };
                numbered(base, n)
            }
        })
        .collect()
}

/// The path of `docs[i]` (see [`document_paths`]; for one document, not all).
pub(crate) fn document_path<M: Borrow<Mapping>>(docs: &[M], i: usize) -> ConfigPath {
    let m = docs[i].borrow();
    let (base, kind) = match own_path(m) {
        Ok(path) => return path,
        Err(unnamed) => unnamed,
    };
    let unnamed = |d: &Mapping| lookup(d, "name").and_then(Value::as_str).is_none();
    let n = 1 + docs[..i]
        .iter()
        .map(Borrow::borrow)
        .filter(|d: &&Mapping| match kind_of(m) {
            // the kind's look-up first: it rules out nearly every document
            Some(_) => kind_of(d) == Some(kind) && unnamed(d),
            None => !is_v1alpha1(d) && kind_of(d).is_none() && unnamed(d),
        })
        .count();
    numbered(base, n)
}

/// A document's path when the document alone says it (`[]`, `Kind[name]`);
/// else its kind's path and kind, for [`numbered`].
fn own_path(m: &Mapping) -> Result<ConfigPath, (ConfigPath, &str)> {
    if is_v1alpha1(m) {
        return Ok(ConfigPath::default());
    }
    let kind = kind_of(m).unwrap_or("<no kind>");
    let base = ConfigPath::default().key(kind);
    match lookup(m, "name").and_then(Value::as_str) {
        Some(name) => Ok(base.item(name)),
        None => Err((base, kind)),
    }
}

/// The path of the `n`-th unnamed document of a kind.
fn numbered(base: ConfigPath, n: usize) -> ConfigPath {
    if n == 1 {
        base
    } else {
        base.item(&format!("#{n}"))
    }
}

/// [`set`] on a document borrowed from the live config: the document is
/// copied only when the value at `keys` changes.
pub(crate) fn set_doc(doc: &mut CowMapping<'_>, keys: &[&str], value: Value) -> bool {
    if get(doc, keys) == Some(&value) {
        return false;
    }
    set(doc, keys, value)
}

/// [`set_existing`] on a borrowed document, copied only when it changes.
pub(crate) fn set_existing_doc(doc: &mut CowMapping<'_>, keys: &[&str], value: Value) -> bool {
    let Some((_, parents)) = keys.split_last() else {
        return false;
    };
    let parent_is_mapping = parents.is_empty() || get(doc, parents).is_some_and(Value::is_mapping);
    if !parent_is_mapping || get(doc, keys) == Some(&value) {
        return false;
    }
    set_existing(doc, keys, value)
}

/// [`remove`] on a borrowed document, copied only when something goes.
pub(crate) fn remove_doc(doc: &mut CowMapping<'_>, keys: &[&str]) -> bool {
    if get(doc, keys).is_none() {
        return false;
    }
    remove(doc, keys)
}

/// The value at `keys` under a mapping.
pub(crate) fn get<'a>(m: &'a Mapping, keys: &[&str]) -> Option<&'a Value> {
    let (first, rest) = keys.split_first()?;
    let v = lookup(m, first)?;
    if rest.is_empty() {
        Some(v)
    } else {
        get(v.as_mapping()?, rest)
    }
}

/// Sets the value at `keys`, creating mappings on the way (a non-mapping on
/// the way is replaced). Returns whether anything changed.
pub(crate) fn set(m: &mut Mapping, keys: &[&str], value: Value) -> bool {
    let Some((first, rest)) = keys.split_first() else {
        return false;
    };
    if rest.is_empty() {
        if lookup(m, first) == Some(&value) {
            return false;
        }
        m.insert(Value::String((*first).to_owned()), value);
        return true;
    }
    let child = m
        .entry(Value::String((*first).to_owned()))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !child.is_mapping() {
        *child = Value::Mapping(Mapping::new());
    }
    match child.as_mapping_mut() {
        Some(cm) => set(cm, rest, value),
        None => false,
    }
}

/// Sets the value at `keys` only when the parent mapping exists. Returns whether anything changed.
pub(crate) fn set_existing(m: &mut Mapping, keys: &[&str], value: Value) -> bool {
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    let parent = if parents.is_empty() {
        Some(m)
    } else {
        get_mut(m, parents).and_then(Value::as_mapping_mut)
    };
    match parent {
        Some(p) if p.get(*last) != Some(&value) => {
            p.insert(Value::String((*last).to_owned()), value);
            true
        }
        _ => false,
    }
}

fn get_mut<'a>(m: &'a mut Mapping, keys: &[&str]) -> Option<&'a mut Value> {
    let (first, rest) = keys.split_first()?;
    let v = m.get_mut(*first)?;
    if rest.is_empty() {
        Some(v)
    } else {
        get_mut(v.as_mapping_mut()?, rest)
    }
}

/// The mapping at `keys`, mutable.
pub(crate) fn mapping_mut<'a>(m: &'a mut Mapping, keys: &[&str]) -> Option<&'a mut Mapping> {
    if keys.is_empty() {
        return Some(m);
    }
    get_mut(m, keys).and_then(Value::as_mapping_mut)
}

/// The list at `keys`, mutable.
pub(crate) fn sequence_mut<'a>(m: &'a mut Mapping, keys: &[&str]) -> Option<&'a mut Vec<Value>> {
    get_mut(m, keys).and_then(Value::as_sequence_mut)
}

/// Removes the value at `keys`. Returns whether anything changed.
pub(crate) fn remove(m: &mut Mapping, keys: &[&str]) -> bool {
    let Some((last, parents)) = keys.split_last() else {
        return false;
    };
    match mapping_mut(m, parents) {
        Some(p) => p.shift_remove(*last).is_some(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: the render + drift goal (docs/benchmarks.md): the first-key check gives what the step-by-step match gives
    #[test]
    fn the_first_key_check_agrees_with_the_step_by_step_match() {
        let paths = [
            ConfigPath::default(),
            ConfigPath::default().key("cluster"),
            ConfigPath::default().key("cluster").key("ca").key("key"),
            ConfigPath::default().key("clusterX").key("ca"),
            ConfigPath::default()
                .key("machine")
                .key("network")
                .item("eth0"),
            ConfigPath::default().key("KubeProxyConfig").key("enabled"),
            ConfigPath::default()
                .key("KubeExternalManifestConfig")
                .item("x")
                .key("url"),
            ConfigPath::default().key("a.b").key("c"),
            ConfigPath::default().key("a").key("b"),
            ConfigPath::default().key("a[x]"),
            ConfigPath::default().item("x"),
        ];
        let mut patterns: Vec<&str> = crate::redact::PUBLIC_PATHS.to_vec();
        patterns.extend(crate::classes::RULES.iter().map(|r| r.pattern));
        patterns.extend([
            "",
            "*",
            "*.ca",
            "[*]",
            ".cluster",
            "a.b",
            "a[x]",
            "a",
            "a.b.c",
            "cluster.",
            "clusterX",
            "KubeExternalManifestConfig[*].url",
        ]);
        for path in &paths {
            for pattern in &patterns {
                assert_eq!(
                    path.is_under(pattern),
                    path.matches_step_by_step(pattern),
                    "{path} under {pattern:?}"
                );
            }
        }
    }

    #[test]
    fn display_and_patterns() {
        let p = ConfigPath::default()
            .key("cluster")
            .key("inlineManifests")
            .item("cilium")
            .key("contents");
        assert_eq!(p.to_string(), "cluster.inlineManifests[cilium].contents");
        assert!(p.is_under("cluster.inlineManifests[cilium]"));
        assert!(p.is_under("cluster.inlineManifests[*]"));
        assert!(p.is_under("cluster.inlineManifests"));
        assert!(p.is_under(""));
        assert!(!p.is_under("cluster.inlineManifests[other]"));
        assert!(!p.is_under("cluster.network"));
        let d = ConfigPath::default().key("KubeProxyConfig").key("enabled");
        assert_eq!(d.to_string(), "KubeProxyConfig.enabled");
        assert!(d.is_under("KubeProxyConfig"));
        let l = ConfigPath::default()
            .key("machine")
            .key("nodeLabels")
            .key("node.kubernetes.io/x");
        assert_eq!(
            l.to_string(),
            "machine.nodeLabels[\"node.kubernetes.io/x\"]"
        );
        assert!(l.is_under("machine.nodeLabels"));
        assert!(
            ConfigPath::default()
                .key("cluster")
                .is_ancestor_of("cluster.ca.key")
        );
        assert_eq!(ConfigPath::default().to_string(), "v1alpha1");
    }
}
