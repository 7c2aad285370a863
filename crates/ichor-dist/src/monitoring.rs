//! The chart's monitoring files, hand-written and shipped as they are: the
//! Prometheus rule file the PrometheusRule carries and the Grafana
//! dashboard. Tests and the lab load the same files through these paths,
//! so what they check is what the chart ships.

use serde_json::Value;

/// Ichor's alerts, a plain Prometheus rule file (relative to the workspace root).
pub const RULES_FILE: &str = "dist/chart/files/prometheus-rules.yaml";
/// Ichor's Grafana dashboard (relative to the workspace root).
pub const DASHBOARD_FILE: &str = "dist/chart/files/dashboards/ichor.json";
/// The runbook address written in [`RULES_FILE`], which the chart's
/// `monitoring.prometheusRule.runbookUrl` replaces.
pub const RUNBOOK_URL: &str = "https://github.com/maesh/ichor/blob/main/docs/runbooks.md";

/// One query of a dashboard panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelQuery {
    pub panel: String,
    /// As Grafana holds it, with its variables.
    pub expr: String,
}

impl PanelQuery {
    /// The query as Prometheus gets it from Grafana over every cluster:
    /// `$__rate_interval` and `$__range` given a duration, the cluster
    /// variable matching any value.
    pub fn promql(&self) -> String {
        self.expr
            .replace("$__rate_interval", "5m")
            .replace("$__range", "1h")
            .replace("${cluster}", ".+")
            .replace("$cluster", ".+")
    }
}

/// Every query of every panel of `dashboard` (a Grafana dashboard's JSON
/// model), in panel order.
pub fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(PanelQuery {
                    panel: panel["title"].as_str().unwrap_or_default().to_string(),
                    expr: expr.to_string(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn panel_queries_read_every_target_and_substitute_grafanas_variables() {
        let dashboard = json!({"panels": [
            {"type": "row", "title": "Row"},
            {"title": "Rate", "targets": [
                {"expr": "sum(rate(x_total{cluster=~\"$cluster\"}[$__rate_interval]))"},
                {"expr": "y{cluster=~\"${cluster}\"}"}
            ]}
        ]});
        let q = panel_queries(&dashboard);
        assert_eq!(q.len(), 2);
        assert_eq!(q[0].panel, "Rate");
        assert_eq!(q[0].promql(), "sum(rate(x_total{cluster=~\".+\"}[5m]))");
        assert_eq!(q[1].promql(), "y{cluster=~\".+\"}");
    }
}
