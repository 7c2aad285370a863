//! The bootstrap manifests an emulated control plane renders from its active
//! config, served as `Manifests.kubernetes.talos.dev` in namespace
//! `controlplane` (one resource per manifest, each item one object), which
//! is where `talosctl upgrade-k8s`'s manifests step reads them (see
//! docs/adr/0014-talos-operations.md and
//! docs/adr/0015-a-cilium-hand-over-talos-cannot-prune.md).
//!
//! What is played, and what is not:
//! - `10-kube-proxy` when kube-proxy is enabled: its ServiceAccount, the
//!   binding to `system:node-proxier` and the DaemonSet running the config's
//!   proxy image — the object an upgrade's image change reaches;
//! - `11-core-dns` when CoreDNS is enabled: its ServiceAccount, ConfigMap
//!   and Deployment at one fixed image (the emulator has no CoreDNS image in
//!   its config facts);
//! - each inline manifest of the config (`cluster.inlineManifests` of a
//!   v1alpha1 config, `KubeInlineManifestConfig` of the v1.14 shape), id
//!   `99-<name>`, its objects as written.
//!
//! The objects are the emulator's own small rendering, enough for a sync to
//! have something real to apply: Talos's full templates (Flannel, the
//! bootstrap RBAC, the kubeconfig-in-cluster ConfigMap) are not played, and
//! the ids of inline manifests are the emulator's choice.

use prost::Message;
use prost_types::value::Kind as ProtoKind;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use crate::derive::{ConfigFacts, documents};
use crate::resources::{Definition, Item};

/// The resource definition (`talosctl get manifests`).
pub const DEFINITION: Definition = Definition {
    namespace: kinds::MANIFESTS.namespace,
    r#type: kinds::MANIFESTS.r#type,
    display: "Manifest",
    extra_aliases: &[],
    sensitive: false,
    columns: &[],
};

/// The CoreDNS image the emulator renders.
pub const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.12.4";

/// The Manifests of a control plane whose active config is `active`.
pub fn manifest_items(facts: &ConfigFacts, active: &[u8]) -> Vec<Item> {
    let mut manifests: Vec<(String, Vec<Value>)> = Vec::new();
    if facts.proxy_enabled && !facts.proxy_image.is_empty() {
        manifests.push(("10-kube-proxy".into(), kube_proxy(&facts.proxy_image)));
    }
    if facts.coredns_enabled {
        manifests.push(("11-core-dns".into(), core_dns(&facts.dns_domain)));
    }
    for (name, contents) in inline_manifests(active) {
        let objects = documents(contents.as_bytes()).unwrap_or_default();
        manifests.push((format!("99-{name}"), objects));
    }
    manifests
        .into_iter()
        .map(|(id, objects)| item(&id, objects))
        .collect()
}

fn item(id: &str, objects: Vec<Value>) -> Item {
    let spec = specs::ManifestSpec {
        items: objects
            .iter()
            .map(|o| specs::SingleManifest {
                object: match to_proto(o).kind {
                    Some(ProtoKind::StructValue(s)) => Some(s),
                    _ => None,
                },
            })
            .collect(),
    };
    Item {
        namespace: kinds::MANIFESTS.namespace.to_string(),
        r#type: kinds::MANIFESTS.r#type.to_string(),
        id: id.to_string(),
        proto_spec: spec.encode_to_vec(),
        // Talos prints a Manifest as the list of its objects.
        yaml_spec: serde_yaml_ng::to_string(&Value::Sequence(objects)).unwrap_or_default(),
        annotations: Vec::new(),
    }
}

/// A YAML value as a `google.protobuf.Value` (numbers become doubles, as
/// in any `Struct`).
fn to_proto(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => ProtoKind::NullValue(0),
        Value::Bool(b) => ProtoKind::BoolValue(*b),
        Value::Number(n) => ProtoKind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => ProtoKind::StringValue(s.clone()),
        Value::Sequence(items) => ProtoKind::ListValue(prost_types::ListValue {
            values: items.iter().map(to_proto).collect(),
        }),
        Value::Mapping(m) => ProtoKind::StructValue(prost_types::Struct {
            fields: m
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), to_proto(v))))
                .collect(),
        }),
        Value::Tagged(t) => return to_proto(&t.value),
    };
    prost_types::Value { kind: Some(kind) }
}

