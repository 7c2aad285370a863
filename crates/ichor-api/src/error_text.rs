//! How an error reads where a person sees it: a message that says what
//! failed, then each cause that says why, once. Ichor's own errors never
//! repeat their source in their message (`source()` carries it); some
//! libraries' errors do, ending their message with their source's, and such
//! a cause is not said twice.
//!
//! The CLI prints [`causes`] one per line; status conditions, Events, logs
//! and the UI show [`chain`] on one line.

use std::error::Error;

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
