//! The `k8s` namespace: what every node derives for Kubernetes (its node
//! name, KubePrism, the kubelet's config) and the status of the static pods
//! a control plane runs.

use std::collections::BTreeMap;

use ichor_api::endpoint::Endpoint;
use prost::Message;
use prost_types::value::Kind;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NodeView, item, map};
use crate::derive::ConfigFacts;
use crate::wire::specs as emulated;

/// `talosctl get staticpodstatus`.
const STATIC_POD_STATUS_TYPE: &str = "StaticPodStatuses.kubernetes.talos.dev";

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::NODENAME.namespace,
        r#type: kinds::NODENAME.r#type,
        display: "Nodename",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Nodename", "{.nodename}")],
    },
    Definition {
        namespace: kinds::KUBEPRISM_CONFIG.namespace,
        r#type: kinds::KUBEPRISM_CONFIG.r#type,
        display: "KubePrismConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Host", "{.host}"),
            ("Port", "{.port}"),
            ("Endpoints", "{.endpoints}"),
        ],
    },
    Definition {
        namespace: kinds::KUBEPRISM_STATUS.namespace,
        r#type: kinds::KUBEPRISM_STATUS.r#type,
        display: "KubePrismStatus",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("HOST", "{.host}"), ("HEALTHY", "{.healthy}")],
    },
    Definition {
        namespace: kinds::KUBEPRISM_ENDPOINTS.namespace,
        r#type: kinds::KUBEPRISM_ENDPOINTS.r#type,
        display: "KubePrismEndpoint",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
    Definition {
        namespace: kinds::KUBELET_CONFIG.namespace,
        r#type: kinds::KUBELET_CONFIG.r#type,
        display: "KubeletConfig",
        extra_aliases: &[],
        sensitive: false,
        columns: &[("Image", "{.image}")],
    },
    Definition {
        namespace: "k8s",
        r#type: STATIC_POD_STATUS_TYPE,
        display: "StaticPodStatus",
        extra_aliases: &["podstatus"],
        sensitive: false,
        columns: &[("Ready", "{.conditions[?(@.type==\"Ready\")].status}")],
    },
];

/// The k8s resources of a configured node.
pub(super) fn items(view: &NodeView<'_>, facts: &ConfigFacts, hostname: &str) -> Vec<Item> {
    let mut items = vec![nodename_item(hostname)];
    if let Some(port) = facts.kubeprism_port {
        items.extend(kubeprism_items(facts, port));
    }
    items.push(item(
        kinds::KUBELET_CONFIG.namespace,
        kinds::KUBELET_CONFIG.r#type,
        kinds::KUBELET_CONFIG.id,
        specs::KubeletConfigSpec {
            image: facts.kubelet_image.clone(),
        }
        .encode_to_vec(),
        map(vec![("image", Value::from(facts.kubelet_image.as_str()))]),
    ));
    if view.static_pods_run {
        let booted = crate::journal::rfc3339_nanos(view.journal.booted_at);
        let started = booted.split('.').next().unwrap_or_default().to_string() + "Z";
        for (component, image) in crate::host::static_pods(facts) {
            items.push(static_pod_status_item(
                component,
                hostname,
                &image,
                &view.address.to_string(),
                &started,
            ));
        }
    }
    items
}

fn string(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn object(fields: Vec<(&str, prost_types::Value)>) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StructValue(prost_types::Struct {
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>(),
        })),
    }
}

/// The conditions of a running static pod, every one true.
const POD_CONDITIONS: [&str; 4] = ["Initialized", "Ready", "ContainersReady", "PodScheduled"];

/// The status a kubelet reports for a running static pod: Running, every
/// condition true.
fn static_pod_status_item(
    component: &str,
    nodename: &str,
    image: &str,
    address: &str,
    started: &str,
) -> Item {
    item(
        "k8s",
        STATIC_POD_STATUS_TYPE,
        &format!("kube-system/{component}-{nodename}"),
        emulated::StaticPodStatusSpec {
            pod_status: Some(pod_status(component, image, address, started)),
        }
        .encode_to_vec(),
        pod_status_yaml(address, started),
    )
}

