//! The chart's values as Rust types: `dist/chart/values.schema.json` is
//! generated from them (schemars), so Helm refuses on install, upgrade,
//! template and lint a value the chart does not read (every object is
//! closed: `additionalProperties: false`) or one of the wrong type, naming
//! its path. `values.yaml` must deserialize into [`Values`] (a test), so the
//! schema and the defaults cannot drift apart.
//!
//! Draft 7, with every definition in the file: Helm up to 3.18 validates
//! with gojsonschema (drafts 4-7), later ones with a 2020-12 validator that
//! reads draft 7 too, and a remote `$ref` would break offline installs.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Where the schema lives in the chart.
pub const SCHEMA_FILE: &str = "values.schema.json";

/// Every value of Ichor's chart.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Values of Ichor's chart")]
pub struct Values {
    pub manager: Manager,
    pub image_pull_secrets: Vec<LocalObjectReference>,
    pub webhook: Webhook,
    pub crd: Crd,
    pub preflight: Preflight,
    pub cni_helm: Enabled,
    pub installer: Installer,
    pub network_policy: NetworkPolicy,
    #[serde(rename = "ichorUI")]
    pub ichor_ui: IchorUi,
    pub backup: Backup,
    pub settings: Settings,
    pub monitoring: Monitoring,
}

/// The controller (reconcilers, CNI hand-over, admission webhooks).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Manager {
    pub image: Image,
    /// More than one replica elects a leader through a Lease.
    pub replicas: u32,
    /// How often every object is looked at again (a duration: 30s, 5m, 1h).
    pub resync: String,
    pub resources: Resources,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Map<String, Value>>,
    pub affinity: Map<String, Value>,
}

/// An image and how it is pulled.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Image {
    pub repository: String,
    /// Empty: the chart's appVersion (with its v).
    pub tag: String,
    pub pull_policy: PullPolicy,
}

/// Kubernetes's image pull policies.
#[derive(Debug, Deserialize, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// An image of the web UI (pulled as the controller's is).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UiImage {
    pub repository: String,
    /// Empty: the chart's appVersion (with its v).
    pub tag: String,
}

/// A container's requests and limits, as Kubernetes takes them.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
}

/// A Kubernetes quantity: `100m`, `64Mi`, or a number.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Quantity {
    Text(String),
    Number(f64),
}

/// An image pull Secret, by name.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalObjectReference {
    pub name: String,
}

/// The admission webhooks for TalosClusters and TalosMachines.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Webhook {
    pub enabled: bool,
    pub failure_policy: FailurePolicy,
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: u32,
    #[schemars(range(min = 1))]
    pub cert_validity_days: u32,
}

/// What the API server does when a webhook cannot be reached.
#[derive(Debug, Deserialize, JsonSchema)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Crd {
    /// Keep Ichor's CRDs (and so every TalosCluster and TalosMachine) on
    /// `helm uninstall`.
    pub keep: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Preflight {
    /// Refuse to install on a cluster with no pod network.
    pub cni: bool,
}

/// A part of the chart that is on or off.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Enabled {
    pub enabled: bool,
}

/// The installer Job's identity.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Installer {
    pub enabled: bool,
    pub image: Repository,
}

/// An image repository (the tag is the chart's appVersion).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Repository {
    pub repository: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    pub cilium: CiliumPolicies,
}

/// Ichor's CiliumNetworkPolicies for ichor-system.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CiliumPolicies {
    /// true renders them (the cluster must run Cilium); null or false
    /// renders none.
    pub enabled: Option<bool>,
}

/// The web UI (`ichor ui`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IchorUi {
    pub enabled: bool,
    pub image: UiImage,
    /// HTTPS port of the UI, 1-65535 (the chart says so when it is not).
    pub port: u32,
    /// Deprecated, opt-in: a plain-HTTP port as well (null: none).
    pub plaintext_port: Option<u32>,
    pub resources: Resources,
    pub tls: UiTls,
}

/// The certificate the UI serves.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UiTls {
    /// The kubernetes.io/tls Secret the UI serves; empty: self-signed.
    pub cert_secret: String,
    pub ca_config_map: String,
    pub ca_secret: String,
    pub ca_key: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Backup {
    pub volume: BackupVolume,
}

/// Backups to a volume: one PersistentVolumeClaim mounted into the controller.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BackupVolume {
    /// Empty: none is mounted.
    pub claim_name: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Settings {
    /// The UI writes nothing when true.
    pub read_only: bool,
}

