//! Whether a control plane may leave etcd now, and how.
//!
//! etcd commits with a majority of its voters. A removal must leave the
//! healthy voters a majority of the voters that remain; counting a member
//! that is leaving as gone already keeps a second removal from counting on
//! it (the trap where a rollout waits for N members after one left).

use super::{Member, majority};

/// How the member of the machine being removed leaves etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leave {
    /// The node leaves itself (`EtcdLeaveCluster`), after forfeiting
    /// leadership.
    Itself,
    /// A peer removes the member by id (`EtcdRemoveMemberByID`): the node
    /// does not answer or its member is unhealthy.
    ById { id: u64 },
    /// The machine has no member (it never joined, or left already).
    NotAMember,
}

/// Why a control plane may not leave now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumRefusal {
    #[error("removing {name} would leave no control plane")]
    LastControlPlane { name: String },
    #[error(
        "removing {name} would leave {healthy_after} healthy of {voters_after} etcd voters, \
         fewer than the {needed} a majority needs"
    )]
    NoMajority {
        name: String,
        healthy_after: usize,
        voters_after: usize,
        needed: usize,
    },
    #[error("{leaving} is leaving etcd; one control plane leaves at a time")]
    AnotherLeaving { leaving: String },
}

impl QuorumRefusal {
    /// What to do about it.
    pub fn help(&self) -> &'static str {
        match self {
            QuorumRefusal::LastControlPlane { .. } => {
                "add a control plane first (ichor machine add --role controlplane), or remove the whole cluster"
            }
            QuorumRefusal::NoMajority { .. } => {
                "bring the unhealthy members back, or replace a failed control plane (ichor machine replace) before removing another"
            }
            QuorumRefusal::AnotherLeaving { .. } => {
                "wait for the other removal to finish (ichor machine list shows it)"
            }
        }
    }
}

/// Whether the control plane whose member is named `name` (its hostname)
/// may leave `members`, and how. `node_answers`: the node's Talos API
/// answered this reconcile (a node that does not leaves by id).
pub fn may_leave(
    members: &[Member],
    name: &str,
    node_answers: bool,
) -> Result<Leave, QuorumRefusal> {
    if let Some(other) = members.iter().find(|m| m.leaving && m.name != name) {
        return Err(QuorumRefusal::AnotherLeaving {
            leaving: other.name.clone(),
        });
    }
    let own = members.iter().find(|m| m.name == name);
    let voters_after = members
        .iter()
        .filter(|m| !m.is_learner && m.name != name)
        .count();
    if voters_after == 0 {
        return Err(QuorumRefusal::LastControlPlane { name: name.into() });
    }
    let healthy_after = members
        .iter()
        .filter(|m| m.name != name && m.counts())
        .count();
    let needed = majority(voters_after);
    if healthy_after < needed {
        return Err(QuorumRefusal::NoMajority {
            name: name.into(),
            healthy_after,
            voters_after,
            needed,
        });
    }
    Ok(match own {
        None => Leave::NotAMember,
        Some(m) if node_answers && m.healthy => Leave::Itself,
        Some(m) => Leave::ById { id: m.id },
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::voter;
    use super::*;

    fn three() -> Vec<Member> {
        vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")]
    }

    /// Covers: R14.3 (a removal that breaks quorum is refused)
    #[test]
    fn three_healthy_lose_one() {
        assert_eq!(may_leave(&three(), "cp-2", true), Ok(Leave::Itself));
    }

    /// Covers: R14.3
    #[test]
    fn one_unhealthy_of_three_blocks_removing_a_healthy_one() {
        let mut members = three();
        members[0].healthy = false;
        assert_eq!(
            may_leave(&members, "cp-2", true),
            Err(QuorumRefusal::NoMajority {
                name: "cp-2".into(),
                healthy_after: 1,
                voters_after: 2,
                needed: 2
            })
        );
        // Removing the unhealthy one itself keeps two healthy of two.
        assert_eq!(may_leave(&members, "cp-1", true), Ok(Leave::ById { id: 1 }));
    }

    /// Covers: R14.3
    #[test]
    fn the_last_control_plane_never_leaves() {
        assert_eq!(
            may_leave(&[voter(1, "cp-1")], "cp-1", true),
            Err(QuorumRefusal::LastControlPlane {
                name: "cp-1".into()
            })
        );
    }

    /// Covers: R14.2 (an unreachable node leaves by id, from a peer: no dead member left)
    #[test]
    fn an_unreachable_node_leaves_by_id() {
        assert_eq!(
            may_leave(&three(), "cp-3", false),
            Ok(Leave::ById { id: 3 })
        );
    }

    #[test]
    fn a_machine_without_a_member_has_nothing_to_leave() {
        assert_eq!(may_leave(&three(), "cp-9", true), Ok(Leave::NotAMember));
    }

    /// Covers: R14.3
    #[test]
    fn one_removal_at_a_time() {
        let mut members = three();
        members.push(voter(4, "cp-4"));
        members[3].leaving = true;
        assert_eq!(
            may_leave(&members, "cp-1", true),
            Err(QuorumRefusal::AnotherLeaving {
                leaving: "cp-4".into()
            })
        );
        // The leaving machine's own removal goes on (a resumed removal).
        assert_eq!(may_leave(&members, "cp-4", true), Ok(Leave::Itself));
    }

    #[test]
    fn learners_do_not_vote() {
        let mut members = vec![voter(1, "cp-1"), voter(2, "cp-2")];
        members[1].is_learner = true;
        assert!(matches!(
            may_leave(&members, "cp-1", true),
            Err(QuorumRefusal::LastControlPlane { .. })
        ));
    }

    /// Over every cluster of up to 7 members: an allowed removal always
    /// leaves a healthy majority of the voters that remain.
    #[test]
    fn an_allowed_removal_keeps_a_majority() {
        for size in 1..=7usize {
            for unhealthy in 0..(1u32 << size) {
                let members: Vec<Member> = (0..size)
                    .map(|i| Member {
                        healthy: unhealthy & (1 << i) == 0,
                        ..voter(i as u64 + 1, &format!("cp-{i}"))
                    })
                    .collect();
                for victim in &members {
                    if may_leave(&members, &victim.name, true).is_ok() {
                        let rest: Vec<_> =
                            members.iter().filter(|m| m.name != victim.name).collect();
                        let healthy = rest.iter().filter(|m| m.counts()).count();
                        assert!(!rest.is_empty());
                        assert!(
                            healthy >= majority(rest.len()),
                            "{members:?} without {}",
                            victim.name
                        );
                    }
                }
            }
        }
    }
}
