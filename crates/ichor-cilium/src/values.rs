//! Effective values: the Cilium chart values Ichor installs, as a pure
//! function of the cluster settings and the kube-proxy mode. Ichor-owned
//! keys first, user values merged on top; a user value that would set an
//! Ichor-owned key is refused. The hash of the effective values is how the
//! controller recognises "the release is at the values it should have".

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use ichor_api::cilium::NullAbove;
// One node-count rule, in ichor-api beside the owned paths it decides.
pub use ichor_api::cilium::node_count_rule;

pub use ichor_api::{KubeProxyMode, Tunnel};

/// What the values depend on: the parts of a TalosCluster that matter to
/// Cilium, and the node count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSettings {
    pub tunnel: Tunnel,
    pub kube_proxy: KubeProxyMode,
    /// `spec.cni.cilium.values`: user values (a mapping), merged on top.
    #[serde(default)]
    pub user_values: Map<String, Value>,
    /// Nodes in the cluster; on a one-node cluster the operator runs one
    /// replica (its required anti-affinity would leave a second Pending).
    pub node_count: u32,
}

impl ClusterSettings {
    pub fn new(tunnel: Tunnel, kube_proxy: KubeProxyMode, node_count: u32) -> Self {
        ClusterSettings {
            tunnel,
            kube_proxy,
            user_values: Map::new(),
            node_count,
        }
    }

    pub fn with_user_values(mut self, values: Map<String, Value>) -> Self {
        self.user_values = values;
        self
    }
}

impl ClusterSettings {
    /// The settings of a `TalosCluster` (`spec.cni.tunnel`, `spec.cni.kubeProxy`,
    /// `spec.cni.cilium.values`) on a cluster of `node_count` nodes (the
    /// TalosCluster does not say how many nodes it has: count its
    /// TalosMachines or the Nodes).
    pub fn from_cluster(
        cluster: &ichor_api::TalosCluster,
        node_count: u32,
    ) -> Result<Self, ValuesError> {
        let cni = &cluster.spec.cni;
        let user_values = match cni.cilium.as_ref().and_then(|c| c.values.clone()) {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(ValuesError::NotAMap {
                    cluster: kube::ResourceExt::name_any(cluster),
                    got: other.to_string(),
                });
            }
        };
        Ok(ClusterSettings {
            tunnel: cni.tunnel,
            kube_proxy: cni.kube_proxy,
            user_values,
            node_count,
        })
    }
}

/// User values from a YAML (or JSON) file's text, as `--cilium-values FILE`
/// gives them: must be a mapping; an empty file is no values. Owned keys are
/// refused later, by [`effective_values`], with the settings at hand.
pub fn user_values_from_yaml(text: &str, file: &str) -> Result<Map<String, Value>, ValuesError> {
    let v: Value = serde_yaml_ng::from_str(text).map_err(|source| ValuesError::Yaml {
        file: file.into(),
        source,
    })?;
    match v {
        Value::Null => Ok(Map::new()),
        Value::Object(m) => Ok(m),
        other => Err(ValuesError::FileNotAMap {
            file: file.into(),
            got: other.to_string(),
        }),
    }
}

/// The tunnel and kube-proxy mode an existing release was installed with,
/// read from its values (`tunnelProtocol`, `kubeProxyReplacement`): what
/// adopt compares with the Talos side after `ichor cni bootstrap`. `None`
/// where the value is absent or not one Ichor writes.
pub fn recorded_settings(config: &Map<String, Value>) -> (Option<Tunnel>, Option<KubeProxyMode>) {
    let tunnel = config
        .get("tunnelProtocol")
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok());
    let kube_proxy = match config.get("kubeProxyReplacement") {
        Some(Value::String(s)) if s == "true" => Some(KubeProxyMode::Replaced),
        Some(Value::String(s)) if s == "false" => Some(KubeProxyMode::Enabled),
        Some(Value::Bool(true)) => Some(KubeProxyMode::Replaced),
        Some(Value::Bool(false)) => Some(KubeProxyMode::Enabled),
        _ => None,
    };
    (tunnel, kube_proxy)
}

/// Dotted paths of the values Ichor always sets: the one table in `ichor-api`.
pub use ichor_api::cilium::OWNED_PATHS as OWNED_KEYS;

