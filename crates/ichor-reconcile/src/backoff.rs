//! Exponential back-off with jitter: how long to wait before trying again
//! after failures in a row. One rule for the ichor-cni Job and for every
//! failed reconcile, so many objects failing together (an API server that
//! went away, a Talos release that refuses them all) neither retry in step
//! nor keep hammering at a fixed pace.

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
}
