//! The Cilium chart values Ichor owns (R1.4c, R7.4): users may not
//! set them in `spec.cni.cilium.values`.
//!
//! [`OWNED_PATHS`] is the one table. The CRD schema and its CEL rule read the
//! top-level entries (CEL can only see what the schema declares), the
//! webhook reads every entry through [`owned_paths_in`], and `ichor-cilium`
//! writes the values and refuses user values at the same paths.

use kube::core::{Message, Rule};
use serde_json::Value;

/// Dotted paths of the chart values Ichor always sets, in the order
/// messages name them. The top-level ones come first.
pub const OWNED_PATHS: [&str; 10] = [
    "k8sServiceHost",
    "k8sServicePort",
    "kubeProxyReplacement",
    "tunnelProtocol",
    "ipam.mode",
    "cgroup.autoMount.enabled",
    "cgroup.hostRoot",
    "securityContext.capabilities.ciliumAgent",
    "securityContext.capabilities.cleanCiliumState",
    ONE_NODE_ONLY_PATH,
];

/// The one owned path that depends on the cluster: on a one-node cluster
/// Ichor sets one operator replica (its required anti-affinity would leave a
/// second Pending); elsewhere the chart's default stands and the user may set it.
pub const ONE_NODE_ONLY_PATH: &str = "operator.replicas";

/// The owned paths that are top-level keys (what the schema declares).
pub fn owned_top_level_keys() -> impl Iterator<Item = &'static str> {
    OWNED_PATHS.into_iter().filter(|p| !p.contains('.'))
}

/// The owned paths on a cluster of `node_count` nodes.
pub fn owned_paths_for(node_count: u32) -> impl Iterator<Item = &'static str> {
    OWNED_PATHS
        .into_iter()
        .filter(move |p| *p != ONE_NODE_ONLY_PATH || node_count <= 1)
}

/// The node count the effective values depend on, one rule for the
/// controller, `ichor cni` and adopt (the count changes the values and so
/// their hash): the registered Nodes, or, while none has registered, the
/// cluster's TalosMachines (`machines` is 0 where the caller knows none).
pub fn node_count_rule(nodes: usize, machines: usize) -> u32 {
    let n = if nodes == 0 { machines } else { nodes };
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The CEL rule on `spec.cni.cilium` refusing the top-level owned keys.
pub(crate) fn owned_keys_rule() -> Rule {
    let keys: Vec<&str> = owned_top_level_keys().collect();
    let absent = keys
        .iter()
        .map(|k| format!("!has(self.values.{k})"))
        .collect::<Vec<_>>()
        .join(" && ");
    Rule::new(format!("!has(self.values) || ({absent})")).message(Message::Message(format!(
        "spec.cni.cilium.values must not set {}: Ichor owns them; set spec.cni.tunnel and spec.cni.kubeProxy instead",
        crate::cluster::one_of(&keys)
    )))
}

/// The owned paths set in user `values` (a user value at or above an owned
/// path counts, since it replaces what Ichor sets), in [`OWNED_PATHS`]
/// order, each once. The one-node-only path is left out: only the values
/// function knows the node count, and it refuses that one itself.
pub fn owned_paths_in(
    values: &serde_json::Map<String, Value>,
    null_above: NullAbove,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for path in OWNED_PATHS.into_iter().filter(|p| *p != ONE_NODE_ONLY_PATH) {
        if let Some(hit) = user_value_over(values, path, null_above)
            && !out.contains(&hit)
        {
            out.push(hit);
        }
    }
    out
}

/// How a `null` user value above an owned path is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullAbove {
    /// It replaces the map that holds the owned path (the webhook's reading).
    Replaces,
    /// It leaves the owned path to Ichor (the values function's reading).
    Leaves,
}

/// Where user `values` set `path`, or replace a map above it with a value
/// that is not a map: that user path. `None` when they leave `path` to Ichor.
pub fn user_value_over(
    values: &serde_json::Map<String, Value>,
    path: &str,
    null_above: NullAbove,
) -> Option<String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = values;
    for (i, part) in parts.iter().enumerate() {
        let v = node.get(*part)?;
        if i + 1 == parts.len() {
            return Some(parts[..=i].join("."));
        }
        match v {
            Value::Object(m) => node = m,
            Value::Null if null_above == NullAbove::Leaves => return None,
            _ => return Some(parts[..=i].join(".")),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cel_rule_names_the_top_level_keys() {
        let rule = serde_json::to_value(owned_keys_rule()).unwrap();
        assert_eq!(
            rule["rule"],
            "!has(self.values) || (!has(self.values.k8sServiceHost) && !has(self.values.k8sServicePort) && !has(self.values.kubeProxyReplacement) && !has(self.values.tunnelProtocol))"
        );
        assert_eq!(
            rule["message"],
            "spec.cni.cilium.values must not set k8sServiceHost, k8sServicePort, kubeProxyReplacement or tunnelProtocol: Ichor owns them; set spec.cni.tunnel and spec.cni.kubeProxy instead"
        );
    }

    /// Covers: R1.4c
    #[test]
    fn owned_paths_are_found_at_and_above() {
        let v = serde_json::json!({"tunnelProtocol": "geneve", "hubble": {"enabled": true},
            "k8sServiceHost": "x", "cgroup": "flat", "ipam": {"operator": {}}});
        assert_eq!(
            owned_paths_in(v.as_object().unwrap(), NullAbove::Replaces),
            vec!["k8sServiceHost", "tunnelProtocol", "cgroup"]
        );
        assert_eq!(owned_paths_for(1).count(), 10);
        assert_eq!(owned_paths_for(3).count(), 9);
    }
}
