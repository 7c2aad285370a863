//! `BackupHealthy` of a TalosCluster with `spec.backup`: whether its newest
//! finished backup succeeded, and whether the newest succeeded one is
//! recent enough for its schedule. Pure: the controller reads the cluster's
//! TalosBackups and hands over the finished ones, the schedule's runs and
//! the clock.
//!
//! The rule (ADR 0018, "Watching backups"):
//! - no backup has finished: Unknown `WaitingForBackup`, until the
//!   schedule's second run after the cluster's creation is [`SLACK`] past,
//!   then False `BackupOverdue`;
//! - the newest finished backup failed: False `BackupFailed`, with its
//!   message;
//! - the newest finished backup succeeded: True `BackupSucceeded`, until
//!   the schedule's second run after it finished is [`SLACK`] past, then
//!   False `BackupOverdue`. One missed run is tolerated; two are not.
//!
//! Without a schedule (backups only before operations and on request)
//! nothing is ever overdue: the newest finished backup alone decides.
//! Pending and Running backups are not looked at, so the condition does
//! not flap while one runs.

use ichor_api::conditions::{self, Status, reasons, types};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How long past a due run a backup may take to be created (the schedule
/// looks every 15 s), taken and written before it counts as missed.
pub const SLACK: SignedDuration = SignedDuration::from_mins(30);

/// How a finished backup ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// Failed, with its status message (the failure's chain, no secret).
    Failed(String),
}

/// One finished TalosBackup of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub name: String,
    pub finished: Timestamp,
    pub outcome: Outcome,
}

/// The condition's content, and when to look again without any change of
/// the backups: the moment it turns overdue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
    pub recheck_at: Option<Timestamp>,
}

impl Health {
    /// The `BackupHealthy` condition.
    pub fn condition(&self, generation: Option<i64>, now: Time) -> Condition {
        conditions::new(
            types::BACKUP_HEALTHY,
            self.status,
            self.reason,
            self.message.clone(),
            generation,
            now,
        )
    }
}

/// The schedule's next run strictly after a time, if it has one.
pub type NextRun<'a> = &'a dyn Fn(Timestamp) -> Option<Timestamp>;

/// When the backups are overdue: [`SLACK`] after the schedule's second run
/// after `from` (the newest success, or the cluster's creation).
pub fn overdue_at(next_run: NextRun<'_>, from: Timestamp) -> Option<Timestamp> {
    let second = next_run(from).and_then(next_run)?;
    second.checked_add(SLACK).ok()
}