/// Capabilities of the agent on Talos (no `SYS_MODULE`: Talos forbids loading modules).
pub const AGENT_CAPABILITIES: [&str; 11] = [
    "CHOWN",
    "KILL",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "SYS_ADMIN",
    "SYS_RESOURCE",
    "DAC_OVERRIDE",
    "FOWNER",
    "SETGID",
    "SETUID",
];
/// Capabilities of the clean-state init container on Talos.
pub const CLEAN_STATE_CAPABILITIES: [&str; 3] = ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"];

/// A user value that Ichor does not accept.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    #[error(
        "Cilium values file {file} is not valid YAML; fix the file (a YAML mapping of chart keys)"
    )]
    Yaml {
        file: String,
        source: serde_yaml_ng::Error,
    },
    #[error("Cilium values file {file} must be a mapping of chart keys, not {got}; fix the file")]
    FileNotAMap { file: String, got: String },
    #[error(
        "the Cilium user values of TalosCluster {cluster} must be a mapping of chart keys, got {got}; fix spec.cni.cilium.values"
    )]
    NotAMap { cluster: String, got: String },
    #[error(
        "Cilium value {key} is set by Ichor and cannot be overridden (user value at {user_path}); remove it from spec.cni.cilium.values (or --cilium-values) and use the TalosCluster's own field where there is one (spec.cni.tunnel, spec.cni.kubeProxy)"
    )]
    OwnedKey { key: String, user_path: String },
}

