use super::*;
use ichor_api::operation::HealthCheckTarget;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
}

fn check(name: &str, expression: &str, timeout: Option<&str>) -> HealthCheck {
    HealthCheck {
        name: name.to_string(),
        expression: expression.to_string(),
        target: HealthCheckTarget {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("web".into()),
            name: Some("api".into()),
            label_selector: None,
        },
        timeout: timeout.map(str::to_string),
    }
}

const AVAILABLE: &str =
    "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')";

/// Covers: R15.5
#[test]
fn a_check_fails_naming_the_object_and_value_and_pauses_past_its_timeout() {
    let checks = compile_checks(&[check("api-available", AVAILABLE, Some("1m"))]).unwrap();
    let c = &checks[0];
    assert_eq!(c.timeout_secs, 60);
    let down = vec![(
        "Deployment web/api".to_string(),
        json!({"status": {"conditions": [{"type": "Available", "status": "False"}]}}),
    )];
    let f = judge_check(c, "Deployment web/api", &down).unwrap();
    assert_eq!(f.check, "api-available");
    assert_eq!(f.object.as_deref(), Some("Deployment web/api"));
    assert_eq!(f.value.as_deref(), Some("false"));

    let first = decide(None, Some(f.clone()), 60, false, &at(0));
    let GateDecision::Wait(gate) = first else {
        panic!("{first:?}")
    };
    assert_eq!(gate.since, Some(at(0)));
    // The same check still failing keeps its since; past the timeout: Paused.
    let later = decide(Some(&gate), Some(f.clone()), 60, false, &at(61));
    let GateDecision::Pause(paused) = later else {
        panic!("{later:?}")
    };
    assert_eq!(paused.since, Some(at(0)));
    let msg = gate_message(&paused, true);
    assert!(
        msg.contains("api-available") && msg.contains("Deployment web/api: false"),
        "{msg}"
    );
    // Passing again: go on.
    assert_eq!(
        decide(Some(&paused), None, 60, false, &at(90)),
        GateDecision::Go
    );
    // The skip annotation: go on although it fails.
    assert_eq!(
        decide(Some(&paused), Some(f), 60, true, &at(90)),
        GateDecision::Go
    );
}

/// Covers: R15.5
#[test]
fn no_timeout_pauses_at_once_and_another_check_starts_its_own_clock() {
    let f = |check: &str| GateFailure {
        check: check.to_string(),
        object: None,
        value: Some("x".into()),
    };
    assert!(matches!(
        decide(None, Some(f("a")), 0, false, &at(0)),
        GateDecision::Pause(_)
    ));
    let GateDecision::Wait(a) = decide(None, Some(f("a")), 30, false, &at(0)) else {
        panic!()
    };
    let GateDecision::Wait(b) = decide(Some(&a), Some(f("b")), 30, false, &at(20)) else {
        panic!()
    };
    assert_eq!(b.since, Some(at(20)));
}

/// Covers: R15.5
#[test]
fn a_selector_that_selects_nothing_fails() {
    let checks = compile_checks(&[check("any", "has(object.metadata)", None)]).unwrap();
    let f = judge_check(&checks[0], "Deployment web -l app=none", &[]).unwrap();
    assert_eq!(f.value.as_deref(), Some("no object selected"));
    let every = vec![
        ("a".to_string(), json!({"metadata": {}})),
        ("b".to_string(), json!({"spec": {}})),
    ];
    let f = judge_check(&checks[0], "x", &every).unwrap();
    assert_eq!(f.object.as_deref(), Some("b"));
}

/// Covers: R15.7
#[test]
fn checks_that_cannot_be_read_are_refused_naming_them() {
    let e = compile_checks(&[check("bad", "object.(", None)]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("spec.healthChecks[0] (bad): expression"),
        "{e}"
    );
    let e = compile_checks(&[check("t", AVAILABLE, Some("soon"))]).unwrap_err();
    assert!(e.to_string().contains("timeout \"soon\""), "{e}");
    let e =
        compile_checks(&[check("a", AVAILABLE, None), check("a", AVAILABLE, None)]).unwrap_err();
    assert!(
        matches!(e, CheckError::DuplicateName { index: 1, .. }),
        "{e}"
    );
}

/// A check may not read Secrets: the controller may get every one, and the
/// value (or the verdict alone) would show their contents in status.
/// Covers: R15.5
#[test]
fn a_check_on_secrets_is_refused() {
    let mut c = check("leak", "object.data.token == 'x'", None);
    c.target.api_version = "v1".into();
    c.target.kind = "Secret".into();
    let e = compile_checks(&[c]).unwrap_err();
    assert!(
        matches!(e, CheckError::SecretTarget { index: 0, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("spec.healthChecks[0] (leak): a health check may not read Secrets"),
        "{e}"
    );
}

#[test]
fn the_first_failure_in_order() {
    let f = |c: &str| {
        Some(GateFailure {
            check: c.into(),
            object: None,
            value: None,
        })
    };
    assert_eq!(
        first_failure([None, f("b"), f("c")]).map(|g| g.check),
        Some("b".into())
    );
    assert_eq!(first_failure([None, None]), None);
}