/// Prometheus and Grafana objects, for a cluster running the Prometheus
/// Operator. Everything is off by default.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Monitoring {
    pub service_monitor: ScrapeMonitor,
    pub pod_monitor: ScrapeMonitor,
    /// Under `networkPolicy.cilium.enabled`, the Cilium endpoint selectors
    /// of the pods allowed to scrape the controller.
    pub scrape_from: Vec<Map<String, Value>>,
    pub prometheus_rule: PrometheusRule,
    pub dashboards: Dashboards,
}

/// A Prometheus duration or empty: the Prometheus Operator's own pattern
/// for an endpoint's interval (it takes the empty text too).
const DURATION: &str =
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$";

/// A ServiceMonitor or a PodMonitor for the controller's /metrics (one of
/// the two, never both).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScrapeMonitor {
    pub enabled: bool,
    /// How often Prometheus scrapes (30s, 1m30s); empty: Prometheus's own.
    #[schemars(regex(pattern = DURATION))]
    pub interval: String,
    /// Empty: Prometheus's own.
    #[schemars(regex(pattern = DURATION))]
    pub scrape_timeout: String,
    /// Labels your Prometheus selects monitors by (kube-prometheus-stack:
    /// `release: <its release name>`).
    pub labels: BTreeMap<String, String>,
}

/// The PrometheusRule holding Ichor's alerts.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRule {
    pub enabled: bool,
    /// Labels your Prometheus selects rules by.
    pub labels: BTreeMap<String, String>,
    /// Where each alert's runbook_url points (a section per alert is added).
    pub runbook_url: String,
}

/// The Grafana dashboard, as a ConfigMap the Grafana sidecar picks up.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Dashboards {
    pub enabled: bool,
    /// Labels besides `grafana_dashboard: "1"`.
    pub labels: BTreeMap<String, String>,
    /// The ConfigMap's namespace (the one your Grafana sidecar watches);
    /// empty: the release's.
    pub namespace: String,
}

/// `values.schema.json`: the JSON Schema of [`Values`], pretty-printed
/// with a final newline.
///
/// No value is required: `helm upgrade --reuse-values` validates the
/// previous release's values, which lack every value added since, and
/// values.yaml gives them all anyway. The schema refuses what is there and
/// wrong, never what is missing.
pub fn schema_json() -> String {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let mut schema = serde_json::to_value(generator.into_root_schema_for::<Values>())
        .expect("a JSON Schema is JSON");
    drop_required(&mut schema);
    let mut text = serde_json::to_string_pretty(&schema).expect("a JSON Schema serialises");
    text.push('\n');
    text
}

/// Removes every `required` list of `schema`'s objects.
fn drop_required(schema: &mut Value) {
    match schema {
        Value::Object(m) => {
            if m.get("required").is_some_and(Value::is_array) {
                m.remove("required");
            }
            m.values_mut().for_each(drop_required);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_required),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values_yaml() -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(crate::CHART_DIR)
                .join("values.yaml"),
        )
        .expect("the chart's values.yaml")
    }

    /// Covers: R17.3a
    ///
    /// The defaults are exactly what the types describe: every key of
    /// values.yaml has a field (unknown keys are refused) of its type.
    #[test]
    fn values_yaml_deserializes_into_the_types() {
        let values: Values = serde_yaml_ng::from_str(&values_yaml()).expect("values.yaml");
        assert!(!values.monitoring.service_monitor.enabled);
        assert!(!values.monitoring.pod_monitor.enabled);
        assert!(!values.monitoring.prometheus_rule.enabled);
        assert!(!values.monitoring.dashboards.enabled);
    }

    /// Covers: R17.3a
    #[test]
    fn a_misspelled_key_does_not_deserialize() {
        let text = values_yaml().replace("  replicas: 1", "  replica: 1");
        let err = serde_yaml_ng::from_str::<Values>(&text).unwrap_err();
        assert!(err.to_string().contains("replica"), "{err}");
    }

    /// Covers: R17.3a
    ///
    /// Every object is closed and nothing is fetched: no `$ref` leaves the file.
    #[test]
    fn the_schema_is_closed_and_self_contained() {
        let schema: Value = serde_json::from_str(&schema_json()).unwrap();
        fn walk(v: &Value, path: &str, open: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                        assert!(r.starts_with("#/"), "{path}: remote $ref {r}");
                    }
                    if m.get("type") == Some(&Value::from("object"))
                        && m.contains_key("properties")
                        && m.get("additionalProperties") != Some(&Value::Bool(false))
                    {
                        open.push(path.to_string());
                    }
                    for (k, v) in m {
                        walk(v, &format!("{path}/{k}"), open);
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, path, open)),
                _ => {}
            }
        }
        let mut open = Vec::new();
        walk(&schema, "", &mut open);
        assert!(
            open.is_empty(),
            "objects with properties left open: {open:?}"
        );
        assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    }
}
