//! The one etcd membership the control planes of an emulator share, as
//! etcd keeps it: members (voters and learners) with their ids and names,
//! and a log of every change with the counts after it, which tests read
//! back ([`crate::Emulator::membership_log`]).
//!
//! The rules are etcd's (strict reconfiguration, the default): a learner
//! is added only while no other learner waits (etcd admits one at a time)
//! and promoted once it has caught up; removing a voter is refused unless
//! the voters left that run still form a majority of the voters left;
//! removing a learner is always allowed.
//!
//! Who is healthy is the nodes' business (their etcd runs, they answer):
//! the emulator's cluster decides it and hands the answer in.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

/// One etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub id: u64,
    /// The member's name: its node's hostname when it joined.
    pub hostname: String,
    /// The index of the node it runs on.
    pub node: usize,
    /// Where its peer and client URLs point.
    pub address: IpAddr,
    pub learner: bool,
    /// When it was added (a learner is promoted once it caught up).
    pub added: Instant,
}

/// What changed in the membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipChangeKind {
    /// A member the emulator started with, or one of a bootstrap (or a
    /// recovery): a voter at once.
    Started,
    /// A joining control plane added itself as a learner.
    LearnerAdded,
    /// A learner caught up and became a voter.
    Promoted,
    /// A member removed itself (`EtcdLeaveCluster`, or a graceful `Reset`).
    Left,
    /// A peer removed the member by id (`EtcdRemoveMemberByID`).
    RemovedById,
    /// A joining control plane removed the member named like its hostname
    /// before adding itself, as Talos does.
    ReplacedOnJoin,
    /// etcd's data was lost everywhere: no member is left.
    Lost,
    /// No member changed, but how many voters are healthy did (a node went
    /// down, rebooted, came back, its etcd stopped or started).
    Health,
}

/// One change of the membership, with the counts right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipChange {
    pub at: SystemTime,
    pub kind: MembershipChangeKind,
    /// The member concerned (0 for [`MembershipChangeKind::Lost`] and
    /// [`MembershipChangeKind::Health`]).
    pub member_id: u64,
    /// Its name (empty when no one member is concerned).
    pub hostname: String,
    /// Members after the change, learners included.
    pub members: usize,
    /// Voters after the change.
    pub voters: usize,
    /// Voters whose node runs etcd and answers, after the change.
    pub healthy_voters: usize,
}

/// Why etcd refused a membership change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// etcd's `ErrMemberNotFound`.
    #[error("etcdserver: member not found")]
    NotFound,
    /// etcd's `ErrNotEnoughStartedMembers`: the voters left that run would
    /// not form a majority.
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStarted,
    /// etcd's `ErrTooManyLearners`: one learner at a time.
    #[error("etcdserver: too many learner members in cluster")]
    TooManyLearners,
}

/// Whether etcd removes member `id` from `members`, given who is healthy:
/// a learner always; a voter when the healthy voters left are a majority of
/// the voters left (etcd's `IsReadyToRemoveVotingMember`).
pub(crate) fn may_remove(
    members: &[Member],
    id: u64,
    healthy: impl Fn(&Member) -> bool,
) -> Result<(), Refusal> {
    let target = members
        .iter()
        .find(|m| m.id == id)
        .ok_or(Refusal::NotFound)?;
    if target.learner {
        return Ok(());
    }
    let left: Vec<&Member> = members
        .iter()
        .filter(|m| !m.learner && m.id != id)
        .collect();
    let started = left.iter().filter(|m| healthy(m)).count();
    if started < left.len() / 2 + 1 {
        return Err(Refusal::NotEnoughStarted);
    }
    Ok(())
}

/// The membership and its log.
#[derive(Debug, Default)]
pub(crate) struct Membership {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    members: Vec<Member>,
    log: Vec<MembershipChange>,
    /// The healthy voters of the last entry (a change of it is logged;
    /// none before the first entry).
    last_healthy: usize,
}

impl Membership {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every member, in the order they were added.
    pub fn members(&self) -> Vec<Member> {
        self.inner().members.clone()
    }

    /// The member node `node` runs, if any.
    pub fn member_of(&self, node: usize) -> Option<Member> {
        self.inner()
            .members
            .iter()
            .find(|m| m.node == node)
            .cloned()
    }

    /// Adds a member (a learner only while no other learner waits).
    pub fn add(&self, member: Member) -> Result<(), Refusal> {
        let mut inner = self.inner();
        if member.learner && inner.members.iter().any(|m| m.learner) {
            return Err(Refusal::TooManyLearners);
        }
        inner.members.retain(|m| m.id != member.id);
        inner.members.push(member);
        Ok(())
    }

