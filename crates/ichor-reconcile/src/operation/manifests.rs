//! The last step of a kubernetes-upgrade: the bootstrap-manifests sync, as
//! `talosctl upgrade-k8s` ends (its last step), with Ichor's rules.
//!
//! **Where the manifests come from.** Talos renders them on each control
//! plane from its machine config as `Manifests.kubernetes.talos.dev`
//! resources (kube-proxy's DaemonSet at the config's proxy image, CoreDNS,
//! the inline manifests …), and that is what `talosctl upgrade-k8s` reads
//! and applies. Ichor reads the same resources over the Talos API from the
//! control plane of the step, after every component step wrote the new
//! images. It does not render them itself: the templates are Talos's and
//! change with each Talos release; reading them means the objects are what
//! that node's Talos would create, whatever its version (ADR 0014).
//!
//! **What the sync writes, and what it never does.**
//! - It never prunes and never creates: an object of the manifests that is
//!   missing is Talos's to create (its apply at boot creates the missing
//!   ones and never updates), so the sync only brings existing objects to
//!   what the new manifests say — the half Talos leaves to `upgrade-k8s`.
//!   Nothing is ever deleted, so a Cilium that left the manifests (the CNI
//!   hand-over, ADR 0015) stays; the inventory ConfigMap is not written.
//! - It never writes an object a Helm release owns (`meta.helm.sh/release-name`
//!   or `app.kubernetes.io/managed-by: Helm`): Ichor's Cilium release
//!   (R6.1) and any release of the user. A stale inline copy of Cilium in
//!   the manifests would otherwise revert it (talos#5640).
//! - It never writes an object another inventory owns (as Talos refuses).
//! - It writes only the kinds the controller may patch: ServiceAccounts,
//!   ConfigMaps, Services, DaemonSets and Deployments. Secrets (the
//!   controller never writes one, ADR 0007), RBAC objects (the API server
//!   lets a subject change a role only with every right in it) and other
//!   kinds are left as Talos's apply made them, and counted in the message.
//! - Server-side apply under the controller's field manager, forced: the
//!   fields the manifests set become the controller's, the rest of the
//!   object (Talos's owning-inventory annotation included) is kept. An
//!   apply of the same objects again changes nothing, so a controller
//!   killed mid-step reapplies on restart without effect.
//!
//! Here the decision ([`plan`]) and what the manifests hold ([`objects`]);
//! the controller's `operation::manifests` reads the cluster and applies.

use std::collections::BTreeMap;

use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, OWNING_INVENTORY_ANNOTATION, WORKLOADS_NAMESPACE,
};
use serde_json::Value;

/// The kinds the sync writes: (group, version, kind, plural).
pub const WRITABLE: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "ServiceAccount", "serviceaccounts"),
    ("", "v1", "ConfigMap", "configmaps"),
    ("", "v1", "Service", "services"),
    ("apps", "v1", "DaemonSet", "daemonsets"),
    ("apps", "v1", "Deployment", "deployments"),
];

/// One object of Talos's bootstrap manifests.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestObject {
    /// The Manifest resource it comes from (`10-kube-proxy`).
    pub manifest: String,
    pub group: String,
    pub version: String,
    pub kind: String,
    /// `default` for a namespaced object written without one (every
    /// writable kind is namespaced).
    pub namespace: String,
    pub name: String,
    /// The object to apply: server-set fields and `status` left out.
    pub body: Value,
}

impl std::fmt::Display for ManifestObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = if self.namespace.is_empty() {
            String::new()
        } else {
            format!("{}/", self.namespace)
        };
        write!(f, "{} {ns}{}", self.kind, self.name)
    }
}

/// What the live cluster says of one object before the sync.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
}

/// Why an object of the manifests is not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// Missing in the cluster: Talos's apply creates it.
    Missing,
    /// A Helm release owns it (the release, when named).
    HelmOwned(String),
    /// Another inventory owns it.
    ForeignInventory(String),
    /// A kind the controller does not write.
    NotWritten,
    /// A Deployment or DaemonSet outside `kube-system` without Talos's
    /// inventory annotation: the admission policy that bounds the
    /// controller lets it change the spec only of Talos's workloads.
    NotTalos,
}

