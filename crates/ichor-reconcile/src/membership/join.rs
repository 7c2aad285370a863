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

/// What a reconcile saw of a machine that joins.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinSeen {
    pub control_plane: bool,
    /// The node answers in maintenance mode (no config yet).
    pub maintenance: bool,
    /// The node answers the cluster's credentials: Talos booted its config.
    pub booted: bool,
    /// The node's own etcd member, once it is listed (a control plane).
    pub member: Option<Member>,
    /// The Node is registered and Ready.
    pub node_ready: bool,
    /// The node's hostname, for the messages.
    pub hostname: String,
}

/// Where a join stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinNext {
    /// The node waits in maintenance mode: apply its config (when the
    /// gate allows it).
    Apply,
    /// Applied; waiting for this, in words for the status.
    Wait(String),
    /// Booted, a started healthy voter (a control plane), Node Ready.
    Joined,
}

/// The next move of a join, from what was `seen`; `waited` says for how
/// long the join has waited since its config was applied, so the message
/// tells a stuck join from a slow one.
pub fn join_next(seen: &JoinSeen, waited: Option<std::time::Duration>) -> JoinNext {
    let host = &seen.hostname;
    let why = if seen.maintenance {
        return JoinNext::Apply;
    } else if !seen.booted {
        format!("Talos on {host} to boot its config")
    } else if seen.control_plane && seen.member.is_none() {
        format!("{host} to join etcd")
    } else if seen.control_plane && seen.member.as_ref().is_some_and(|m| !m.counts()) {
        let m = seen.member.as_ref().expect("checked above");
        if m.is_learner {
            format!("etcd to promote {host} (a learner now)")
        } else {
            format!("etcd member {host} to start and answer healthy")
        }
    } else if !seen.node_ready {
        format!("Node {host} to register and be Ready")
    } else {
        return JoinNext::Joined;
    };
    JoinNext::Wait(match waited {
        Some(d) if d >= JOIN_SLOW => format!(
            "waiting for {why} ({}s since the config was applied; Talos retries an etcd join for up to 30 minutes: check the node with talosctl dmesg)",
            d.as_secs()
        ),
        _ => format!("waiting for {why}"),
    })
}

/// After this long a join's message says it is slow, and what to check.
pub const JOIN_SLOW: std::time::Duration = std::time::Duration::from_secs(300);

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

    /// Covers: R14.1 (bounded waits that say why: boot, etcd, Node Ready)
    #[test]
    fn a_join_waits_for_boot_then_etcd_then_the_node() {
        let mut seen = JoinSeen {
            control_plane: true,
            maintenance: true,
            hostname: "cp-4".into(),
            ..JoinSeen::default()
        };
        assert_eq!(join_next(&seen, None), JoinNext::Apply);
        seen.maintenance = false;
        let wait = |seen: &JoinSeen| match join_next(seen, None) {
            JoinNext::Wait(w) => w,
            other => panic!("{other:?}"),
        };
        assert!(wait(&seen).contains("Talos on cp-4 to boot"));
        seen.booted = true;
        assert!(wait(&seen).contains("cp-4 to join etcd"));
        let mut m = voter(4, "cp-4");
        m.is_learner = true;
        seen.member = Some(m.clone());
        assert!(wait(&seen).contains("promote cp-4"));
        m.is_learner = false;
        seen.member = Some(m);
        assert!(wait(&seen).contains("Node cp-4 to register"));
        assert!(matches!(
            join_next(&seen, Some(JOIN_SLOW)),
            JoinNext::Wait(w) if w.contains("300s since the config was applied")
        ));
        seen.node_ready = true;
        assert_eq!(join_next(&seen, None), JoinNext::Joined);
        // A worker has no member to wait for.
        let worker = JoinSeen {
            control_plane: false,
            booted: true,
            node_ready: true,
            ..JoinSeen::default()
        };
        assert_eq!(join_next(&worker, None), JoinNext::Joined);
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
