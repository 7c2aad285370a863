//! How an error reads where a person sees it: a message that says what
//! failed, then each cause that says why, once. Ichor's own errors never
//! repeat their source in their message (`source()` carries it); some
//! libraries' errors do, ending their message with their source's, and such
//! a cause is not said twice.
//!
//! What can help (the one step that changes the outcome) is not part of a
//! message: an error type that knows it has an inherent
//! `pub fn help(&self) -> Option<String>` (an inherent method, so that pure
//! libraries such as ichor-talos need not depend on this crate), and the CLI
//! prints the first help of the chain once, on its own `help:` line
//! ([`first_help`]).
//!
//! The CLI prints [`causes`] one per line; status conditions, Events, logs
//! and the UI show [`chain`] on one line ([`with_help`] adds the help there).

use std::error::Error;

/// The first help `find` knows for `error` or one of its causes, outermost
/// first. `find` downcasts a cause to the error types that have a `help()`;
/// a crate that knows all of them (the CLI) gives it.
pub fn first_help(
    error: &(dyn Error + 'static),
    find: impl FnMut(&(dyn Error + 'static)) -> Option<String>,
) -> Option<String> {
    std::iter::successors(Some(error), |e| (*e).source()).find_map(find)
}

/// A one-line text ([`chain`]) followed by what can help, if anything:
/// `what: why; help`.
pub fn with_help(said: String, help: Option<String>) -> String {
    match help {
        Some(help) => format!("{said}; {help}"),
        None => said,
    }
}

/// The error's message and each of its causes, outermost first, a cause the
/// line before already ends with left out.
pub fn causes(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut said = vec![error.to_string()];
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        let repeated = said.last().is_some_and(|last| last.ends_with(&text));
        if !repeated && !text.is_empty() {
            said.push(text);
        }
        next = cause.source();
    }
    said
}

/// The error and its causes on one line: `what: why: why`.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    causes(error).join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading TalosMachine prod/w1")]
    struct Outer {
        #[source]
        source: Middle,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the Talos API of node 10.0.0.1 failed")]
    struct Middle {
        #[source]
        source: Repeating,
    }

    /// A library error that ends its message with its source's.
    #[derive(Debug, thiserror::Error)]
    #[error("transport error: connection refused")]
    struct Repeating {
        #[source]
        source: std::io::Error,
    }

    impl Middle {
        fn help(&self) -> Option<String> {
            Some("check that the node is up".into())
        }
    }

    #[test]
    fn the_first_help_of_the_chain_is_found_and_said_after_it() {
        let e = Outer {
            source: Middle {
                source: Repeating {
                    source: std::io::Error::other("connection refused"),
                },
            },
        };
        let find = |cause: &(dyn Error + 'static)| cause.downcast_ref::<Middle>()?.help();
        let help = first_help(&e, find);
        assert_eq!(help.as_deref(), Some("check that the node is up"));
        assert!(!chain(&e).contains("check that"), "{}", chain(&e));
        assert_eq!(
            with_help(chain(&e), help),
            "reading TalosMachine prod/w1: the Talos API of node 10.0.0.1 failed: transport error: connection refused; check that the node is up"
        );
        let none = first_help(&e.source.source, find);
        assert_eq!(with_help("what".into(), none), "what");
    }

    #[test]
    fn each_cause_is_said_once_in_order() {
        let e = Outer {
            source: Middle {
                source: Repeating {
                    source: std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connection refused",
                    ),
                },
            },
        };
        assert_eq!(
            causes(&e),
            [
                "reading TalosMachine prod/w1",
                "the Talos API of node 10.0.0.1 failed",
                "transport error: connection refused",
            ]
        );
        assert_eq!(
            chain(&e),
            "reading TalosMachine prod/w1: the Talos API of node 10.0.0.1 failed: transport error: connection refused"
        );
    }
}
