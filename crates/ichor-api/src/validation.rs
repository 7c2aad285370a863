//! The checks the admission webhooks run, as pure functions over the raw
//! objects (so an unknown enum value gets a message a person understands,
//! not a decoding error). They say the same as the CRD's CEL rules, which the
//! apiserver runs even when the webhook is down.

use serde_json::Value;

use crate::cilium;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The field, for example `spec.cni.tunnel`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// An object the webhook refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name} is refused: {}", .violations.iter().map(|v| v.message.as_str()).collect::<Vec<_>>().join("; "))]
pub struct Invalid {
    /// `TalosCluster`, `TalosMachine`, ...
    pub kind: &'static str,
    /// `namespace/name` of the object.
    pub name: String,
    /// Every problem found.
    pub violations: Vec<Violation>,
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(*k))
}

fn enum_check(obj: &Value, path: &[&str], allowed: &[&str], out: &mut Vec<Violation>) {
    let field = path.join(".");
    match at(obj, path) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => {}
        Some(other) => out.push(Violation {
            message: format!(
                "{field}: unknown value {other}; use one of {}",
                allowed.join(", ")
            ),
            field,
        }),
    }
}

fn name_of(obj: &Value) -> String {
    let ns = at(obj, &["metadata", "namespace"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = at(obj, &["metadata", "name"])
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}/{name}")
    }
}

