//! Machines that come and go, decided without I/O: whether etcd keeps a
//! healthy majority when a control plane leaves ([`quorum`]), whether a
//! machine may join now ([`join`]), and a removal as steps whose intent is
//! written before each runs ([`removal`]).
//!
//! The rules (ADR 0019): a control plane joins only when every member is a
//! started, healthy voter and no other control plane is joining (etcd
//! admits one learner at a time); a removal is refused when the healthy
//! voters left would be no majority of the members left, or when it takes
//! the last control plane; a member marked as leaving counts as gone
//! before it leaves, so the checks that follow never wait for it.

pub mod join;
pub mod quorum;
pub mod record;
pub mod removal;
pub mod replace;

/// One etcd member as the controller sees it: the member list (id, name,
/// learner) joined with each control plane's `EtcdStatus` (health) and the
/// machines' status (leaving).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// The member's name, its node's hostname; empty while it has not
    /// started.
    pub name: String,
    pub is_learner: bool,
    /// Its node answered `EtcdStatus` without errors.
    pub healthy: bool,
    /// Its machine's removal has begun (written before the member leaves).
    pub leaving: bool,
}

impl Member {
    /// A started voter that answers healthy and is not leaving: one vote
    /// the cluster can count on.
    pub fn counts(&self) -> bool {
        !self.name.is_empty() && !self.is_learner && self.healthy && !self.leaving
    }
}

/// The smallest majority of `voters` members.
pub fn majority(voters: usize) -> usize {
    voters / 2 + 1
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn voter(id: u64, name: &str) -> Member {
        Member {
            id,
            name: name.into(),
            is_learner: false,
            healthy: true,
            leaving: false,
        }
    }

    #[test]
    fn majorities() {
        assert_eq!(
            (1..=7).map(majority).collect::<Vec<_>>(),
            [1, 2, 2, 3, 3, 4, 4]
        );
    }

    #[test]
    fn only_started_healthy_voters_not_leaving_count() {
        let m = voter(1, "cp-1");
        assert!(m.counts());
        assert!(
            !Member {
                name: String::new(),
                ..m.clone()
            }
            .counts()
        );
        assert!(
            !Member {
                is_learner: true,
                ..m.clone()
            }
            .counts()
        );
        assert!(
            !Member {
                healthy: false,
                ..m.clone()
            }
            .counts()
        );
        assert!(!Member { leaving: true, ..m }.counts());
    }
}