/// The inline manifests of a config, in either shape: (name, contents).
fn inline_manifests(active: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in documents(active).unwrap_or_default() {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        if doc.get("kind").and_then(Value::as_str) == Some("KubeInlineManifestConfig") {
            if let (Some(name), Some(manifest)) = (s(&doc, "name"), s(&doc, "manifest")) {
                out.push((name, manifest));
            }
            continue;
        }
        let listed = doc
            .get("cluster")
            .and_then(|c| c.get("inlineManifests"))
            .and_then(Value::as_sequence);
        for m in listed.into_iter().flatten() {
            if let (Some(name), Some(contents)) = (s(m, "name"), s(m, "contents")) {
                out.push((name, contents));
            }
        }
    }
    out
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or(Value::Null)
}

fn kube_proxy(image: &str) -> Vec<Value> {
    vec![
        yaml(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: kube-proxy, namespace: kube-system}\n",
        ),
        yaml(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: kube-proxy}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'system:node-proxier'}\nsubjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]\n",
        ),
        yaml(&format!(
            "apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {{k8s-app: kube-proxy, tier: node}}
spec:
  selector:
    matchLabels: {{k8s-app: kube-proxy, tier: node}}
  template:
    metadata:
      labels: {{k8s-app: kube-proxy, tier: node}}
    spec:
      serviceAccountName: kube-proxy
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations: [{{operator: Exists}}]
      containers:
        - name: kube-proxy
          image: {image}
          command: [/usr/local/bin/kube-proxy, --cluster-cidr=10.244.0.0/16, --proxy-mode=iptables]
          securityContext: {{privileged: true}}
"
        )),
    ]
}

fn core_dns(domain: &str) -> Vec<Value> {
    vec![
        yaml(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: coredns, namespace: kube-system}\n",
        ),
        yaml(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: coredns, namespace: kube-system}}\ndata:\n  Corefile: |\n    .:53 {{\n        kubernetes {domain} in-addr.arpa ip6.arpa\n        forward . /etc/resolv.conf\n    }}\n"
        )),
        yaml(&format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 2
  selector:
    matchLabels: {{k8s-app: kube-dns}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      containers:
        - name: coredns
          image: {COREDNS_IMAGE}
          args: [-conf, /etc/coredns/Corefile]
"
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(proxy: bool) -> ConfigFacts {
        ConfigFacts {
            machine_type: crate::derive::MachineType::ControlPlane,
            hostname: None,
            kubeprism_port: None,
            cni_name: "none".into(),
            proxy_enabled: proxy,
            proxy_image: "registry.k8s.io/kube-proxy:v1.36.0".into(),
            apiserver_image: String::new(),
            controller_manager_image: String::new(),
            scheduler_image: String::new(),
            kubelet_image: String::new(),
            coredns_enabled: true,
            pod_subnets: Vec::new(),
            service_subnets: Vec::new(),
            dns_domain: "cluster.local".into(),
            control_plane_endpoint: None,
            cluster_id: String::new(),
            cluster_name: String::new(),
            has_kubernetes_network: true,
        }
    }

    fn decoded(item: &Item) -> specs::ManifestSpec {
        specs::ManifestSpec::decode(item.proto_spec.as_slice()).unwrap()
    }

    #[test]
    fn kube_proxy_core_dns_and_inline_manifests_in_both_shapes() {
        let legacy = b"version: v1alpha1\ncluster:\n  inlineManifests:\n    - name: cilium\n      contents: |\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: cilium-config, namespace: kube-system}\n";
        let items = manifest_items(&facts(true), legacy);
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["10-kube-proxy", "11-core-dns", "99-cilium"]);
        let proxy = decoded(&items[0]);
        let ds = proxy.items[2].object.as_ref().unwrap();
        let text = format!("{ds:?}");
        assert!(
            text.contains("registry.k8s.io/kube-proxy:v1.36.0"),
            "{text}"
        );
        assert_eq!(decoded(&items[2]).items.len(), 1);

        let multidoc = b"version: v1alpha1\n---\napiVersion: v1alpha1\nkind: KubeInlineManifestConfig\nname: extra\nmanifest: |\n  apiVersion: v1\n  kind: ServiceAccount\n  metadata: {name: a, namespace: default}\n";
        let items = manifest_items(&facts(false), multidoc);
        let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["11-core-dns", "99-extra"]);
    }
}
