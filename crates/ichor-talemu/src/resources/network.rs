//! The `network` namespace: the node's hostname, and its links, addresses
//! and routes as a node with one Ethernet link holding the lab's address
//! for it would show them (a /24 around it, or a /64 for IPv6, the first
//! address of which is the gateway).

use std::net::IpAddr;

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::cluster::net_ip;
use super::{Definition, Item, NodeView, item, map};
use crate::wire::specs as emulated;

const ADDRESS_STATUS_TYPE: &str = "AddressStatuses.net.talos.dev";
const LINK_STATUS_TYPE: &str = "LinkStatuses.net.talos.dev";
const ROUTE_STATUS_TYPE: &str = "RouteStatuses.net.talos.dev";

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::HOSTNAME_STATUS.namespace,
        r#type: kinds::HOSTNAME_STATUS.r#type,
        display: "HostnameStatus",
        extra_aliases: &["hostname"],
        sensitive: false,
        columns: &[("Hostname", "{.hostname}"), ("Domainname", "{.domainname}")],
    },
    Definition {
        namespace: "network",
        r#type: ADDRESS_STATUS_TYPE,
        display: "AddressStatus",
        extra_aliases: &["address", "addresses"],
        sensitive: false,
        columns: &[("Address", "{.address}"), ("Link", "{.linkName}")],
    },
    Definition {
        namespace: "network",
        r#type: LINK_STATUS_TYPE,
        display: "LinkStatus",
        extra_aliases: &["link", "links"],
        sensitive: false,
        columns: &[
            ("Alias", "{.alias}"),
            ("Type", "{.type}"),
            ("Kind", "{.kind}"),
            ("Hw Addr", "{.hardwareAddr}"),
            ("Oper State", "{.operationalState}"),
            ("Link State", "{.linkState}"),
        ],
    },
    Definition {
        namespace: "network",
        r#type: ROUTE_STATUS_TYPE,
        display: "RouteStatus",
        extra_aliases: &["route", "routes"],
        sensitive: false,
        columns: &[
            ("Destination", "{.dst}"),
            ("Gateway", "{.gateway}"),
            ("Link", "{.outLinkName}"),
            ("Metric", "{.priority}"),
        ],
    },
];

/// Linux's interface flags.
const IFF_UP: u32 = 0x1;
const IFF_BROADCAST: u32 = 0x2;
const IFF_LOOPBACK: u32 = 0x8;
const IFF_RUNNING: u32 = 0x40;
const IFF_MULTICAST: u32 = 0x1000;
const IFF_LOWER_UP: u32 = 0x1_0000;
/// An address that does not expire.
const IFA_F_PERMANENT: u32 = 0x80;
/// The metric of the routes Talos adds for a static address.
const ROUTE_METRIC: u32 = 1024;

/// The node's own link.
const LINK: &str = "eth0";

/// The network resources of a node (its hostname, links, addresses, routes).
pub(super) fn items(view: &NodeView<'_>, hostname: &str) -> Vec<Item> {
    let mut items = vec![hostname_status_item(hostname)];
    items.extend(link_items(view.address));
    items.extend(address_items(view.address));
    items.extend(route_items(view.address));
    items
}

/// The subnet around the node's address and its gateway (the subnet's first address).
fn subnet(address: IpAddr) -> (IpAddr, u8, IpAddr) {
    match address {
        IpAddr::V4(v4) => {
            let net = u32::from(v4) & 0xffff_ff00;
            (
                IpAddr::from(std::net::Ipv4Addr::from(net)),
                24,
                IpAddr::from(std::net::Ipv4Addr::from(net + 1)),
            )
        }
        IpAddr::V6(v6) => {
            let net = u128::from(v6) & !((1u128 << 64) - 1);
            (
                IpAddr::from(std::net::Ipv6Addr::from(net)),
                64,
                IpAddr::from(std::net::Ipv6Addr::from(net + 1)),
            )
        }
    }
}

fn family(address: IpAddr) -> (i32, &'static str) {
    match address {
        IpAddr::V4(_) => (2, "inet4"),
        IpAddr::V6(_) => (10, "inet6"),
    }
}

fn prefix(ip: IpAddr, len: u8) -> emulated::NetIpPrefix {
    emulated::NetIpPrefix {
        ip: net_ip(ip).ip,
        prefix_length: i32::from(len),
    }
}

