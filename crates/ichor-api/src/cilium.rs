//! The Cilium chart values Ichor owns (ADR 0099 decision 3): users may not
//! set them in `spec.cni.cilium.values`.

/// Top-level chart keys Ichor always sets itself.
pub const OWNED_KEYS: &[&str] = &[
    "k8sServiceHost",
    "k8sServicePort",
    "kubeProxyReplacement",
    "tunnelProtocol",
];

/// The Ichor-owned keys present in user values, in [`OWNED_KEYS`] order.
/// Empty when the values are acceptable (or not an object).
pub fn owned_keys_in(values: &serde_json::Value) -> Vec<&'static str> {
    match values.as_object() {
        Some(map) => OWNED_KEYS
            .iter()
            .copied()
            .filter(|k| map.contains_key(*k))
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R1.4c
    #[test]
    fn owned_keys_are_found() {
        let v = serde_json::json!({"tunnelProtocol": "geneve", "hubble": {"enabled": true}, "k8sServiceHost": "x"});
        assert_eq!(owned_keys_in(&v), vec!["k8sServiceHost", "tunnelProtocol"]);
        assert!(owned_keys_in(&serde_json::json!({"ipam": {"mode": "kubernetes"}})).is_empty());
    }
}