/// The sync decided: the objects to apply, in order (ConfigMaps, accounts
/// and Services before the workloads that use them), and those left, each
/// with why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub apply: Vec<ManifestObject>,
    pub left: Vec<(ManifestObject, Left)>,
}

impl Plan {
    /// The step's message: what was applied and what was left, counted.
    pub fn summary(&self) -> String {
        let count = |f: fn(&Left) -> bool| self.left.iter().filter(|(_, l)| f(l)).count();
        let helm: Vec<String> = self
            .left
            .iter()
            .filter(|(_, l)| matches!(l, Left::HelmOwned(_)))
            .map(|(o, l)| match l {
                Left::HelmOwned(r) if !r.is_empty() => format!("{o} (Helm release {r})"),
                _ => o.to_string(),
            })
            .collect();
        let mut out = format!(
            "applied {} objects of Talos's bootstrap manifests",
            self.apply.len()
        );
        if !helm.is_empty() {
            out.push_str(&format!(
                "; left to their Helm release: {}",
                helm.join(", ")
            ));
        }
        let foreign = count(|l| matches!(l, Left::ForeignInventory(_)));
        if foreign > 0 {
            out.push_str(&format!("; {foreign} owned by another inventory left"));
        }
        let missing = count(|l| *l == Left::Missing);
        if missing > 0 {
            out.push_str(&format!("; {missing} missing, left for Talos to create"));
        }
        let not_talos = count(|l| *l == Left::NotTalos);
        if not_talos > 0 {
            out.push_str(&format!(
                "; {not_talos} workloads outside kube-system without Talos's inventory annotation left (the controller may not change them)"
            ));
        }
        let kinds = count(|l| *l == Left::NotWritten);
        if kinds > 0 {
            out.push_str(&format!(
                "; {kinds} of kinds Ichor does not write (RBAC, Secrets, others) left as Talos made them"
            ));
        }
        out.push_str("; nothing pruned");
        out
    }

    /// The image the plan gives kube-proxy's DaemonSet, if it holds one.
    pub fn kube_proxy_image(&self) -> Option<String> {
        self.apply
            .iter()
            .find(|o| o.kind == "DaemonSet" && o.name == "kube-proxy")
            .and_then(|o| first_image(&o.body))
    }
}

/// The image of a workload's first container.
pub fn first_image(body: &Value) -> Option<String> {
    body.pointer("/spec/template/spec/containers/0/image")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// An item of a served manifest that is not a Kubernetes object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "item {item} of manifest {manifest} is not a Kubernetes object (apiVersion, kind and metadata.name are needed)"
)]
pub struct NotAnObject {
    pub manifest: String,
    pub item: usize,
}

/// The objects of the manifests (`(id, objects)` in Talos's order), each
/// made ready to apply. An item that is not a Kubernetes object (no kind,
/// no name) is an error naming the manifest.
pub fn objects(
    manifests: &[(String, Vec<Value>)],
) -> std::result::Result<Vec<ManifestObject>, NotAnObject> {
    let mut out = Vec::new();
    for (id, items) in manifests {
        for (i, item) in items.iter().enumerate() {
            let text = |p: &str| item.pointer(p).and_then(Value::as_str).unwrap_or_default();
            let (api_version, kind, name) =
                (text("/apiVersion"), text("/kind"), text("/metadata/name"));
            if api_version.is_empty() || kind.is_empty() || name.is_empty() {
                return Err(NotAnObject {
                    manifest: id.clone(),
                    item: i,
                });
            }
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let mut body = item.clone();
            if let Some(o) = body.as_object_mut() {
                o.remove("status");
            }
            if let Some(md) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                for k in [
                    "resourceVersion",
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "managedFields",
                ] {
                    md.remove(k);
                }
            }
            let namespace = match text("/metadata/namespace") {
                "" if writable(group, kind).is_some() => "default".to_string(),
                ns => ns.to_string(),
            };
            out.push(ManifestObject {
                manifest: id.clone(),
                group: group.to_string(),
                version: version.to_string(),
                kind: kind.to_string(),
                namespace,
                name: name.to_string(),
                body,
            });
        }
    }
    Ok(out)
}

/// The row of [`WRITABLE`] for a kind, `None` when the sync does not write it.
pub fn writable(
    group: &str,
    kind: &str,
) -> Option<&'static (&'static str, &'static str, &'static str, &'static str)> {
    WRITABLE
        .iter()
        .find(|(g, _, k, _)| *g == group && *k == kind)
}

