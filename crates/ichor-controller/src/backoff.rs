//! The failed reconciles in a row of each object: the count the back-off
//! ([`wait`], pure, in `ichor-reconcile`) is drawn from.

use std::collections::HashMap;
use std::sync::Mutex;

pub use ichor_reconcile::backoff::wait;

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
