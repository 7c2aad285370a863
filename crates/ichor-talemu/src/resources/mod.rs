//! The COSI resources an emulated node serves, one file per COSI
//! namespace: their definitions (so `talosctl get <alias>` resolves them)
//! and their specs derived from the node's state, encoded both as protobuf
//! (`proto_spec`) and YAML (`yaml_spec`).

mod cluster;
mod config;
mod controlplane;
mod k8s;
mod meta;
mod network;
mod runtime;

use serde_yaml_ng::{Mapping, Value};

use crate::derive::ConfigFacts;

pub use meta::meta_items;

/// A resource definition the emulator serves.
#[derive(Debug, Clone, Copy)]
pub struct Definition {
    pub namespace: &'static str,
    pub r#type: &'static str,
    /// Singular display name (`MachineConfig`).
    pub display: &'static str,
    pub extra_aliases: &'static [&'static str],
    pub sensitive: bool,
    pub columns: &'static [(&'static str, &'static str)],
}

/// Every resource type the emulator knows, namespace by namespace (others
/// are "not supported", as Talos answers for unregistered types).
pub fn definitions() -> impl Iterator<Item = &'static Definition> {
    [
        config::DEFINITIONS,
        runtime::DEFINITIONS,
        network::DEFINITIONS,
        cluster::DEFINITIONS,
        k8s::DEFINITIONS,
        controlplane::DEFINITIONS,
        meta::DEFINITIONS,
    ]
    .into_iter()
    .flatten()
}

/// The namespaces the emulator serves.
pub const NAMESPACES: &[(&str, &str)] = &[
    ("cluster", "Cluster configuration and discovery resources."),
    ("config", "Talos node configuration."),
    ("controlplane", "Kubernetes control plane resources."),
    ("k8s", "Kubernetes all node types resources."),
    (
        "meta",
        "Metadata namespace which contains resource definitions.",
    ),
    ("network", "Networking resources."),
    ("runtime", "Talos runtime resources."),
];

/// The definition of a type, if the emulator knows it.
pub fn definition(r#type: &str) -> Option<&'static Definition> {
    definitions().find(|d| d.r#type == r#type)
}

/// Aliases as COSI computes them (`ResourceDefinitionSpec.Fill`): the
/// lower-cased singular, the acronym of its capitals (and its plural), the
/// lower-cased plural and its dotted prefixes of the suffix.
pub fn aliases(def: &Definition) -> (Vec<String>, Vec<String>) {
    let (name, suffix) = def.r#type.split_once('.').unwrap_or((def.r#type, ""));
    let mut aliases: Vec<String> = def.extra_aliases.iter().map(|s| s.to_string()).collect();
    let mut all = Vec::new();
    aliases.push(def.display.to_lowercase());
    all.push(name.to_lowercase());
    let parts: Vec<&str> = suffix.split('.').collect();
    for i in 1..parts.len() {
        all.push(format!("{}.{}", name.to_lowercase(), parts[..i].join(".")));
    }
    let upper: String = name.chars().filter(char::is_ascii_uppercase).collect();
    if upper.len() > 1 {
        aliases.push(upper.to_lowercase());
        if !upper.ends_with('S') {
            aliases.push(format!("{}s", upper.to_lowercase()));
        }
    }
    all.extend(aliases.iter().cloned());
    (aliases, all)
}

/// One resource, ready to be stored and served.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub namespace: String,
    pub r#type: String,
    pub id: String,
    pub proto_spec: Vec<u8>,
    pub yaml_spec: String,
    pub annotations: Vec<(String, String)>,
}

fn item(kind_ns: &str, r#type: &str, id: &str, proto: Vec<u8>, yaml: Value) -> Item {
    Item {
        namespace: kind_ns.to_string(),
        r#type: r#type.to_string(),
        id: id.to_string(),
        proto_spec: proto,
        yaml_spec: serde_yaml_ng::to_string(&yaml).unwrap_or_default(),
        annotations: Vec::new(),
    }
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(Value::from(k), v);
    }
    Value::Mapping(m)
}

fn strings(v: &[String]) -> Value {
    Value::Sequence(v.iter().map(|s| Value::from(s.as_str())).collect())
}

/// The inputs of a node's resources.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    pub hostname: &'a str,
    /// The node's IP (its links, addresses and routes are built around it).
    pub address: std::net::IpAddr,
    pub talos_version: &'a str,
    /// v1.13+ (the Version resource has `name`, BootstrapManifestsConfig has `cniName`).
    pub v1_13_or_later: bool,
    pub active_config: Option<&'a [u8]>,
    pub persistent_config: Option<&'a [u8]>,
    pub facts: Option<&'a ConfigFacts>,
    /// `MachineStatus.stage`: 3 maintenance, 4 running, 5 rebooting.
    pub stage: i32,
    /// The node's block devices.
    pub disks: &'a [crate::node::Disk],
    /// The members of the node's cluster, as discovery tells them.
    pub(crate) members: &'a [crate::discovery::Affiliate],
    /// What happened to the node since it booted (its services' states).
    pub(crate) journal: &'a crate::journal::Journal,
    /// The node runs the control plane's static pods (etcd was bootstrapped).
    pub static_pods_run: bool,
}

/// Every resource of a node (meta resources included).
pub fn node_items(view: &NodeView<'_>) -> Vec<Item> {
    let mut items = meta_items();
    let hostname = view
        .facts
        .and_then(|f| f.hostname.as_deref())
        .unwrap_or(view.hostname);
    items.extend(runtime::items(view));
    items.extend(network::items(view, hostname));

    // A node without an applied config serves only what maintenance mode has.
    let (Some(active), Some(facts)) = (view.active_config, view.facts) else {
        return items;
    };
    items.extend(config::items(view, active, facts));
    items.extend(cluster::items(view, facts));
    items.extend(k8s::items(view, facts, hostname));
    items.extend(controlplane::items(view, active, facts));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_follow_cosi_rules() {
        let def = definition("MachineConfigs.config.talos.dev").unwrap();
        let (short, all) = aliases(def);
        assert_eq!(short, vec!["machineconfig", "mc", "mcs"]);
        assert!(all.contains(&"machineconfigs".to_string()));
        assert!(all.contains(&"machineconfigs.config".to_string()));
        assert!(all.contains(&"machineconfigs.config.talos".to_string()));
        let def = definition("KubePrismConfigs.kubernetes.talos.dev").unwrap();
        let (short, _) = aliases(def);
        assert!(short.contains(&"kubeprismconfig".to_string()));
    }

    #[test]
    fn every_type_is_defined_once() {
        let mut types: Vec<&str> = definitions().map(|d| d.r#type).collect();
        let all = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), all);
    }
}