/// Whether the sync writes this kind at this version.
pub fn is_writable(o: &ManifestObject) -> bool {
    writable(&o.group, &o.kind).is_some_and(|(_, v, _, _)| *v == o.version)
}

/// A Deployment or DaemonSet: what the workloads admission policy bounds.
fn is_workload(o: &ManifestObject) -> bool {
    o.group == "apps" && matches!(o.kind.as_str(), "DaemonSet" | "Deployment")
}

/// The decision for every object, from what the cluster holds (`live`, by
/// object; absent = missing). Pure.
pub fn plan(objects: Vec<ManifestObject>, live: &dyn Fn(&ManifestObject) -> Option<Live>) -> Plan {
    let mut p = Plan::default();
    for o in objects {
        if !is_writable(&o) {
            p.left.push((o, Left::NotWritten));
            continue;
        }
        let Some(l) = live(&o) else {
            p.left.push((o, Left::Missing));
            continue;
        };
        if let Some(release) = helm_release(&l) {
            p.left.push((o, Left::HelmOwned(release)));
            continue;
        }
        match l.annotations.get(OWNING_INVENTORY_ANNOTATION) {
            Some(owner) if owner != INVENTORY_NAME => {
                let owner = owner.clone();
                p.left.push((o, Left::ForeignInventory(owner)));
            }
            None if is_workload(&o) && o.namespace != WORKLOADS_NAMESPACE => {
                p.left.push((o, Left::NotTalos));
            }
            _ => p.apply.push(o),
        }
    }
    p.apply.sort_by_key(|o| match o.kind.as_str() {
        "ConfigMap" | "ServiceAccount" => 0,
        "Service" => 1,
        _ => 2,
    });
    p
}