/// The pod status on the wire: phase, conditions, addresses, start time and
/// the one container, running and ready.
fn pod_status(component: &str, image: &str, address: &str, started: &str) -> prost_types::Struct {
    let condition = |t: &str| {
        object(vec![
            ("type", string(t)),
            ("status", string("True")),
            ("lastTransitionTime", string(started)),
        ])
    };
    let container = object(vec![
        ("name", string(component)),
        ("image", string(image)),
        (
            "ready",
            prost_types::Value {
                kind: Some(Kind::BoolValue(true)),
            },
        ),
        (
            "state",
            object(vec![(
                "running",
                object(vec![("startedAt", string(started))]),
            )]),
        ),
    ]);
    let list = |values: Vec<prost_types::Value>| prost_types::Value {
        kind: Some(Kind::ListValue(prost_types::ListValue { values })),
    };
    prost_types::Struct {
        fields: [
            ("phase".to_string(), string("Running")),
            (
                "conditions".to_string(),
                list(POD_CONDITIONS.iter().map(|c| condition(c)).collect()),
            ),
            ("hostIP".to_string(), string(address)),
            ("podIP".to_string(), string(address)),
            ("startTime".to_string(), string(started)),
            ("containerStatuses".to_string(), list(vec![container])),
        ]
        .into_iter()
        .collect(),
    }
}

/// The pod status in the YAML talosctl shows (no container statuses).
fn pod_status_yaml(address: &str, started: &str) -> Value {
    let condition = |t: &str| {
        map(vec![
            ("type", Value::from(t)),
            ("status", Value::from("True")),
            ("lastTransitionTime", Value::from(started)),
        ])
    };
    map(vec![
        ("phase", Value::from("Running")),
        (
            "conditions",
            Value::Sequence(POD_CONDITIONS.iter().map(|c| condition(c)).collect()),
        ),
        ("hostIP", Value::from(address)),
        ("podIP", Value::from(address)),
        ("startTime", Value::from(started)),
    ])
}

fn nodename_item(hostname: &str) -> Item {
    item(
        kinds::NODENAME.namespace,
        kinds::NODENAME.r#type,
        kinds::NODENAME.id,
        specs::NodenameSpec {
            nodename: hostname.to_string(),
            hostname_version: "1".to_string(),
            skip_node_registration: false,
        }
        .encode_to_vec(),
        map(vec![
            ("nodename", Value::from(hostname)),
            ("hostnameVersion", Value::from("1")),
            ("skipNodeRegistration", Value::from(false)),
        ]),
    )
}

/// The host and port of the control plane endpoint, `https://HOST[:PORT][/]`
/// (443, a URL's port, when none is written), as KubePrism dials it.
fn control_plane_host_port(endpoint: &str) -> Option<(String, u32)> {
    let e = Endpoint::parse_https_url(endpoint, HTTPS_PORT).ok()?;
    Some((e.host, u32::from(e.port)))
}

/// The port of an `https://` URL that names none.
const HTTPS_PORT: u16 = 443;

/// KubePrism's endpoints: the control plane endpoint, then (on a control
/// plane node) the local API server.
fn kubeprism_endpoints(facts: &ConfigFacts) -> Vec<(String, u32)> {
    let mut endpoints = Vec::new();
    if let Some((host, p)) = facts
        .control_plane_endpoint
        .as_deref()
        .and_then(control_plane_host_port)
    {
        endpoints.push((host, p));
    }
    if facts.machine_type.is_control_plane() {
        endpoints.push(("localhost".to_string(), 6443));
    }
    endpoints
}

