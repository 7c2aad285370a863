//! The chart's `values.schema.json` (generated from `ichor_dist::values`)
//! with the real helm v3 and v4: a misspelled or ill-typed value is refused
//! on lint, template, install and upgrade, naming the value; the defaults
//! pass.

use ichor_testenv::TestEnv;

use crate::chart::{HELMS, chart, helm, template, text};

/// Values files a person could write by mistake, and what helm must name.
const MISTAKES: [(&str, &str); 4] = [
    // A misspelled key.
    (
        "manager:\n  replica: 2\n",
        "at '/manager': additional properties 'replica' not allowed",
    ),
    (
        "monitoring:\n  serviceMonitor:\n    enable: true\n",
        "at '/monitoring/serviceMonitor': additional properties 'enable' not allowed",
    ),
    // A value of the wrong type.
    (
        "webhook:\n  timeoutSeconds: ten\n",
        "at '/webhook/timeoutSeconds': got string, want integer",
    ),
    (
        "monitoring:\n  prometheusRule:\n    enabled: \"yes\"\n",
        "at '/monitoring/prometheusRule/enabled': got string, want boolean",
    ),
];

fn values_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("values.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Covers: R17.3, R17.3b
///
/// `helm lint --strict` and `helm template` refuse each mistake, naming the
/// value and what is wrong with it.
#[test]
fn lint_and_template_refuse_a_misspelled_or_ill_typed_value() {
    for tool in HELMS {
        for (values, said) in MISTAKES {
            let home = tempfile::tempdir().unwrap();
            let file = values_file(&home, values);
            let chart = chart();
            let lint = helm(
                tool,
                &home,
                &[
                    "lint",
                    "--strict",
                    chart.to_str().unwrap(),
                    "--namespace",
                    "ichor-system",
                    "--values",
                    &file,
                ],
            );
            assert!(!lint.status.success(), "{tool:?} lint took {values:?}");
            assert!(text(&lint).contains(said), "{tool:?} lint: {}", text(&lint));
            let out = template(tool, &["--values", &file]);
            assert!(!out.status.success(), "{tool:?} template took {values:?}");
            assert!(
                text(&out).contains(said),
                "{tool:?} template: {}",
                text(&out)
            );
        }
        let out = template(tool, &["--set", "monitoring.podMonitor.interval=5 minutes"]);
        assert!(
            text(&out).contains("at '/monitoring/podMonitor/interval'"),
            "{tool:?}: {}",
            text(&out)
        );
    }
}

/// Covers: R17.3, R17.3b
///
/// `helm install` and `helm upgrade --install` on a real API server refuse
/// a misspelled value before anything is written: no release exists after.
#[test]
fn install_and_upgrade_refuse_a_misspelled_value() {
    let env = TestEnv::shared();
    let kubeconfig = env.kubeconfig_path().to_str().unwrap().to_string();
    let (values, said) = MISTAKES[1];
    for tool in HELMS {
        let home = tempfile::tempdir().unwrap();
        let file = values_file(&home, values);
        let chart = chart();
        for verb in [&["install"][..], &["upgrade", "--install"][..]] {
            let mut args = verb.to_vec();
            args.extend_from_slice(&[
                "ichor-typo",
                chart.to_str().unwrap(),
                "--namespace",
                "ichor-system",
                "--kubeconfig",
                &kubeconfig,
                "--values",
                &file,
            ]);
            let out = helm(tool, &home, &args);
            assert!(!out.status.success(), "{tool:?} {verb:?} took {values:?}");
            assert!(
                text(&out).contains(said),
                "{tool:?} {verb:?}: {}",
                text(&out)
            );
        }
        let status = helm(
            tool,
            &home,
            &[
                "status",
                "ichor-typo",
                "--namespace",
                "ichor-system",
                "--kubeconfig",
                &kubeconfig,
            ],
        );
        assert!(
            !status.status.success(),
            "{tool:?}: a release was written: {}",
            text(&status)
        );
    }
}

/// Covers: R17.3a
///
/// Every value with a monitoring object on passes the schema, and the
/// schema helm reads is the one the types generate.
#[test]
fn the_defaults_and_the_monitoring_switches_pass_the_schema() {
    let on_disk = std::fs::read_to_string(chart().join(ichor_dist::values::SCHEMA_FILE)).unwrap();
    assert_eq!(on_disk, ichor_dist::values::schema_json());
    for tool in HELMS {
        let out = template(
            tool,
            &[
                "--set",
                "monitoring.serviceMonitor.enabled=true",
                "--set",
                "monitoring.serviceMonitor.scrapeTimeout=10s",
                "--set",
                "monitoring.serviceMonitor.interval=1m30s",
                "--set",
                "monitoring.prometheusRule.enabled=true",
                "--set",
                "monitoring.dashboards.enabled=true",
                "--set",
                "monitoring.dashboards.labels.team=platform",
                "--set",
                "manager.resources.limits.cpu=1",
                "--set",
                "networkPolicy.cilium.enabled=true",
                "--set",
                "ichorUI.plaintextPort=8080",
            ],
        );
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        let home = tempfile::tempdir().unwrap();
        let chart = chart();
        let lint = helm(
            tool,
            &home,
            &[
                "lint",
                "--strict",
                chart.to_str().unwrap(),
                "--namespace",
                "ichor-system",
                "--set",
                "monitoring.podMonitor.enabled=true",
                "--set",
                "monitoring.prometheusRule.enabled=true",
                "--set",
                "monitoring.dashboards.enabled=true",
            ],
        );
        assert!(lint.status.success(), "{tool:?} lint: {}", text(&lint));
    }
}

/// Covers: R17.3a
///
/// `helm upgrade --reuse-values` from a release older than the monitoring
/// values validates and renders values without them (`--set monitoring=null`
/// removes them the same way): no value is required, and the monitoring
/// templates render nothing.
#[test]
fn values_without_the_monitoring_ones_still_render() {
    for tool in HELMS {
        let out = template(
            tool,
            &[
                "--set",
                "monitoring=null",
                "--set",
                "networkPolicy.cilium.enabled=true",
            ],
        );
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        assert!(!text(&out).contains("monitoring.coreos.com"), "{tool:?}");
    }
}
