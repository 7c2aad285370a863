//! The `k8s` namespace: what every node derives for Kubernetes (its node
//! name, KubePrism, the kubelet's config) and the status of the static pods
//! a control plane runs.

use std::collections::BTreeMap;

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

fn host_port(endpoint: &str) -> Option<(String, u32)> {
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

/// KubePrism's endpoints: the control plane endpoint, then (on a control
/// plane node) the local API server.
fn kubeprism_endpoints(facts: &ConfigFacts) -> Vec<(String, u32)> {
    let mut endpoints = Vec::new();
    if let Some((host, p)) = facts.control_plane_endpoint.as_deref().and_then(host_port) {
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
