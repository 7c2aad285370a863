//! The TalosCluster check the admission webhook runs, as a pure function
//! over the raw object (so an unknown enum value gets a message a person
//! understands, not a decoding error).
//!
//! The CRD's CEL rules already refuse some of these (tunnel immutability,
//! the top-level Ichor-owned Cilium keys, enums) and the apiserver runs them
//! even when the webhook is down. This check says them again so that every
//! refusal reads the same, and adds what CEL cannot say: the nested
//! Ichor-owned Cilium keys (`ipam.mode`, `cgroup.*`, ...) and an unknown
//! preset named with the ones that exist.

use serde_json::Value;

use crate::Tunnel;
use crate::cilium::{self, NullAbove};
use crate::cluster::one_of;

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// Checks a TalosCluster (`old` on an update) and returns every refusal,
/// each a sentence that says what is wrong and what to do. Empty: allowed.
pub fn talos_cluster(old: Option<&Value>, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let preset = at(new, &["spec", "cni", "preset"])
        .and_then(Value::as_str)
        .unwrap_or("cilium");
    if !["cilium", "unmanaged"].contains(&preset) {
        out.push(format!(
            "spec.cni.preset {preset:?} is not a preset Ichor knows: use cilium (Ichor installs and owns Cilium) or unmanaged (the CNI is yours and Ichor leaves it alone)"
        ));
    }
    tunnel_problems(old, new, &mut out);
    if let Some(values) = at(new, &["spec", "cni", "cilium", "values"]) {
        values_problems(values, &mut out);
        let opted_in = at(
            new,
            &[
                "metadata",
                "annotations",
                crate::PRIVILEGED_VALUES_ANNOTATION,
            ],
        )
        .and_then(Value::as_str)
            == Some("true");
        let privileged = privileged_values(values);
        if !privileged.is_empty() && !opted_in {
            out.push(format!(
                "spec.cni.cilium.values sets {}: Ichor applies these values as a cluster-admin Job, so they would give whoever edits this TalosCluster control of every node; remove them, or have a cluster admin set the annotation {}: \"true\" (see docs/security.md)",
                privileged.join(", "),
                crate::PRIVILEGED_VALUES_ANNOTATION
            ));
        }
    }
    out
}

/// Keys of Cilium chart values that choose what runs, and as whom, with
/// the agent's privileges: images, host paths, extra or init containers and
/// ServiceAccounts. (The agent's own capabilities are Ichor's to set.)
const PRIVILEGED_KEYS: &[&str] = &[
    "image",
    "hostPath",
    "extraHostPathMounts",
    "extraVolumes",
    "extraVolumeMounts",
    "extraContainers",
    "extraInitContainers",
    "initContainers",
    "sidecars",
    "serviceAccounts",
    "serviceAccount",
    "serviceAccountName",
];

