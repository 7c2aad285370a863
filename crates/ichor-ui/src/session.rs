//! Server-side sessions and the bounded caches of the API server's answers.
//!
//! The cookie carries a random 256-bit session id, never the Kubernetes
//! token: the token stays in this process's memory, with the user the
//! TokenReview named. A session ends when it is idle for [`IDLE_TIMEOUT`],
//! [`ABSOLUTE_TIMEOUT`] after sign-in, at sign-out (removed here, so a copy
//! of the cookie no longer works), when the API server stops accepting its
//! token, or when [`MAX_SESSIONS`] newer ones push it out.
//!
//! Every function takes `now`, so the expiry rules are tested without waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use crate::auth::User;

/// The session cookie's name over HTTPS: `__Host-` makes the browser keep it
/// only when it was set Secure, from this host, with `Path=/` and no Domain,
/// so no other host or plain-HTTP page can plant or overwrite it.
pub const COOKIE: &str = "__Host-ichor_session";
/// The cookie's name on the deprecated plain-HTTP port: browsers refuse a
/// `__Host-` cookie there, so it keeps the name it had before (still Secure,
/// as before: browsers keep it only where http counts as secure, localhost).
pub const PLAINTEXT_COOKIE: &str = "ichor_session";
/// A session unused this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A session ends this long after sign-in, however busy.
pub const ABSOLUTE_TIMEOUT: Duration = Duration::from_secs(8 * 60 * 60);
/// The most sessions kept; a new one beyond it pushes out the least recently used.
pub const MAX_SESSIONS: usize = 10_000;

/// The length of a session id in bytes (256 bits).
const ID_BYTES: usize = 32;

/// What can go wrong making a session id.
#[derive(Debug, thiserror::Error)]
#[error("the operating system's random number generator failed to make a session id")]
pub struct RandomError;

/// A session id as the cookie carries it: 64 hex digits of fresh randomness.
pub fn new_id() -> Result<String, RandomError> {
    let mut bytes = [0u8; ID_BYTES];
    // rustls' ring provider reads the operating system's CSPRNG (getrandom).
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| RandomError)?;
    Ok(hex::encode(bytes))
}

/// The map key of a session id: its SHA-256, so the map holds no cookie
/// value a memory dump could replay, and lookups compare digests.
pub type Key = [u8; 32];

/// The key of `id`; None when `id` is not the form [`new_id`] makes.
pub fn key_of(id: &str) -> Option<Key> {
    (id.len() == 2 * ID_BYTES && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| Sha256::digest(id.as_bytes()).into())
}

/// One signed-in user.
pub struct Session {
    /// The user's bearer token: the UI's writes are made with it.
    pub token: String,
    pub user: User,
    pub created: Instant,
    pub last_seen: Instant,
    /// When the API server last accepted the token (TokenReview).
    pub reviewed: Instant,
}

impl std::fmt::Debug for Session {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("user", &self.user.username)
            .field("created", &self.created)
            .field("last_seen", &self.last_seen)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Whether the session has ended by time at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_seen) >= IDLE_TIMEOUT
            || now.saturating_duration_since(self.created) >= ABSOLUTE_TIMEOUT
    }
}

/// The sessions of this process, at most `max`.
#[derive(Debug)]
pub struct Sessions {
    map: HashMap<Key, Session>,
    max: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_max(MAX_SESSIONS)
    }
}

impl Sessions {
    /// An empty store that keeps at most `max` sessions (at least one).
    pub fn with_max(max: usize) -> Sessions {
        Sessions {
            map: HashMap::new(),
            max: max.max(1),
        }
    }

    /// How many sessions are kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Starts a session for `user` with `token` under the fresh `id`; drops
    /// expired sessions, then the least recently used ones, to stay within the bound.
    pub fn insert(&mut self, id: &str, token: String, user: User, now: Instant) -> Option<Key> {
        let key = key_of(id)?;
        if self.map.len() >= self.max {
            self.map.retain(|_, s| !s.expired(now));
        }
        while self.map.len() >= self.max {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| *k)?;
            self.map.remove(&oldest);
        }
        self.map.insert(
            key,
            Session {
                token,
                user,
                created: now,
                last_seen: now,
                reviewed: now,
            },
        );
        Some(key)
    }

    /// The live session of `id`, marked as used at `now`; an expired one is
    /// removed and None.
    pub fn touch(&mut self, id: &str, now: Instant) -> Option<(Key, &mut Session)> {
        let key = key_of(id)?;
        if self.map.get(&key)?.expired(now) {
            self.map.remove(&key);
            return None;
        }
        let session = self.map.get_mut(&key)?;
        session.last_seen = now;
        Some((key, session))
    }

    /// The session of `key`, if it is still there.
    pub fn get_mut(&mut self, key: &Key) -> Option<&mut Session> {
        self.map.get_mut(key)
    }

    /// Ends the session of `key`.
    pub fn remove(&mut self, key: &Key) -> bool {
        self.map.remove(key).is_some()
    }

    /// Ends the session of the cookie value `id`.
    pub fn remove_id(&mut self, id: &str) -> bool {
        key_of(id).is_some_and(|k| self.remove(&k))
    }
}