/// The Ichor-owned values alone, for these settings and kube-proxy mode.
pub fn owned_values(settings: &ClusterSettings, kube_proxy: KubeProxyMode) -> Map<String, Value> {
    let mut v = json!({
        "k8sServiceHost": "localhost",
        "k8sServicePort": 7445,
        "kubeProxyReplacement": match kube_proxy { KubeProxyMode::Enabled => "false", KubeProxyMode::Replaced => "true" },
        "tunnelProtocol": settings.tunnel.as_str(),
        "ipam": {"mode": "kubernetes"},
        "cgroup": {"autoMount": {"enabled": false}, "hostRoot": "/sys/fs/cgroup"},
        "securityContext": {"capabilities": {
            "ciliumAgent": AGENT_CAPABILITIES,
            "cleanCiliumState": CLEAN_STATE_CAPABILITIES,
        }},
    });
    if settings.node_count <= 1 {
        v["operator"] = json!({"replicas": 1});
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The effective values for the settings' own kube-proxy mode.
pub fn effective_values(settings: &ClusterSettings) -> Result<Map<String, Value>, ValuesError> {
    effective_values_for_mode(settings, settings.kube_proxy)
}

/// The effective values: Ichor-owned keys for (`settings`, `kube_proxy`), with
/// the user values merged on top (maps merge deeply, anything else
/// replaces). A user value at or above an Ichor-owned key is refused.
pub fn effective_values_for_mode(
    settings: &ClusterSettings,
    kube_proxy: KubeProxyMode,
) -> Result<Map<String, Value>, ValuesError> {
    check_user_values(settings)?;
    let mut out = owned_values(settings, kube_proxy);
    merge(&mut out, &settings.user_values);
    Ok(out)
}

/// Refuses user values that set an Ichor-owned key, or replace a map that
/// holds one with something that is not a map.
pub fn check_user_values(settings: &ClusterSettings) -> Result<(), ValuesError> {
    for key in ichor_api::cilium::owned_paths_for(settings.node_count) {
        if let Some(user_path) =
            ichor_api::cilium::user_value_over(&settings.user_values, key, NullAbove::Leaves)
        {
            return Err(ValuesError::OwnedKey {
                key: key.to_string(),
                user_path,
            });
        }
    }
    Ok(())
}

fn merge(base: &mut Map<String, Value>, top: &Map<String, Value>) {
    for (k, v) in top {
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(t)) => merge(b, t),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A stable hash of values: SHA-256 of their canonical JSON (keys sorted at
/// every level), as lowercase hex. Key order and formatting do not matter.
pub fn values_hash(values: &Map<String, Value>) -> String {
    let mut canonical = String::new();
    write_canonical(&Value::Object(values.clone()), &mut canonical);
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// Covers: R1.4b
    #[test]
    fn owned_keys_follow_the_settings() {
        let s = ClusterSettings::new(Tunnel::Geneve, KubeProxyMode::Replaced, 3);
        let v = effective_values(&s).unwrap();
        assert_eq!(v["k8sServiceHost"], "localhost");
        assert_eq!(v["k8sServicePort"], 7445);
        assert_eq!(v["kubeProxyReplacement"], "true");
        assert_eq!(v["tunnelProtocol"], "geneve");
        assert_eq!(v["ipam"]["mode"], "kubernetes");
        assert_eq!(v["cgroup"]["autoMount"]["enabled"], false);
        assert_eq!(v["cgroup"]["hostRoot"], "/sys/fs/cgroup");
        assert_eq!(
            v["securityContext"]["capabilities"]["ciliumAgent"]
                .as_array()
                .unwrap()
                .len(),
            11
        );
        assert!(
            !v["securityContext"]["capabilities"]["ciliumAgent"]
                .as_array()
                .unwrap()
                .contains(&json!("SYS_MODULE"))
        );
        assert_eq!(
            v["securityContext"]["capabilities"]["cleanCiliumState"],
            json!(["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"])
        );
        assert!(
            v.get("operator").is_none(),
            "3 nodes keep the chart's operator replicas"
        );

        let one = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 1);
        let v = effective_values(&one).unwrap();
        assert_eq!(v["kubeProxyReplacement"], "false");
        assert_eq!(v["tunnelProtocol"], "vxlan");
        assert_eq!(v["operator"]["replicas"], 1);
        // The mode argument decides kubeProxyReplacement.
        let v = effective_values_for_mode(&one, KubeProxyMode::Replaced).unwrap();
        assert_eq!(v["kubeProxyReplacement"], "true");
    }

    /// Covers: R1.4c
    #[test]
    fn user_values_merge_deeply_on_top() {
        let s = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 3).with_user_values(
            obj(json!({
                "hubble": {"relay": {"enabled": true}},
                "ipam": {"operator": {"clusterPoolIPv4PodCIDRList": ["10.0.0.0/8"]}},
                "operator": {"replicas": 3},
            })),
        );
        let v = effective_values(&s).unwrap();
        assert_eq!(v["ipam"]["mode"], "kubernetes");
        assert_eq!(
            v["ipam"]["operator"]["clusterPoolIPv4PodCIDRList"][0],
            "10.0.0.0/8"
        );
        assert_eq!(v["hubble"]["relay"]["enabled"], true);
        assert_eq!(
            v["operator"]["replicas"], 3,
            "operator.replicas is the user's on 3 nodes"
        );
    }

    /// Covers: R1.4c
    #[test]
    fn owned_keys_are_refused_by_name() {
        let cases = [
            (
                json!({"tunnelProtocol": "geneve"}),
                3,
                "tunnelProtocol",
                "tunnelProtocol",
            ),
            (
                json!({"ipam": {"mode": "cluster-pool"}}),
                3,
                "ipam.mode",
                "ipam.mode",
            ),
            (json!({"ipam": "x"}), 3, "ipam.mode", "ipam"),
            (
                json!({"operator": {"replicas": 2}}),
                1,
                "operator.replicas",
                "operator.replicas",
            ),
            (
                json!({"securityContext": {"capabilities": {"ciliumAgent": []}}}),
                2,
                "securityContext.capabilities.ciliumAgent",
                "securityContext.capabilities.ciliumAgent",
            ),
            (
                json!({"k8sServicePort": 6443}),
                2,
                "k8sServicePort",
                "k8sServicePort",
            ),
        ];
        for (user, nodes, key, path) in cases {
            let s = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, nodes)
                .with_user_values(obj(user.clone()));
            let e = effective_values(&s).unwrap_err();
            assert!(
                matches!(
                    &e,
                    ValuesError::OwnedKey { key: k, user_path: p } if k == key && p == path
                ),
                "{user}: {e:?}"
            );
            assert!(e.to_string().contains(key), "{e}");
        }
    }

    #[test]
    fn hash_is_stable_and_order_independent() {
        let a = obj(json!({"a": 1, "b": {"c": [1, 2], "d": "x"}}));
        let b = obj(json!({"b": {"d": "x", "c": [1, 2]}, "a": 1}));
        assert_eq!(values_hash(&a), values_hash(&b));
        assert_eq!(values_hash(&a).len(), 64);
        let c = obj(json!({"a": 1, "b": {"c": [2, 1], "d": "x"}}));
        assert_ne!(values_hash(&a), values_hash(&c));
        // Pinned: a change to the hash function changes every release's hash.
        assert_eq!(
            values_hash(&obj(json!({}))),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    /// Covers: R1.4d
    #[test]
    fn settings_from_a_talos_cluster() {
        let cluster: ichor_api::TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "ichor-system"},
            "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1",
                "kubernetesVersion": "v1.34.1", "secretsRef": {"name": "b"},
                "cni": {"preset": "cilium", "tunnel": "geneve", "kubeProxy": "replaced",
                    "cilium": {"values": {"hubble": {"enabled": false}}}}}
        }))
        .unwrap();
        let s = ClusterSettings::from_cluster(&cluster, 3).unwrap();
        assert_eq!(s.tunnel, Tunnel::Geneve);
        assert_eq!(s.kube_proxy, KubeProxyMode::Replaced);
        assert_eq!(s.node_count, 3);
        assert_eq!(s.user_values["hubble"]["enabled"], false);
        let mut bad = cluster.clone();
        bad.spec.cni.cilium.as_mut().unwrap().values = Some(json!([1]));
        let e = ClusterSettings::from_cluster(&bad, 3).unwrap_err();
        assert!(e.to_string().contains("TalosCluster prod"), "{e}");
    }

    /// Covers: R1.4c, R4.4b, R4.4c
    #[test]
    fn values_file_and_recorded_settings() {
        let m = user_values_from_yaml("hubble:\n  enabled: false\n", "v.yaml").unwrap();
        assert_eq!(m["hubble"]["enabled"], false);
        assert!(user_values_from_yaml("", "v.yaml").unwrap().is_empty());
        let e = user_values_from_yaml("- a\n", "v.yaml").unwrap_err();
        assert!(
            e.to_string().contains("v.yaml") && e.to_string().contains("mapping"),
            "{e}"
        );
        assert!(
            user_values_from_yaml("a: [", "bad.yaml")
                .unwrap_err()
                .to_string()
                .contains("bad.yaml")
        );

        let s = ClusterSettings::new(Tunnel::Geneve, KubeProxyMode::Replaced, 2);
        let v = effective_values(&s).unwrap();
        assert_eq!(
            recorded_settings(&v),
            (Some(Tunnel::Geneve), Some(KubeProxyMode::Replaced))
        );
        assert_eq!(recorded_settings(&Map::new()), (None, None));
        let helm_set = obj(json!({"kubeProxyReplacement": false, "tunnelProtocol": "vxlan"}));
        assert_eq!(
            recorded_settings(&helm_set),
            (Some(Tunnel::Vxlan), Some(KubeProxyMode::Enabled))
        );
    }

    proptest! {
        /// The effective values always carry the owned keys unchanged,
        /// whatever user values are accepted.
        #[test]
        fn accepted_user_values_never_change_owned_keys(
            keys in prop::collection::btree_map("[a-z]{1,5}", "[a-z]{0,5}", 0..5),
            nodes in 0u32..5, geneve in any::<bool>(), replaced in any::<bool>(),
        ) {
            let tunnel = if geneve { Tunnel::Geneve } else { Tunnel::Vxlan };
            let kp = if replaced { KubeProxyMode::Replaced } else { KubeProxyMode::Enabled };
            let user: Map<String, Value> = keys.into_iter().map(|(k, v)| (k, Value::from(v))).collect();
            let s = ClusterSettings::new(tunnel, kp, nodes).with_user_values(user);
            let owned = owned_values(&s, kp);
            if let Ok(v) = effective_values(&s) {
                for (k, val) in &owned {
                    prop_assert_eq!(&v[k], val);
                }
                prop_assert_eq!(values_hash(&v), values_hash(&effective_values(&s).unwrap()));
            }
        }
    }
}