/// The paths of `values` (dotted) that set a privileged key, at any depth.
pub fn privileged_values(values: &Value) -> Vec<String> {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    let here = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    if PRIVILEGED_KEYS.contains(&k.as_str()) && !child.is_null() {
                        out.push(here);
                    } else {
                        walk(child, &here, out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(values, "", &mut out);
    out
}

/// An unknown tunnel, and a tunnel that changes (absent means the API default).
fn tunnel_problems(old: Option<&Value>, new: &Value, out: &mut Vec<String>) {
    let tunnel = |v: &Value| {
        at(v, &["spec", "cni", "tunnel"])
            .and_then(Value::as_str)
            .unwrap_or(Tunnel::default().as_str())
            .to_owned()
    };
    let new_tunnel = tunnel(new);
    if new_tunnel.parse::<Tunnel>().is_err() {
        out.push(format!(
            "spec.cni.tunnel {new_tunnel:?} is not a tunnel protocol Cilium supports: use {}",
            one_of(&Tunnel::ALL.map(Tunnel::as_str))
        ));
    }
    if let Some(old) = old {
        let old_tunnel = tunnel(old);
        if old_tunnel != new_tunnel {
            out.push(format!(
                "spec.cni.tunnel cannot change from {old_tunnel} to {new_tunnel}: changing the tunnel protocol of a running cluster breaks pod traffic between nodes; set it back to {old_tunnel}, or create the cluster again to change it"
            ));
        }
    }
}

/// User Cilium values that are not a mapping or set an Ichor-owned path.
fn values_problems(values: &Value, out: &mut Vec<String>) {
    match values {
        Value::Null => {}
        Value::Object(map) => {
            let owned = cilium::owned_paths_in(map, NullAbove::Replaces);
            if !owned.is_empty() {
                out.push(format!(
                    "spec.cni.cilium.values sets {}, which Ichor owns and sets itself; remove {} and use the TalosCluster's own fields where there is one (spec.cni.tunnel for tunnelProtocol, spec.cni.kubeProxy for kubeProxyReplacement)",
                    owned.join(", "),
                    if owned.len() == 1 { "it" } else { "them" }
                ));
            }
        }
        other => out.push(format!(
            "spec.cni.cilium.values must be a mapping of Cilium chart values, got {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Covers: R18.2
    #[test]
    fn privileged_cilium_values_need_the_admins_opt_in() {
        let with = |values: Value, annotations: Value| {
            json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
                "metadata": {"name": "c", "annotations": annotations},
                "spec": {"endpoint": "https://x:6443", "cni": {"preset": "cilium", "cilium": {"values": values}}}})
        };
        for values in [
            json!({"image": {"repository": "evil/cilium"}}),
            json!({"operator": {"image": {"tag": "v0"}}}),
            json!({"extraVolumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            json!({"extraInitContainers": [{"name": "x", "image": "busybox"}]}),
            json!({"serviceAccounts": {"cilium": {"name": "cluster-admin-sa"}}}),
            json!({"hubble": {"relay": {"extraVolumeMounts": [{"name": "root", "mountPath": "/host"}]}}}),
        ] {
            let refused = talos_cluster(None, &with(values.clone(), json!({})));
            assert_eq!(refused.len(), 1, "{values}: {refused:?}");
            assert!(
                refused[0].contains(crate::PRIVILEGED_VALUES_ANNOTATION),
                "{}",
                refused[0]
            );
            let opted = with(
                values.clone(),
                json!({crate::PRIVILEGED_VALUES_ANNOTATION: "true"}),
            );
            assert!(talos_cluster(None, &opted).is_empty(), "{values}");
        }
        let plain = with(
            json!({"hubble": {"enabled": true}, "debug": {"enabled": true}}),
            json!({}),
        );
        assert!(talos_cluster(None, &plain).is_empty());
        assert_eq!(
            privileged_values(&json!({"a": [{"image": "x"}], "b": {"image": null}})),
            vec!["a[0].image".to_owned()]
        );
    }

    fn cluster(cni: Value) -> Value {
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "c"}, "spec": {"endpoint": "https://x:6443", "cni": cni}})
    }

    /// Covers: R1.4a
    #[test]
    fn a_changed_tunnel_is_refused_with_what_to_do() {
        let old = cluster(json!({"preset": "cilium", "tunnel": "vxlan"}));
        let new = cluster(json!({"preset": "cilium", "tunnel": "geneve"}));
        let p = talos_cluster(Some(&old), &new);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("cannot change from vxlan to geneve"),
            "{}",
            p[0]
        );
        assert!(talos_cluster(Some(&old), &old).is_empty());
        // Absent means the API default, vxlan.
        assert!(talos_cluster(Some(&cluster(json!({}))), &old).is_empty());
    }

    #[test]
    fn an_unknown_preset_is_refused_naming_the_known_ones() {
        let p = talos_cluster(None, &cluster(json!({"preset": "calico"})));
        assert_eq!(p.len(), 1);
        assert!(
            p[0].contains("\"calico\"") && p[0].contains("cilium") && p[0].contains("unmanaged")
        );
    }

    #[test]
    fn an_unknown_tunnel_is_refused_naming_the_known_ones() {
        let p = talos_cluster(None, &cluster(json!({"tunnel": "ipip"})));
        assert_eq!(
            p,
            vec![
                "spec.cni.tunnel \"ipip\" is not a tunnel protocol Cilium supports: use vxlan or geneve"
            ]
        );
    }

    /// Covers: R1.4c
    #[test]
    fn ichor_owned_cilium_values_are_refused_top_level_and_nested() {
        let v = cluster(json!({"preset": "cilium", "cilium": {"values": {
            "tunnelProtocol": "geneve", "ipam": {"mode": "cluster-pool"}, "hubble": {"enabled": true}}}}));
        let p = talos_cluster(None, &v);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("tunnelProtocol, ipam.mode"), "{}", p[0]);
        let ok = cluster(
            json!({"preset": "cilium", "cilium": {"values": {"hubble": {"enabled": true}, "ipam": {"operator": {}}}}}),
        );
        assert!(talos_cluster(None, &ok).is_empty());
        // A scalar above an owned key replaces it: refused too.
        let above = cluster(json!({"preset": "cilium", "cilium": {"values": {"cgroup": "x"}}}));
        assert!(talos_cluster(None, &above)[0].contains("cgroup"));
    }
}
