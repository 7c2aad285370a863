//! Windows on a fake clock.

use super::*;
use ichor_api::operation::{ComponentProgress, KubernetesComponent, MachineProgress};

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn window(cron: &str, duration: &str, zone: Option<&str>, blackout: &[&str]) -> MaintenanceWindow {
    MaintenanceWindow {
        cron: cron.into(),
        duration: duration.into(),
        time_zone: zone.map(str::to_string),
        blackout_dates: blackout.iter().map(|d| d.to_string()).collect(),
    }
}

fn parsed(ws: &[MaintenanceWindow]) -> Vec<ParsedWindow> {
    parse_windows(ws, SPEC_FIELD).expect("windows")
}

fn verdict(ws: &[MaintenanceWindow], now: DateTime<Utc>) -> WindowVerdict {
    window_verdict(&parsed(ws), now)
}

/// Saturdays 02:00–04:00 UTC.
/// Covers: R15.1
#[test]
fn open_closed_and_the_next_window() {
    let ws = [window("0 2 * * sat", "2h", None, &[])];
    // 2026-12-05 is a Saturday.
    assert_eq!(
        verdict(&ws, utc(2026, 12, 5, 1, 59)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 12, 5, 2, 0))
        }
    );
    assert_eq!(
        verdict(&ws, utc(2026, 12, 5, 2, 0)),
        WindowVerdict::Open {
            closes: utc(2026, 12, 5, 4, 0)
        }
    );
    assert_eq!(
        verdict(&ws, utc(2026, 12, 5, 3, 59)),
        WindowVerdict::Open {
            closes: utc(2026, 12, 5, 4, 0)
        }
    );
    // Closes at start + duration, exactly.
    assert_eq!(
        verdict(&ws, utc(2026, 12, 5, 4, 0)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 12, 12, 2, 0))
        }
    );
    // No window: any time. Two windows: the earliest next, the latest close.
    assert_eq!(verdict(&[], utc(2026, 12, 5, 1, 0)), WindowVerdict::Always);
    let two = [
        window("0 2 * * sat", "2h", None, &[]),
        window("0 3 * * *", "90m", None, &[]),
    ];
    assert_eq!(
        verdict(&two, utc(2026, 12, 5, 1, 0)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 12, 5, 2, 0))
        }
    );
    assert_eq!(
        verdict(&two, utc(2026, 12, 5, 3, 30)),
        WindowVerdict::Open {
            closes: utc(2026, 12, 5, 4, 30)
        }
    );
    // A window that never opens again (30 February).
    assert_eq!(
        verdict(
            &[window("0 2 30 2 *", "1h", None, &[])],
            utc(2026, 1, 1, 0, 0)
        ),
        WindowVerdict::Closed { next: None }
    );
}

/// A window closing with a machine in flight: it finishes; the next waits.
/// Covers: R15.1
#[test]
fn a_machine_in_flight_finishes_and_the_next_waits() {
    let ws = [window("0 2 * * *", "1h", None, &[])];
    let batch = vec![("w-1".to_string(), MachineStep::Pending)];
    let open = verdict(&ws, utc(2026, 12, 5, 2, 59));
    assert_eq!(
        gate_starts(batch.clone(), &open),
        StartGate::Run(batch.clone())
    );
    // w-1 started at 02:59 and is rebooting at 03:10, after the close.
    let shut = verdict(&ws, utc(2026, 12, 5, 3, 10));
    let in_flight = vec![("w-1".to_string(), MachineStep::WaitingForReturn)];
    assert_eq!(
        gate_starts(in_flight.clone(), &shut),
        StartGate::Run(in_flight)
    );
    // The next machine does not start until the next window.
    assert_eq!(
        gate_starts(vec![("w-2".to_string(), MachineStep::Pending)], &shut),
        StartGate::Wait {
            next: Some(utc(2026, 12, 6, 2, 0))
        }
    );
    // A batch of workers: those started go on, the others wait.
    let mixed = vec![
        ("w-2".to_string(), MachineStep::Draining),
        ("w-3".to_string(), MachineStep::Pending),
    ];
    assert_eq!(
        gate_starts(mixed, &shut),
        StartGate::Run(vec![("w-2".to_string(), MachineStep::Draining)])
    );
    // Component steps: one begun goes on, one not begun waits.
    assert!(component_may_run(ComponentPhase::Waiting, &shut));
    assert!(!component_may_run(ComponentPhase::Pending, &shut));
    assert!(component_may_run(ComponentPhase::Pending, &open));
    assert!(component_may_run(
        ComponentPhase::Pending,
        &WindowVerdict::Always
    ));
}

/// Covers: R15.1
#[test]
fn no_window_opens_on_a_blackout_date() {
    // Daily 22:00–02:00 in Berlin; not on 24 December (local).
    let ws = [window(
        "0 22 * * *",
        "4h",
        Some("Europe/Berlin"),
        &["2026-12-24", "2026-12-25"],
    )];
    // 23 Dec 22:00 CET = 21:00 UTC opens, and stays open past local midnight.
    assert_eq!(
        verdict(&ws, utc(2026, 12, 23, 23, 30)),
        WindowVerdict::Open {
            closes: utc(2026, 12, 24, 1, 0)
        }
    );
    // 24 and 25 Dec start nothing; the next is 26 Dec 22:00 CET.
    assert_eq!(
        verdict(&ws, utc(2026, 12, 24, 21, 30)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 12, 26, 21, 0))
        }
    );
    // A window every minute, blacked out for a day, skips the whole day.
    let every = [window("* * * * *", "1m", None, &["2026-12-24"])];
    assert_eq!(
        verdict(&every, utc(2026, 12, 24, 12, 0)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 12, 25, 0, 0))
        }
    );
}

