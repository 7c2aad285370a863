//! Which backups retention deletes: pure, over a list and a clock.
//!
//! Only this cluster's succeeded backups are ever deleted. One is deleted
//! when it is beyond the newest `keepLast` succeeded ones, or older than
//! `maxAge` — but the newest succeeded backup is never deleted for its age,
//! so a cluster whose schedule stopped still has its last good backup.
//! Running and failed backups are left alone.

use chrono::{DateTime, TimeDelta, Utc};

/// The retention policy; either or both limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    keep_last: Option<u32>,
    max_age: Option<TimeDelta>,
}

/// Why a policy is refused; the field named is relative to the backup's
/// spec's `retention`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("retention.keepLast: 0 would delete every backup; keep at least 1")]
    KeepNone,
    #[error("retention.maxAge {given:?}: not a positive duration such as 30d, 36h or 90m")]
    MaxAge { given: String },
}

impl Policy {
    pub fn new(keep_last: Option<u32>, max_age: Option<TimeDelta>) -> Result<Self, PolicyError> {
        if keep_last == Some(0) {
            return Err(PolicyError::KeepNone);
        }
        if let Some(a) = max_age
            && a <= TimeDelta::zero()
        {
            return Err(PolicyError::MaxAge {
                given: format_age(a),
            });
        }
        Ok(Policy { keep_last, max_age })
    }

    pub fn keep_last(&self) -> Option<u32> {
        self.keep_last
    }

    pub fn max_age(&self) -> Option<TimeDelta> {
        self.max_age
    }
}

/// Parses a `maxAge` as written in a spec, with the one duration parser
/// the maintenance windows use (`30d`, `36h`, `1d12h`).
pub fn parse_max_age(s: &str) -> Result<TimeDelta, PolicyError> {
    ichor_api::window::parse_duration(s)
        .ok()
        .and_then(|d| TimeDelta::from_std(d).ok())
        .ok_or_else(|| PolicyError::MaxAge {
            given: s.to_string(),
        })
}

fn format_age(a: TimeDelta) -> String {
    let s = a.num_seconds();
    let (d, h, m) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60);
    match (d, h, m) {
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, 0) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

/// A backup's state as Ichor records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Succeeded,
    Failed,
}

/// One backup retention looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    pub cluster: String,
    pub name: String,
    pub phase: Phase,
    /// When it finished; a succeeded backup without one is kept.
    pub finished: Option<DateTime<Utc>>,
}

/// A backup to delete, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub name: String,
    pub why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The `rank`th newest succeeded backup (1 is the newest), beyond `keep_last`.
    BeyondKeepLast { keep_last: u32, rank: usize },
    /// Finished `age` ago, more than `max_age`.
    OlderThanMaxAge { max_age: TimeDelta, age: TimeDelta },
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::BeyondKeepLast { keep_last, rank } => write!(
                f,
                "it is succeeded backup number {rank} from the newest, beyond keepLast {keep_last}"
            ),
            Why::OlderThanMaxAge { max_age, age } => write!(
                f,
                "it finished {} ago, more than maxAge {}",
                format_age(*age),
                format_age(*max_age)
            ),
        }
    }
}

