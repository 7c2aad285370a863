//! A node's record of what happened to it since it booted: the kernel's
//! lines, machined's (the `[talos]` lines, the service state changes among
//! them) and each service's own log. `talosctl dmesg`, `talosctl logs <id>`
//! and `talosctl services` read it; the node writes it as it boots, applies
//! a config, reboots, upgrades, bootstraps etcd. Like Talos's logs, which
//! live in memory, it starts over at each boot.

use std::time::{Duration, SystemTime};

/// A service's state, as Talos names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServiceState {
    Waiting,
    Preparing,
    Running,
    Stopping,
    Finished,
    Failed,
}

impl ServiceState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Waiting => "Waiting",
            ServiceState::Preparing => "Preparing",
            ServiceState::Running => "Running",
            ServiceState::Stopping => "Stopping",
            ServiceState::Finished => "Finished",
            ServiceState::Failed => "Failed",
        }
    }
}

/// What one line of the record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// The kernel's (dmesg only).
    Kernel(String),
    /// machined's (`logs machined`, and dmesg as `[talos] …`).
    Talos(String),
    /// A service changed state (machined's line `service[id](State): msg`).
    Service {
        id: String,
        state: ServiceState,
        msg: String,
    },
    /// A service's own output (`logs <id>`).
    Output { id: String, text: String },
}

/// One line and when it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub at: SystemTime,
    pub line: Line,
}

/// One service's state changes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceEvents {
    pub id: String,
    pub events: Vec<(SystemTime, ServiceState, String)>,
}

impl ServiceEvents {
    /// The state of the last event.
    pub fn state(&self) -> Option<ServiceState> {
        self.events.last().map(|(_, s, _)| *s)
    }
}

/// The record of one boot.
#[derive(Debug, Clone)]
pub(crate) struct Journal {
    pub booted_at: SystemTime,
    entries: Vec<Entry>,
}

/// machined's wording of a passed health check.
pub(crate) const HEALTHY: &str = "Health check successful";

impl Journal {
    /// An empty record of a boot that happens now.
    pub fn boot() -> Self {
        Journal {
            booted_at: SystemTime::now(),
            entries: Vec::new(),
        }
    }

    fn push(&mut self, line: Line) {
        // Lines keep their order even when the clock does not move between them.
        let now = SystemTime::now();
        let at = match self.entries.last() {
            Some(last) if last.at >= now => last.at + Duration::from_micros(1),
            _ => now,
        };
        self.entries.push(Entry { at, line });
    }

    pub fn kernel(&mut self, text: impl Into<String>) {
        self.push(Line::Kernel(text.into()));
    }

    pub fn talos(&mut self, text: impl Into<String>) {
        self.push(Line::Talos(text.into()));
    }

    pub fn service(&mut self, id: &str, state: ServiceState, msg: impl Into<String>) {
        self.push(Line::Service {
            id: id.to_string(),
            state,
            msg: msg.into(),
        });
    }

    pub fn output(&mut self, id: &str, text: impl Into<String>) {
        self.push(Line::Output {
            id: id.to_string(),
            text: text.into(),
        });
    }

    /// Every service that changed state this boot, sorted by id (as Talos lists them).
    pub fn services(&self) -> Vec<ServiceEvents> {
        let mut out: Vec<ServiceEvents> = Vec::new();
        for e in &self.entries {
            if let Line::Service { id, state, msg } = &e.line {
                let event = (e.at, *state, msg.clone());
                match out.iter_mut().find(|s| s.id == *id) {
                    Some(s) => s.events.push(event),
                    None => out.push(ServiceEvents {
                        id: id.clone(),
                        events: vec![event],
                    }),
                }
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// One service's state changes.
    pub fn service_events(&self, id: &str) -> Option<ServiceEvents> {
        self.services().into_iter().find(|s| s.id == id)
    }

    /// The kernel log as `talosctl dmesg` shows Talos's: `facility: level:
    /// [time]: message`, machined's lines among the kernel's.
    pub fn dmesg(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| {
                let ts = rfc3339_nanos(e.at);
                match &e.line {
                    Line::Kernel(t) => Some(format!("kern:    info: [{ts}]: {t}")),
                    Line::Talos(t) => Some(format!("user: warning: [{ts}]: [talos] {t}")),
                    Line::Service { id, state, msg } => Some(format!(
                        "user: warning: [{ts}]: [talos] service[{id}]({}): {msg}",
                        state.as_str()
                    )),
                    Line::Output { .. } => None,
                }
            })
            .collect()
    }

    /// The log of `id` (`machined`: machined's own lines), one line each.
    pub fn log(&self, id: &str) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| match &e.line {
                Line::Talos(t) if id == "machined" => {
                    Some(format!("[talos] {} {t}", go_log_time(e.at)))
                }
                Line::Service { id: s, state, msg } if id == "machined" => Some(format!(
                    "[talos] {} service[{s}]({}): {msg}",
                    go_log_time(e.at),
                    state.as_str()
                )),
                Line::Output { id: s, text } if s == id => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    /// The ids that have a log this boot (machined's always).
    pub fn log_ids(&self) -> Vec<String> {
        let mut ids = vec!["machined".to_string()];
        for e in &self.entries {
            if let Line::Output { id, .. } = &e.line
                && !ids.contains(id)
            {
                ids.push(id.clone());
            }
        }
        ids.sort();
        ids
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A UTC time's parts: (year, month, day, hour, minute, second, nanosecond).
pub(crate) fn utc_parts(at: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400) as u32;
    (
        y,
        m,
        d,
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        since.subsec_nanos(),
    )
}

/// `2006-01-02T15:04:05.999999999Z`.
pub(crate) fn rfc3339_nanos(at: SystemTime) -> String {
    let (y, mo, d, h, mi, s, ns) = utc_parts(at);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ns:09}Z")
}

/// `2006/01/02 15:04:05` (Go's log package).
pub(crate) fn go_log_time(at: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _) = utc_parts(at);
    format!("{y:04}/{mo:02}/{d:02} {h:02}:{mi:02}:{s:02}")
}

/// `0102 15:04:05.000000` (klog's header, after its severity letter).
pub(crate) fn klog_time(at: SystemTime) -> String {
    let (_, mo, d, h, mi, s, ns) = utc_parts(at);
    format!("{mo:02}{d:02} {h:02}:{mi:02}:{s:02}.{:06}", ns / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_go_writes_them() {
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_767_323_045, 123_456_789);
        assert_eq!(rfc3339_nanos(at), "2026-01-02T03:04:05.123456789Z");
        assert_eq!(go_log_time(at), "2026/01/02 03:04:05");
        assert_eq!(klog_time(at), "0102 03:04:05.123456");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(go_log_time(leap), "2000/02/29 00:00:00");
    }

    #[test]
    fn a_service_is_in_the_state_of_its_last_event() {
        let mut j = Journal::boot();
        j.service("etcd", ServiceState::Preparing, "Running pre state");
        j.service("apid", ServiceState::Running, HEALTHY);
        j.service("etcd", ServiceState::Running, HEALTHY);
        let services = j.services();
        assert_eq!(services[0].id, "apid");
        assert_eq!(services[1].state(), Some(ServiceState::Running));
        assert_eq!(services[1].events.len(), 2);
        assert!(j.dmesg()[0].contains("[talos] service[etcd](Preparing): Running pre state"));
        assert!(j.log("machined")[2].ends_with("service[etcd](Running): Health check successful"));
    }
}
