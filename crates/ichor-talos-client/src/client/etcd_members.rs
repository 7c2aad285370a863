//! etcd's membership through `MachineService`: the members, a leader
//! handing over, and the bootstrap of a new cluster — empty, or recovered
//! from an uploaded snapshot. (A member's status, its snapshot and the
//! upload of one are [`crate::etcd`]'s.)

use crate::error::Error;
use crate::proto::machine;

use super::TalosClient;

/// One etcd member as `EtcdMemberList` reports it. `name` is empty for a
/// member that has not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    pub id: u64,
    pub name: String,
    pub is_learner: bool,
}

impl TalosClient {
    /// `MachineService/EtcdMemberList` (fails when etcd has no leader).
    pub async fn etcd_members(&self, node: &str) -> Result<Vec<EtcdMember>, Error> {
        let call = "EtcdMemberList";
        let request = self.request(node, machine::EtcdMemberListRequest { query_local: false })?;
        let response = self
            .call(node, call, self.machine().etcd_member_list(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.members
            .into_iter()
            .map(|m| EtcdMember {
                id: m.id,
                name: m.hostname,
                is_learner: m.is_learner,
            })
            .collect())
    }

    /// `MachineService/EtcdForfeitLeadership` on a control plane; returns the member named.
    pub async fn etcd_forfeit_leadership(&self, node: &str) -> Result<String, Error> {
        let call = "EtcdForfeitLeadership";
        let request = self.request(node, machine::EtcdForfeitLeadershipRequest {})?;
        let response = self
            .call(node, call, self.machine().etcd_forfeit_leadership(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.member)
    }

    /// `MachineService/Bootstrap` on a control plane: starts etcd as a new
    /// cluster. Returns `Ok(false)` when the node answers that etcd's data
    /// directory is not empty (`AlreadyExists`): the cluster was bootstrapped before.
    pub async fn bootstrap(&self, node: &str) -> Result<bool, Error> {
        let call = "Bootstrap";
        let request = self.request(
            node,
            machine::BootstrapRequest {
                recover_etcd: false,
                recover_skip_hash_check: false,
            },
        )?;
        match self
            .call(node, call, self.machine().bootstrap(request))
            .await
        {
            Ok(response) => {
                self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
                Ok(true)
            }
            Err(Error::Status {
                code: tonic::Code::AlreadyExists,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `MachineService/Bootstrap{recover_etcd}` on a control plane: starts
    /// etcd as a new cluster from the snapshot uploaded before with
    /// [`TalosClient::etcd_recover`] (`skip_hash_check`: accept a snapshot
    /// without etcd's sha256 trailer, such as a copy of `member/snap/db`).
    ///
    /// Talos answers before it restores: `Ok(())` means the node took the
    /// request, not that etcd runs. It keeps the request only in memory, so
    /// a reboot before etcd started loses it, and a snapshot that fails its
    /// checks leaves etcd waiting (the reason is the etcd service's last
    /// event). The caller polls [`TalosClient::etcd_service`] until etcd runs
    /// and is healthy, then [`TalosClient::etcd_status`]. Refusals come back
    /// as [`Error::Status`]: `AlreadyExists` when etcd's data directory is not
    /// empty (etcd runs or ran there), `FailedPrecondition` when the node is
    /// not ready for a bootstrap.
    pub async fn bootstrap_recover(&self, node: &str, skip_hash_check: bool) -> Result<(), Error> {
        let call = "Bootstrap";
        let request = self.request(
            node,
            machine::BootstrapRequest {
                recover_etcd: true,
                recover_skip_hash_check: skip_hash_check,
            },
        )?;
        let response = self
            .call(node, call, self.machine().bootstrap(request))
            .await?;
        self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(())
    }
}
