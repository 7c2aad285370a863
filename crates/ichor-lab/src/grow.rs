//! The lab grows and shrinks: a node added to a running lab boots in
//! maintenance mode (no config; the insecure API on port 50000 of the
//! next loopback address of the lab's own), as a machine newly racked
//! would; and each node's kubelet registers its Node once a config is
//! applied to it, as Talos's kubelet does when it starts. Nothing is
//! deleted by the lab: a node wiped back to maintenance mode keeps its
//! Node until someone (Ichor) deletes it.
//!
//! `ichor-lab node add` reaches the running `ichor-lab up` through the
//! lab's control socket ([`crate::control`]).

use std::net::{IpAddr, Ipv4Addr};

use ichor_talemu::{ConfiguredNode, NodeSpec};

use crate::nodes::{Kubelet, register_node};
use crate::{Lab, LabError, LabOptions, LabShape};

/// The role a node added to the lab is meant for: it names the node
/// (`lab-cp-N` or `lab-worker-N`). A node in maintenance mode has no role
/// yet; the config applied to it gives it one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeRole {
    #[default]
    Worker,
    ControlPlane,
}

/// A role the lab does not know (`--role`).
#[derive(Debug, thiserror::Error)]
#[error("unknown role {0:?}: use worker or controlplane")]
pub struct UnknownRole(pub String);

impl std::str::FromStr for NodeRole {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, UnknownRole> {
        match s {
            "worker" => Ok(NodeRole::Worker),
            "controlplane" | "control-plane" => Ok(NodeRole::ControlPlane),
            o => Err(UnknownRole(o.into())),
        }
    }
}

impl NodeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Worker => "worker",
            NodeRole::ControlPlane => "controlplane",
        }
    }
}

/// A node to add to a running lab.
#[derive(Debug, Clone, Default)]
pub struct NewNode {
    pub role: NodeRole,
    /// The Talos the node runs, as the shape's version (`None`: the lab's).
    pub shape: Option<LabShape>,
}

/// A node added to the lab, in maintenance mode.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AddedNode {
    /// Its index among the lab's nodes (and the emulator's).
    pub index: usize,
    pub hostname: String,
    pub address: IpAddr,
    /// `ip:50000`: where its Talos API (insecure, in maintenance mode) answers.
    pub endpoint: String,
    pub talos_version: String,
}