/// A locally administered MAC address made of the node's address.
fn mac(address: IpAddr) -> Vec<u8> {
    let tail = match address {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    vec![0x02, 0x00, tail[0], tail[1], tail[2], tail[3]]
}

fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A link as `LinkStatus` shows it: the numbers on the wire and, for the
/// YAML, their names.
struct Link {
    name: &'static str,
    index: u32,
    /// nethelpers.LinkType: 1 ether, 772 loopback.
    r#type: i32,
    flags: u32,
    hardware_addr: Vec<u8>,
    broadcast_addr: Vec<u8>,
    mtu: u32,
    queue_disc: &'static str,
    /// nethelpers.OperationalState: 0 unknown, 6 up.
    operational_state: i32,
    driver: &'static str,
    flags_text: &'static str,
    type_text: &'static str,
    operational_state_text: &'static str,
}

fn link_items(address: IpAddr) -> Vec<Item> {
    let loopback = Link {
        name: "lo",
        index: 1,
        r#type: 772,
        flags: IFF_UP | IFF_LOOPBACK | IFF_RUNNING | IFF_LOWER_UP,
        hardware_addr: vec![0u8; 6],
        broadcast_addr: vec![0u8; 6],
        mtu: 65_536,
        queue_disc: "noqueue",
        operational_state: 0,
        driver: "",
        flags_text: "UP,LOOPBACK,RUNNING,LOWER_UP",
        type_text: "loopback",
        operational_state_text: "unknown",
    };
    let ethernet = Link {
        name: LINK,
        index: 2,
        r#type: 1,
        flags: IFF_UP | IFF_BROADCAST | IFF_RUNNING | IFF_MULTICAST | IFF_LOWER_UP,
        hardware_addr: mac(address),
        broadcast_addr: vec![0xff; 6],
        mtu: 1500,
        queue_disc: "fq_codel",
        operational_state: 6,
        driver: "virtio_net",
        flags_text: "UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP",
        type_text: "ether",
        operational_state_text: "up",
    };
    [loopback, ethernet].iter().map(link_item).collect()
}

fn link_item(link: &Link) -> Item {
    let spec = emulated::LinkStatusSpec {
        index: link.index,
        r#type: link.r#type,
        link_index: 0,
        flags: link.flags,
        hardware_addr: link.hardware_addr.clone(),
        broadcast_addr: link.broadcast_addr.clone(),
        mtu: link.mtu,
        queue_disc: link.queue_disc.to_string(),
        operational_state: link.operational_state,
        kind: String::new(),
        driver: link.driver.to_string(),
        link_state: true,
        permanent_addr: link.hardware_addr.clone(),
    };
    let yaml = map(vec![
        ("index", Value::from(link.index)),
        ("type", Value::from(link.type_text)),
        ("linkIndex", Value::from(0)),
        ("flags", Value::from(link.flags_text)),
        ("hardwareAddr", Value::from(mac_text(&link.hardware_addr))),
        ("permanentAddr", Value::from(mac_text(&link.hardware_addr))),
        ("broadcastAddr", Value::from(mac_text(&link.broadcast_addr))),
        ("mtu", Value::from(link.mtu)),
        ("queueDisc", Value::from(link.queue_disc)),
        ("operationalState", Value::from(link.operational_state_text)),
        ("kind", Value::from("")),
        ("slaveKind", Value::from("")),
        ("driver", Value::from(link.driver)),
        ("linkState", Value::from(true)),
    ]);
    item(
        "network",
        LINK_STATUS_TYPE,
        link.name,
        spec.encode_to_vec(),
        yaml,
    )
}

fn address_items(address: IpAddr) -> Vec<Item> {
    let (_, len, _) = subnet(address);
    let loopbacks = [
        (IpAddr::from([127, 0, 0, 1]), 8u8),
        (IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 128u8),
    ];
    let mut out: Vec<(&str, u32, IpAddr, u8, i32, &str)> = loopbacks
        .iter()
        .map(|(ip, l)| ("lo", 1, *ip, *l, 254, "host"))
        .collect();
    out.push((LINK, 2, address, len, 0, "global"));
    out.into_iter()
        .map(|(link, index, ip, len, scope, scope_text)| {
            let (fam, fam_text) = family(ip);
            let broadcast = match (ip, link) {
                (IpAddr::V4(v4), LINK) => {
                    Some(IpAddr::from(std::net::Ipv4Addr::from(u32::from(v4) | 0xff)))
                }
                _ => None,
            };
            let spec = emulated::AddressStatusSpec {
                address: Some(prefix(ip, len)),
                local: Some(net_ip(ip)),
                broadcast: broadcast.map(net_ip),
                link_index: index,
                link_name: link.to_string(),
                family: fam,
                scope,
                flags: IFA_F_PERMANENT,
                priority: 0,
            };
            let mut yaml = vec![
                ("address", Value::from(format!("{ip}/{len}"))),
                ("local", Value::from(ip.to_string())),
            ];
            if let Some(b) = broadcast {
                yaml.push(("broadcast", Value::from(b.to_string())));
            }
            yaml.extend([
                ("linkIndex", Value::from(index)),
                ("linkName", Value::from(link)),
                ("family", Value::from(fam_text)),
                ("scope", Value::from(scope_text)),
                ("flags", Value::from("permanent")),
                ("priority", Value::from(0)),
            ]);
            item(
                "network",
                ADDRESS_STATUS_TYPE,
                &format!("{link}/{ip}/{len}"),
                spec.encode_to_vec(),
                map(yaml),
            )
        })
        .collect()
}

/// The default route through the gateway and the route to the link's subnet.
fn route_items(address: IpAddr) -> Vec<Item> {
    let (net, len, gateway) = subnet(address);
    let (fam, fam_text) = family(address);
    let link_prefix = if fam == 10 {
        format!("{LINK}/")
    } else {
        String::new()
    };
    let routes = [
        (None, Some(gateway), 0, 3, "global", "unicast", "static"),
        (Some((net, len)), None, 253, 2, "link", "unicast", "kernel"),
    ];
    routes
        .into_iter()
        .map(
            |(dst, gw, scope, protocol, scope_text, type_text, protocol_text)| {
                let dst_text = dst.map_or(String::new(), |(ip, l)| format!("{ip}/{l}"));
                let gw_text = gw.map_or(String::new(), |g| g.to_string());
                let spec = emulated::RouteStatusSpec {
                    family: fam,
                    destination: dst.map(|(ip, l)| prefix(ip, l)),
                    source: Some(net_ip(address)),
                    gateway: gw.map(net_ip),
                    out_link_index: 2,
                    out_link_name: LINK.to_string(),
                    table: 254,
                    priority: ROUTE_METRIC,
                    scope,
                    r#type: 1,
                    flags: 0,
                    protocol,
                    mtu: 0,
                };
                let yaml = map(vec![
                    ("family", Value::from(fam_text)),
                    ("dst", Value::from(dst_text.as_str())),
                    ("src", Value::from(address.to_string())),
                    ("gateway", Value::from(gw_text.as_str())),
                    ("outLinkIndex", Value::from(2)),
                    ("outLinkName", Value::from(LINK)),
                    ("table", Value::from("main")),
                    ("priority", Value::from(ROUTE_METRIC)),
                    ("scope", Value::from(scope_text)),
                    ("type", Value::from(type_text)),
                    ("flags", Value::from("")),
                    ("protocol", Value::from(protocol_text)),
                ]);
                item(
                    "network",
                    ROUTE_STATUS_TYPE,
                    &format!("{link_prefix}{fam_text}/{gw_text}/{dst_text}/{ROUTE_METRIC}"),
                    spec.encode_to_vec(),
                    yaml,
                )
            },
        )
        .collect()
}

fn hostname_status_item(hostname: &str) -> Item {
    item(
        kinds::HOSTNAME_STATUS.namespace,
        kinds::HOSTNAME_STATUS.r#type,
        kinds::HOSTNAME_STATUS.id,
        specs::HostnameStatusSpec {
            hostname: hostname.to_string(),
            domainname: String::new(),
        }
        .encode_to_vec(),
        map(vec![
            ("hostname", Value::from(hostname)),
            ("domainname", Value::from("")),
        ]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_routes_through_the_first_address_of_its_subnet() {
        let (net, len, gw) = subnet(IpAddr::from([127, 31, 7, 12]));
        assert_eq!(
            (net.to_string(), len, gw.to_string()),
            ("127.31.7.0".into(), 24, "127.31.7.1".into())
        );
        let ids: Vec<String> = route_items(IpAddr::from([10, 5, 0, 2]))
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(ids, ["inet4/10.5.0.1//1024", "inet4//10.5.0.0/24/1024"]);
    }
}
