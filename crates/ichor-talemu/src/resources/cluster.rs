//! The `cluster` namespace: the cluster's identity and its members (the
//! configured nodes of the cluster, as discovery tells every node).

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NodeView, item, map};
use crate::derive::ConfigFacts;
use crate::wire::specs as emulated;

/// `talosctl get members`.
const MEMBER_TYPE: &str = "Members.cluster.talos.dev";

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::CLUSTER_INFO.namespace,
        r#type: kinds::CLUSTER_INFO.r#type,
        display: "Info",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Cluster ID", "{.clusterId}"),
            ("Cluster Name", "{.clusterName}"),
        ],
    },
    Definition {
        namespace: "cluster",
        r#type: MEMBER_TYPE,
        display: "Member",
        extra_aliases: &[],
        sensitive: false,
        columns: &[
            ("Hostname", "{.hostname}"),
            ("Machine Type", "{.machineType}"),
            ("OS", "{.operatingSystem}"),
            ("Addresses", "{.addresses}"),
        ],
    },
];

/// The cluster resources of a configured node.
pub(super) fn items(view: &NodeView<'_>, facts: &ConfigFacts) -> Vec<Item> {
    let mut items = vec![cluster_info_item(facts)];
    items.extend(view.members.iter().map(member_item));
    items
}

/// An address as Talos's `NetIP` carries it (4 or 16 bytes).
pub(super) fn net_ip(ip: std::net::IpAddr) -> emulated::NetIp {
    let ip = match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    emulated::NetIp { ip }
}

/// One member, named by its node's name.
fn member_item(m: &crate::discovery::Affiliate) -> Item {
    let control_plane = m.machine_type.is_control_plane();
    let spec = emulated::MemberSpec {
        node_id: m.node_id.clone(),
        addresses: vec![net_ip(m.address)],
        hostname: m.hostname.clone(),
        machine_type: m.machine_type.proto(),
        operating_system: m.operating_system.clone(),
        control_plane: control_plane.then_some(emulated::ControlPlane {
            api_server_port: 6443,
        }),
    };
    let mut yaml = vec![
        ("nodeId", Value::from(spec.node_id.as_str())),
        (
            "addresses",
            Value::Sequence(vec![Value::from(m.address.to_string())]),
        ),
        ("hostname", Value::from(m.hostname.as_str())),
        ("machineType", Value::from(m.machine_type.as_str())),
        ("operatingSystem", Value::from(m.operating_system.as_str())),
    ];
    if control_plane {
        yaml.push((
            "controlPlane",
            map(vec![("apiServerPort", Value::from(6443))]),
        ));
    }
    item(
        "cluster",
        MEMBER_TYPE,
        &m.hostname,
        spec.encode_to_vec(),
        map(yaml),
    )
}

fn cluster_info_item(facts: &ConfigFacts) -> Item {
    item(
        kinds::CLUSTER_INFO.namespace,
        kinds::CLUSTER_INFO.r#type,
        kinds::CLUSTER_INFO.id,
        specs::ClusterInfoSpec {
            cluster_id: facts.cluster_id.clone(),
            cluster_name: facts.cluster_name.clone(),
        }
        .encode_to_vec(),
        map(vec![
            ("clusterId", Value::from(facts.cluster_id.as_str())),
            ("clusterName", Value::from(facts.cluster_name.as_str())),
        ]),
    )
}
