//! The chart's alert rules and dashboard with the real promtool (Debian's
//! Prometheus package, which `tools/testbin.sh` unpacks into the tools
//! cache): the rules load, each alert fires for its cause and stays quiet
//! without it, and every dashboard query is valid PromQL.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ichor_testenv::Tool;
use ichor_testenv::tools::repo_root;
use serde_json::Value;

/// The rule file the chart's PrometheusRule carries (and the lab loads).
pub(crate) fn rules_file() -> PathBuf {
    repo_root()
        .join(ichor_dist::CHART_DIR)
        .join("files/prometheus-rules.yaml")
}

/// The chart's Grafana dashboard.
pub(crate) fn dashboard_file() -> PathBuf {
    repo_root()
        .join(ichor_dist::CHART_DIR)
        .join("files/dashboards/ichor.json")
}

/// promtool's unit tests of the rules.
fn rule_tests_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/promtool/alerts.test.yaml")
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(Tool::Promtool.path())
        .args(args)
        .output()
        .expect("run promtool")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} cannot be read: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every alerting rule of the chart's rule file.
pub(crate) fn alerts() -> Vec<Value> {
    yaml(&rules_file())["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Covers: R17.2a
///
/// `promtool check rules` passes on the chart's rule file, duplicates
/// being fatal.
#[test]
fn promtool_checks_the_rules() {
    let out = run(&[
        "check".as_ref(),
        "rules".as_ref(),
        "--lint=duplicate-rules".as_ref(),
        "--lint-fatal".as_ref(),
        rules_file().as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Covers: R17.2a
///
/// `promtool test rules`: each alert fires in a series built for its cause,
/// with its labels and annotations, and stays quiet in one without it.
#[test]
fn promtool_rule_tests_pass() {
    // The test file names the rule file by its bare name: both side by side.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(rules_file(), dir.path().join("prometheus-rules.yaml")).unwrap();
    let tests = dir.path().join("alerts.test.yaml");
    std::fs::copy(rule_tests_file(), &tests).unwrap();
    let out = run(&["test".as_ref(), "rules".as_ref(), tests.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Covers: R17.2a
///
/// Every alert has a firing and a non-firing case in promtool's tests, every
/// test sets its interval (promtool 2.42 has no default), and no test names
/// an alert the rules do not have.
#[test]
fn every_alert_has_a_firing_and_a_quiet_case() {
    let names: BTreeSet<String> = alerts()
        .iter()
        .map(|a| a["alert"].as_str().unwrap().to_string())
        .collect();
    let tests = yaml(&rule_tests_file());
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for (i, test) in tests["tests"].as_array().expect("tests").iter().enumerate() {
        assert!(
            test["interval"].as_str().is_some(),
            "test {i} has no interval"
        );
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_string();
            assert!(names.contains(&name), "test {i} names no alert: {name}");
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            if fires {
                firing.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let no_firing: Vec<_> = names.difference(&firing).collect();
    let no_quiet: Vec<_> = names.difference(&quiet).collect();
    assert!(
        no_firing.is_empty(),
        "alerts never seen firing: {no_firing:?}"
    );
    assert!(no_quiet.is_empty(), "alerts never seen quiet: {no_quiet:?}");
}

/// The anchors GitHub gives the headings of a Markdown file.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// Covers: R17.2a
///
/// Every alert has a severity, a summary, a description and a runbook_url
/// pointing at its own section of docs/runbooks.md.
#[test]
fn every_alert_says_what_happened_and_where_its_runbook_is() {
    let runbooks = std::fs::read_to_string(repo_root().join("docs/runbooks.md")).unwrap();
    let sections = anchors(&runbooks);
    let alerts = alerts();
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    for a in alerts {
        let name = a["alert"].as_str().unwrap();
        assert!(
            name.starts_with("Ichor"),
            "{name}: alerts share the Ichor prefix"
        );
        assert!(
            ["critical", "warning", "info"]
                .contains(&a["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity {}",
            a["labels"]["severity"]
        );
        for k in ["summary", "description"] {
            assert!(
                a["annotations"][k].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: no {k}"
            );
        }
        let url = a["annotations"]["runbook_url"].as_str().unwrap_or("");
        let anchor = name.to_lowercase();
        assert_eq!(
            url,
            format!("{}#{anchor}", ichor_dist::monitoring::RUNBOOK_URL),
            "{name}"
        );
        assert!(
            sections.contains(&anchor),
            "{name}: docs/runbooks.md has no section {anchor}"
        );
    }
}

/// Covers: R17.2b
///
/// The dashboard follows Grafana's dashboard linter's rules: a datasource
/// variable used by every panel, a cluster variable, `$__rate_interval` in
/// every rate, and every query valid PromQL (promtool checks them wrapped
/// as recording rules).
#[test]
fn every_dashboard_query_is_valid_promql() {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard_file()).unwrap()).unwrap();
    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(
        vars.contains(&"datasource") && vars.contains(&"cluster"),
        "{vars:?}"
    );
    let uid = dashboard["uid"].as_str().unwrap();
    assert!((8..=40).contains(&uid.len()), "uid {uid}");
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        for target in panel["targets"].as_array().expect("targets") {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    let queries = ichor_dist::monitoring::panel_queries(&dashboard);
    assert!(queries.len() >= 8, "{} queries", queries.len());
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let (title, expr) = (&q.panel, &q.expr);
        for f in ["rate(", "increase(", "irate("] {
            if expr.contains(f) {
                assert!(
                    expr.contains("[$__rate_interval]"),
                    "{title}: {f} without [$__rate_interval]: {expr}"
                );
            }
        }
        rules.push_str(&format!(
            "      - record: dashboard:panel_{i}\n        expr: {}\n",
            serde_json::to_string(&q.promql()).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, &rules).unwrap();
    let out = run(&["check".as_ref(), "rules".as_ref(), file.as_os_str()]);
    assert!(out.status.success(), "{}\n{rules}", text(&out));
}
