//! `Reset` (`talosctl reset`): answered at once with an actor id, then run
//! as Talos's reset sequence runs it — a graceful reset of a control plane
//! leaves etcd first (a refused leave aborts the reset: the node stays as
//! it was), then the node stops, its volumes are wiped, and it reboots
//! (back in maintenance mode when STATE was wiped, with a new identity and
//! boot id) or powers off. The lab has no kubelet to drain: Ichor drains
//! through the Kubernetes API before it resets.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use ichor_talos_client::proto::machine;

use super::{Caller, NodeApi, caller};
use crate::node::{Node, Wipe, WriteAction, check_reset};

impl NodeApi {
    pub(super) async fn reset_answer(
        &self,
        request: Request<machine::ResetRequest>,
    ) -> Result<Response<machine::ResetResponse>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let messages = self
            .unary(&md, |node| {
                // A node in maintenance mode takes a reset over its insecure API.
                let maintenance = matches!(caller, Caller::Maintenance) && node.in_maintenance();
                if !caller.is_admin() && !maintenance {
                    return Err(Status::permission_denied("not authorized"));
                }
                let disks: Vec<String> =
                    node.spec.disks.iter().map(|d| d.dev_path.clone()).collect();
                let wipe = check_reset(&req, &node.located_volumes(), &disks)?;
                let actor_id = crate::node::new_uuid();
                node.lock()
                    .journal
                    .talos(format!("reset request received. actorID: {actor_id}"));
                node.record(WriteAction::Reset {
                    graceful: req.graceful,
                    reboot: req.reboot,
                    wipe: wipe.volumes.clone(),
                });
                let api = self.clone();
                let node = Arc::clone(node);
                let (graceful, reboot) = (req.graceful, req.reboot);
                tokio::spawn(async move { api.run_reset(node, graceful, reboot, wipe).await });
                Ok(machine::Reset {
                    metadata: None,
                    actor_id,
                })
            })
            .await?;
        Ok(Response::new(machine::ResetResponse { messages }))
    }

    /// The reset sequence, after the answer.
    async fn run_reset(&self, node: Arc<Node>, graceful: bool, reboot: bool, wipe: Wipe) {
        // Talos answers first; its sequence starts right after.
        tokio::task::yield_now().await;
        let member = self.cluster.membership.member_of(node.index);
        let leaves = graceful && node.is_control_plane() && member.is_some();
        if leaves && let Err(refused) = self.leave_etcd(node.index) {
            let mut st = node.lock();
            st.journal
                .talos(format!("reset failed: {}", refused.message()));
            tracing::info!(node = %node.spec.hostname, reason = %refused.message(), "reset aborted: etcd refused the leave");
            return;
        }
        node.wipe(&wipe);
        if reboot {
            Arc::clone(&node).boot_after(node.reboot_outage).await;
        } else {
            node.power_off();
        }
    }
}