/// `BackupHealthy` from the cluster's finished backups, its schedule (none:
/// manual and operation backups only), its creation and `now`.
pub fn health(
    backups: &[Finished],
    next_run: Option<NextRun<'_>>,
    created: Timestamp,
    now: Timestamp,
) -> Health {
    let newest = backups.iter().max_by_key(|b| (b.finished, &b.name));
    let newest_ok = backups
        .iter()
        .filter(|b| b.outcome == Outcome::Succeeded)
        .max_by_key(|b| (b.finished, &b.name));
    let from = newest_ok.map_or(created, |b| b.finished);
    let overdue = next_run.and_then(|n| overdue_at(n, from));
    let late = overdue.filter(|at| now > *at);
    if let Some(b) = newest
        && let Outcome::Failed(why) = &b.outcome
    {
        return Health {
            status: Status::False,
            reason: reasons::BACKUP_FAILED,
            message: format!("the newest backup, {}, failed: {why}", b.name),
            recheck_at: None,
        };
    }
    match (newest, late) {
        (None, None) => Health {
            status: Status::Unknown,
            reason: reasons::WAITING_FOR_BACKUP,
            message: match overdue {
                Some(at) => format!("no backup has finished yet; one is expected by {at}"),
                None => "no backup has finished yet (no schedule: backups are taken before control-plane operations and on request)".to_owned(),
            },
            recheck_at: overdue,
        },
        (None, Some(at)) => Health {
            status: Status::False,
            reason: reasons::BACKUP_OVERDUE,
            message: format!(
                "no backup has succeeded since the cluster was created at {created}; two scheduled runs have passed (overdue since {at})"
            ),
            recheck_at: None,
        },
        (Some(_), Some(at)) => Health {
            status: Status::False,
            reason: reasons::BACKUP_OVERDUE,
            message: format!(
                "the newest succeeded backup, {}, finished at {from}; two scheduled runs have passed without one (overdue since {at})",
                newest_ok.map_or("", |b| b.name.as_str())
            ),
            recheck_at: None,
        },
        (Some(b), None) => Health {
            status: Status::True,
            reason: reasons::BACKUP_SUCCEEDED,
            message: match overdue {
                Some(at) => format!(
                    "backup {} succeeded at {}; the next is expected by {at}",
                    b.name, b.finished
                ),
                None => format!("backup {} succeeded at {}", b.name, b.finished),
            },
            recheck_at: overdue,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::civil::Weekday;
    use k8s_openapi::jiff::tz::TimeZone;

    /// 2026-12-02 (a Wednesday) at `h:m` UTC, plus `days`.
    fn at(days: i64, h: i64, m: i64) -> Timestamp {
        let wed = Timestamp::from_second(1_796_169_600).expect("2026-12-02");
        wed.checked_add(SignedDuration::from_hours(days * 24 + h) + SignedDuration::from_mins(m))
            .expect("in range")
    }

    fn ok(name: &str, finished: Timestamp) -> Finished {
        Finished {
            name: name.into(),
            finished,
            outcome: Outcome::Succeeded,
        }
    }

    fn failed(name: &str, finished: Timestamp, why: &str) -> Finished {
        Finished {
            name: name.into(),
            finished,
            outcome: Outcome::Failed(why.into()),
        }
    }

    /// Every hour on the hour.
    fn hourly(t: Timestamp) -> Option<Timestamp> {
        let s = t.as_second();
        Timestamp::from_second((s.div_euclid(3600) + 1) * 3600).ok()
    }

    /// 02:00 UTC Monday to Friday.
    fn weekdays(t: Timestamp) -> Option<Timestamp> {
        let mut day = (t.as_second().div_euclid(86_400)) * 86_400;
        loop {
            let run = Timestamp::from_second(day + 2 * 3600).ok()?;
            let weekday = run.to_zoned(TimeZone::UTC).weekday();
            if run > t && !matches!(weekday, Weekday::Saturday | Weekday::Sunday) {
                return Some(run);
            }
            day += 86_400;
        }
    }

    #[test]
    fn the_test_schedules_are_what_they_say() {
        assert_eq!(
            at(0, 0, 0).to_zoned(TimeZone::UTC).weekday(),
            Weekday::Wednesday
        );
        assert_eq!(hourly(at(0, 1, 0)), Some(at(0, 2, 0)));
        assert_eq!(hourly(at(0, 1, 59)), Some(at(0, 2, 0)));
        // Friday 02:05 → Monday 02:00.
        assert_eq!(weekdays(at(2, 2, 5)), Some(at(5, 2, 0)));
    }

    /// Covers: R20.8
    #[test]
    fn before_the_first_backup_it_waits_and_goes_overdue_after_two_runs() {
        let created = at(0, 0, 10);
        let h = health(&[], Some(&hourly), created, at(0, 2, 30));
        assert_eq!(
            (h.status, h.reason),
            (Status::Unknown, reasons::WAITING_FOR_BACKUP)
        );
        // Runs at 01:00 and 02:00, slack 30 min.
        assert_eq!(h.recheck_at, Some(at(0, 2, 30)));
        let h = health(&[], Some(&hourly), created, at(0, 2, 31));
        assert_eq!(
            (h.status, h.reason),
            (Status::False, reasons::BACKUP_OVERDUE)
        );
        assert!(
            h.message
                .contains("no backup has succeeded since the cluster was created"),
            "{}",
            h.message
        );
        // Without a schedule it waits for ever.
        let h = health(&[], None, created, at(400, 0, 0));
        assert_eq!(
            (h.status, h.reason),
            (Status::Unknown, reasons::WAITING_FOR_BACKUP)
        );
        assert_eq!(h.recheck_at, None);
    }

    /// Covers: R20.8
    #[test]
    fn a_success_is_healthy_until_two_runs_and_the_slack_have_passed() {
        let backups = [ok("c-20261202010000", at(0, 1, 2))];
        // Runs at 02:00 and 03:00 after it: overdue after 03:30, not at it.
        let h = health(&backups, Some(&hourly), at(0, 0, 0), at(0, 3, 30));
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        assert_eq!(h.recheck_at, Some(at(0, 3, 30)));
        assert!(h.message.contains("c-20261202010000"), "{}", h.message);
        let h = health(&backups, Some(&hourly), at(0, 0, 0), at(0, 3, 31));
        assert_eq!(
            (h.status, h.reason),
            (Status::False, reasons::BACKUP_OVERDUE)
        );
        assert!(h.message.contains("c-20261202010000"), "{}", h.message);
        assert_eq!(h.recheck_at, None);
    }

    /// Covers: R20.8
    #[test]
    fn the_newest_finished_backup_decides_between_failed_and_succeeded() {
        let backups = [
            ok("c-20261202010000", at(0, 1, 2)),
            failed(
                "c-20261202020000",
                at(0, 2, 1),
                "no control plane of TalosCluster c has a healthy etcd member",
            ),
        ];
        let h = health(&backups, Some(&hourly), at(0, 0, 0), at(0, 2, 5));
        assert_eq!(
            (h.status, h.reason),
            (Status::False, reasons::BACKUP_FAILED)
        );
        assert_eq!(
            h.message,
            "the newest backup, c-20261202020000, failed: no control plane of TalosCluster c has a healthy etcd member"
        );
        // A failure stays the reason even once the success is overdue.
        let h = health(&backups, Some(&hourly), at(0, 0, 0), at(1, 0, 0));
        assert_eq!(h.reason, reasons::BACKUP_FAILED);
        // A later success heals it.
        let mut more = backups.to_vec();
        more.push(ok("c-20261202030000", at(0, 3, 2)));
        let h = health(&more, Some(&hourly), at(0, 0, 0), at(0, 3, 5));
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        assert!(h.message.contains("c-20261202030000"), "{}", h.message);
        // Order of the input does not matter.
        more.reverse();
        assert_eq!(health(&more, Some(&hourly), at(0, 0, 0), at(0, 3, 5)), h);
    }

    /// Covers: R20.8
    #[test]
    fn without_a_schedule_only_the_newest_backup_counts() {
        let old = [ok("c-manual", at(0, 1, 0))];
        let h = health(&old, None, at(0, 0, 0), at(365, 0, 0));
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        assert_eq!(h.recheck_at, None);
        assert_eq!(
            h.message,
            format!("backup c-manual succeeded at {}", at(0, 1, 0))
        );
        let h = health(
            &[ok("a", at(0, 1, 0)), failed("b", at(0, 2, 0), "cut")],
            None,
            at(0, 0, 0),
            at(0, 3, 0),
        );
        assert_eq!(
            (h.status, h.reason),
            (Status::False, reasons::BACKUP_FAILED)
        );
    }

    /// Covers: R20.8
    #[test]
    fn an_irregular_schedule_is_judged_by_its_own_runs_not_a_fixed_period() {
        // Friday's 02:00 backup: Saturday and Sunday have no run, so on
        // Monday evening it is still healthy (a fixed two days would not be).
        let friday = [ok("c-20261204020000", at(2, 2, 4))];
        let h = health(&friday, Some(&weekdays), at(0, 0, 0), at(5, 20, 0));
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        // Runs Monday and Tuesday 02:00 missed: overdue from Tuesday 02:30.
        assert_eq!(h.recheck_at, Some(at(6, 2, 30)));
        let h = health(&friday, Some(&weekdays), at(0, 0, 0), at(6, 2, 31));
        assert_eq!(h.reason, reasons::BACKUP_OVERDUE);
    }

    /// Covers: R20.8
    #[test]
    fn ties_and_a_schedule_without_runs_are_decided() {
        // Two finished at the same second: the later name (names sort by time).
        let same = [failed("c-a", at(0, 1, 0), "x"), ok("c-b", at(0, 1, 0))];
        assert_eq!(
            health(&same, None, at(0, 0, 0), at(0, 2, 0)).status,
            Status::True
        );
        // A schedule that never runs again never makes anything overdue.
        let never = |_: Timestamp| None;
        let h = health(&[], Some(&never), at(0, 0, 0), at(900, 0, 0));
        assert_eq!((h.status, h.recheck_at), (Status::Unknown, None));
        // The condition carries the health as it is.
        let c = health(&same, None, at(0, 0, 0), at(0, 2, 0)).condition(Some(3), Time(at(0, 2, 0)));
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (types::BACKUP_HEALTHY, "True", reasons::BACKUP_SUCCEEDED)
        );
        assert_eq!(c.observed_generation, Some(3));
    }
}
