//! When scheduled backups run: a 5-field cron expression read in an IANA
//! time zone (UTC when none is given).
//!
//! Across daylight-saving changes the rules are Vixie cron's, as croner
//! implements them: on a spring-forward day a fixed-time job whose time does
//! not exist runs once, at the first minute after the gap (a daily 02:30 in
//! Europe/Berlin runs at 03:00 CEST on the last Sunday of March); on a
//! fall-back day a fixed-time job whose time happens twice runs once, at the
//! first (a daily 02:30 runs at 02:30 CEST, not again at 02:30 CET). A job
//! with a wildcard or step in its minute or hour runs by the wall clock: no
//! run inside the gap, and a run in each pass of the repeated hour.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// A validated schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: Tz,
}

/// Why a schedule is refused; the field named is relative to the backup's
/// spec (`spec.backup.schedule.cron` in a TalosCluster).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "schedule.cron {given:?}: has {fields} fields; a cron expression has 5 (minute hour day-of-month month day-of-week)"
    )]
    FieldCount { given: String, fields: usize },
    #[error("schedule.cron {given:?}: not a cron expression")]
    Cron {
        given: String,
        #[source]
        source: croner::errors::CronError,
    },
    #[error("schedule.timeZone {given:?}: not an IANA time zone such as UTC or Europe/Berlin")]
    TimeZone { given: String },
}

impl ScheduleError {
    /// The field the error is about: `schedule.cron` or `schedule.timeZone`.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::FieldCount { .. } | ScheduleError::Cron { .. } => "schedule.cron",
            ScheduleError::TimeZone { .. } => "schedule.timeZone",
        }
    }
}

impl Schedule {
    /// Parses a 5-field cron expression and an optional IANA time zone.
    pub fn parse(cron: &str, time_zone: Option<&str>) -> Result<Self, ScheduleError> {
        let fields = cron.split_whitespace().count();
        if fields != 5 {
            return Err(ScheduleError::FieldCount {
                given: cron.to_string(),
                fields,
            });
        }
        let parsed = Cron::from_str(cron).map_err(|source| ScheduleError::Cron {
            given: cron.to_string(),
            source,
        })?;
        let zone = match time_zone.map(str::trim) {
            None | Some("") => Tz::UTC,
            Some(z) => z.parse::<Tz>().map_err(|_| ScheduleError::TimeZone {
                given: z.to_string(),
            })?,
        };
        Ok(Schedule { cron: parsed, zone })
    }

    pub fn time_zone(&self) -> Tz {
        self.zone
    }

    /// The first run strictly after `t`; `None` when the expression never
    /// matches again (for example 30 February).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone};
    use proptest::prelude::*;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    /// The runs in `[from, to)`.
    fn runs(s: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut out = vec![];
        let mut t = from - TimeDelta::seconds(1);
        while let Some(n) = s.next_after(t) {
            if n >= to {
                break;
            }
            out.push(n);
            t = n;
        }
        out
    }

    /// Covers: R20.6
    #[test]
    fn a_daily_0230_job_across_dst_in_berlin() {
        let s = Schedule::parse("30 2 * * *", Some("Europe/Berlin")).unwrap();
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        // The job runs once, at 03:00 CEST = 01:00 UTC.
        assert_eq!(
            runs(&s, utc(2026, 3, 28, 0, 0), utc(2026, 3, 31, 0, 0)),
            [
                utc(2026, 3, 28, 1, 30), // 02:30 CET
                utc(2026, 3, 29, 1, 0),  // 03:00 CEST, right after the gap
                utc(2026, 3, 30, 0, 30), // 02:30 CEST
            ]
        );
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens
        // twice. The job runs once, at the first (CEST).
        assert_eq!(
            runs(&s, utc(2026, 10, 24, 0, 0), utc(2026, 10, 27, 0, 0)),
            [
                utc(2026, 10, 24, 0, 30), // 02:30 CEST
                utc(2026, 10, 25, 0, 30), // 02:30 CEST, not again at 01:30 UTC
                utc(2026, 10, 26, 1, 30), // 02:30 CET
            ]
        );
    }

    /// Covers: R20.6
    #[test]
    fn a_daily_0230_job_across_dst_in_new_york() {
        let s = Schedule::parse("30 2 * * *", Some("America/New_York")).unwrap();
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT; the job runs at 03:00 EDT.
        assert_eq!(
            runs(&s, utc(2026, 3, 7, 0, 0), utc(2026, 3, 10, 0, 0)),
            [
                utc(2026, 3, 7, 7, 30), // 02:30 EST
                utc(2026, 3, 8, 7, 0),  // 03:00 EDT, right after the gap
                utc(2026, 3, 9, 6, 30), // 02:30 EDT
            ]
        );
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST; the repeated hour
        // is 01:00-01:59, so 02:30 happens once (EST) and the job runs once.
        assert_eq!(
            runs(&s, utc(2026, 10, 31, 0, 0), utc(2026, 11, 3, 0, 0)),
            [
                utc(2026, 10, 31, 6, 30), // 02:30 EDT
                utc(2026, 11, 1, 7, 30),  // 02:30 EST
                utc(2026, 11, 2, 7, 30),  // 02:30 EST
            ]
        );
    }

