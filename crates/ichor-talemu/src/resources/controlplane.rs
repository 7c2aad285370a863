//! The `controlplane` namespace: what a control plane derives from its
//! config for the Kubernetes control plane (component configs, bootstrap
//! manifests and their config).

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NodeView, item, map, strings};
use crate::derive::ConfigFacts;

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::BOOTSTRAP_MANIFESTS_CONFIG.namespace,
        r#type: kinds::BOOTSTRAP_MANIFESTS_CONFIG.r#type,
        display: "BootstrapManifestsConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
    Definition {
        namespace: kinds::APISERVER_CONFIG.namespace,
        r#type: kinds::APISERVER_CONFIG.r#type,
        display: "APIServerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::CONTROLLER_MANAGER_CONFIG.namespace,
        r#type: kinds::CONTROLLER_MANAGER_CONFIG.r#type,
        display: "ControllerManagerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: kinds::SCHEDULER_CONFIG.namespace,
        r#type: kinds::SCHEDULER_CONFIG.r#type,
        display: "SchedulerConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    crate::manifests::DEFINITION,
];

/// The control-plane resources of a configured control plane.
pub(super) fn items(view: &NodeView<'_>, active: &[u8], facts: &ConfigFacts) -> Vec<Item> {
    let mut items = Vec::new();
    if !facts.machine_type.is_control_plane() {
        return items;
    }
    if facts.has_kubernetes_network {
        items.push(bootstrap_manifests_config_item(facts, view.v1_13_or_later));
    }
    items.extend(crate::manifests::manifest_items(facts, active));
    items.extend(component_items(facts));
    items
}

/// The control-plane components' configs Talos derives from the machine
/// config. A node applied a new image when its item says so (what an
/// upgrade waits for).
fn component_items(facts: &ConfigFacts) -> Vec<Item> {
    let image_yaml = |image: &str| map(vec![("image", Value::from(image))]);
    let enabled_yaml = |image: &str| {
        map(vec![
            ("enabled", Value::from(true)),
            ("image", Value::from(image)),
        ])
    };
    vec![
        item(
            kinds::APISERVER_CONFIG.namespace,
            kinds::APISERVER_CONFIG.r#type,
            kinds::APISERVER_CONFIG.id,
            specs::ApiServerConfigSpec {
                image: facts.apiserver_image.clone(),
            }
            .encode_to_vec(),
            image_yaml(&facts.apiserver_image),
        ),
        item(
            kinds::CONTROLLER_MANAGER_CONFIG.namespace,
            kinds::CONTROLLER_MANAGER_CONFIG.r#type,
            kinds::CONTROLLER_MANAGER_CONFIG.id,
            specs::ControllerManagerConfigSpec {
                enabled: true,
                image: facts.controller_manager_image.clone(),
            }
            .encode_to_vec(),
            enabled_yaml(&facts.controller_manager_image),
        ),
        item(
            kinds::SCHEDULER_CONFIG.namespace,
            kinds::SCHEDULER_CONFIG.r#type,
            kinds::SCHEDULER_CONFIG.id,
            specs::SchedulerConfigSpec {
                enabled: true,
                image: facts.scheduler_image.clone(),
            }
            .encode_to_vec(),
            enabled_yaml(&facts.scheduler_image),
        ),
    ]
}

/// The tenth address of the first service subnet (the cluster DNS service IP).
fn dns_service_ip(service_subnets: &[String]) -> String {
    service_subnets
        .iter()
        .find_map(|s| {
            let (addr, _) = s.split_once('/')?;
            let ip: std::net::Ipv4Addr = addr.parse().ok()?;
            Some(std::net::Ipv4Addr::from(u32::from(ip) + 10).to_string())
        })
        .unwrap_or_default()
}

/// The BootstrapManifestsConfig of a control plane node with a Kubernetes
/// network (`cniName` only from v1.13).
fn bootstrap_manifests_config_item(facts: &ConfigFacts, v1_13_or_later: bool) -> Item {
    let server = match facts.kubeprism_port {
        Some(p) => format!("https://127.0.0.1:{p}"),
        None => "https://localhost:6443".to_string(),
    };
    let flannel = facts.cni_name == "flannel";
    let dns_ip = dns_service_ip(&facts.service_subnets);
    let spec = specs::BootstrapManifestsConfigSpec {
        server: server.clone(),
        cluster_domain: facts.dns_domain.clone(),
        pod_cid_rs: facts.pod_subnets.clone(),
        proxy_enabled: facts.proxy_enabled,
        proxy_image: facts.proxy_image.clone(),
        core_dns_enabled: facts.coredns_enabled,
        dns_service_ip: dns_ip.clone(),
        flannel_enabled: flannel,
        cni_name: if v1_13_or_later {
            facts.cni_name.clone()
        } else {
            String::new()
        },
        ..Default::default()
    };
    let mut yaml = vec![
        ("string", Value::from(server.as_str())),
        ("clusterDomain", Value::from(facts.dns_domain.as_str())),
        ("podCIDRs", strings(&facts.pod_subnets)),
        ("proxyEnabled", Value::from(facts.proxy_enabled)),
        ("proxyImage", Value::from(facts.proxy_image.as_str())),
        ("proxyArgs", Value::Sequence(Vec::new())),
        ("coreDNSEnabled", Value::from(facts.coredns_enabled)),
        ("coreDNSImage", Value::from("")),
        ("dnsServiceIP", Value::from(dns_ip.as_str())),
        ("dnsServiceIPv6", Value::from("")),
        ("flannelEnabled", Value::from(flannel)),
        ("flannelImage", Value::from("")),
        ("flannelExtraArgs", Value::Sequence(Vec::new())),
        ("flannelKubeServiceHost", Value::from("")),
        ("flannelKubeServicePort", Value::from("")),
        ("podSecurityPolicyEnabled", Value::from(false)),
        ("talosAPIServiceEnabled", Value::from(false)),
    ];
    if v1_13_or_later {
        yaml.push(("cniName", Value::from(facts.cni_name.as_str())));
    }
    item(
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.namespace,
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.r#type,
        kinds::BOOTSTRAP_MANIFESTS_CONFIG.id,
        spec.encode_to_vec(),
        map(yaml),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_service_ip_is_the_tenth_address() {
        assert_eq!(dns_service_ip(&["10.96.0.0/12".to_string()]), "10.96.0.10");
    }
}