/// Answers remembered for `ttl`, at most `max` of them: when full, expired
/// entries go first, then the oldest.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    map: HashMap<K, (Instant, V)>,
    ttl: Duration,
    max: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration, max: usize) -> TtlCache<K, V> {
        TtlCache {
            map: HashMap::new(),
            ttl,
            max: max.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The answer for `key` if it is younger than the TTL at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.map
            .get(key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, v)| v.clone())
    }

    pub fn insert(&mut self, key: K, value: V, now: Instant) {
        if !self.map.contains_key(&key) && self.map.len() >= self.max {
            let ttl = self.ttl;
            self.map
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            while self.map.len() >= self.max {
                let Some(oldest) = self
                    .map
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                self.map.remove(&oldest);
            }
        }
        self.map.insert(key, (now, value));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn user(name: &str) -> User {
        User {
            username: name.into(),
            uid: None,
            groups: vec![],
            extra: BTreeMap::new(),
        }
    }

    /// Covers: R18.3 (session ids are 256 random bits, never the token)
    #[test]
    fn session_ids_are_fresh_256_bit_values() {
        let a = new_id().unwrap();
        let b = new_id().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(key_of(&a).is_some());
        for bad in ["", "abc", &"z".repeat(64), &"a".repeat(63), &"a".repeat(65)] {
            assert!(key_of(bad).is_none(), "{bad:?}");
        }
    }

    /// Covers: R18.3 (idle expiry, absolute expiry, sign-out removes the session server-side)
    #[test]
    fn sessions_expire_when_idle_or_old_and_end_at_sign_out() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        let id = new_id().unwrap();
        s.insert(&id, "tok".into(), user("alice"), t0).unwrap();
        // Used within the idle limit, again and again, it lives on…
        let mut now = t0;
        while now < t0 + ABSOLUTE_TIMEOUT - IDLE_TIMEOUT {
            now += IDLE_TIMEOUT - Duration::from_secs(1);
            assert!(s.touch(&id, now).is_some(), "alive at {:?}", now - t0);
        }
        // …but not beyond the absolute limit.
        assert!(s.touch(&id, t0 + ABSOLUTE_TIMEOUT).is_none());
        assert!(s.is_empty(), "an expired session is dropped");

        // Idle too long.
        let id = new_id().unwrap();
        s.insert(&id, "tok".into(), user("bob"), t0).unwrap();
        assert!(s.touch(&id, t0 + IDLE_TIMEOUT).is_none());

        // Sign-out: the same cookie value no longer finds a session.
        let id = new_id().unwrap();
        s.insert(&id, "tok".into(), user("carol"), t0).unwrap();
        assert!(s.remove_id(&id));
        assert!(s.touch(&id, t0).is_none());
        // An id nobody was given finds nothing.
        assert!(s.touch(&new_id().unwrap(), t0).is_none());
        // The Debug form never shows the token.
        let id = new_id().unwrap();
        s.insert(&id, "SECRET-TOKEN".into(), user("dave"), t0)
            .unwrap();
        let (_, session) = s.touch(&id, t0).unwrap();
        assert!(!format!("{session:?}").contains("SECRET-TOKEN"));
    }

    /// Covers: R18.3 (the session map is bounded: the least recently used go first)
    #[test]
    fn more_sessions_than_the_bound_push_out_the_least_recently_used() {
        let t0 = Instant::now();
        let mut s = Sessions::with_max(3);
        let ids: Vec<String> = (0..5).map(|_| new_id().unwrap()).collect();
        for (i, id) in ids.iter().enumerate() {
            s.insert(
                id,
                "tok".into(),
                user(&format!("u{i}")),
                t0 + Duration::from_secs(i as u64),
            )
            .unwrap();
            // The first stays in use, so it is not the one pushed out.
            s.touch(&ids[0], t0 + Duration::from_secs(i as u64));
            assert!(s.len() <= 3);
        }
        assert_eq!(s.len(), 3);
        let now = t0 + Duration::from_secs(5);
        assert!(s.touch(&ids[0], now).is_some());
        assert!(s.touch(&ids[1], now).is_none());
        assert!(s.touch(&ids[2], now).is_none());
        assert!(s.touch(&ids[3], now).is_some());
        assert!(s.touch(&ids[4], now).is_some());
    }

    /// Covers: R18.3 (the review caches are bounded and forget expired answers)
    #[test]
    fn the_answer_cache_is_bounded_and_answers_expire() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(Duration::from_secs(10), 100);
        for i in 0..1_000u32 {
            c.insert(i, true, t0 + Duration::from_millis(i.into()));
        }
        assert_eq!(c.len(), 100);
        assert_eq!(c.get(&999, t0 + Duration::from_secs(1)), Some(true));
        assert_eq!(
            c.get(&0, t0 + Duration::from_secs(1)),
            None,
            "the oldest went first"
        );
        assert_eq!(c.get(&999, t0 + Duration::from_secs(11)), None, "expired");
        // When full, expired entries make room before young ones are dropped.
        c.insert(5_000, false, t0 + Duration::from_secs(60));
        assert_eq!(c.len(), 1);
    }
}
