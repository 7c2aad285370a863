//! Replacing a control plane: the new machine joins first; the old one is
//! removed only once etcd lists the new member as a started, healthy voter
//! and the old member is still listed beside it (so the count grew) or is
//! gone already. Quorum never rests on the new member before it counts.

use super::Member;

/// Why the old control plane stays for now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotYet {
    #[error("etcd does not list {new} yet")]
    NotListed { new: String },
    #[error("etcd member {new} is not a healthy voter yet; {old} stays until it is")]
    NotCounting { new: String, old: String },
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
}
