//! Rate limits of sign-in: each attempt costs the API server a TokenReview,
//! so attempts draw from a token bucket per client address and from one
//! bucket for everyone. A refused attempt is answered 429 with the wait.
//!
//! The client address is the TCP peer: behind a proxy every user shares the
//! proxy's bucket. `X-Forwarded-For` is not read: any client can write it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A bucket's shape: `burst` attempts at once, then one every `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub burst: u32,
    pub every: Duration,
}

/// Sign-in attempts one client address may make: 10 at once, then one every 6 s.
pub const PER_CLIENT: Rate = Rate {
    burst: 10,
    every: Duration::from_secs(6),
};
/// Sign-in attempts of all clients together: 100 at once, then ten a second.
pub const GLOBAL: Rate = Rate {
    burst: 100,
    every: Duration::from_millis(100),
};
/// The most client addresses remembered; the one unseen longest goes first.
pub const MAX_CLIENTS: usize = 10_000;

/// One token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Attempts left, in units of `1 / every` so the refill is exact.
    left: Duration,
    updated: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket {
            left: rate.every * rate.burst,
            updated: now,
        }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let cap = rate.every * rate.burst;
        self.left = (self.left + now.saturating_duration_since(self.updated)).min(cap);
        self.updated = now;
    }

    /// The wait until one attempt is available (zero: available now).
    fn wait(&self, rate: Rate) -> Duration {
        rate.every.saturating_sub(self.left)
    }

    fn take(&mut self, rate: Rate) {
        self.left = self.left.saturating_sub(rate.every);
    }
}

/// The sign-in limiter: a bucket per client address and a global one.
#[derive(Debug)]
pub struct SignInLimiter {
    per_client: Rate,
    global_rate: Rate,
    max_clients: usize,
    clients: HashMap<Option<IpAddr>, Bucket>,
    global: Option<Bucket>,
}

impl Default for SignInLimiter {
    fn default() -> Self {
        SignInLimiter::new(PER_CLIENT, GLOBAL, MAX_CLIENTS)
    }
}

impl SignInLimiter {
    pub fn new(per_client: Rate, global: Rate, max_clients: usize) -> SignInLimiter {
        SignInLimiter {
            per_client,
            global_rate: global,
            max_clients: max_clients.max(1),
            clients: HashMap::new(),
            global: None,
        }
    }

    /// How many client buckets are kept.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Takes one attempt for `client` at `now`, or says how long to wait.
    /// A refused attempt takes nothing from either bucket.
    pub fn attempt(&mut self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        let (per, global_rate) = (self.per_client, self.global_rate);
        let mut global = self
            .global
            .unwrap_or_else(|| Bucket::full(global_rate, now));
        global.refill(global_rate, now);
        let mut mine = self
            .clients
            .get(&client)
            .copied()
            .unwrap_or_else(|| Bucket::full(per, now));
        mine.refill(per, now);
        let wait = mine.wait(per).max(global.wait(global_rate));
        if !wait.is_zero() {
            self.global = Some(global);
            return Err(wait);
        }
        mine.take(per);
        global.take(global_rate);
        self.global = Some(global);
        if !self.clients.contains_key(&client) && self.clients.len() >= self.max_clients {
            // A full bucket forgets nothing: drop those first, then the stalest.
            let cap = per.every * per.burst;
            self.clients
                .retain(|_, b| b.left + now.saturating_duration_since(b.updated) < cap);
            while self.clients.len() >= self.max_clients {
                let Some(stalest) = self
                    .clients
                    .iter()
                    .min_by_key(|(_, b)| b.updated)
                    .map(|(k, _)| *k)
                else {
                    break;
                };
                self.clients.remove(&stalest);
            }
        }
        self.clients.insert(client, mine);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    /// Covers: R18.3 (sign-in is rate-limited per client and globally; the N+1th attempt waits)
    #[test]
    fn the_attempt_after_the_burst_waits_for_the_refill() {
        let rate = Rate {
            burst: 3,
            every: Duration::from_secs(6),
        };
        let wide = Rate {
            burst: 1000,
            every: Duration::from_millis(1),
        };
        let t0 = Instant::now();
        let mut l = SignInLimiter::new(rate, wide, 100);
        for _ in 0..3 {
            assert_eq!(l.attempt(ip(1), t0), Ok(()));
        }
        assert_eq!(l.attempt(ip(1), t0), Err(Duration::from_secs(6)));
        assert_eq!(
            l.attempt(ip(1), t0 + Duration::from_secs(2)),
            Err(Duration::from_secs(4))
        );
        // Another client has its own bucket.
        assert_eq!(l.attempt(ip(2), t0), Ok(()));
        // The refill gives one attempt back every 6 s, never more than the burst.
        assert_eq!(l.attempt(ip(1), t0 + Duration::from_secs(6)), Ok(()));
        assert!(l.attempt(ip(1), t0 + Duration::from_secs(6)).is_err());
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(l.attempt(ip(1), later), Ok(()));
        }
        assert!(l.attempt(ip(1), later).is_err());

        // The global bucket holds for every client together.
        let mut l = SignInLimiter::new(wide, rate, 100);
        for i in 0..3 {
            assert_eq!(l.attempt(ip(i), t0), Ok(()));
        }
        assert_eq!(l.attempt(ip(200), t0), Err(Duration::from_secs(6)));
    }

    /// Covers: R18.3 (the per-client buckets are bounded)
    #[test]
    fn client_buckets_are_bounded() {
        let t0 = Instant::now();
        let mut l = SignInLimiter::new(
            PER_CLIENT,
            Rate {
                burst: 100_000,
                every: Duration::from_nanos(1),
            },
            50,
        );
        for i in 0..1_000u32 {
            let addr = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
            assert_eq!(
                l.attempt(Some(addr), t0 + Duration::from_millis(i.into())),
                Ok(())
            );
            assert!(l.clients() <= 50);
        }
        assert_eq!(l.clients(), 50);
    }
}
