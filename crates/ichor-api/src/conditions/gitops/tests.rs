//! Every state of every kind, settled, against Flux's checker rules.

use super::*;
use crate::conditions::flux::{Violation, ichor_violations, violations};
use k8s_openapi::jiff::Timestamp;

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).expect("timestamp"))
}

fn cond(type_: &str, status: Status, reason: &str, generation: i64) -> Condition {
    new(type_, status, reason, "m", Some(generation), t(10))
}

/// Settles `summary` into `conditions` at generation 2, checks Flux's rules
/// and returns the three conditions' statuses.
fn settled(mut conditions: Vec<Condition>, summary: &Summary) -> [Option<String>; 3] {
    settle(&mut conditions, summary, Some(2), &t(20));
    let found = ichor_violations(Some(2), Some(2), &conditions);
    assert!(found.is_empty(), "{summary:?}: {found:?}");
    [types::READY, types::RECONCILING, types::STALLED]
        .map(|ty| find(&conditions, ty).map(|c| c.status.clone()))
}

fn expect(standing: Standing) -> [Option<String>; 3] {
    let s = |v: &str| Some(v.to_owned());
    match standing {
        Standing::Ready => [s("True"), None, None],
        Standing::Progressing => [s("Unknown"), s("True"), None],
        Standing::Failing => [s("False"), None, None],
        Standing::Stalled => [s("False"), None, s("True")],
    }
}

/// Covers: R17.1a, R17.1b
#[test]
fn every_operation_phase_settles_within_fluxs_rules() {
    let cases = [
        (OperationPhase::Pending, Standing::Progressing),
        (OperationPhase::Running, Standing::Progressing),
        (OperationPhase::Waiting, Standing::Progressing),
        (OperationPhase::Paused, Standing::Failing),
        (OperationPhase::Succeeded, Standing::Ready),
        (OperationPhase::Failed, Standing::Stalled),
    ];
    for (phase, standing) in cases {
        let mut status = TalosOperationStatus {
            phase: Some(phase),
            ..Default::default()
        };
        // An operation's conditions are those of an earlier generation
        // until settled: a Ready one carries the new one.
        status.conditions = vec![
            cond(types::WAITING, Status::False, reasons::NOT_WAITING, 1),
            cond(types::SKIPPED, Status::False, reasons::NONE_SKIPPED, 1),
        ];
        let summary = operation(&status);
        assert_eq!(summary.standing, standing, "{phase:?}");
        assert_eq!(
            settled(status.conditions, &summary),
            expect(standing),
            "{phase:?}"
        );
    }
}

/// Covers: R17.1a
#[test]
fn a_failed_operation_carries_completes_reason() {
    let status = TalosOperationStatus {
        phase: Some(OperationPhase::Failed),
        message: Some("node n1 did not return".into()),
        conditions: vec![new(
            types::COMPLETE,
            Status::True,
            reasons::RETURN_TIMEOUT,
            "node n1 did not return within 10m",
            Some(1),
            t(1),
        )],
        ..Default::default()
    };
    let s = operation(&status);
    assert_eq!(s.standing, Standing::Stalled);
    assert_eq!(s.reason, reasons::RETURN_TIMEOUT);
    assert_eq!(s.message, "node n1 did not return within 10m");
}

/// Covers: R17.1a, R17.1b
#[test]
fn every_backup_phase_settles_within_fluxs_rules() {
    for (phase, standing) in [
        (BackupPhase::Pending, Standing::Progressing),
        (BackupPhase::Running, Standing::Progressing),
        (BackupPhase::Succeeded, Standing::Ready),
        (BackupPhase::Failed, Standing::Stalled),
    ] {
        let status = TalosBackupStatus {
            phase,
            message: (phase == BackupPhase::Failed).then(|| "the bucket refused".to_owned()),
            ..Default::default()
        };
        let summary = backup(&status);
        assert_eq!(summary.standing, standing, "{phase:?}");
        assert!(!summary.message.is_empty(), "{phase:?}");
        assert_eq!(settled(Vec::new(), &summary), expect(standing), "{phase:?}");
    }
}

/// Covers: R17.1a, R17.1b
#[test]
fn every_machine_ready_settles_within_fluxs_rules() {
    let cases = [
        (Status::True, reasons::RECONCILED, Standing::Ready),
        (Status::False, reasons::NODE_UNREACHABLE, Standing::Failing),
        (
            Status::False,
            reasons::BUNDLE_UNAVAILABLE,
            Standing::Failing,
        ),
        (Status::False, reasons::CLUSTER_NOT_FOUND, Standing::Failing),
        (Status::False, reasons::API_ERROR, Standing::Failing),
        (Status::False, reasons::RENDER_FAILED, Standing::Stalled),
    ];
    for (status, reason, standing) in cases {
        let ready = cond(types::READY, status, reason, 2);
        // Held with class C drift and a refused apply: still Ready when read.
        let others = vec![
            cond(types::HELD, Status::True, reasons::HOLD_SET, 2),
            cond(types::DRIFTED, Status::True, reasons::UNSAFE_DRIFT, 1),
            cond(types::APPLIED, Status::False, reasons::UNSAFE_DRIFT, 1),
            ready.clone(),
        ];
        let summary = machine(&ready);
        assert_eq!(summary.standing, standing, "{reason}");
        assert_eq!(summary.reason, reason);
        assert_eq!(settled(others, &summary), expect(standing), "{reason}");
    }
}

