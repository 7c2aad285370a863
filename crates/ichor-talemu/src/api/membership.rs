//! The control planes' etcd membership as the nodes live it: a configured
//! control plane of a bootstrapped cluster that is no member joins (it
//! removes a member named like its hostname, adds itself as a learner
//! while no other learner waits, and is promoted once it caught up), as
//! Talos's etcd service does; `EtcdLeaveCluster` (`talosctl etcd leave`)
//! removes the node's own member and stops its etcd; a peer removes a
//! member by id (`talosctl etcd remove-member`). Every change, and every
//! change in how many voters are healthy, goes to the membership log.
//!
//! [`run_etcd_service`] is the loop that joins, promotes and watches health.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use ichor_talos_client::proto::machine;

use super::{ADMIN, Cluster, NodeApi, caller, not_in_maintenance};
use crate::host;
use crate::journal::ServiceState;
use crate::membership::{Member, MembershipChangeKind, Refusal};
use crate::node::{Node, WriteAction};

/// Joins, promotes and watches the members' health every `interval`, until
/// `shutdown`.
pub(crate) async fn run_etcd_service(
    cluster: Arc<Cluster>,
    interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let api = NodeApi { cluster, me: 0 };
    loop {
        api.etcd_service_tick();
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// What a node's etcd service does now.
enum Wants {
    Nothing,
    Join,
    Promote(u64),
}

impl NodeApi {
    /// The ids of the members whose node runs them and answers now.
    pub(crate) fn healthy_member_ids(&self) -> HashSet<u64> {
        self.cluster
            .membership
            .members()
            .into_iter()
            .filter(|m| self.member_healthy(m))
            .map(|m| m.id)
            .collect()
    }

    /// A member is healthy when its node is up and running, and runs it.
    fn member_healthy(&self, m: &Member) -> bool {
        let Some(node) = self.cluster.nodes.try_get(m.node) else {
            return false;
        };
        if node.is_down() || node.member_id() != m.id {
            return false;
        }
        let st = node.lock();
        st.stage == 4
            && st.runs_control_plane
            && st.etcd_data
            && !st.etcd_unhealthy
            && self.cluster.discovery.bootstrapped()
    }

    /// Logs a membership change with the counts after it.
    pub(crate) fn log_membership(&self, kind: MembershipChangeKind, member: Option<&Member>) {
        let healthy = self.healthy_member_ids();
        self.cluster
            .membership
            .log(kind, member, |m| healthy.contains(&m.id));
    }

    /// One entry per member the emulator started with.
    pub(crate) fn log_started_members(&self) {
        for m in self.cluster.membership.members() {
            self.log_membership(MembershipChangeKind::Started, Some(&m));
        }
    }

    /// etcd was bootstrapped (or recovered) on node `bootstrapper`: every
    /// configured control plane that is no member starts as a voter at once
    /// (the cluster is new; the others were waiting to join it).
    pub(crate) fn add_bootstrap_members(&self, bootstrapper: usize) {
        let mut order: Vec<Arc<Node>> = self.cluster.nodes.all();
        // The bootstrapper's member comes first, as etcd lists it.
        order.sort_by_key(|n| n.index != bootstrapper);
        for n in order {
            if self.cluster.membership.member_of(n.index).is_some() || !n.is_control_plane() {
                continue;
            }
            let member = {
                let mut st = n.lock();
                st.etcd_data = true;
                n.new_member(&st, crate::discovery::member_id(&n.spec.hostname), false)
            };
            if self.cluster.membership.add(member.clone()).is_ok() {
                self.log_membership(MembershipChangeKind::Started, Some(&member));
            }
        }
    }

    /// One pass of every control plane's etcd service, then a look at health.
    fn etcd_service_tick(&self) {
        for node in self.cluster.nodes.all() {
            match self.etcd_wants(&node) {
                Wants::Nothing => {}
                Wants::Join => self.join(&node),
                Wants::Promote(id) => {
                    if self.cluster.membership.promote(id) {
                        node.lock().journal.output(
                            "etcd",
                            format!("{{\"level\":\"info\",\"msg\":\"promoted learner to voting member\",\"member-id\":\"{id:x}\"}}"),
                        );
                        let member = self.cluster.membership.member_of(node.index);
                        self.log_membership(MembershipChangeKind::Promoted, member.as_ref());
                    }
                }
            }
        }
        let healthy = self.healthy_member_ids();
        self.cluster
            .membership
            .log_health(|m| healthy.contains(&m.id));
    }

    fn etcd_wants(&self, node: &Arc<Node>) -> Wants {
        if !self.cluster.discovery.bootstrapped() || node.is_down() {
            return Wants::Nothing;
        }
        let st = node.lock();
        // A member whose data is gone (EPHEMERAL wiped) joins again, as a
        // Talos node with an empty etcd folder does.
        if let Some(member) = self.cluster.membership.member_of(node.index)
            && st.etcd_data
        {
            return if member.learner && member.added.elapsed() >= self.cluster.etcd_catch_up {
                Wants::Promote(member.id)
            } else {
                Wants::Nothing
            };
        }
        if st.runs_control_plane && st.stage == 4 && !st.etcd_unhealthy && !st.etcd_left {
            Wants::Join
        } else {
            Wants::Nothing
        }
    }

    /// Talos's join: remove any member named like this node's hostname,
    /// then add this node as a learner (not while another learner waits:
    /// the next pass tries again).
    fn join(&self, node: &Arc<Node>) {
        let hostname = node.hostname();
        let same_name: Vec<Member> = self
            .cluster
            .membership
            .members()
            .into_iter()
            .filter(|m| m.hostname == hostname)
            .collect();
        for m in same_name {
            let healthy = self.healthy_member_ids();
            match self
                .cluster
                .membership
                .remove(m.id, |x| healthy.contains(&x.id))
            {
                Ok(removed) => {
                    // The joining node's own old member (its data wiped) has
                    // no etcd left to stop.
                    if removed.node != node.index {
                        self.stop_removed_member(&removed);
                    }
                    self.log_membership(MembershipChangeKind::ReplacedOnJoin, Some(&removed));
                }
                Err(_) => return,
            }
        }
        let id = rand::random::<u64>() | 1;
        let (member, config) = {
            let st = node.lock();
            (node.new_member(&st, id, true), st.active.clone())
        };
        if self.cluster.membership.add(member.clone()).is_err() {
            return;
        }
        {
            let mut st = node.lock();
            st.etcd_data = true;
            if let Some(config) = config {
                host::record_etcd_start(&mut st.journal, &config, id, false);
            }
            node.refresh(&mut st);
        }
        self.log_membership(MembershipChangeKind::LearnerAdded, Some(&member));
    }

    /// Removes member `id` as etcd would, saying why not as etcd does.
    fn remove_member(&self, id: u64) -> Result<Member, Refusal> {
        let healthy = self.healthy_member_ids();
        self.cluster
            .membership
            .remove(id, |m| healthy.contains(&m.id))
    }

    /// A removed member's node stops its etcd (etcd exits once its member
    /// is removed) and keeps it stopped until it boots again.
    fn stop_removed_member(&self, removed: &Member) {
        let Some(node) = self.cluster.nodes.try_get(removed.node) else {
            return;
        };
        let mut st = node.lock();
        st.etcd_left = true;
        st.etcd_data = false;
        st.journal.output(
            "etcd",
            format!(
                "{{\"level\":\"warn\",\"msg\":\"the member has been permanently removed from the cluster\",\"member-id\":\"{:x}\"}}",
                removed.id
            ),
        );
        st.journal.service(
            "etcd",
            ServiceState::Finished,
            "Service finished successfully",
        );
        node.refresh(&mut st);
    }

    /// Node `i` leaves etcd: removes its own member (refused as etcd
    /// refuses), stops etcd and empties its data.
    pub(crate) fn leave_etcd(&self, i: usize) -> Result<(), Status> {
        let node = self.node(i);
        let Some(member) = self.cluster.membership.member_of(i) else {
            // Talos: the member is already gone; nothing to remove.
            return Ok(());
        };
        match self.remove_member(member.id) {
            // Talos: a member already gone is a leave done.
            Ok(_) | Err(Refusal::NotFound) => {}
            Err(refusal) => {
                return Err(Status::unknown(format!(
                    "failed to leave cluster: failed to remove member {}: {refusal}",
                    member.id
                )));
            }
        }
        self.stop_removed_member(&member);
        node.lock()
            .journal
            .talos("etcd: left the cluster, data removed");
        self.log_membership(MembershipChangeKind::Left, Some(&member));
        Ok(())
    }

    pub(super) async fn etcd_leave_cluster_answer(
        &self,
        request: Request<machine::EtcdLeaveClusterRequest>,
    ) -> Result<Response<machine::EtcdLeaveClusterResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let messages = self
            .unary(request.metadata(), |node| {
                Self::control_plane_for(node, "EtcdLeaveCluster", "etcd leave")?;
                self.require_leader()?;
                self.leave_etcd(node.index)?;
                node.record(WriteAction::EtcdLeaveCluster);
                Ok(machine::EtcdLeaveCluster { metadata: None })
            })
            .await?;
        Ok(Response::new(machine::EtcdLeaveClusterResponse {
            messages,
        }))
    }

    pub(super) async fn etcd_remove_member_by_id_answer(
        &self,
        request: Request<machine::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<machine::EtcdRemoveMemberByIdResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN])?;
        let id = request.get_ref().member_id;
        let messages = self
            .unary(request.metadata(), |node| {
                Self::control_plane_for(node, "EtcdRemoveMemberByID", "etcd remove member")?;
                self.require_leader()?;
                let removed = match self.remove_member(id) {
                    Ok(removed) => removed,
                    Err(Refusal::NotFound) => {
                        return Err(Status::not_found(format!(
                            "failed to remove member {id}: {}",
                            Refusal::NotFound
                        )));
                    }
                    Err(refusal) => {
                        return Err(Status::unknown(format!(
                            "failed to remove member: failed to remove member {id}: {refusal}"
                        )));
                    }
                };
                self.stop_removed_member(&removed);
                self.log_membership(MembershipChangeKind::RemovedById, Some(&removed));
                node.record(WriteAction::EtcdRemoveMemberById { member_id: id });
                Ok(machine::EtcdRemoveMemberById { metadata: None })
            })
            .await?;
        Ok(Response::new(machine::EtcdRemoveMemberByIdResponse {
            messages,
        }))
    }

    /// Talos's check of a cluster-wide etcd call: a configured control plane.
    fn control_plane_for(node: &Node, method: &str, api: &str) -> Result<(), Status> {
        if node.in_maintenance() {
            return Err(not_in_maintenance(method));
        }
        if !node.is_control_plane() {
            return Err(Status::unimplemented(format!(
                "{api} is only available on control plane nodes"
            )));
        }
        Ok(())
    }

    /// Cluster calls go `WithRequireLeader`: a majority of the voters must
    /// be healthy.
    fn require_leader(&self) -> Result<(), Status> {
        let healthy = self.healthy_member_ids();
        let voters: Vec<Member> = self
            .cluster
            .membership
            .members()
            .into_iter()
            .filter(|m| !m.learner)
            .collect();
        let up = voters.iter().filter(|m| healthy.contains(&m.id)).count();
        if voters.is_empty() || up < voters.len() / 2 + 1 {
            return Err(Status::unavailable("etcdserver: no leader"));
        }
        Ok(())
    }
}
