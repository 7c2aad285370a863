//! Bounded polling: a test waits for what another process or task does. The
//! bound only turns a hang into a failure (a loaded 2-core machine is slow;
//! nothing is timed), and the failure says what was awaited and what the
//! last look saw.
//!
//! ```no_run
//! # async fn t(client: kube::Client) {
//! use std::time::Duration;
//! use ichor_testenv::wait;
//!
//! let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::all(client);
//! wait::until("a pod to exist", Duration::from_secs(60), Duration::from_millis(200), || async {
//!     pods.list(&Default::default()).await.is_ok_and(|l| !l.items.is_empty())
//! })
//! .await
//! .unwrap();
//! # }
//! ```
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// What one look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen<T> {
    /// What was awaited, with its value.
    Done(T),
    /// Not yet; what was seen instead, when the look can say.
    NotYet(Option<String>),
}

impl<T> Seen<T> {
    /// Not yet, and what was seen instead.
    pub fn not_yet(seen: impl fmt::Display) -> Self {
        Seen::NotYet(Some(seen.to_string()))
    }
}

/// A look's answer that [`until`] understands: `bool` (done when true),
/// `Option<T>` (done when `Some`), `Result<T, E>` (done when `Ok`; the
/// error is what was seen) or [`Seen`] itself.
pub trait Look {
    type Value;
    fn seen(self) -> Seen<Self::Value>;
}

impl Look for bool {
    type Value = ();
    fn seen(self) -> Seen<()> {
        if self {
            Seen::Done(())
        } else {
            Seen::NotYet(None)
        }
    }
}

impl<T> Look for Option<T> {
    type Value = T;
    fn seen(self) -> Seen<T> {
        self.map_or(Seen::NotYet(None), Seen::Done)
    }
}

impl<T, E: std::error::Error + 'static> Look for Result<T, E> {
    type Value = T;
    fn seen(self) -> Seen<T> {
        match self {
            Ok(v) => Seen::Done(v),
            Err(e) => Seen::not_yet(crate::chain(&e)),
        }
    }
}

impl<T> Look for Seen<T> {
    type Value = T;
    fn seen(self) -> Seen<T> {
        self
    }
}

/// A wait that reached its bound.
#[derive(thiserror::Error, PartialEq, Eq)]
#[error("{what}: not within {timeout:?}; last seen: {}", .last.as_deref().unwrap_or("nothing to report"))]
pub struct WaitError {
    /// What was awaited.
    pub what: String,
    pub timeout: Duration,
    /// What the last look saw, when it could say.
    pub last: Option<String>,
}

/// The sentence, so that a test's `unwrap()` reads as one.
impl fmt::Debug for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Looks every `every` until `look` is done, and returns its value; after
/// `timeout` (the look at the bound included), says what was awaited and
/// what the last look saw.
pub async fn until<F, Fut>(
    what: impl Into<String>,
    timeout: Duration,
    every: Duration,
    mut look: F,
) -> Result<<Fut::Output as Look>::Value, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Look,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match look().await.seen() {
            Seen::Done(v) => return Ok(v),
            Seen::NotYet(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(WaitError {
                what: what.into(),
                timeout,
                last,
            });
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);
    const EVERY: Duration = Duration::from_millis(5);

    #[tokio::test]
    async fn a_wait_returns_the_value_of_the_look_that_is_done() {
        let mut looks = 0;
        let got = until("the third look", SHORT * 20, EVERY, || {
            looks += 1;
            let n = looks;
            async move { (n == 3).then_some(n) }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
    }

    #[tokio::test]
    async fn a_wait_at_its_bound_says_what_was_awaited_and_what_was_seen_last() {
        let mut looks = 0;
        let err = until("the answer", SHORT, EVERY, || {
            looks += 1;
            let n = looks;
            async move { Seen::<()>::not_yet(format!("look {n}")) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.what, "the answer");
        assert_eq!(err.last, Some(format!("look {looks}")));
        assert!(looks >= 2, "looked {looks} times");
        assert_eq!(
            err.to_string(),
            format!("the answer: not within 50ms; last seen: look {looks}")
        );
        assert_eq!(format!("{err:?}"), err.to_string());
    }

    #[tokio::test]
    async fn an_error_is_what_a_look_saw() {
        let err = until("a file", SHORT, EVERY, || async {
            std::fs::read("/nonexistent/ichor-testenv")
        })
        .await
        .unwrap_err();
        assert!(err.last.is_some_and(|l| !l.is_empty()));
    }

    #[tokio::test]
    async fn a_false_look_has_nothing_to_report() {
        let err = until("never", SHORT, EVERY, || async { false })
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "never: not within 50ms; last seen: nothing to report"
        );
    }
}