/// The backups of `cluster` that `policy` deletes at `now`, newest first.
pub fn to_delete(
    cluster: &str,
    backups: &[Backup],
    policy: &Policy,
    now: DateTime<Utc>,
) -> Vec<Deletion> {
    let mut succeeded: Vec<(&Backup, DateTime<Utc>)> = backups
        .iter()
        .filter(|b| b.cluster == cluster && b.phase == Phase::Succeeded)
        .filter_map(|b| Some((b, b.finished?)))
        .collect();
    // Newest first; names break a tie, and they sort by start time.
    succeeded.sort_by(|(a, ta), (b, tb)| tb.cmp(ta).then(b.name.cmp(&a.name)));
    succeeded
        .iter()
        .enumerate()
        .filter_map(|(i, (b, finished))| {
            let rank = i + 1;
            let why = match (policy.keep_last, policy.max_age) {
                (Some(k), _) if rank > k as usize => Why::BeyondKeepLast { keep_last: k, rank },
                (_, Some(max)) if rank > 1 && now - *finished > max => Why::OlderThanMaxAge {
                    max_age: max,
                    age: now - *finished,
                },
                _ => return None,
            };
            Some(Deletion {
                name: b.name.clone(),
                why,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn at(h: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap() + TimeDelta::hours(h)
    }

    fn backup(cluster: &str, h: i64, phase: Phase) -> Backup {
        Backup {
            cluster: cluster.into(),
            name: format!("{cluster}-{h:05}"),
            phase,
            finished: (phase != Phase::Running).then(|| at(h) + TimeDelta::minutes(3)),
        }
    }

    /// Covers: R20.5
    #[test]
    fn max_age_parses_and_refuses() {
        assert_eq!(parse_max_age("30d"), Ok(TimeDelta::days(30)));
        assert_eq!(parse_max_age("1d12h"), Ok(TimeDelta::hours(36)));
        assert_eq!(parse_max_age("90m"), Ok(TimeDelta::minutes(90)));
        for bad in ["", "30", "d", "0h", "3w", "-1h", "1h 2"] {
            assert!(parse_max_age(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            parse_max_age("3w").unwrap_err().to_string(),
            "retention.maxAge \"3w\": not a positive duration such as 30d, 36h or 90m"
        );
        assert_eq!(Policy::new(Some(0), None), Err(PolicyError::KeepNone));
    }

    /// Covers: R20.5
    #[test]
    fn the_newest_succeeded_backup_outlives_max_age_and_others_are_untouched() {
        let backups = vec![
            backup("prod", 0, Phase::Succeeded),
            backup("prod", 1, Phase::Failed),
            backup("prod", 2, Phase::Succeeded),
            backup("prod", 3, Phase::Running),
            backup("prod-2", 0, Phase::Succeeded),
        ];
        let p = Policy::new(None, Some(TimeDelta::hours(1))).unwrap();
        let d = to_delete("prod", &backups, &p, at(1000));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, "prod-00000");
        assert_eq!(
            d[0].why.to_string(),
            "it finished 41d15h ago, more than maxAge 1h"
        );
        let p = Policy::new(Some(1), None).unwrap();
        let d = to_delete("prod", &backups, &p, at(3));
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].why.to_string(),
            "it is succeeded backup number 2 from the newest, beyond keepLast 1"
        );
        assert!(to_delete("prod", &backups, &Policy::default(), at(9999)).is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// An hourly schedule for 30 days, some runs failing, retention run
        /// after each: what remains is exactly what the policy keeps.
        ///
        /// Covers: R20.5
        #[test]
        fn hourly_for_30_days_leaves_exactly_the_policys_set(
            fails in prop::collection::vec(prop::bool::weighted(0.2), 720),
            keep_last in prop::option::of(1u32..60),
            max_age_h in prop::option::of(1i64..400),
            other_cluster_every in 1usize..50,
        ) {
            let policy = Policy::new(keep_last, max_age_h.map(TimeDelta::hours)).unwrap();
            let mut kept: Vec<Backup> = Vec::new();
            let mut deleted: BTreeSet<String> = BTreeSet::new();
            for (h, fail) in fails.iter().enumerate() {
                let phase = if *fail { Phase::Failed } else { Phase::Succeeded };
                kept.push(backup("prod", h as i64, phase));
                if h % other_cluster_every == 0 {
                    kept.push(backup("prod-2", h as i64, Phase::Succeeded));
                }
                let now = at(h as i64) + TimeDelta::minutes(10);
                let gone = to_delete("prod", &kept, &policy, now);
                for g in &gone {
                    prop_assert!(deleted.insert(g.name.clone()), "{} deleted twice", g.name);
                }
                kept.retain(|b| !gone.iter().any(|g| g.name == b.name));
            }
            let now = at(719) + TimeDelta::minutes(10);
            // Never: another cluster's, a failed one.
            let all: Vec<Backup> = (0..720).map(|h| backup("prod", h, if fails[h as usize] { Phase::Failed } else { Phase::Succeeded })).collect();
            for b in &all {
                if b.phase == Phase::Failed {
                    prop_assert!(!deleted.contains(&b.name));
                }
            }
            prop_assert!(deleted.iter().all(|n| n.starts_with("prod-0")));
            // The policy's set, stated directly: the newest keepLast
            // succeeded ones, of which those within maxAge, and the newest
            // whatever its age.
            let mut succeeded: Vec<&Backup> = all.iter().filter(|b| b.phase == Phase::Succeeded).collect();
            succeeded.reverse();
            let want: BTreeSet<&str> = succeeded
                .iter()
                .enumerate()
                .filter(|(i, _)| keep_last.is_none_or(|k| *i < k as usize))
                .filter(|(i, b)| *i == 0 || max_age_h.is_none_or(|m| now - b.finished.unwrap() <= TimeDelta::hours(m)))
                .map(|(_, b)| b.name.as_str())
                .collect();
            let have: BTreeSet<&str> = kept.iter().filter(|b| b.cluster == "prod" && b.phase == Phase::Succeeded).map(|b| b.name.as_str()).collect();
            prop_assert_eq!(have, want);
            // A second pass at the same time deletes nothing more.
            prop_assert!(to_delete("prod", &kept, &policy, now).is_empty());
        }
    }
}