    /// Covers: R20.6
    #[test]
    fn a_job_in_the_repeated_hour_runs_once_and_a_step_job_runs_in_both_passes() {
        // New York repeats 01:00–01:59 on 2026-11-01.
        let daily = Schedule::parse("30 1 * * *", Some("America/New_York")).unwrap();
        assert_eq!(
            runs(&daily, utc(2026, 11, 1, 0, 0), utc(2026, 11, 2, 0, 0)),
            [utc(2026, 11, 1, 5, 30)] // 01:30 EDT only
        );
        let every_20 = Schedule::parse("*/20 1 * * *", Some("America/New_York")).unwrap();
        assert_eq!(
            runs(&every_20, utc(2026, 11, 1, 0, 0), utc(2026, 11, 2, 0, 0)).len(),
            6,
            "01:00, 01:20, 01:40 in EDT and again in EST"
        );
    }

    /// Covers: R20.6
    #[test]
    fn every_five_minutes_keeps_real_five_minute_steps_across_dst() {
        let s = Schedule::parse("*/5 * * * *", Some("Europe/Berlin")).unwrap();
        for (from, to) in [
            (utc(2026, 3, 28, 23, 0), utc(2026, 3, 29, 3, 0)),
            (utc(2026, 10, 24, 23, 0), utc(2026, 10, 25, 3, 0)),
        ] {
            let r = runs(&s, from, to);
            assert_eq!(r.len(), 48, "4 real hours of 5-minute runs");
            assert!(r.windows(2).all(|w| w[1] - w[0] == TimeDelta::minutes(5)));
        }
        let s = Schedule::parse("*/5 * * * *", None).unwrap();
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 0)),
            Some(utc(2026, 1, 1, 0, 5))
        );
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 3)),
            Some(utc(2026, 1, 1, 0, 5))
        );
    }

    /// Covers: R20.6
    #[test]
    fn invalid_inputs_name_the_field() {
        for (cron, zone, field, msg) in [
            (
                "* * * *",
                None,
                "schedule.cron",
                "schedule.cron \"* * * *\": has 4 fields; a cron expression has 5 (minute hour day-of-month month day-of-week)",
            ),
            ("0 * * * * *", None, "schedule.cron", "has 6 fields"),
            ("@daily", None, "schedule.cron", "has 1 fields"),
            ("61 * * * *", None, "schedule.cron", "not a cron expression"),
            (
                "0 0 * * mon-",
                None,
                "schedule.cron",
                "not a cron expression",
            ),
            (
                "0 2 * * *",
                Some("Europe/Berlinn"),
                "schedule.timeZone",
                "schedule.timeZone \"Europe/Berlinn\": not an IANA time zone such as UTC or Europe/Berlin",
            ),
            (
                "0 2 * * *",
                Some("+02:00"),
                "schedule.timeZone",
                "not an IANA",
            ),
        ] {
            let e = Schedule::parse(cron, zone).unwrap_err();
            assert_eq!(e.field(), field, "{cron} {zone:?}");
            assert!(e.to_string().contains(msg), "{e}");
        }
        assert_eq!(
            Schedule::parse("0 2 * * *", None).unwrap().time_zone(),
            Tz::UTC
        );
        assert_eq!(
            Schedule::parse("0 2 * * *", Some("")).unwrap().time_zone(),
            Tz::UTC
        );
    }

    proptest! {
        /// Covers: R20.6
        #[test]
        fn the_next_run_is_after_and_matches(
            minute in 0u32..60, hour in 0u32..24,
            zone in prop::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]),
            secs in 1_700_000_000i64..2_000_000_000,
        ) {
            let s = Schedule::parse(&format!("{minute} {hour} * * *"), Some(zone)).unwrap();
            let t = Utc.timestamp_opt(secs, 0).unwrap();
            let n = s.next_after(t).unwrap();
            prop_assert!(n > t);
            // a daily job runs at most a day (plus a DST shift) later
            prop_assert!(n - t <= TimeDelta::hours(26));
            let local = n.with_timezone(&s.time_zone());
            use chrono::Timelike;
            // at its time, or (in a gap) right after the gap on that day
            prop_assert!(
                (local.hour(), local.minute()) == (hour, minute)
                    || (local.hour(), local.minute()) > (hour, minute) && local.minute().is_multiple_of(30),
                "{} in {} for {:02}:{:02}", local, zone, hour, minute
            );
        }
    }
}
