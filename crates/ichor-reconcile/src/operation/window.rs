//! Maintenance windows, decided purely: whether a window is open now, when
//! the next one opens, and which machines of a batch may start. The I/O
//! code reads the windows (the operation's, else its cluster's) and the
//! clock, and carries out what [`gate_starts`] says.
//!
//! A window is open at `t` when some start `s` of its cron expression, not
//! on a blackout date (the start's local date in the window's zone), has
//! `s <= t < s + duration`. The duration is elapsed time. Starts across
//! daylight-saving changes follow Vixie cron's rules as croner implements
//! them (a fixed-time start inside the spring-forward gap opens at the
//! first minute after it; in the repeated fall-back hour it opens once, at
//! the first pass). ichor-backup's `schedule` reads cron in a zone the
//! same way; this crate may not depend on it (it carries I/O).

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeDelta, TimeZone as _, Utc};
use chrono_tz::Tz;
use croner::Cron;
use ichor_api::operation::{ComponentPhase, MachineStep, TalosOperationStatus};
use ichor_api::window::{MaintenanceWindow, parse_duration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The field of the windows of the object at hand (an operation's own, or
/// a cluster's in the webhook).
pub const SPEC_FIELD: &str = "spec.maintenanceWindows";
/// The field of the cluster's windows, as an operation's message names it.
pub const CLUSTER_FIELD: &str = "TalosCluster spec.maintenanceWindows";

/// How many starts are looked at for one answer: a bound, so a window that
/// starts every minute and lasts a week still answers quickly.
const MAX_STARTS: usize = 20_000;

/// A window read and checked.
#[derive(Debug, Clone)]
pub struct ParsedWindow {
    cron: Cron,
    zone: Tz,
    duration: TimeDelta,
    blackout: BTreeSet<NaiveDate>,
}

/// Why a window is refused; `field` is the window's own path
/// (`spec.maintenanceWindows[0]`).
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error(
        "{field}.cron {given:?}: has {fields} fields; a cron expression has 5 (minute hour day-of-month month day-of-week)"
    )]
    FieldCount {
        field: String,
        given: String,
        fields: usize,
    },
    #[error("{field}.cron {given:?}: not a cron expression")]
    Cron {
        field: String,
        given: String,
        #[source]
        source: croner::errors::CronError,
    },
    #[error("{field}.timeZone {given:?}: not an IANA time zone such as UTC or Europe/Berlin")]
    TimeZone { field: String, given: String },
    #[error(
        "{field}.duration {given:?}: not a duration such as 2h, 90m or 1h30m (units d, h, m, s)"
    )]
    Duration { field: String, given: String },
    #[error("{field}.blackoutDates[{index}] {given:?}: not a date written YYYY-MM-DD")]
    BlackoutDate {
        field: String,
        index: usize,
        given: String,
    },
}

impl ParsedWindow {
    /// Reads one window; `field` names it in errors.
    pub fn parse(w: &MaintenanceWindow, field: &str) -> Result<Self, WindowError> {
        let fields = w.cron.split_whitespace().count();
        if fields != 5 {
            return Err(WindowError::FieldCount {
                field: field.to_string(),
                given: w.cron.clone(),
                fields,
            });
        }
        let cron = Cron::from_str(&w.cron).map_err(|source| WindowError::Cron {
            field: field.to_string(),
            given: w.cron.clone(),
            source,
        })?;
        let zone = match w.time_zone.as_deref().map(str::trim) {
            None | Some("") => Tz::UTC,
            Some(z) => z.parse::<Tz>().map_err(|_| WindowError::TimeZone {
                field: field.to_string(),
                given: z.to_string(),
            })?,
        };
        let duration = parse_duration(&w.duration)
            .ok()
            .and_then(|d| TimeDelta::from_std(d).ok())
            .ok_or_else(|| WindowError::Duration {
                field: field.to_string(),
                given: w.duration.clone(),
            })?;
        let mut blackout = BTreeSet::new();
        for (index, d) in w.blackout_dates.iter().enumerate() {
            let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").map_err(|_| {
                WindowError::BlackoutDate {
                    field: field.to_string(),
                    index,
                    given: d.clone(),
                }
            })?;
            blackout.insert(date);
        }
        Ok(ParsedWindow {
            cron,
            zone,
            duration,
            blackout,
        })
    }

    /// The first start strictly after `t` that is not on a blackout date.
    fn next_start(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut from = t;
        for _ in 0..MAX_STARTS {
            let local = from.with_timezone(&self.zone);
            let s = self.cron.find_next_occurrence(&local, false).ok()?;
            let date = s.date_naive();
            if !self.blackout.contains(&date) {
                return Some(s.with_timezone(&Utc));
            }
            // Nothing starts on this local date: go on from its end.
            from = self.day_end(date).unwrap_or(s.with_timezone(&Utc));
        }
        None
    }

    /// The last second of local `date` (its next day's first instant,
    /// minus one second), in UTC.
    fn day_end(&self, date: NaiveDate) -> Option<DateTime<Utc>> {
        let next = date.succ_opt()?.and_hms_opt(0, 0, 0)?;
        let start = self.zone.from_local_datetime(&next).earliest()?;
        Some(start.with_timezone(&Utc) - TimeDelta::seconds(1))
    }

    /// When the window that is open at `t` closes; `None` when it is shut.
    fn open_until(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut closes = None;
        let mut from = t - self.duration;
        for _ in 0..MAX_STARTS {
            let Some(s) = self.next_start(from) else {
                break;
            };
            if s > t {
                break;
            }
            closes = Some(s + self.duration);
            from = s;
        }
        closes
    }
}

