//! Replacing a control plane. A healthy old one: the new machine joins
//! first; the old one is removed only once etcd lists the new member as a
//! started, healthy voter and the old member is still listed beside it (so
//! the count grew) or is gone already. Quorum never rests on the new member
//! before it counts.
//!
//! A failed old one (its member does not count: its node down or its etcd
//! unhealthy) cannot vote on the change, and while it is listed the new one
//! may not join (etcd would admit a learner beside a dead voter). So it is
//! removed first: a peer removes its member by id, its Node is deleted,
//! and nothing is written to a node that does not answer; then the new one
//! joins a membership whose every member counts.

use super::Member;

/// Why the old control plane stays for now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotYet {
    #[error("etcd does not list {new} yet")]
    NotListed { new: String },
    #[error("etcd member {new} is not a healthy voter yet; {old} stays until it is")]
    NotCounting { new: String, old: String },
}

/// Which goes first when a control plane replaces `old`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Order {
    /// The old member counts, or is not listed: the new one joins first
    /// and the old one goes once the new one counts ([`old_may_go`]).
    JoinFirst,
    /// The old member is listed and does not count: it is removed first,
    /// by id from a peer (the old machine's removal, forced when its node
    /// does not answer), before the new one joins.
    RemoveOldFirst { failed: Failed },
}

/// What failed of the old control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub old: String,
    /// Its etcd member's id.
    pub id: u64,
    /// Its node's Talos API answered this reconcile.
    pub node_answers: bool,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = if self.node_answers {
            "its node answers"
        } else {
            "its node does not answer"
        };
        write!(
            f,
            "control plane {} has failed: {node} and its etcd member {:x} is not a healthy voter",
            self.old, self.id
        )
    }
}

impl Failed {
    /// Its removal goes on without the node only when the node is gone:
    /// a node that answers is drained and reset as any other.
    pub fn force(&self) -> bool {
        !self.node_answers
    }
}

/// Which goes first when a control plane replaces `old`, given etcd's
/// `members` and whether the old node's Talos API answers.
pub fn order(members: &[Member], old: &str, old_answers: bool) -> Order {
    match members.iter().find(|m| m.name == old) {
        Some(m) if !m.counts() && !m.leaving => Order::RemoveOldFirst {
            failed: Failed {
                old: old.into(),
                id: m.id,
                node_answers: old_answers,
            },
        },
        _ => Order::JoinFirst,
    }
}

/// Whether the machine that replaces `old` (member name `new`) may have
/// `old` removed now.
pub fn old_may_go(members: &[Member], new: &str, old: &str) -> Result<(), NotYet> {
    match members.iter().find(|m| m.name == new) {
        None => Err(NotYet::NotListed { new: new.into() }),
        Some(m) if !m.counts() => Err(NotYet::NotCounting {
            new: new.into(),
            old: old.into(),
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::voter;
    use super::*;

    /// Covers: R14.4 (the old control plane goes only after the new one counts)
    #[test]
    fn the_old_goes_once_the_new_counts() {
        let mut members = vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")];
        assert!(old_may_go(&members, "cp-4", "cp-3").is_err());
        let mut new = voter(4, "cp-4");
        new.is_learner = true;
        members.push(new);
        assert!(old_may_go(&members, "cp-4", "cp-3").is_err());
        members[3].is_learner = false;
        assert_eq!(old_may_go(&members, "cp-4", "cp-3"), Ok(()));
    }

    /// Covers: R14.14 (a healthy old control plane: the new one joins first)
    #[test]
    fn a_healthy_old_one_waits_for_the_new_one() {
        let members = vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")];
        assert_eq!(order(&members, "cp-3", true), Order::JoinFirst);
        // Not listed (it left already): nothing in etcd waits on it.
        assert_eq!(order(&members, "cp-9", false), Order::JoinFirst);
    }

    /// Covers: R14.14 (a failed old control plane is removed by id first,
    /// nothing written to a node that does not answer)
    #[test]
    fn a_failed_old_one_goes_first() {
        let mut members = vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")];
        members[2].healthy = false;
        let Order::RemoveOldFirst { failed } = order(&members, "cp-3", false) else {
            panic!("the failed member goes first");
        };
        assert_eq!((failed.id, failed.force()), (3, true));
        assert!(failed.to_string().contains("does not answer"), "{failed}");
        // Its node answers but its etcd does not: removed first, not forced
        // (the node is drained and reset as any other).
        let Order::RemoveOldFirst { failed } = order(&members, "cp-3", true) else {
            panic!("the failed member goes first");
        };
        assert!(!failed.force());
        // Leaving already: its removal runs; the join waits for it anyway.
        members[2].leaving = true;
        assert_eq!(order(&members, "cp-3", false), Order::JoinFirst);
    }

    /// Covers: R14.14 (the failed member's removal by id keeps quorum
    /// arithmetic right: removing it first leaves every voter healthy, so
    /// the new one joins a majority that counts)
    #[test]
    fn removing_the_failed_one_first_keeps_a_majority() {
        use super::super::majority;
        use super::super::quorum::{Leave, may_leave};
        let mut members = vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")];
        members[2].healthy = false;
        assert_eq!(
            may_leave(&members, "cp-3", false),
            Ok(Leave::ById { id: 3 })
        );
        members.pop();
        let healthy = members.iter().filter(|m| m.counts()).count();
        assert!(healthy >= majority(members.len()));
        assert_eq!(
            super::super::join::control_plane(&members, "cp-4", &[]),
            super::super::join::JoinVerdict::Join
        );
    }
}
