//! Exponential back-off with jitter: how long to wait before trying again
//! after failures in a row. One rule for the ichor-cni Job and for every
//! failed reconcile, so many objects failing together (an API server that
//! went away, a Talos release that refuses them all) neither retry in step
//! nor keep hammering at a fixed pace.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The wait after the `failures`-th failure in a row: `first`, doubled with
/// each failure after, at most `max`, each times a factor in [0.8, 1.2)
/// drawn from `seed` (the object) and the count. Pure: the same inputs
/// give the same wait; zero failures, no wait.
pub fn wait(failures: u32, first: Duration, max: Duration, seed: &str) -> Duration {
    use std::hash::{Hash as _, Hasher as _};
    if failures == 0 {
        return Duration::ZERO;
    }
    let doubled = first.saturating_mul(1u32 << (failures - 1).min(16));
    let base = doubled.min(max);
    let mut hasher = std::hash::DefaultHasher::new();
    (seed, failures).hash(&mut hasher);
    let factor = 0.8 + (hasher.finish() % 4000) as f64 / 10_000.0;
    base.mul_f64(factor)
}

/// How many objects' counts are kept before they are forgotten together:
/// an object deleted while failing never reconciles again to reset its
/// count, so the map is bounded rather than trusted to empty itself.
const MAX_TRACKED: usize = 10_000;

/// Failed reconciles in a row, per object (kind, namespace, name); a
/// success forgets the object.
#[derive(Debug, Default)]
pub struct FailureCounts(Mutex<HashMap<(String, String, String), u32>>);

impl FailureCounts {
    /// Counts one more failure of the object; the count, now.
    pub fn failed(&self, kind: &str, namespace: &str, name: &str) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = (kind.to_owned(), namespace.to_owned(), name.to_owned());
        if map.len() >= MAX_TRACKED && !map.contains_key(&key) {
            map.clear();
        }
        let count = map.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    /// The object's reconcile succeeded: its next failure waits `first` again.
    pub fn succeeded(&self, kind: &str, namespace: &str, name: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.is_empty() {
            map.remove(&(kind.to_owned(), namespace.to_owned(), name.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_secs(15);
    const MAX: Duration = Duration::from_secs(600);

    /// Covers: R18.5 (the wait doubles from its first value up to its
    /// ceiling, ±20%, the same for the same object and count, and objects
    /// failing together are spread)
    #[test]
    fn the_wait_doubles_up_to_its_ceiling_with_jitter() {
        assert_eq!(wait(0, FIRST, MAX, "c"), Duration::ZERO);
        let base = |n: u32| FIRST.saturating_mul(1u32 << (n - 1).min(16)).min(MAX);
        for n in 1..40 {
            let w = wait(n, FIRST, MAX, "ns/prod");
            assert!(
                w >= base(n).mul_f64(0.8) && w < base(n).mul_f64(1.2),
                "{n}: {w:?}"
            );
            assert_eq!(w, wait(n, FIRST, MAX, "ns/prod"));
        }
        let spread: std::collections::BTreeSet<_> = (0..20)
            .map(|i| wait(3, FIRST, MAX, &format!("ns/c{i}")))
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
    }

    /// Covers: R18.5 (a success resets an object's count; others keep theirs;
    /// the map never grows past its bound)
    #[test]
    fn a_success_resets_the_count_of_that_object_alone() {
        let counts = FailureCounts::default();
        assert_eq!(counts.failed("TalosMachine", "a", "m1"), 1);
        assert_eq!(counts.failed("TalosMachine", "a", "m1"), 2);
        assert_eq!(counts.failed("TalosMachine", "a", "m2"), 1);
        assert_eq!(counts.failed("TalosCluster", "a", "m1"), 1, "kinds apart");
        counts.succeeded("TalosMachine", "a", "m1");
        assert_eq!(counts.failed("TalosMachine", "a", "m1"), 1);
        assert_eq!(counts.failed("TalosMachine", "a", "m2"), 2);
        for i in 0..(MAX_TRACKED + 5) {
            counts.failed("TalosMachine", "b", &i.to_string());
        }
        assert!(counts.0.lock().unwrap().len() <= MAX_TRACKED);
    }
}
