//! Durations in an operation's status: per machine (every hop together)
//! and in all, written as Go and Kubernetes write durations (`83.412s`), so
//! `kubectl`, `jq` and a benchmark read them alike.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// `83.412s`: seconds with milliseconds.
pub fn words(d: Duration) -> String {
    format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
}

/// What [`words`] wrote, back; `None` for anything else.
pub fn parse(words: &str) -> Option<Duration> {
    let (secs, millis) = words.strip_suffix('s')?.split_once('.')?;
    if millis.len() != 3 {
        return None;
    }
    Some(Duration::from_secs(secs.parse().ok()?) + Duration::from_millis(millis.parse().ok()?))
}

/// From `start` to `end` (zero when the clock went back).
pub fn between(start: &Time, end: &Time) -> Duration {
    Duration::try_from(end.0.duration_since(start.0)).unwrap_or_default()
}

/// `so_far` (a duration in [`words`], or none) plus `start`..`end`.
pub fn add(so_far: Option<&str>, start: Option<&Time>, end: &Time) -> String {
    let before = so_far.and_then(parse).unwrap_or_default();
    let this = start.map(|s| between(s, end)).unwrap_or_default();
    words(before + this)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64, millis: i64) -> Time {
        Time(
            k8s_openapi::jiff::Timestamp::from_millisecond(secs * 1000 + millis)
                .expect("timestamp"),
        )
    }

    /// Per-machine durations add up over hops; the words read back.
    /// Covers: R15.9
    #[test]
    fn durations_add_up_and_read_back() {
        assert_eq!(words(Duration::from_millis(83_412)), "83.412s");
        assert_eq!(parse("83.412s"), Some(Duration::from_millis(83_412)));
        assert_eq!(parse("1m2s"), None);
        let first = add(None, Some(&at(100, 0)), &at(130, 250));
        assert_eq!(first, "30.250s");
        assert_eq!(
            add(Some(&first), Some(&at(200, 0)), &at(209, 750)),
            "40.000s"
        );
        assert_eq!(words(between(&at(10, 0), &at(5, 0))), "0.000s");
    }
}
