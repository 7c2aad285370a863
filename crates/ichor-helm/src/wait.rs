//! The one bounded, reporting wait. Every wait says what it waits for (its
//! "why"), has a bound, and reports what is still pending: at once, then
//! every `report_interval`, to tracing at INFO and to a progress callback.
//! It lives here, below `ichor-cilium` and the CLI, so that every crate that
//! waits on the cluster can use it.

use std::future::Future;
use std::time::Duration;

/// Receives, while waiting, what is still pending, one line each.
pub type Progress<'a> = dyn Fn(&[String]) + Send + Sync + 'a;

/// A [`Progress`] that can be kept (in options, behind an `Arc`).
pub type ProgressFn = Progress<'static>;

/// How one wait runs.
#[derive(Clone, Copy)]
pub struct Wait<'a> {
    /// What is waited for, as a phrase: "the rollout of Helm release cilium".
    pub why: &'a str,
    /// Give up after this long.
    pub timeout: Duration,
    /// Look again this often.
    pub poll_interval: Duration,
    /// Report what is pending at once, then this often.
    pub report_interval: Duration,
    /// Receives the reports (they also go to tracing at INFO).
    pub on_progress: Option<&'a Progress<'a>>,
}

/// Why a wait ended without success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError<E> {
    /// Looking failed; the wait stops at once.
    Check(E),
    /// The bound passed; what was still pending at the last look.
    TimedOut { pending: Vec<String> },
}

/// Calls `pending` until it returns nothing left to wait for, or
/// `wait.timeout` passes. `pending` returns one line per thing not there yet.
pub async fn wait_until<F, Fut, E>(wait: &Wait<'_>, mut pending: F) -> Result<(), WaitError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<String>, E>>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + wait.timeout;
    let mut next_report = start;
    loop {
        let left = pending().await.map_err(WaitError::Check)?;
        if left.is_empty() {
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if now >= next_report {
            tracing::info!("waiting for {}: {}", wait.why, left.join("; "));
            if let Some(report) = wait.on_progress {
                report(&left);
            }
            next_report = now + wait.report_interval;
        }
        if now >= deadline {
            return Err(WaitError::TimedOut { pending: left });
        }
        tokio::time::sleep(wait.poll_interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn wait<'a>(timeout: Duration, on_progress: Option<&'a Progress<'a>>) -> Wait<'a> {
        Wait {
            why: "the test",
            timeout,
            poll_interval: Duration::from_millis(1),
            report_interval: Duration::from_secs(3600),
            on_progress,
        }
    }

    #[tokio::test]
    async fn reports_at_once_and_ends_when_nothing_is_pending() {
        let reports = Mutex::new(Vec::new());
        let report = |left: &[String]| reports.lock().unwrap().push(left.join(","));
        let mut calls = 0;
        let r: Result<(), WaitError<()>> =
            wait_until(&wait(Duration::from_secs(3600), Some(&report)), || {
                calls += 1;
                let n = calls;
                async move {
                    Ok(if n < 3 {
                        vec![format!("call {n}")]
                    } else {
                        vec![]
                    })
                }
            })
            .await;
        assert_eq!(r, Ok(()));
        assert_eq!(calls, 3);
        assert_eq!(*reports.lock().unwrap(), vec!["call 1"]);
    }

    #[tokio::test]
    async fn gives_up_at_the_bound_with_what_is_pending() {
        let r: Result<(), WaitError<()>> = wait_until(&wait(Duration::ZERO, None), || async {
            Ok(vec!["never".to_string()])
        })
        .await;
        assert_eq!(
            r,
            Err(WaitError::TimedOut {
                pending: vec!["never".into()]
            })
        );
        let r: Result<(), WaitError<&str>> =
            wait_until(&wait(Duration::ZERO, None), || async { Err("cannot look") }).await;
        assert_eq!(r, Err(WaitError::Check("cannot look")));
    }
}