    /// Removes member `id` when etcd would (see [`may_remove`]); returns it.
    pub fn remove(&self, id: u64, healthy: impl Fn(&Member) -> bool) -> Result<Member, Refusal> {
        let mut inner = self.inner();
        may_remove(&inner.members, id, healthy)?;
        let at = inner
            .members
            .iter()
            .position(|m| m.id == id)
            .ok_or(Refusal::NotFound)?;
        Ok(inner.members.remove(at))
    }

    /// Promotes learner `id`; whether it was one.
    pub fn promote(&self, id: u64) -> bool {
        let mut inner = self.inner();
        match inner.members.iter_mut().find(|m| m.id == id && m.learner) {
            Some(m) => {
                m.learner = false;
                true
            }
            None => false,
        }
    }

    /// etcd's data is gone: no member is left.
    pub fn clear(&self) {
        self.inner().members.clear();
    }

    /// Logs a change with the counts now (`healthy` decides who is healthy).
    pub fn log(
        &self,
        kind: MembershipChangeKind,
        member: Option<&Member>,
        healthy: impl Fn(&Member) -> bool,
    ) {
        let mut inner = self.inner();
        let voters: Vec<&Member> = inner.members.iter().filter(|m| !m.learner).collect();
        let healthy_voters = voters.iter().filter(|m| healthy(m)).count();
        let entry = MembershipChange {
            at: SystemTime::now(),
            kind,
            member_id: member.map_or(0, |m| m.id),
            hostname: member.map(|m| m.hostname.clone()).unwrap_or_default(),
            members: inner.members.len(),
            voters: voters.len(),
            healthy_voters,
        };
        inner.last_healthy = healthy_voters;
        inner.log.push(entry);
    }

    /// Logs a [`MembershipChangeKind::Health`] entry when the healthy
    /// voters are no longer what the last entry said.
    pub fn log_health(&self, healthy: impl Fn(&Member) -> bool) {
        let now = {
            let inner = self.inner();
            let count = inner
                .members
                .iter()
                .filter(|m| !m.learner && healthy(m))
                .count();
            (inner.last_healthy != count).then_some(count)
        };
        if now.is_some() {
            self.log(MembershipChangeKind::Health, None, healthy);
        }
    }

    /// Every change so far, in order.
    pub fn changes(&self) -> Vec<MembershipChange> {
        self.inner().log.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, learner: bool) -> Member {
        Member {
            id,
            hostname: format!("cp-{id}"),
            node: id as usize,
            address: IpAddr::from([127, 0, 0, 1]),
            learner,
            added: Instant::now(),
        }
    }

    /// etcd's strict reconfiguration: a voter leaves only when the healthy
    /// voters left are a majority of the voters left; a learner always; the
    /// last member never.
    #[test]
    fn a_voter_is_removed_only_when_a_healthy_majority_is_left() {
        let three = [member(1, false), member(2, false), member(3, false)];
        assert_eq!(may_remove(&three, 1, |_| true), Ok(()));
        // Member 2 is down: removing 1 leaves {2, 3} with one healthy of two.
        assert_eq!(
            may_remove(&three, 1, |m| m.id != 2),
            Err(Refusal::NotEnoughStarted)
        );
        // Removing the unhealthy one itself is fine: {1, 3} both run.
        assert_eq!(may_remove(&three, 2, |m| m.id != 2), Ok(()));
        assert_eq!(
            may_remove(&[member(1, false)], 1, |_| true),
            Err(Refusal::NotEnoughStarted)
        );
        let with_learner = [member(1, false), member(2, true)];
        assert_eq!(may_remove(&with_learner, 2, |_| false), Ok(()));
        assert_eq!(may_remove(&three, 9, |_| true), Err(Refusal::NotFound));
    }

    #[test]
    fn one_learner_at_a_time_then_promoted() {
        let m = Membership::default();
        m.add(member(1, false)).unwrap();
        m.add(member(2, true)).unwrap();
        assert_eq!(m.add(member(3, true)), Err(Refusal::TooManyLearners));
        assert!(m.promote(2));
        assert!(!m.promote(2));
        m.add(member(3, true)).unwrap();
        assert_eq!(m.members().len(), 3);
    }

    #[test]
    fn the_log_counts_after_each_change_and_notes_health_changes_once() {
        let m = Membership::default();
        // No member, nothing to say.
        m.log_health(|_| true);
        assert!(m.changes().is_empty());
        m.add(member(1, false)).unwrap();
        m.add(member(2, false)).unwrap();
        m.log(MembershipChangeKind::Started, None, |_| true);
        m.log_health(|_| true);
        m.log_health(|x| x.id == 1);
        m.log_health(|x| x.id == 1);
        let log = m.changes();
        let counts: Vec<(MembershipChangeKind, usize, usize)> = log
            .iter()
            .map(|c| (c.kind, c.voters, c.healthy_voters))
            .collect();
        assert_eq!(
            counts,
            [
                (MembershipChangeKind::Started, 2, 2),
                (MembershipChangeKind::Health, 2, 1)
            ]
        );
    }
}
