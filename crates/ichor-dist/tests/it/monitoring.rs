//! The chart's monitoring objects (ServiceMonitor or PodMonitor,
//! PrometheusRule, the Grafana dashboard's ConfigMap), rendered by the real
//! helm v3 and v4 and applied to the test API server with the Prometheus
//! Operator's CRDs, which `tools/testbin.sh` generates with controller-gen
//! from the operator's published Go types.

use std::path::PathBuf;

use ichor_testenv::tools::{cache_dir, repo_root};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;

use crate::chart::{HELMS, docs, template, text};
use crate::promtool::{dashboard_file, rules_file};

/// Everything on, with the labels kube-prometheus-stack selects by.
const ALL_ON: [&str; 12] = [
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
    "--set",
    "monitoring.prometheusRule.enabled=true",
    "--set",
    "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
    "--set",
    "monitoring.dashboards.enabled=true",
    "--set",
    "monitoring.serviceMonitor.interval=30s",
];

const POD_MONITOR: [&str; 4] = [
    "--set",
    "monitoring.podMonitor.enabled=true",
    "--set",
    "monitoring.podMonitor.labels.release=kube-prometheus-stack",
];

fn json(docs: &[serde_yaml_ng::Value]) -> Vec<Value> {
    docs.iter()
        .map(|d| serde_json::to_value(d).expect("a rendered object is JSON"))
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

/// Whether every label of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .expect("matchLabels")
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// Covers: R17.2c
///
/// Off by default: no monitoring object, no dashboard, no metrics Service.
#[test]
fn monitoring_is_off_by_default() {
    for tool in HELMS {
        let out = template(tool, &[]);
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        for o in json(&docs(&out)) {
            let api = o["apiVersion"].as_str().unwrap_or("");
            assert!(!api.starts_with("monitoring.coreos.com"), "{tool:?}: {o}");
            assert!(
                o["metadata"]["labels"].get("grafana_dashboard").is_none(),
                "{o}"
            );
            assert_ne!(o["metadata"]["name"], "ichor-controller-metrics", "{o}");
        }
    }
}

/// Covers: R17.2c
///
/// A ServiceMonitor and a PodMonitor together are refused, naming both values.
#[test]
fn a_service_monitor_and_a_pod_monitor_together_are_refused() {
    for tool in HELMS {
        let mut args = ALL_ON.to_vec();
        args.extend_from_slice(&POD_MONITOR);
        let out = template(tool, &args);
        assert!(!out.status.success(), "{tool:?}: {}", text(&out));
        let said = text(&out);
        assert!(
            said.contains(
                "monitoring.serviceMonitor.enabled and monitoring.podMonitor.enabled are both true"
            ),
            "{tool:?}: {said}"
        );
    }
}

/// Covers: R17.2c
///
/// Everything on: the ServiceMonitor scrapes port metrics of the Service
/// that selects the controller's pods, every object carries the extra
/// labels, the PrometheusRule's groups are the rule file's (runbook
/// address replaced when set), and the dashboard's ConfigMap carries the
/// sidecar's label and the dashboard file as it is.
#[test]
fn the_monitoring_objects_scrape_the_controller_and_carry_the_files() {
    let rules: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(rules_file()).unwrap()).unwrap();
    let dashboard = std::fs::read_to_string(dashboard_file()).unwrap();
    for tool in HELMS {
        let mut args = ALL_ON.to_vec();
        args.extend_from_slice(&[
            "--set",
            "monitoring.prometheusRule.runbookUrl=https://wiki.example/ichor",
            "--set",
            "monitoring.dashboards.namespace=monitoring",
        ]);
        let out = template(tool, &args);
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        let objects = json(&docs(&out));
        let deployment = find(&objects, "Deployment", "ichor-controller");
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let service = find(&objects, "Service", "ichor-controller-metrics");
        assert!(
            selects(&service["spec"]["selector"], pod_labels),
            "{service}"
        );
        assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
        let monitor = find(&objects, "ServiceMonitor", "ichor-controller");
        assert!(
            selects(
                &monitor["spec"]["selector"]["matchLabels"],
                &service["metadata"]["labels"]
            ),
            "{monitor}"
        );
        assert!(
            !selects(
                &monitor["spec"]["selector"]["matchLabels"],
                &find(&objects, "Service", "ichor-webhook")["metadata"]["labels"]
            ),
            "the ServiceMonitor selects the webhook's Service too"
        );
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["port"], "metrics");
        assert_eq!(endpoint["interval"], "30s");
        assert_eq!(endpoint["honorLabels"], true);
        assert_eq!(
            monitor["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );

        let rule = find(&objects, "PrometheusRule", "ichor");
        assert_eq!(
            rule["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );
        let want = serde_json::to_string(&rules["groups"]).unwrap().replace(
            ichor_dist::monitoring::RUNBOOK_URL,
            "https://wiki.example/ichor",
        );
        assert_eq!(
            serde_json::to_string(&rule["spec"]["groups"]).unwrap(),
            want
        );
        assert!(want.contains("https://wiki.example/ichor#ichorcontrollerdown"));

        let cm = find(&objects, "ConfigMap", "ichor-dashboards");
        assert_eq!(cm["metadata"]["namespace"], "monitoring");
        assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
        assert_eq!(
            cm["data"]["ichor.json"].as_str().unwrap(),
            dashboard.trim_end()
        );
    }
}

/// Covers: R17.2c
///
/// The PodMonitor selects the controller's pods and scrapes their port
/// metrics; no Service is added for it.
#[test]
fn the_pod_monitor_scrapes_the_controller_pods() {
    for tool in HELMS {
        let out = template(tool, &POD_MONITOR);
        assert!(out.status.success(), "{tool:?}: {}", text(&out));
        let objects = json(&docs(&out));
        let deployment = find(&objects, "Deployment", "ichor-controller");
        let pod = &deployment["spec"]["template"];
        let monitor = find(&objects, "PodMonitor", "ichor-controller");
        assert!(
            selects(
                &monitor["spec"]["selector"]["matchLabels"],
                &pod["metadata"]["labels"]
            ),
            "{monitor}"
        );
        let port = &monitor["spec"]["podMetricsEndpoints"][0]["port"];
        assert!(
            pod["spec"]["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| &p["name"] == port),
            "{monitor}"
        );
        assert_eq!(
            monitor["metadata"]["labels"]["release"],
            "kube-prometheus-stack"
        );
        assert!(
            !objects
                .iter()
                .any(|o| o["metadata"]["name"] == "ichor-controller-metrics")
        );
    }
}

/// The Prometheus Operator's CRDs that `tools/testbin.sh` generated:
/// `$ICHOR_PROMETHEUS_OPERATOR_CRDS`, else the cache folder of the pinned
/// version (`PROMETHEUS_OPERATOR_VERSION` in tools/versions.env).
fn prometheus_operator_crds() -> Vec<CustomResourceDefinition> {
    let dir = std::env::var_os("ICHOR_PROMETHEUS_OPERATOR_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let versions = std::fs::read_to_string(repo_root().join("tools/versions.env"))
                .expect("tools/versions.env");
            let version = versions
                .lines()
                .find_map(|l| l.strip_prefix("PROMETHEUS_OPERATOR_VERSION="))
                .expect("PROMETHEUS_OPERATOR_VERSION in tools/versions.env")
                .trim()
                .to_string();
            cache_dir().join(format!("prometheus-operator-crds-{version}"))
        });
    ["servicemonitors", "podmonitors", "prometheusrules"]
        .iter()
        .map(|plural| {
            let file = dir.join(format!("monitoring.coreos.com_{plural}.yaml"));
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
                panic!(
                    "{} cannot be read ({e}): run tools/testbin.sh (or make test), which generates the Prometheus Operator's CRDs with controller-gen",
                    file.display()
                )
            });
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        })
        .collect()
}

/// Server-side applies `object` into `ns` with strict field validation: an
/// unknown or ill-typed field is refused, not dropped.
async fn apply(client: &kube::Client, ns: &str, object: &Value) -> Result<(), kube::Error> {
    let (group, version) = object["apiVersion"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap();
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let mut object = object.clone();
    object["metadata"]["namespace"] = Value::from(ns);
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let params = PatchParams::apply("ichor-dist-test").validation_strict();
    api.patch(&name, &params, &Patch::Apply(&object)).await?;
    Ok(())
}

/// Covers: R17.2c
///
/// The ServiceMonitor, PodMonitor and PrometheusRule each helm renders are
/// accepted by the API server's validation against the Prometheus
/// Operator's CRDs (strict: no field dropped); a misspelled field is refused.
#[tokio::test]
async fn the_api_server_accepts_the_monitoring_objects() {
    let env = ichor_testenv::TestEnv::shared();
    let client = env.client().await;
    ichor_testenv::install::crds(&client, prometheus_operator_crds())
        .await
        .unwrap();
    let ns = env.namespace("monitoring").await;
    for tool in HELMS {
        let mut objects = Vec::new();
        for args in [&ALL_ON[..], &POD_MONITOR[..]] {
            let out = template(tool, args);
            assert!(out.status.success(), "{tool:?}: {}", text(&out));
            objects.extend(
                json(&docs(&out))
                    .into_iter()
                    .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1"),
            );
        }
        let mut kinds: Vec<_> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        kinds.sort_unstable();
        assert_eq!(
            kinds,
            ["PodMonitor", "PrometheusRule", "ServiceMonitor"],
            "{tool:?}"
        );
        for o in &objects {
            if let Err(e) = apply(&client, &ns, o).await {
                panic!("{tool:?}: the API server refused {}: {e}", o["kind"]);
            }
        }
    }
    let mut rule = serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "misspelled"},
        "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0", "four": "5m"}]}]},
    });
    let err = apply(&client, &ns, &rule).await.unwrap_err();
    assert!(err.to_string().contains("four"), "{err}");
    rule["spec"]["groups"][0]["rules"][0]["for"] =
        rule["spec"]["groups"][0]["rules"][0]["four"].take();
    rule["spec"]["groups"][0]["rules"][0]
        .as_object_mut()
        .unwrap()
        .remove("four");
    apply(&client, &ns, &rule).await.unwrap();
}

