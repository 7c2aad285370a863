//! Maintenance windows: when an operation may start a machine. A window is
//! a 5-field cron start read in an IANA time zone, a duration, and
//! blackout dates on which no window opens. Set on a TalosCluster as the
//! default for its operations, or on a TalosOperation (which then
//! overrides the cluster's; an empty list means "any time").
//!
//! The shape is checked here and by the CRD's rules; whether a cron
//! expression or a time zone means something is decided where windows are
//! read (`ichor_reconcile::operation::window`), which the admission
//! webhook and the controller share.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The Waiting condition's reason while an operation waits for its window.
/// (A reason of `conditions::reasons` in spirit; kept here with the window.)
pub const OUTSIDE_MAINTENANCE_WINDOW: &str = "OutsideMaintenanceWindow";

/// One maintenance window: machines start only between a start the cron
/// expression gives and that start plus the duration, and never on a
/// blackout date.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When the window opens: a 5-field cron expression (minute hour
    /// day-of-month month day-of-week), read in `timeZone`. For example
    /// `0 2 * * sat` opens every Saturday at 02:00.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("self.matches('^ *[^ ]+( +[^ ]+){4} *$')").message("cron must have 5 fields (minute hour day-of-month month day-of-week), for example 0 2 * * sat"))]
    pub cron: String,
    /// How long the window stays open: one or more `<number><unit>` with
    /// units d, h, m, s (`2h`, `90m`, `1h30m`).
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+[dhms])+$')").message("duration must look like 2h, 90m or 1h30m"))]
    pub duration: String,
    /// The IANA time zone the cron expression and the blackout dates are
    /// read in (for example Europe/Berlin). Default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$')").message("timeZone must be an IANA time zone such as UTC or Europe/Berlin"))]
    pub time_zone: Option<String>,
    /// Dates (YYYY-MM-DD, in `timeZone`) on which the window does not
    /// open: a start on such a local date is no start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 366),
        inner(regex(pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"))
    )]
    pub blackout_dates: Vec<String>,
}

/// A duration that is not `<number><unit>`…
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not a duration such as 2h, 90m or 1h30m (units d, h, m, s)")]
pub struct BadDuration {
    pub given: String,
}

/// Parses a duration as written in a spec: one or more `<number><unit>`
/// with units `d`, `h`, `m`, `s` (`2h`, `90m`, `1d12h`); zero is refused.
/// The grammar of a backup retention's `maxAge`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, BadDuration> {
    let bad = || BadDuration {
        given: s.to_string(),
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        let unit: u64 = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit)
            .and_then(|secs| total.checked_add(secs))
            .ok_or_else(bad)?;
    }
    if !digits.is_empty() || total == 0 {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_as_retention_writes_them() {
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_duration(" 30s "), Ok(Duration::from_secs(30)));
        for bad in [
            "",
            "2",
            "h",
            "0m",
            "2w",
            "1.5h",
            "-1h",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            parse_duration("3w").unwrap_err().to_string(),
            "\"3w\" is not a duration such as 2h, 90m or 1h30m (units d, h, m, s)"
        );
    }

    #[test]
    fn a_window_reads_from_its_spec_names() {
        let w: MaintenanceWindow = serde_json::from_value(serde_json::json!({
            "cron": "0 2 * * sat", "duration": "2h", "timeZone": "Europe/Berlin",
            "blackoutDates": ["2026-12-26"]
        }))
        .unwrap();
        assert_eq!(w.time_zone.as_deref(), Some("Europe/Berlin"));
        assert_eq!(w.blackout_dates, ["2026-12-26"]);
    }
}
