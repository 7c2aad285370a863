use super::objects::{Applies, Snapshot, Value, families};
use super::*;

#[test]
fn renders_counters_with_labels() {
    let m = Metrics::new("v1.2.3");
    m.reconciled("talosmachine");
    m.reconciled("talosmachine");
    m.failed("talosmachine", "talos");
    m.applied("applied");
    m.try_apply("tried");
    m.try_apply("reverted");
    m.set_leader(true);
    m.operation_finished("talos-upgrade", "Succeeded");
    m.operation_step(
        "talos-upgrade",
        "Draining",
        std::time::Duration::from_secs(20),
    );
    m.operation_phase("talos-upgrade", None, "Running");
    m.operation_phase("talos-upgrade", Some("Running"), "Succeeded");
    m.reconcile_took("TalosMachine", std::time::Duration::from_millis(30));
    let text = m.render();
    for line in [
        "ichor_operations_total{kind=\"talos-upgrade\",phase=\"Succeeded\"} 1",
        "ichor_operation_step_duration_seconds_bucket{kind=\"talos-upgrade\",step=\"Draining\",le=\"15\"} 0",
        "ichor_operation_step_duration_seconds_bucket{kind=\"talos-upgrade\",step=\"Draining\",le=\"30\"} 1",
        "ichor_operation_step_duration_seconds_count{kind=\"talos-upgrade\",step=\"Draining\"} 1",
        "ichor_operation_phase_changes_total{kind=\"talos-upgrade\",phase=\"Running\"} 1",
        "ichor_operation_phase_changes_total{kind=\"talos-upgrade\",phase=\"Succeeded\"} 1",
        "ichor_reconciles_total{controller=\"talosmachine\"} 2",
        "ichor_reconcile_errors_total{controller=\"talosmachine\",error=\"talos\"} 1",
        "ichor_reconcile_duration_seconds_count{controller=\"talosmachine\"} 1",
        "ichor_node_applies_total{outcome=\"applied\"} 1",
        "ichor_try_applies_total{outcome=\"tried\"} 1",
        "ichor_try_applies_total{outcome=\"reverted\"} 1",
        "ichor_leader 1",
        "ichor_build_info{version=\"v1.2.3\"} 1",
        "# TYPE ichor_reconciles_total counter",
        // Before any operation is watched every kind and phase reads 0.
        "ichor_operations{kind=\"reboot\",phase=\"Failed\"} 0",
    ] {
        assert!(text.contains(line), "{line} is not in:\n{text}");
    }
    assert_eq!(m.failures("talosmachine", "talos"), 1);
}

/// Covers: R20.9
#[test]
fn backup_metrics_keep_the_newest_success_per_cluster() {
    let m = Metrics::default();
    let at = |finished_seconds, size_bytes, duration_seconds| LastBackup {
        finished_seconds,
        size_bytes,
        duration_seconds,
    };
    m.backup_succeeded("ns/a", at(1_796_000_100, 2048, 12.5));
    // An older one read back later (a restart's first look) changes nothing.
    m.backup_succeeded("ns/a", at(1_796_000_000, 1024, 3.0));
    m.backup_succeeded("ns/b", at(1_796_000_050, 512, 1.0));
    m.backup_finished("ns/a", "succeeded");
    m.backup_finished("ns/a", "failed");
    m.backup_finished("ns/a", "failed");
    let text = m.render();
    let expected = "\
# HELP ichor_backup_last_success_timestamp_seconds When the newest succeeded backup of each TalosCluster finished (Unix time).
# TYPE ichor_backup_last_success_timestamp_seconds gauge
ichor_backup_last_success_timestamp_seconds{cluster=\"ns/a\"} 1796000100
ichor_backup_last_success_timestamp_seconds{cluster=\"ns/b\"} 1796000050
# HELP ichor_backup_last_size_bytes The bytes the newest succeeded backup of each TalosCluster wrote, all parts together.
# TYPE ichor_backup_last_size_bytes gauge
ichor_backup_last_size_bytes{cluster=\"ns/a\"} 2048
ichor_backup_last_size_bytes{cluster=\"ns/b\"} 512
# HELP ichor_backup_last_duration_seconds How long the newest succeeded backup of each TalosCluster took.
# TYPE ichor_backup_last_duration_seconds gauge
ichor_backup_last_duration_seconds{cluster=\"ns/a\"} 12.5
ichor_backup_last_duration_seconds{cluster=\"ns/b\"} 1.0
";
    assert!(text.contains(expected), "{text}");
    for line in [
        "ichor_backups_total{cluster=\"ns/a\",result=\"failed\"} 2",
        "ichor_backups_total{cluster=\"ns/a\",result=\"succeeded\"} 1",
    ] {
        assert!(text.contains(line), "{line} is not in:\n{text}");
    }
    // Before any backup the gauges are declared, with no sample, and
    // nothing is counted.
    let empty = Metrics::default().render();
    assert!(
        empty.contains("# TYPE ichor_backup_last_success_timestamp_seconds gauge\n# HELP"),
        "{empty}"
    );
    assert!(!empty.contains("\nichor_backups_total"), "{empty}");
}

fn machine(name: &str, hold: bool, classes: &[&str]) -> ichor_api::TalosMachine {
    let drift: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| serde_json::json!({"path": format!("p{i}"), "class": c}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"clusterRef": {"name": "c"}, "role": "controlplane", "address": "10.5.0.2", "hold": hold},
        "status": {"drift": drift, "talosVersion": "v1.13.0"}
    }))
    .unwrap()
}

fn operation(name: &str, phase: &str) -> ichor_api::TalosOperation {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "c"}}},
        "status": {"phase": phase, "startTime": "2026-12-02T08:00:00Z"}
    }))
    .unwrap()
}

