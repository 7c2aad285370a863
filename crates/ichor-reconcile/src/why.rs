//! Reasons carried as words: what a decision reads of an observation that
//! did not go as hoped, in the words the status shows. They are data for a
//! condition or a step's message, not errors: the error they come from
//! stays with the crate that read it and is written out with each of its
//! causes ([`ichor_api::error_text::chain`]).

use std::fmt;

/// What something still waits for (`0 of 3 ready`, `Node w-1 is not
/// registered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting(pub String);

/// Why a node or the API server could not say (the read's error with each
/// of its causes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered(pub String);

/// Why nothing (more) was written, as the step's message says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotWritten(pub String);

macro_rules! words {
    ($($t:ident),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $t {
            fn from(words: &str) -> $t {
                $t(words.to_owned())
            }
        }

        impl From<String> for $t {
            fn from(words: String) -> $t {
                $t(words)
            }
        }
    )*};
}

words!(Waiting, Unanswered, NotWritten);