/// A daily 02:30 Europe/Berlin window for 1h across both DST changes: on
/// the spring-forward day 02:30 does not exist and the window opens at
/// 03:00 CEST; on the fall-back day it opens once, at the first 02:30.
/// Covers: R15.1
#[test]
fn a_0230_berlin_window_across_dst() {
    let ws = [window("30 2 * * *", "1h", Some("Europe/Berlin"), &[])];
    // 2026-03-29: 02:00 CET jumps to 03:00 CEST.
    assert_eq!(
        verdict(&ws, utc(2026, 3, 29, 0, 30)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 3, 29, 1, 0))
        }
    );
    assert_eq!(
        verdict(&ws, utc(2026, 3, 29, 1, 30)),
        WindowVerdict::Open {
            closes: utc(2026, 3, 29, 2, 0)
        }
    );
    // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    // The window opens at 02:30 CEST (00:30 UTC) and not again at 01:30 UTC.
    assert_eq!(
        verdict(&ws, utc(2026, 10, 25, 0, 45)),
        WindowVerdict::Open {
            closes: utc(2026, 10, 25, 1, 30)
        }
    );
    assert_eq!(
        verdict(&ws, utc(2026, 10, 25, 1, 45)),
        WindowVerdict::Closed {
            next: Some(utc(2026, 10, 26, 1, 30))
        }
    );
}

/// The operation's windows override the cluster's; an explicit empty list
/// means any time; unset, the cluster's apply.
/// Covers: R15.1
#[test]
fn windows_from_the_cluster_or_the_operation() {
    let cluster = [window("0 2 * * sat", "2h", None, &[])];
    let own = [window("0 12 * * *", "1h", None, &[])];
    let (ws, field) = effective(None, &cluster);
    assert_eq!((ws, field), (&cluster[..], CLUSTER_FIELD));
    let (ws, field) = effective(Some(&own), &cluster);
    assert_eq!((ws, field), (&own[..], SPEC_FIELD));
    let (ws, _) = effective(Some(&[]), &cluster);
    assert!(ws.is_empty());
    assert_eq!(verdict(ws, utc(2026, 12, 2, 9, 0)), WindowVerdict::Always);
    // The operation's own window is open at noon, the cluster's is not.
    let now = utc(2026, 12, 2, 12, 30);
    assert!(matches!(
        verdict(effective(Some(&own), &cluster).0, now),
        WindowVerdict::Open { .. }
    ));
    assert!(matches!(
        verdict(effective(None, &cluster).0, now),
        WindowVerdict::Closed { .. }
    ));
}

/// Covers: R15.1
#[test]
fn bad_windows_name_the_field() {
    for (w, want) in [
        (
            window("0 2 * *", "2h", None, &[]),
            "spec.maintenanceWindows[0].cron \"0 2 * *\": has 4 fields",
        ),
        (
            window("61 2 * * *", "2h", None, &[]),
            "spec.maintenanceWindows[0].cron \"61 2 * * *\": not a cron expression",
        ),
        (
            window("0 2 * * *", "2h", Some("Europe/Berlinn"), &[]),
            "spec.maintenanceWindows[0].timeZone \"Europe/Berlinn\": not an IANA time zone",
        ),
        (
            window("0 2 * * *", "2 hours", None, &[]),
            "spec.maintenanceWindows[0].duration \"2 hours\": not a duration",
        ),
        (
            window("0 2 * * *", "2h", None, &["2026-12-24", "2026-02-30"]),
            "spec.maintenanceWindows[0].blackoutDates[1] \"2026-02-30\": not a date",
        ),
    ] {
        let e = parse_windows(std::slice::from_ref(&w), SPEC_FIELD).unwrap_err();
        assert!(e.to_string().starts_with(want), "{e}");
        let spec =
            serde_json::json!({ "maintenanceWindows": [window("0 2 * * *", "1h", None, &[]), w] });
        let problems = problems_in(Some(&spec));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("spec.maintenanceWindows[1]."),
            "{problems:?}"
        );
    }
    assert!(problems_in(Some(&serde_json::json!({}))).is_empty());
}

#[test]
fn nothing_started_and_the_recheck() {
    let mut st = TalosOperationStatus {
        machines: vec![
            MachineProgress {
                machine: "cp-1".into(),
                ..Default::default()
            },
            MachineProgress {
                machine: "w-1".into(),
                step: MachineStep::Skipped,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    assert!(nothing_started(&st));
    st.components.push(ComponentProgress {
        component: KubernetesComponent::ApiServer,
        machine: "cp-1".into(),
        phase: ComponentPhase::Applying,
        image_before: None,
        image: None,
        start_time: None,
        completion_time: None,
        message: None,
    });
    assert!(!nothing_started(&st));
    let now = utc(2026, 12, 5, 1, 0);
    let cap = Duration::from_secs(300);
    assert_eq!(
        recheck_after(Some(utc(2026, 12, 5, 1, 1)), now, cap),
        Duration::from_secs(60)
    );
    assert_eq!(recheck_after(Some(utc(2026, 12, 5, 2, 0)), now, cap), cap);
    assert_eq!(recheck_after(None, now, cap), cap);
    assert_eq!(recheck_after(Some(now), now, cap), Duration::from_secs(1));
    let t = utc(2026, 12, 5, 2, 0);
    assert_eq!(from_time(&to_time(t).unwrap()), t);
    assert!(waiting_message(Some(t), SPEC_FIELD).ends_with("at 2026-12-05T02:00:00Z"));
}
