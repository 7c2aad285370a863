//! Ichor's effective Cilium values against the real Cilium chart (the chart
//! folder of Cilium's published Go module, copied into the tools cache by
//! `tools/testbin.sh`), rendered by the real helm v3 and v4 for every preset
//! that installs Cilium, both tunnels, both kube-proxy modes, and one- and
//! many-node clusters. Nobody here wrote the chart or helm: they judge.

use ichor_testenv::tools::template_cilium as template;

use ichor_cilium::{
    CHART_VERSION, ClusterSettings, KubeProxyMode, OWNED_KEYS, Tunnel, chart_version_of,
    effective_values, offline_chart,
};
use ichor_testenv::Tool;
use ichor_testenv::tools::{cilium_version, require_cilium_chart};
use serde_json::{Map, Value};

/// Every combination Ichor derives values for. A preset that installs no
/// Cilium has no values to render; the match keeps this list honest when a
/// preset is added.
fn settings() -> Vec<ClusterSettings> {
    let mut out = Vec::new();
    for preset in [
        ichor_api::CniPreset::Cilium,
        ichor_api::CniPreset::Unmanaged,
    ] {
        match preset {
            ichor_api::CniPreset::Cilium => {}
            ichor_api::CniPreset::Unmanaged => continue,
        }
        for tunnel in [Tunnel::Vxlan, Tunnel::Geneve] {
            for kube_proxy in [KubeProxyMode::Enabled, KubeProxyMode::Replaced] {
                for nodes in [1, 3] {
                    out.push(ClusterSettings::new(tunnel, kube_proxy, nodes));
                }
            }
        }
    }
    out
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the real chart rendered no {kind} {name}"))
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    pod[list].as_array()?.iter().find(|c| c["name"] == name)
}

fn added_capabilities(c: &Value) -> Vec<String> {
    c["securityContext"]["capabilities"]["add"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

/// The value at a dotted path of a values mapping.
fn at<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(values, |v, k| v.get(k))
}

/// The schema node of a dotted path in `values.schema.json`.
fn schema_at<'a>(schema: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(schema, |s, k| s.get("properties").and_then(|p| p.get(k)))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Covers: R1.4b, R7.4: the chart Ichor pins is the chart the
/// tools cache holds.
#[test]
fn the_tools_cache_holds_the_pinned_real_chart() {
    let chart = require_cilium_chart();
    assert_eq!(cilium_version(), format!("v{CHART_VERSION}"));
    assert_eq!(
        chart_version_of(&offline_chart(&chart)).as_deref(),
        Some(CHART_VERSION)
    );
    let meta: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(meta["name"], "cilium");
    assert!(
        !chart.join("templates/cilium-standin.yaml").exists()
            && chart
                .join("templates/cilium-agent/daemonset.yaml")
                .is_file(),
        "{} is not Cilium's own chart",
        chart.display()
    );
}

/// Covers: R1.4b, R7.4: every key Ichor owns is a key of the real
/// chart's values (values.yaml and values.schema.json), with a type the
/// schema allows.
#[test]
fn every_owned_key_is_a_key_of_the_real_chart() {
    let chart = require_cilium_chart();
    let defaults: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(chart.join("values.yaml")).unwrap())
            .unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart.join("values.schema.json")).unwrap())
            .unwrap();
    for s in settings() {
        let values = Value::Object(effective_values(&s).unwrap());
        for key in OWNED_KEYS {
            let Some(mine) = at(&values, key) else {
                // operator.replicas is owned on one-node clusters only.
                assert_eq!(key, "operator.replicas", "{s:?} lacks owned key {key}");
                continue;
            };
            assert!(
                at(&defaults, key).is_some(),
                "{key} is not a key of the real chart's values.yaml"
            );
            let node = schema_at(&schema, key)
                .unwrap_or_else(|| panic!("{key} is not in the real chart's values.schema.json"));
            let allowed: Vec<&str> = match &node["type"] {
                Value::String(t) => vec![t.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                other => panic!("{key}: schema type {other} not understood"),
            };
            let t = json_type(mine);
            assert!(
                allowed.contains(&t) || (t == "integer" && allowed.contains(&"number")),
                "{key}: Ichor writes a {t} ({mine}), the real chart's schema allows {allowed:?}"
            );
        }
    }
}

