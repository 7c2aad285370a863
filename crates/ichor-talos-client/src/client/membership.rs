//! A node leaving the cluster: it leaves etcd itself (`EtcdLeaveCluster`),
//! a peer removes the member of a node that is gone
//! (`EtcdRemoveMemberByID`), and the node is reset (`Reset`). Forfeiting
//! leadership and the member list are [`super::etcd_members`]'s.

use crate::error::Error;
use crate::proto::machine;

use super::TalosClient;

/// A system volume a reset wipes, by its label.
pub const STATE: &str = "STATE";
pub const EPHEMERAL: &str = "EPHEMERAL";
/// The volumes Talos v1.14 may carve out of EPHEMERAL: wiping EPHEMERAL
/// alone leaves them (and etcd's data with them).
pub const DEDICATED_V1_14: [&str; 4] = ["ETCD", "CRI", "KUBELET", "LOG"];

/// How a node is reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetRequest {
    /// Leave etcd and drain first (a node that leaves the cluster).
    pub graceful: bool,
    /// Reboot afterwards (a node wiped of STATE comes back in maintenance
    /// mode); otherwise it powers off.
    pub reboot: bool,
    /// The system volumes to wipe, by label; empty wipes the whole system disk.
    pub wipe: Vec<String>,
}

impl ResetRequest {
    /// A graceful reset that reboots into maintenance mode: STATE and
    /// EPHEMERAL wiped, and the volumes Talos v1.14 may carve out of
    /// EPHEMERAL among `volumes` (the node's, [`TalosClient::volume_labels`]):
    /// Talos refuses a label it cannot find.
    pub fn back_to_maintenance(volumes: &[String]) -> Self {
        let mut wipe = vec![STATE.to_string(), EPHEMERAL.to_string()];
        wipe.extend(
            DEDICATED_V1_14
                .iter()
                .filter(|l| volumes.iter().any(|v| v == *l))
                .map(|l| l.to_string()),
        );
        ResetRequest {
            graceful: true,
            reboot: true,
            wipe,
        }
    }

    fn to_proto(&self) -> machine::ResetRequest {
        machine::ResetRequest {
            graceful: self.graceful,
            reboot: self.reboot,
            system_partitions_to_wipe: self
                .wipe
                .iter()
                .map(|label| machine::ResetPartitionSpec {
                    label: label.clone(),
                    wipe: true,
                })
                .collect(),
            user_disks_to_wipe: Vec::new(),
            mode: machine::reset_request::WipeMode::SystemDisk as i32,
        }
    }
}

/// The node's volumes (`VolumeStatuses.block.talos.dev`, by id).
const VOLUME_STATUSES: (&str, &str) = ("runtime", "VolumeStatuses.block.talos.dev");

impl TalosClient {
    /// The ids of the node's volumes (`STATE`, `EPHEMERAL`, and on Talos
    /// v1.14 `ETCD` and the others a config carved out).
    pub async fn volume_labels(&self, node: &str) -> Result<Vec<String>, Error> {
        let (namespace, r#type) = VOLUME_STATUSES;
        Ok(self
            .cosi_list(node, namespace, r#type)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect())
    }

    /// `MachineService/EtcdLeaveCluster` on the control plane that leaves.
    pub async fn etcd_leave_cluster(&self, node: &str) -> Result<(), Error> {
        let call = "EtcdLeaveCluster";
        let request = self.request(node, machine::EtcdLeaveClusterRequest {})?;
        let response = self
            .call(node, call, self.machine().etcd_leave_cluster(request))
            .await?;
        self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(())
    }

    /// `MachineService/EtcdRemoveMemberByID` on a peer: removes the member
    /// `id` (one whose node is gone or cannot leave itself).
    pub async fn etcd_remove_member_by_id(&self, node: &str, id: u64) -> Result<(), Error> {
        let call = "EtcdRemoveMemberByID";
        let request = self.request(node, machine::EtcdRemoveMemberByIdRequest { member_id: id })?;
        let response = self
            .call(node, call, self.machine().etcd_remove_member_by_id(request))
            .await?;
        self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(())
    }

    /// `MachineService/Reset`. Talos answers at once and resets after the
    /// answer: `Ok` means the node took the request (returns its actor id).
    pub async fn reset(&self, node: &str, reset: &ResetRequest) -> Result<String, Error> {
        let call = "Reset";
        let request = self.request(node, reset.to_proto())?;
        let response = self.call(node, call, self.machine().reset(request)).await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.actor_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_maintenance_wipes_state_ephemeral_and_the_dedicated_volumes_there_are() {
        let r = ResetRequest::back_to_maintenance(&[]).to_proto();
        assert!(r.graceful && r.reboot);
        let labels: Vec<_> = r
            .system_partitions_to_wipe
            .iter()
            .map(|p| (p.label.as_str(), p.wipe))
            .collect();
        assert_eq!(labels, [("STATE", true), ("EPHEMERAL", true)]);
        let volumes: Vec<String> = ["META", "STATE", "EPHEMERAL", "ETCD", "LOG"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = ResetRequest::back_to_maintenance(&volumes);
        assert_eq!(r.wipe, ["STATE", "EPHEMERAL", "ETCD", "LOG"]);
        assert_eq!(
            r.to_proto().mode,
            machine::reset_request::WipeMode::SystemDisk as i32
        );
    }
}
