//! The lab's rule for a config that makes its node unhealthy: a config
//! whose `machine.nodeLabels` carries [`UNHEALTHY_LABEL`] set to `"true"`
//! leaves the node NotReady, as a real change that breaks the kubelet
//! would. Tests tell the lab a change is bad by putting the label in it.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// The node label that marks a config the lab plays as unhealthy.
pub const UNHEALTHY_LABEL: &str = "lab.ichor.maesh.dev/unhealthy";

/// The kubelet's message on a node the rule made NotReady.
pub const UNHEALTHY_MESSAGE: &str =
    "the lab plays this node's config as unhealthy (machine.nodeLabels marks it)";

/// Whether the lab plays a node running `config` (Talos's YAML documents)
/// Ready: every config but one marked with [`UNHEALTHY_LABEL`] `"true"`.
pub fn config_is_healthy(config: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(config) else {
        return true;
    };
    !serde_yaml_ng::Deserializer::from_str(text).any(|doc| {
        let Ok(value) = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc) else {
            return false;
        };
        value
            .get("machine")
            .and_then(|m| m.get("nodeLabels"))
            .and_then(|l| l.get(UNHEALTHY_LABEL))
            .is_some_and(|v| v.as_str() == Some("true"))
    })
}

/// Which nodes run a config the lab plays as unhealthy, read from the
/// emulator's active configs each pass. A config is parsed only when it
/// changed (its hash differs from the last pass's), so an idle lab does
/// no YAML work per tick.
#[derive(Debug, Default)]
pub struct ConfigHealth {
    configs: Option<ichor_talemu::ActiveConfigs>,
    /// Per node: its config's hash and whether it is healthy.
    seen: std::collections::HashMap<String, (u64, bool)>,
}

impl ConfigHealth {
    /// Judges the configs `configs` hands out; `None`: every node healthy.
    pub fn new(configs: Option<ichor_talemu::ActiveConfigs>) -> ConfigHealth {
        ConfigHealth {
            configs,
            seen: Default::default(),
        }
    }

    /// The nodes (by hostname) whose active config is unhealthy now.
    pub fn unhealthy(&mut self) -> std::collections::HashSet<String> {
        let Some(configs) = &self.configs else {
            return Default::default();
        };
        let current = configs.by_hostname();
        self.judge(current.iter().map(|(n, c)| (n.as_str(), c.as_deref())))
    }

    /// [`ConfigHealth::unhealthy`] over `nodes` (hostname, active config;
    /// `None` in maintenance mode, healthy).
    fn judge<'a>(
        &mut self,
        nodes: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> std::collections::HashSet<String> {
        use std::hash::{Hash, Hasher};
        let mut unhealthy = std::collections::HashSet::new();
        for (name, config) in nodes {
            let Some(config) = config else {
                self.seen.remove(name);
                continue;
            };
            let mut h = std::collections::hash_map::DefaultHasher::new();
            config.hash(&mut h);
            let hash = h.finish();
            let healthy = match self.seen.get(name) {
                Some((seen, healthy)) if *seen == hash => *healthy,
                _ => {
                    let healthy = config_is_healthy(config);
                    self.seen.insert(name.to_string(), (hash, healthy));
                    healthy
                }
            };
            if !healthy {
                unhealthy.insert(name.to_string());
            }
        }
        unhealthy
    }
}

/// Plays Node `name`'s Ready condition for a node running `config`
/// ([`config_is_healthy`]), written only when it changes. Returns the
/// readiness played.
pub async fn play(client: &kube::Client, name: &str, config: &[u8]) -> Result<bool, kube::Error> {
    let ready = config_is_healthy(config);
    let api: Api<Node> = Api::all(client.clone());
    let current = api
        .get_opt(name)
        .await?
        .and_then(|n| n.status)
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status == "True");
    if current != Some(ready) {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let (status, reason, message) = if ready {
            ("True", "KubeletReady", crate::simulator::READY_MESSAGE)
        } else {
            ("False", "KubeletNotReady", UNHEALTHY_MESSAGE)
        };
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
        )
        .await?;
    }
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R16.3b
    #[test]
    fn only_a_config_marked_unhealthy_is_played_not_ready() {
        let base = "version: v1alpha1\nmachine:\n  type: worker\n";
        assert!(config_is_healthy(base.as_bytes()));
        let marked = format!(
            "{base}  nodeLabels:\n    {UNHEALTHY_LABEL}: \"true\"\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: w-1\n"
        );
        assert!(!config_is_healthy(marked.as_bytes()));
        let unmarked = marked.replace("\"true\"", "\"false\"");
        assert!(config_is_healthy(unmarked.as_bytes()));
    }

    /// Covers: R16.3b
    #[test]
    fn a_node_is_unhealthy_while_its_active_config_is_marked_and_no_longer() {
        let base = "version: v1alpha1\nmachine:\n  type: worker\n";
        let marked = format!("{base}  nodeLabels:\n    {UNHEALTHY_LABEL}: \"true\"\n");
        let mut health = ConfigHealth::new(None);
        assert!(health.unhealthy().is_empty(), "no emulator: all healthy");
        let pass = |h: &mut ConfigHealth, w1: &str| {
            let mut v: Vec<_> = h
                .judge(
                    [
                        ("w-1", Some(w1.as_bytes())),
                        ("w-2", Some(base.as_bytes())),
                        ("w-3", None),
                    ]
                    .into_iter(),
                )
                .into_iter()
                .collect();
            v.sort();
            v
        };
        assert!(pass(&mut health, base).is_empty());
        assert_eq!(pass(&mut health, &marked), ["w-1"]);
        // Unchanged configs are judged from the cache.
        assert_eq!(health.seen.len(), 2);
        assert_eq!(pass(&mut health, &marked), ["w-1"]);
        // Talos's timer reverts the try: healthy again.
        assert!(pass(&mut health, base).is_empty());
    }
}