/// Reads every window of a list, `field` being the list's path.
pub fn parse_windows(
    windows: &[MaintenanceWindow],
    field: &str,
) -> Result<Vec<ParsedWindow>, WindowError> {
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| ParsedWindow::parse(w, &format!("{field}[{i}]")))
        .collect()
}

/// Every problem of a list of windows as written in an object (for the
/// admission webhook): `spec` is the object's spec.
pub fn problems_in(spec: Option<&serde_json::Value>) -> Vec<String> {
    let Some(list) = spec.and_then(|s| s.get("maintenanceWindows")) else {
        return Vec::new();
    };
    let Ok(windows) = serde_json::from_value::<Vec<MaintenanceWindow>>(list.clone()) else {
        // The schema refuses a list of another shape.
        return Vec::new();
    };
    windows
        .iter()
        .enumerate()
        .filter_map(|(i, w)| ParsedWindow::parse(w, &format!("{SPEC_FIELD}[{i}]")).err())
        .map(|e| e.to_string())
        .collect()
}

/// The windows an operation goes by, and the field they come from: its own
/// when set (an empty list too: any time), else its cluster's.
pub fn effective<'a>(
    operation: Option<&'a [MaintenanceWindow]>,
    cluster: &'a [MaintenanceWindow],
) -> (&'a [MaintenanceWindow], &'static str) {
    match operation {
        Some(own) => (own, SPEC_FIELD),
        None => (cluster, CLUSTER_FIELD),
    }
}

/// Whether a machine may start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowVerdict {
    /// No window is set: any time.
    Always,
    /// A window is open until `closes`.
    Open { closes: DateTime<Utc> },
    /// Every window is shut; the next opens at `next` (`None`: never again).
    Closed { next: Option<DateTime<Utc>> },
}

/// The verdict of `windows` at `now`.
pub fn window_verdict(windows: &[ParsedWindow], now: DateTime<Utc>) -> WindowVerdict {
    if windows.is_empty() {
        return WindowVerdict::Always;
    }
    if let Some(closes) = windows.iter().filter_map(|w| w.open_until(now)).max() {
        return WindowVerdict::Open { closes };
    }
    WindowVerdict::Closed {
        next: windows.iter().filter_map(|w| w.next_start(now)).min(),
    }
}

/// What the operation does with the batch `next` gave, under a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartGate {
    /// Run these steps (all of them when a window is open; when shut, only
    /// those of machines already started: they finish).
    Run(Vec<(String, MachineStep)>),
    /// Every machine of the batch waits to start until `next`.
    Wait { next: Option<DateTime<Utc>> },
}

/// Which of a batch's steps may run: a machine that has not started
/// (`Pending`) starts only inside a window; one in flight goes on.
pub fn gate_starts(steps: Vec<(String, MachineStep)>, verdict: &WindowVerdict) -> StartGate {
    let WindowVerdict::Closed { next } = verdict else {
        return StartGate::Run(steps);
    };
    let in_flight: Vec<_> = steps
        .into_iter()
        .filter(|(_, step)| *step != MachineStep::Pending)
        .collect();
    if in_flight.is_empty() {
        StartGate::Wait { next: *next }
    } else {
        StartGate::Run(in_flight)
    }
}

/// Whether a component step (kubernetes-upgrade) may begin: a step not
/// begun waits for a window; one begun goes on.
pub fn component_may_run(phase: ComponentPhase, verdict: &WindowVerdict) -> bool {
    phase != ComponentPhase::Pending || !matches!(verdict, WindowVerdict::Closed { .. })
}

/// Whether no machine and no component step has started yet (then even the
/// backup before the first control plane waits for the window, so it is
/// taken right before the steps).
pub fn nothing_started(status: &TalosOperationStatus) -> bool {
    status
        .machines
        .iter()
        .all(|m| matches!(m.step, MachineStep::Pending | MachineStep::Skipped))
        && status
            .components
            .iter()
            .all(|c| c.phase == ComponentPhase::Pending)
}

/// The operation's message while it waits for its window.
pub fn waiting_message(next: Option<DateTime<Utc>>, field: &str) -> String {
    match next {
        Some(n) => format!(
            "outside its maintenance window ({field}): the next machine starts when the next window opens, at {}",
            n.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        None => format!(
            "outside its maintenance window ({field}), and no window opens again; change the windows or create a new TalosOperation"
        ),
    }
}

/// When to look again while waiting: at the next window's start, but at
/// least every `cap` (a window edited meanwhile, a clock that moved).
pub fn recheck_after(next: Option<DateTime<Utc>>, now: DateTime<Utc>, cap: Duration) -> Duration {
    next.and_then(|n| (n - now).to_std().ok())
        .map_or(cap, |d| d.min(cap))
        .max(Duration::from_secs(1))
}

/// A status time as chrono's.
pub fn from_time(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// A chrono time as a status time (whole seconds, as the API stores it).
pub fn to_time(t: DateTime<Utc>) -> Option<Time> {
    Timestamp::from_second(t.timestamp()).ok().map(Time)
}

#[cfg(test)]
mod tests;