/// Covers: R1.4b, R7.4: the real chart renders with Ichor's
/// effective values under helm v3 and v4, for every preset, tunnel,
/// kube-proxy mode and node count, and renders what those values mean.
#[test]
fn the_real_chart_renders_ichors_values_with_helm_v3_and_v4() {
    let chart = require_cilium_chart();
    for s in settings() {
        let values = effective_values(&s).unwrap();
        for tool in [Tool::Helm3, Tool::Helm4] {
            let objects = template(tool, &chart, &values);
            let config = &find(&objects, "ConfigMap", "cilium-config")["data"];
            assert_eq!(config["ipam"], "kubernetes", "{tool:?} {s:?}");
            assert_eq!(config["tunnel-protocol"], s.tunnel.as_str(), "{s:?}");
            assert_eq!(config["cgroup-root"], "/sys/fs/cgroup", "{s:?}");
            let kpr = match s.kube_proxy {
                KubeProxyMode::Enabled => "false",
                KubeProxyMode::Replaced => "true",
            };
            assert_eq!(config["kube-proxy-replacement"], kpr, "{s:?}");

            let pod = &find(&objects, "DaemonSet", "cilium")["spec"]["template"]["spec"];
            let agent = container(pod, "containers", "cilium-agent").expect("agent container");
            let caps = added_capabilities(agent);
            assert!(!caps.contains(&"SYS_MODULE".to_string()), "{caps:?}");
            assert!(caps.contains(&"NET_ADMIN".to_string()), "{caps:?}");
            let clean = container(pod, "initContainers", "clean-cilium-state")
                .expect("clean-cilium-state init container");
            assert_eq!(
                added_capabilities(clean),
                ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"]
            );
            assert!(
                container(pod, "initContainers", "mount-cgroup").is_none(),
                "cgroup.autoMount.enabled=false renders no mount-cgroup"
            );
            assert_eq!(
                env(agent, "KUBERNETES_SERVICE_HOST"),
                Some(&"localhost".into())
            );
            assert_eq!(env(agent, "KUBERNETES_SERVICE_PORT"), Some(&"7445".into()));

            let operator = find(&objects, "Deployment", "cilium-operator");
            let replicas = operator["spec"]["replicas"].as_i64().unwrap();
            if s.node_count <= 1 {
                assert_eq!(replicas, 1, "{s:?}");
            } else {
                assert_eq!(replicas, 2, "the chart's default on {s:?}");
            }
        }
    }
}

/// The chart's own defaults are not Talos's: the same render without
/// Ichor's values differs on every owned key this test can see, so the
/// assertions above are not the chart's defaults passing by themselves.
#[test]
fn the_real_chart_defaults_differ_from_ichors_values() {
    let chart = require_cilium_chart();
    let objects = template(Tool::Helm4, &chart, &Map::new());
    let config = &find(&objects, "ConfigMap", "cilium-config")["data"];
    assert_eq!(config["ipam"], "cluster-pool");
    assert_ne!(config["cgroup-root"], "/sys/fs/cgroup");
    let pod = &find(&objects, "DaemonSet", "cilium")["spec"]["template"]["spec"];
    let agent = container(pod, "containers", "cilium-agent").unwrap();
    assert!(added_capabilities(agent).contains(&"SYS_MODULE".to_string()));
    assert!(container(pod, "initContainers", "mount-cgroup").is_some());
    assert!(env(agent, "KUBERNETES_SERVICE_HOST").is_none());
}