/// KubePrismEndpoints, KubePrismConfig and KubePrismStatus of a node with
/// KubePrism on `port`.
fn kubeprism_items(facts: &ConfigFacts, port: u16) -> Vec<Item> {
    let endpoints = kubeprism_endpoints(facts);
    let proto_endpoints: Vec<specs::KubePrismEndpoint> = endpoints
        .iter()
        .map(|(h, p)| specs::KubePrismEndpoint {
            host: h.clone(),
            port: *p,
        })
        .collect();
    let yaml_endpoints = Value::Sequence(
        endpoints
            .iter()
            .map(|(h, p)| {
                map(vec![
                    ("host", Value::from(h.as_str())),
                    ("port", Value::from(*p)),
                ])
            })
            .collect(),
    );
    let host = format!("127.0.0.1:{port}");
    vec![
        item(
            kinds::KUBEPRISM_ENDPOINTS.namespace,
            kinds::KUBEPRISM_ENDPOINTS.r#type,
            kinds::KUBEPRISM_ENDPOINTS.id,
            specs::KubePrismEndpointsSpec {
                endpoints: proto_endpoints.clone(),
            }
            .encode_to_vec(),
            map(vec![("endpoints", yaml_endpoints.clone())]),
        ),
        item(
            kinds::KUBEPRISM_CONFIG.namespace,
            kinds::KUBEPRISM_CONFIG.r#type,
            kinds::KUBEPRISM_CONFIG.id,
            specs::KubePrismConfigSpec {
                host: "127.0.0.1".to_string(),
                port: i64::from(port),
                endpoints: proto_endpoints,
            }
            .encode_to_vec(),
            map(vec![
                ("host", Value::from("127.0.0.1")),
                ("port", Value::from(port)),
                ("endpoints", yaml_endpoints),
            ]),
        ),
        item(
            kinds::KUBEPRISM_STATUS.namespace,
            kinds::KUBEPRISM_STATUS.r#type,
            kinds::KUBEPRISM_STATUS.id,
            specs::KubePrismStatusesSpec {
                host: host.clone(),
                healthy: true,
            }
            .encode_to_vec(),
            map(vec![
                ("host", Value::from(host.as_str())),
                ("healthy", Value::from(true)),
            ]),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use ichor_api::endpoint::{Endpoint, EndpointProblem};
    use proptest::prelude::*;

    use super::{HTTPS_PORT, control_plane_host_port};

    /// The reading before the one parser.
    fn old_host_port(endpoint: &str) -> Option<(String, u32)> {
        let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
        let rest = rest.split('/').next()?;
        if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            let port = after
                .strip_prefix(':')
                .and_then(|p| p.parse().ok())
                .unwrap_or(443);
            return Some((host.to_string(), port));
        }
        match rest.rsplit_once(':') {
            Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
            None => Some((rest.to_string(), 443)),
        }
    }

    /// Control plane endpoints near every rule: schemes, IPv4 and IPv6
    /// (bare, bracketed), DNS names, garbage with `:` `[` `]` `/` `@`,
    /// ports in and out of range, paths.
    fn endpoint() -> impl Strategy<Value = String> {
        let scheme = prop_oneof![Just("https://"), Just("http://"), Just("")];
        let host = prop_oneof![
            any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
            "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,3}",
            "[a-zA-Z0-9.:\\[\\]/@ _-]{0,16}",
            Just(String::new()),
        ];
        let port = prop_oneof![
            Just(String::new()),
            (0u32..=70000).prop_map(|p| format!(":{p}")),
            ":[0-9a-z+:]{0,7}",
        ];
        let tail = prop_oneof![Just(""), Just("/"), Just("//"), Just("/api")];
        prop_oneof![
            4 => (scheme, host, port, tail).prop_map(|(s, h, p, t)| format!("{s}{h}{p}{t}")),
            1 => any::<String>(),
        ]
    }

    /// What only the old reading took is no `https://` URL of a host: no
    /// scheme or another one, a path, port 0 or a port that is no number
    /// (read as 443 after brackets), a host with `:` outside brackets (read
    /// up to its last `:`), a bare IPv6 address (its last group read as the
    /// port), garbage around or between brackets, no host name.
    fn no_url_of_a_host(text: &str, problem: &EndpointProblem) -> bool {
        !text.starts_with("https://")
            || match problem {
                EndpointProblem::Port(p) => {
                    p.contains(':') || p.parse::<u16>().is_err() || p.parse::<u16>() == Ok(0)
                }
                _ => true,
            }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// What the one parser reads, the old reading read the same (but a
        /// bare IPv6 address); what only the old one took is named by
        /// `no_url_of_a_host`.
        #[test]
        fn the_one_parser_reads_the_control_plane_endpoint_as_kubeprism_did(text in endpoint()) {
            let old = old_host_port(&text);
            match control_plane_host_port(&text) {
                // A bare IPv6 address (no URL writes one): now the address
                // on 443; before, cut at its last `:` into host and port.
                Some((host, _)) if host.parse::<std::net::Ipv6Addr>().is_ok() && !text.contains('[') => {
                    prop_assert!(old.is_none_or(|(h, _)| h != host), "{:?}", text);
                }
                Some(new) => prop_assert_eq!(Some(new), old, "{:?}", text),
                None => {
                    let problem = Endpoint::parse_https_url(&text, HTTPS_PORT)
                        .expect_err("refused")
                        .problem;
                    if old.is_some() {
                        prop_assert!(
                            no_url_of_a_host(&text, &problem),
                            "{:?}: old {:?}, now {}", text, old, problem
                        );
                    }
                }
            }
        }
    }
}