/// Checks a TalosCluster being created (`old` is `None`) or updated.
pub fn talos_cluster(old: Option<&Value>, new: &Value) -> Result<(), Invalid> {
    let mut out = Vec::new();
    enum_check(
        new,
        &["spec", "cni", "preset"],
        &["cilium", "unmanaged"],
        &mut out,
    );
    enum_check(
        new,
        &["spec", "cni", "tunnel"],
        &["vxlan", "geneve"],
        &mut out,
    );
    enum_check(
        new,
        &["spec", "cni", "kubeProxy"],
        &["enabled", "replaced"],
        &mut out,
    );
    enum_check(
        new,
        &["spec", "cni", "unmanaged", "talosCNI"],
        &["none", "flannel", "custom"],
        &mut out,
    );

    let preset = at(new, &["spec", "cni", "preset"])
        .and_then(Value::as_str)
        .unwrap_or("cilium");
    if preset != "unmanaged" && at(new, &["spec", "cni", "unmanaged"]).is_some_and(|v| !v.is_null())
    {
        out.push(Violation {
            field: "spec.cni.unmanaged".into(),
            message: "spec.cni.unmanaged is only allowed with preset unmanaged; remove it or set preset: unmanaged".into(),
        });
    }
    if preset != "cilium" && at(new, &["spec", "cni", "cilium"]).is_some_and(|v| !v.is_null()) {
        out.push(Violation {
            field: "spec.cni.cilium".into(),
            message: "spec.cni.cilium is only allowed with preset cilium; remove it or set preset: cilium".into(),
        });
    }
    if let Some(values) = at(new, &["spec", "cni", "cilium", "values"]) {
        let owned = cilium::owned_keys_in(values);
        if !owned.is_empty() {
            out.push(Violation {
                field: "spec.cni.cilium.values".into(),
                message: format!(
                    "spec.cni.cilium.values must not set {}: Ichor owns them; set spec.cni.tunnel and spec.cni.kubeProxy instead",
                    owned.join(", ")
                ),
            });
        }
    }
    if let Some(old) = old {
        let tunnel = |o: &Value| {
            at(o, &["spec", "cni", "tunnel"])
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        if let (Some(before), after) = (tunnel(old), tunnel(new))
            && Some(&before) != after.as_ref()
        {
            out.push(Violation {
                field: "spec.cni.tunnel".into(),
                message: format!(
                    "spec.cni.tunnel is immutable once set (it is {before}): changing the tunnel protocol of a running cluster breaks pod traffic between nodes; create the cluster again to change it"
                ),
            });
        }
    }
    finish("TalosCluster", new, out)
}

/// Checks a TalosMachine being created (`old` is `None`) or updated.
pub fn talos_machine(old: Option<&Value>, new: &Value) -> Result<(), Invalid> {
    let mut out = Vec::new();
    enum_check(
        new,
        &["spec", "role"],
        &["controlplane", "worker"],
        &mut out,
    );
    if let Some(old) = old {
        if at(old, &["spec", "clusterRef"]) != at(new, &["spec", "clusterRef"]) {
            out.push(Violation {
                field: "spec.clusterRef".into(),
                message: "spec.clusterRef is immutable: a machine cannot move to another cluster; delete this TalosMachine and create a new one".into(),
            });
        }
        if at(old, &["spec", "role"]) != at(new, &["spec", "role"]) {
            out.push(Violation {
                field: "spec.role".into(),
                message: "spec.role is immutable: Talos cannot change a node's role in place; reinstall the node instead".into(),
            });
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for p in at(new, &["spec", "patches"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if names.contains(&name) {
            out.push(Violation {
                field: "spec.patches".into(),
                message: format!(
                    "spec.patches has two patches named {name:?}; give each patch its own name"
                ),
            });
        }
        names.push(name);
    }
    finish("TalosMachine", new, out)
}

fn finish(kind: &'static str, obj: &Value, violations: Vec<Violation>) -> Result<(), Invalid> {
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Invalid {
            kind,
            name: name_of(obj),
            violations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(cni: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "ichor-system"}, "spec": {
            "endpoint": "https://e:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "b"}, "cni": cni}})
    }

    /// Covers: R1.4a
    #[test]
    fn tunnel_change_is_refused() {
        let old = cluster(json!({"tunnel": "vxlan"}));
        let new = cluster(json!({"tunnel": "geneve"}));
        let err = talos_cluster(Some(&old), &new).expect_err("refused");
        assert_eq!(err.violations[0].field, "spec.cni.tunnel");
        assert!(err.to_string().starts_with("TalosCluster ichor-system/c is refused: spec.cni.tunnel is immutable once set (it is vxlan)"), "{err}");
        assert!(talos_cluster(Some(&old), &old).is_ok());
        assert!(talos_cluster(None, &new).is_ok());
    }

    #[test]
    fn unknown_preset_is_refused_in_words() {
        let err = talos_cluster(None, &cluster(json!({"preset": "calico"}))).expect_err("refused");
        assert_eq!(
            err.violations[0].message,
            "spec.cni.preset: unknown value \"calico\"; use one of cilium, unmanaged"
        );
    }

    /// Covers: R1.4c, R1.1c
    #[test]
    fn owned_values_and_preset_sections() {
        let err = talos_cluster(
            None,
            &cluster(json!({"cilium": {"values": {"k8sServicePort": 6443}}})),
        )
        .expect_err("refused");
        assert!(
            err.violations[0]
                .message
                .contains("must not set k8sServicePort"),
            "{err}"
        );
        let err = talos_cluster(None, &cluster(json!({"unmanaged": {"talosCNI": "none"}})))
            .expect_err("refused");
        assert_eq!(err.violations[0].field, "spec.cni.unmanaged");
        assert!(
            talos_cluster(
                None,
                &cluster(json!({"preset": "unmanaged", "unmanaged": {"talosCNI": "none"}}))
            )
            .is_ok()
        );
    }

    #[test]
    fn machine_identity_is_immutable() {
        let m = |c: &str, r: &str| json!({"metadata": {"name": "m"}, "spec": {"clusterRef": {"name": c}, "role": r, "address": "a"}});
        let err =
            talos_machine(Some(&m("a", "worker")), &m("b", "controlplane")).expect_err("refused");
        let fields: Vec<&str> = err.violations.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.clusterRef", "spec.role"]);
        let dup = json!({"metadata": {"name": "m"}, "spec": {"clusterRef": {"name": "a"}, "role": "worker", "address": "a",
            "patches": [{"name": "x", "inline": ""}, {"name": "x", "inline": ""}]}});
        assert!(talos_machine(None, &dup).is_err());
    }
}