/// Covers: R17.2c
///
/// Under Ichor's Cilium policies (which admit only the API server and the
/// nodes), a monitor adds a policy admitting Prometheus pods of any
/// namespace to the controller's port metrics; without a monitor, none.
#[test]
fn cilium_policies_admit_prometheus_to_the_metrics_port() {
    for tool in HELMS {
        let policy = |extra: &[&str]| {
            let mut args = vec!["--set", "networkPolicy.cilium.enabled=true"];
            args.extend_from_slice(extra);
            let out = template(tool, &args);
            assert!(out.status.success(), "{tool:?}: {}", text(&out));
            let objects = json(&docs(&out));
            let pod_labels = find(&objects, "Deployment", "ichor-controller")["spec"]["template"]
                ["metadata"]["labels"]
                .clone();
            objects
                .into_iter()
                .find(|o| {
                    o["metadata"]["name"] == "ichor-controller-metrics"
                        && o["kind"] == "CiliumNetworkPolicy"
                })
                .map(|p| (p, pod_labels))
        };
        assert!(policy(&[]).is_none(), "{tool:?}");
        for monitor in [&ALL_ON[..2], &POD_MONITOR[..2]] {
            let (p, pod_labels) = policy(monitor).expect("the metrics policy");
            assert!(
                selects(&p["spec"]["endpointSelector"]["matchLabels"], &pod_labels),
                "{p}"
            );
            let ingress = &p["spec"]["ingress"][0];
            assert_eq!(ingress["toPorts"][0]["ports"][0]["port"], "8080");
            let from = &ingress["fromEndpoints"][0];
            assert_eq!(from["matchLabels"]["app.kubernetes.io/name"], "prometheus");
            assert_eq!(
                from["matchExpressions"][0]["key"],
                "k8s:io.kubernetes.pod.namespace"
            );
            assert_eq!(from["matchExpressions"][0]["operator"], "Exists");
        }
    }
}
