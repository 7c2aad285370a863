//! [`CowMapping`]: a document's YAML mapping, borrowed from the config it
//! came from until something writes to it.
//!
//! A render starts from the node's live documents and changes a few of
//! them (a v1.14 control plane's config has 27 documents; a render usually
//! writes two or three). Copying every document first costs more than the
//! rest of the render; with this type only a written document is copied, and
//! one never written is known to be the live one without comparing it.

use std::borrow::Borrow;
use std::ops::{Deref, DerefMut};

use serde_yaml_ng::Mapping;

/// A document's mapping: the live one, borrowed, or a copy that was written to.
///
/// Reading goes through [`Deref`]; taking it mutably ([`DerefMut`], as any
/// `&mut Mapping` parameter does) copies a borrowed mapping first, so a
/// caller that only looks should take `&CowMapping`.
#[derive(Debug, Clone, PartialEq)]
pub enum CowMapping<'a> {
    /// Not written to: the mapping it was made from.
    Borrowed(&'a Mapping),
    /// Written to (or made new).
    Owned(Mapping),
}

impl<'a> CowMapping<'a> {
    /// Borrowed mappings for each of `docs`.
    pub fn borrow_all(docs: &'a [Mapping]) -> Vec<Self> {
        docs.iter().map(CowMapping::Borrowed).collect()
    }

    /// Whether this is `original` itself, never written to.
    pub fn is_unwritten(&self, original: &Mapping) -> bool {
        matches!(self, Self::Borrowed(m) if std::ptr::eq(*m, original))
    }

    /// The mapping, owned (a copy when it was never written to).
    pub fn into_owned(self) -> Mapping {
        match self {
            Self::Borrowed(m) => m.clone(),
            Self::Owned(m) => m,
        }
    }
}

impl From<Mapping> for CowMapping<'_> {
    fn from(m: Mapping) -> Self {
        Self::Owned(m)
    }
}

impl Borrow<Mapping> for CowMapping<'_> {
    fn borrow(&self) -> &Mapping {
        self
    }
}

impl Deref for CowMapping<'_> {
    type Target = Mapping;

    fn deref(&self) -> &Mapping {
        match self {
            Self::Borrowed(m) => m,
            Self::Owned(m) => m,
        }
    }
}

impl DerefMut for CowMapping<'_> {
    fn deref_mut(&mut self) -> &mut Mapping {
        if let Self::Borrowed(m) = *self {
            *self = Self::Owned(m.clone());
        }
        match self {
            Self::Owned(m) => m,
            Self::Borrowed(_) => unreachable!("a borrowed mapping was just copied"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CowMapping;
    use serde_yaml_ng::{Mapping, Value};

    #[test]
    fn a_mapping_is_copied_only_when_written() {
        let mut live = Mapping::new();
        live.insert("a".into(), Value::from(1));
        let mut docs = CowMapping::borrow_all(std::slice::from_ref(&live));
        assert_eq!(docs[0].get("a"), Some(&Value::from(1)));
        assert!(docs[0].is_unwritten(&live), "a read does not copy");
        docs[0].insert("b".into(), Value::from(2));
        assert!(!docs[0].is_unwritten(&live));
        assert_eq!(live.len(), 1, "the original is untouched");
        assert_eq!(docs.remove(0).into_owned().len(), 2);
    }
}