/// Covers: R17.1a, R17.1b
#[test]
fn every_cluster_state_settles_within_fluxs_rules() {
    let machines_ok = cond(types::READY, Status::True, reasons::RECONCILED, 2);
    let machines_bad = cond(types::READY, Status::False, reasons::MACHINES_NOT_READY, 2);
    let none = cond(types::READY, Status::False, reasons::NO_MACHINES, 2);
    let handover = |status, reason| cond(types::CNI_HANDOVER, status, reason, 2);
    let cases = [
        (
            &machines_ok,
            Some((Status::True, reasons::HANDED_OVER)),
            Standing::Ready,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::UNMANAGED)),
            Standing::Ready,
        ),
        (&machines_ok, None, Standing::Ready),
        (
            &machines_ok,
            Some((Status::False, reasons::WAITING_FOR_RELEASE)),
            Standing::Progressing,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::JOB_RUNNING)),
            Standing::Progressing,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::WAITING_FOR_DAEMON_SET)),
            Standing::Progressing,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::REMOVING_INLINE_MANIFEST)),
            Standing::Progressing,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::JOB_FAILED)),
            Standing::Failing,
        ),
        (
            &machines_ok,
            Some((Status::False, reasons::INVALID_VALUES)),
            Standing::Stalled,
        ),
        (
            &machines_bad,
            Some((Status::False, reasons::JOB_RUNNING)),
            Standing::Failing,
        ),
        (
            &machines_bad,
            Some((Status::False, reasons::INVALID_VALUES)),
            Standing::Stalled,
        ),
        (&none, None, Standing::Failing),
    ];
    for (machines, cni, standing) in cases {
        let mut conditions = vec![cond(
            types::BACKUP_HEALTHY,
            Status::True,
            reasons::BACKUP_SUCCEEDED,
            1,
        )];
        conditions.extend(cni.map(|(s, r)| handover(s, r)));
        let summary = cluster(machines, &conditions);
        assert_eq!(summary.standing, standing, "{} {cni:?}", machines.reason);
        assert_eq!(settled(conditions, &summary), expect(standing), "{cni:?}");
    }
}

/// Covers: R17.1a
#[test]
fn settling_again_keeps_the_transition_time() {
    let summary = Summary::new(Standing::Progressing, reasons::RUNNING, "step 1");
    let mut cs = Vec::new();
    settle(&mut cs, &summary, Some(1), &t(10));
    settle(&mut cs, &summary, Some(1), &t(20));
    assert!(cs.iter().all(|c| c.last_transition_time == t(10)), "{cs:?}");
    settle(
        &mut cs,
        &Summary::new(Standing::Ready, reasons::SUCCEEDED, "done"),
        Some(1),
        &t(30),
    );
    assert_eq!(cs.len(), 1, "Reconciling removed: {cs:?}");
}

/// The checker itself: each rule is found where Flux finds it.
/// Covers: R17.1b
#[test]
fn the_checker_finds_each_rule() {
    let ready = |s| cond(types::READY, s, "R", 2);
    let codes = |g, o, cs: &[Condition]| -> Vec<String> {
        violations(g, o, cs)
            .iter()
            .map(|v| v.to_string()[..8].to_owned())
            .collect()
    };
    assert_eq!(codes(Some(2), Some(2), &[]), ["FAIL0002"]);
    assert_eq!(
        codes(
            Some(2),
            Some(2),
            &[
                ready(Status::True),
                cond(types::WAITING, Status::True, "W", 2)
            ]
        ),
        ["FAIL0001"]
    );
    let reconciling = cond(types::RECONCILING, Status::True, "R", 2);
    assert_eq!(
        codes(
            Some(2),
            Some(2),
            &[ready(Status::Unknown), reconciling.clone()]
        ),
        ["FAIL0003", "FAIL0010"]
    );
    assert!(
        ichor_violations(
            Some(2),
            Some(2),
            &[ready(Status::Unknown), reconciling.clone()]
        )
        .is_empty()
    );
    assert_eq!(
        codes(
            Some(2),
            Some(1),
            &[ready(Status::False), reconciling.clone()]
        ),
        Vec::<String>::new(),
        "Flux's own result form"
    );
    let stalled = cond(types::STALLED, Status::True, "S", 2);
    assert_eq!(
        codes(Some(2), Some(2), &[ready(Status::Unknown), stalled.clone()]),
        ["FAIL0004"]
    );
    assert!(
        codes(
            Some(2),
            Some(1),
            &[ready(Status::False), stalled, reconciling]
        )
        .contains(&"FAIL0005".to_owned())
    );
    assert_eq!(
        codes(Some(1), Some(2), &[ready(Status::False)]),
        ["FAIL0006"]
    );
    let stale_ready = cond(types::READY, Status::True, "R", 1);
    assert_eq!(
        codes(Some(2), Some(1), &[stale_ready]),
        ["FAIL0007", "FAIL0008"]
    );
    assert_eq!(
        violations(
            Some(2),
            Some(2),
            &[ready(Status::True), cond(types::HELD, Status::True, "H", 3)]
        ),
        [Violation::ReadyWithConditionsOff(vec!["Held".into()])]
    );
}