/// The next node's name: `lab-cp-N` or `lab-worker-N`, N one more than
/// the highest of that role's names so far.
pub(crate) fn next_hostname(hostnames: &[String], role: NodeRole) -> String {
    let prefix = match role {
        NodeRole::Worker => "lab-worker-",
        NodeRole::ControlPlane => "lab-cp-",
    };
    let highest = hostnames
        .iter()
        .filter_map(|h| h.strip_prefix(prefix)?.parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    format!("{prefix}{}", highest + 1)
}

/// The next node's address: the lab's /24, host part 10 + its index.
pub(crate) fn next_address(addresses: &[IpAddr]) -> Result<IpAddr, LabError> {
    let index = addresses.len();
    let (IpAddr::V4(first), Ok(host)) = (
        addresses
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        u8::try_from(10 + index),
    ) else {
        return Err(LabError::Config(format!(
            "the lab has no address left for a node {}",
            index + 1
        )));
    };
    let [a, b, c, _] = first.octets();
    Ok(IpAddr::V4(Ipv4Addr::new(a, b, c, host)))
}

impl Lab {
    /// Starts one more emulated node in maintenance mode in the running
    /// lab, on the next address of the lab's /24 and port 50000. Its Node
    /// registers once a config is applied to it.
    pub async fn add_node(&mut self, node: NewNode) -> Result<AddedNode, LabError> {
        let hostname = next_hostname(&self.hostnames, node.role);
        let address = next_address(&self.addresses)?;
        let talos_version = node.shape.map_or_else(
            || self.options.talos_version.clone(),
            LabShape::talos_version,
        );
        let spec = NodeSpec::maintenance(hostname.clone())
            .with_address(address)
            .with_port(50000)
            .with_version(talos_version.clone());
        let handle = self.emulator.add_node(spec).await?;
        self.addresses.push(address);
        self.hostnames.push(hostname.clone());
        Ok(AddedNode {
            index: self.hostnames.len() - 1,
            hostname,
            address,
            endpoint: handle.endpoint(),
            talos_version,
        })
    }
}

/// What the lab's kubelets need to play a node configured later: its
/// options, and (with [`LabOptions::components`]) an admin identity to read
/// the node's Talos API for the components a control plane runs.
pub(crate) struct Kubelets {
    pub options: LabOptions,
    pub admin: Option<ichor_talos_client::ClientIdentity>,
}

/// The component plays started for nodes configured later, stopped with
/// the kubelets' task.
#[derive(Default)]
struct Plays(std::collections::HashMap<String, tokio::task::JoinHandle<()>>);

impl Drop for Plays {
    fn drop(&mut self) {
        for play in self.0.values() {
            play.abort();
        }
    }
}

/// Registers each node's Node as its kubelet would, when a config is
/// applied to the node (the lab's nodes that start configured were
/// registered when the lab came up), and plays its components' mirror
/// pods as the lab does for the others. Runs until aborted.
pub(crate) fn spawn_kubelets(
    client: kube::Client,
    mut configured: tokio::sync::broadcast::Receiver<ConfiguredNode>,
    kubelets: Kubelets,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut plays = Plays::default();
        loop {
            let node = match configured.recv().await {
                Ok(node) => node,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "lab: kubelets missed nodes leaving maintenance mode"
                    );
                    continue;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            register(&client, &node, &kubelets.options).await;
            if let Some(admin) = &kubelets.admin
                && !plays.0.contains_key(&node.hostname)
            {
                let endpoint = std::net::SocketAddr::new(node.address, 50000).to_string();
                match ichor_talos_client::TalosClient::new(&endpoint, admin, Default::default()) {
                    Ok(talos) => {
                        let play = crate::components::spawn(
                            client.clone(),
                            vec![crate::components::LabKubelet {
                                node: node.hostname.clone(),
                                control_plane: node.control_plane,
                                talos,
                            }],
                        );
                        plays.0.insert(node.hostname.clone(), play);
                    }
                    Err(e) => {
                        tracing::warn!(node = %node.hostname, error = %ichor_api::error_text::chain(&e), "lab: a client of the node's Talos API");
                    }
                }
            }
        }
    })
}

/// Registers `node`'s Node, retried as a kubelet retries until the API
/// server takes it.
async fn register(client: &kube::Client, node: &ConfiguredNode, options: &LabOptions) {
    let kubelet = Kubelet {
        name: &node.hostname,
        address: node.address,
        index: node.index,
        control_plane: node.control_plane,
        talos_version: &node.talos_version,
    };
    for attempt in 0..10u32 {
        match register_node(client, &kubelet, options).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(node = %node.hostname, attempt, error = %ichor_api::error_text::chain(&e), "lab: registering a Node");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_nodes_are_named_after_the_highest_of_their_role() {
        let names: Vec<String> = ["lab-cp-1", "lab-cp-3", "lab-worker-1"]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        assert_eq!(next_hostname(&names, NodeRole::ControlPlane), "lab-cp-4");
        assert_eq!(next_hostname(&names, NodeRole::Worker), "lab-worker-2");
        assert_eq!(next_hostname(&[], NodeRole::Worker), "lab-worker-1");
    }

    #[test]
    fn added_nodes_take_the_next_address_of_the_labs_own() {
        let addresses = vec![
            IpAddr::from([127, 40, 7, 10]),
            IpAddr::from([127, 40, 7, 11]),
        ];
        assert_eq!(
            next_address(&addresses).unwrap(),
            IpAddr::from([127, 40, 7, 12])
        );
        let full: Vec<IpAddr> = (0..246).map(|_| IpAddr::from([127, 1, 1, 1])).collect();
        assert!(next_address(&full).is_err());
    }

    #[test]
    fn roles_read_as_the_cli_writes_them() {
        assert_eq!(
            "controlplane".parse::<NodeRole>().unwrap(),
            NodeRole::ControlPlane
        );
        assert_eq!("worker".parse::<NodeRole>().unwrap(), NodeRole::Worker);
        assert!("master".parse::<NodeRole>().is_err());
    }
}