/// The Helm release that owns an object (`namespace/name`, or empty when
/// only the managed-by label says Helm), `None` when none does.
pub fn helm_release(l: &Live) -> Option<String> {
    match l.annotations.get("meta.helm.sh/release-name") {
        Some(name) => Some(match l.annotations.get("meta.helm.sh/release-namespace") {
            Some(ns) => format!("{ns}/{name}"),
            None => name.clone(),
        }),
        None => (l
            .labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("Helm"))
        .then(String::new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifests() -> Vec<(String, Vec<Value>)> {
        vec![
            (
                "10-kube-proxy".into(),
                vec![
                    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}}),
                    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kube-proxy"}}),
                    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "kube-proxy", "namespace": "kube-system", "resourceVersion": "7"},
                        "spec": {"template": {"spec": {"containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.37.0"}]}}},
                        "status": {"numberReady": 3}}),
                ],
            ),
            (
                "99-cilium".into(),
                vec![
                    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "namespace": "kube-system"}}),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cilium-config", "namespace": "kube-system"}}),
                    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cilium-ca", "namespace": "kube-system"}}),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "loose"}}),
                ],
            ),
        ]
    }

    fn helm() -> Live {
        Live {
            annotations: [
                (
                    "meta.helm.sh/release-name".to_string(),
                    "cilium".to_string(),
                ),
                (
                    "meta.helm.sh/release-namespace".to_string(),
                    "kube-system".to_string(),
                ),
            ]
            .into(),
            labels: [(
                "app.kubernetes.io/managed-by".to_string(),
                "Helm".to_string(),
            )]
            .into(),
        }
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (the sync never writes a Cilium a Helm release owns,
    /// never creates, writes only the kinds it may), R6.1
    #[test]
    fn helm_owned_missing_and_unwritten_kinds_are_left() {
        let objects = objects(&manifests()).unwrap();
        let p = plan(objects, &|o| match o.name.as_str() {
            "cilium" | "cilium-config" => Some(helm()),
            "kube-proxy" => Some(Live {
                annotations: [(
                    OWNING_INVENTORY_ANNOTATION.to_string(),
                    INVENTORY_NAME.to_string(),
                )]
                .into(),
                labels: BTreeMap::new(),
            }),
            _ => None,
        });
        let applied: Vec<String> = p.apply.iter().map(ToString::to_string).collect();
        assert_eq!(
            applied,
            [
                "ServiceAccount kube-system/kube-proxy",
                "DaemonSet kube-system/kube-proxy"
            ]
        );
        let left: Vec<(String, Left)> = p
            .left
            .iter()
            .map(|(o, l)| (o.to_string(), l.clone()))
            .collect();
        assert_eq!(
            left,
            [
                (
                    "ClusterRoleBinding kube-proxy".to_string(),
                    Left::NotWritten
                ),
                (
                    "DaemonSet kube-system/cilium".to_string(),
                    Left::HelmOwned("kube-system/cilium".into())
                ),
                (
                    "ConfigMap kube-system/cilium-config".to_string(),
                    Left::HelmOwned("kube-system/cilium".into())
                ),
                ("Secret kube-system/cilium-ca".to_string(), Left::NotWritten),
                ("ConfigMap default/loose".to_string(), Left::Missing),
            ]
        );
        assert_eq!(
            p.kube_proxy_image().as_deref(),
            Some("registry.k8s.io/kube-proxy:v1.37.0")
        );
        let s = p.summary();
        assert!(
            s.contains("applied 2 objects")
                && s.contains("DaemonSet kube-system/cilium (Helm release kube-system/cilium)")
                && s.contains("nothing pruned"),
            "{s}"
        );
        // Server-set fields and status never reach the apply.
        let ds = &p.apply[1].body;
        assert!(ds.get("status").is_none() && ds.pointer("/metadata/resourceVersion").is_none());
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (Talos refuses another inventory's object; so does the sync;
    /// the managed-by label alone marks Helm's)
    #[test]
    fn another_inventory_or_a_helm_label_leaves_the_object() {
        let objects = objects(&manifests()[..1]).unwrap();
        let p = plan(objects, &|o| {
            Some(match o.kind.as_str() {
                "DaemonSet" => Live {
                    annotations: [(OWNING_INVENTORY_ANNOTATION.to_string(), "other".to_string())]
                        .into(),
                    labels: BTreeMap::new(),
                },
                _ => Live {
                    annotations: BTreeMap::new(),
                    labels: [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "Helm".to_string(),
                    )]
                    .into(),
                },
            })
        });
        assert!(p.apply.is_empty());
        assert_eq!(p.left[0].1, Left::HelmOwned(String::new()));
        assert_eq!(p.left[2].1, Left::ForeignInventory("other".into()));
    }

    /// Covers: R18.2 (the sync changes a workload outside kube-system only
    /// when Talos's inventory stamped it: the admission policy refuses the
    /// controller any other, so the plan leaves it and says so)
    #[test]
    fn a_workload_outside_kube_system_talos_did_not_stamp_is_left() {
        let mut moved = objects(&manifests()[..1]).unwrap();
        for o in &mut moved {
            o.namespace = "apps".into();
        }
        let stamped = |o: &ManifestObject| Live {
            annotations: (o.name == "stamped")
                .then(|| {
                    (
                        OWNING_INVENTORY_ANNOTATION.to_string(),
                        INVENTORY_NAME.to_string(),
                    )
                })
                .into_iter()
                .collect(),
            labels: BTreeMap::new(),
        };
        let p = plan(moved.clone(), &|o| Some(stamped(o)));
        let ds = moved.iter().find(|o| o.kind == "DaemonSet").unwrap();
        assert!(
            p.left.contains(&(ds.clone(), Left::NotTalos)),
            "{:?}",
            p.left
        );
        assert!(p.apply.iter().all(|o| !is_workload(o)), "{:?}", p.apply);
        assert!(
            p.summary().contains("1 workloads outside kube-system"),
            "{}",
            p.summary()
        );
        let mut renamed = ds.clone();
        renamed.name = "stamped".into();
        let p = plan(vec![renamed.clone()], &|o| Some(stamped(o)));
        assert_eq!(p.apply, vec![renamed], "Talos's own workload is synced");
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (an item that is no object is named)
    #[test]
    fn an_item_without_kind_is_an_error_naming_the_manifest() {
        let bad = vec![(
            "99-x".to_string(),
            vec![json!({"apiVersion": "v1", "metadata": {"name": "a"}})],
        )];
        let e = objects(&bad).unwrap_err().to_string();
        assert!(e.contains("item 0 of manifest 99-x"), "{e}");
    }
}
