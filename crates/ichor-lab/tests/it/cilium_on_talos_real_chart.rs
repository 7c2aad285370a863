//! The lab's Cilium-on-Talos conditions against the real Cilium chart,
//! rendered by the real helm: Ichor's effective values pass them on the
//! Talos node they were derived for, for every tunnel, kube-proxy mode and
//! node count; the chart's own defaults and each Talos value changed back to
//! the chart's default fail them, each with its reason.

use std::collections::BTreeMap;
use std::path::Path;

use ichor_cilium::{ClusterSettings, KubeProxyMode, Tunnel, effective_values};
use ichor_lab::cilium_on_talos::{TalosNode, judge_agent};
use ichor_testenv::Tool;
use ichor_testenv::tools::require_cilium_chart;
use serde_json::{Map, Value, json};

/// The agent DaemonSet and the `cilium-config` data the real chart renders.
fn render(chart: &Path, values: &Map<String, Value>) -> (Value, BTreeMap<String, String>) {
    let objects = ichor_testenv::tools::template_cilium(Tool::Helm4, chart, values);
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let config: BTreeMap<String, String> =
        serde_json::from_value(find("ConfigMap", "cilium-config")["data"].clone()).unwrap();
    (find("DaemonSet", "cilium"), config)
}

fn node(kube_proxy: KubeProxyMode) -> TalosNode {
    TalosNode {
        kube_proxy: kube_proxy == KubeProxyMode::Enabled,
        kube_prism_port: Some(7445),
    }
}

/// Covers: R1.4b, R7.3.
#[test]
fn ichors_values_run_on_talos_and_the_charts_defaults_do_not() {
    let chart = require_cilium_chart();
    for tunnel in [Tunnel::Vxlan, Tunnel::Geneve] {
        for kp in [KubeProxyMode::Enabled, KubeProxyMode::Replaced] {
            for nodes in [1, 3] {
                let s = ClusterSettings::new(tunnel, kp, nodes);
                let (ds, config) = render(&chart, &effective_values(&s).unwrap());
                assert_eq!(judge_agent(&ds, Some(&config), &node(kp)), Ok(()), "{s:?}");
                // The values for kube-proxy do not run where Talos disabled it.
                if kp == KubeProxyMode::Enabled {
                    let why = judge_agent(&ds, Some(&config), &node(KubeProxyMode::Replaced))
                        .expect_err("nothing would serve Services");
                    assert!(why.message.contains("kubeProxyReplacement=true"), "{why:?}");
                }
            }
        }
    }

    let (ds, config) = render(&chart, &Map::new());
    let why = judge_agent(&ds, Some(&config), &node(KubeProxyMode::Enabled)).unwrap_err();
    assert!(why.message.contains("SYS_MODULE"), "{why:?}");

    // Each Talos value set back to the chart's default, the rest kept.
    let base = effective_values(&ClusterSettings::new(
        Tunnel::Vxlan,
        KubeProxyMode::Replaced,
        3,
    ))
    .unwrap();
    let cases: [(&str, Value, &str); 5] = [
        ("/ipam/mode", json!("cluster-pool"), "ipam.mode=kubernetes"),
        (
            "/cgroup/autoMount/enabled",
            json!(true),
            "cgroup.autoMount.enabled=false",
        ),
        (
            "/cgroup/hostRoot",
            json!("/run/cilium/cgroupv2"),
            "cgroup.hostRoot=/sys/fs/cgroup",
        ),
        (
            "/securityContext/capabilities/cleanCiliumState",
            json!(["NET_ADMIN", "SYS_MODULE", "SYS_ADMIN", "SYS_RESOURCE"]),
            "SYS_MODULE",
        ),
        ("/k8sServicePort", json!(6443), "k8sServicePort=7445"),
    ];
    for (pointer, value, expected) in cases {
        let mut v = Value::Object(base.clone());
        *v.pointer_mut(pointer).unwrap() = value;
        let (ds, config) = render(&chart, v.as_object().unwrap());
        let why = judge_agent(&ds, Some(&config), &node(KubeProxyMode::Replaced)).unwrap_err();
        assert!(why.message.contains(expected), "{pointer}: {why:?}");
    }
}
