//! Whether a machine in maintenance mode may be joined now.
//!
//! Workers join together. A control plane joins as an etcd learner, and
//! etcd admits one learner at a time; a learner is promoted once it has
//! caught up. So a control plane joins only when every member is a
//! started, healthy voter, none is leaving, and no other control plane is
//! joining. Talos removes any member named like the joining node's
//! hostname before it adds itself, so a hostname that names a live member
//! is refused: joining would evict that member.

use super::Member;

/// What to do about a machine waiting to join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinVerdict {
    /// Apply its config now.
    Join,
    /// Not yet; why, in words for the status.
    Wait(String),
    /// Never as it is; why.
    Refuse(String),
}

/// The verdict for a control plane whose node will take `hostname`, given
/// etcd's `members` and the other control planes `joining` (their machines
/// applied a config and their member is not yet a started voter).
pub fn control_plane(members: &[Member], hostname: &str, joining: &[&str]) -> JoinVerdict {
    if let Some(m) = members.iter().find(|m| m.name == hostname && !m.leaving) {
        return JoinVerdict::Refuse(format!(
            "etcd already has a member named {hostname} (id {:x}); joining would evict it",
            m.id
        ));
    }
    if let Some(other) = joining.iter().find(|j| **j != hostname) {
        return JoinVerdict::Wait(format!(
            "{other} is joining etcd; control planes join one at a time"
        ));
    }
    if let Some(m) = members.iter().find(|m| !m.counts()) {
        let what = if m.name.is_empty() {
            format!("etcd member {:x} has not started", m.id)
        } else if m.is_learner {
            format!("etcd member {} is a learner", m.name)
        } else if m.leaving {
            format!("etcd member {} is leaving", m.name)
        } else {
            format!("etcd member {} is not healthy", m.name)
        };
        return JoinVerdict::Wait(what);
    }
    JoinVerdict::Join
}

#[cfg(test)]
mod tests {
    use super::super::tests::voter;
    use super::*;

    fn three() -> Vec<Member> {
        vec![voter(1, "cp-1"), voter(2, "cp-2"), voter(3, "cp-3")]
    }

    /// Covers: R14.1 (control planes join one at a time)
    #[test]
    fn one_control_plane_at_a_time() {
        assert_eq!(control_plane(&three(), "cp-4", &[]), JoinVerdict::Join);
        assert_eq!(
            control_plane(&three(), "cp-4", &["cp-4"]),
            JoinVerdict::Join
        );
        assert!(matches!(
            control_plane(&three(), "cp-5", &["cp-4"]),
            JoinVerdict::Wait(w) if w.contains("cp-4 is joining")
        ));
    }

    /// Covers: R14.1
    #[test]
    fn waits_for_a_learner_an_unhealthy_or_a_leaving_member() {
        for (change, words) in [
            (
                (|m: &mut Member| m.is_learner = true) as fn(&mut Member),
                "is a learner",
            ),
            (|m: &mut Member| m.healthy = false, "is not healthy"),
            (|m: &mut Member| m.leaving = true, "is leaving"),
            (|m: &mut Member| m.name.clear(), "has not started"),
        ] {
            let mut members = three();
            change(&mut members[1]);
            assert!(
                matches!(control_plane(&members, "cp-4", &[]), JoinVerdict::Wait(ref w) if w.contains(words)),
                "{words}"
            );
        }
    }

    /// Covers: R14.1 (a hostname already a member is refused: joining would evict it)
    #[test]
    fn a_hostname_of_a_live_member_is_refused() {
        assert!(matches!(
            control_plane(&three(), "cp-2", &[]),
            JoinVerdict::Refuse(r) if r.contains("evict")
        ));
        // A leaving member's name may be reused by its replacement once it left.
        let mut members = three();
        members[1].leaving = true;
        assert!(matches!(
            control_plane(&members, "cp-2", &[]),
            JoinVerdict::Wait(w) if w.contains("cp-2 is leaving")
        ));
    }
}