fn sample(fams: &[objects::GaugeFamily], name: &str, labels: &[(&str, &str)]) -> Option<Value> {
    fams.iter()
        .find(|f| f.name == name)?
        .samples
        .iter()
        .find(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.value)
}

/// A family, labels a sample has, and its value (`None`: no such sample).
type Expected = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<i64>,
);

/// Covers: R17.5
#[test]
fn object_gauges_count_machines_by_drift_and_hold_and_forget_deleted_objects() {
    let mut s = Snapshot {
        watching: true,
        machines: vec![
            machine("m1", true, &["A", "B"]),
            machine("m2", false, &[]),
            machine("m3", true, &["C"]),
        ],
        ..Snapshot::default()
    };
    let applies = |last_success, last_failure| Applies {
        last_success,
        last_failure,
    };
    s.applies
        .insert("ns/m1".into(), applies(Some(100), Some(200)));
    s.applies.insert("ns/gone".into(), applies(Some(5), None));
    let f = families(&s);
    let machines = |drift, held| {
        sample(
            &f,
            "ichor_machines",
            &[("cluster", "c"), ("drift", drift), ("held", held)],
        )
    };
    assert_eq!(machines("B", "true"), Some(Value::Int(1)));
    assert_eq!(machines("C", "true"), Some(Value::Int(1)));
    assert_eq!(machines("none", "false"), Some(Value::Int(1)));
    assert_eq!(machines("B", "false"), Some(Value::Int(0)));
    let counts = f.iter().find(|f| f.name == "ichor_machines").unwrap();
    assert_eq!(counts.samples.len(), 8);
    let expected: [Expected; 6] = [
        (
            "ichor_machine_drift_paths",
            &[("machine", "m1"), ("class", "A")],
            Some(1),
        ),
        ("ichor_machine_held", &[("machine", "m2")], Some(0)),
        (
            "ichor_machine_info",
            &[
                ("machine", "m3"),
                ("talos_version", "v1.13.0"),
                ("role", "controlplane"),
            ],
            Some(1),
        ),
        (
            "ichor_machine_last_apply_timestamp_seconds",
            &[("machine", "m1")],
            Some(100),
        ),
        (
            "ichor_machine_last_apply_failure_timestamp_seconds",
            &[("machine", "m1")],
            Some(200),
        ),
        // The applies of a machine no longer in the cache are not reported.
        (
            "ichor_machine_last_apply_timestamp_seconds",
            &[("machine", "gone")],
            None,
        ),
    ];
    for (name, labels, value) in expected {
        assert_eq!(
            sample(&f, name, labels),
            value.map(Value::Int),
            "{name} {labels:?}"
        );
    }
}

/// Covers: R17.5
#[test]
fn operation_gauges_give_each_operation_one_series_per_phase() {
    let s = Snapshot {
        watching: true,
        operations: vec![operation("o1", "Failed"), operation("o2", "Running")],
        ..Snapshot::default()
    };
    let f = families(&s);
    assert_eq!(
        sample(
            &f,
            "ichor_operation_phase",
            &[("operation", "o1"), ("phase", "Failed")]
        ),
        Some(Value::Int(1))
    );
    assert_eq!(
        sample(
            &f,
            "ichor_operation_phase",
            &[("operation", "o1"), ("phase", "Running")]
        ),
        Some(Value::Int(0))
    );
    assert_eq!(
        sample(
            &f,
            "ichor_operations",
            &[("kind", "reboot"), ("phase", "Running")]
        ),
        Some(Value::Int(1))
    );
    assert_eq!(
        sample(
            &f,
            "ichor_operation_start_timestamp_seconds",
            &[("operation", "o2")]
        ),
        Some(Value::Int(1_796_198_400))
    );
}

/// Covers: R17.5
#[test]
fn the_series_of_deleted_objects_disappear() {
    let mut s = Snapshot {
        watching: true,
        ..Snapshot::default()
    };
    s.applies.insert(
        "ns/m1".into(),
        Applies {
            last_success: Some(100),
            last_failure: None,
        },
    );
    // A backup of a cluster that is gone is not reported either.
    s.last_backups.insert(
        "ns/c".into(),
        LastBackup {
            finished_seconds: 1,
            size_bytes: 1,
            duration_seconds: 1.0,
        },
    );
    let f = families(&s);
    for fam in &f {
        // The counts by kind and phase stay, at 0.
        let zero =
            fam.name == "ichor_operations" && fam.samples.iter().all(|s| s.value == Value::Int(0));
        assert!(
            zero || fam.samples.is_empty(),
            "{} kept {:?}",
            fam.name,
            fam.samples
        );
    }
}
