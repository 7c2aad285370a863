//! The control planes' one etcd membership, through the real talosctl:
//! a node added in maintenance mode joins as a learner and is promoted;
//! `etcd members`, `etcd forfeit-leadership`, `etcd leave`, `etcd
//! remove-member` and `reset --graceful` do what Talos does, etcd's
//! refusals included, and the membership log says what changed with the
//! counts after each change.

use std::net::IpAddr;
use std::time::Duration;

use ichor_talemu::{Emulator, MembershipChangeKind, NodeSpec, WriteAction};

use crate::common::talosctl::{Run, Talosctl, insecure};

/// Three configured control planes (one bootstrapped etcd).
async fn three_control_planes() -> Emulator {
    let specs = (1..=3u8)
        .map(|i| {
            NodeSpec::new(format!("cp-{i}"), crate::common::cp_v112())
                .with_address(IpAddr::from([127, 0, 0, i]))
        })
        .collect();
    Emulator::start(specs).await.unwrap()
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what} did not happen within 5s");
}

/// The hostnames `talosctl etcd members` lists, with their LEARNER column.
fn members(run: &Run) -> Vec<(String, String)> {
    assert!(run.ok, "{run}");
    run.stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            // NODE ID HOSTNAME PEER-URLS CLIENT-URLS LEARNER
            (cols.len() >= 6).then(|| (cols[2].to_string(), cols[5].to_string()))
        })
        .collect()
}

fn names(run: &Run) -> Vec<String> {
    members(run).into_iter().map(|(h, _)| h).collect()
}

/// The membership log's changes, health entries left out.
fn changes(emu: &Emulator) -> Vec<(MembershipChangeKind, String)> {
    emu.membership_log()
        .into_iter()
        .filter(|c| c.kind != MembershipChangeKind::Health)
        .map(|c| (c.kind, c.hostname))
        .collect()
}

/// A control plane added in maintenance mode and given its config over the
/// insecure API joins the running cluster's etcd as a learner and is
/// promoted once caught up; `etcd members` lists the four. A worker added
/// the same way is configured and is no member. Every node's etcd calls
/// answer from the one membership. A node in maintenance mode takes a
/// reset over the insecure API.
/// Covers: R14.5, R14.6
#[tokio::test(flavor = "multi_thread")]
async fn a_control_plane_added_in_maintenance_mode_joins_as_a_learner_then_votes() {
    let mut emu = three_control_planes().await;
    let dir = tempfile::tempdir().unwrap();
    let cp4 = emu
        .add_node(NodeSpec::maintenance("cp-4").with_address(IpAddr::from([127, 0, 0, 4])))
        .await
        .unwrap();
    let w1 = emu
        .add_node(NodeSpec::maintenance("worker-1").with_address(IpAddr::from([127, 0, 0, 5])))
        .await
        .unwrap();
    assert!(emu.in_maintenance(3) && emu.in_maintenance(4));
    let mut configured = emu.configured();
    let talosctl = Talosctl::admin(&emu, dir.path());
    assert_eq!(
        names(&talosctl.on("127.0.0.1", &["etcd", "members"]).await),
        ["cp-1", "cp-2", "cp-3"]
    );

    let cp_file = dir.path().join("cp.yaml");
    let worker_file = dir.path().join("worker.yaml");
    std::fs::write(&cp_file, crate::common::cp_v112()).unwrap();
    std::fs::write(&worker_file, crate::common::worker_v112()).unwrap();
    for (i, file) in [(3, &cp_file), (4, &worker_file)] {
        let args = ["apply-config", "--insecure", "-f", file.to_str().unwrap()];
        let run = insecure(&emu, i, dir.path(), &args).await;
        assert!(run.ok, "{run}");
        assert_eq!(configured.recv().await.unwrap().index, i);
    }
    assert!(!emu.in_maintenance(4) && !emu.is_control_plane(4));

    until("cp-4's promotion", || {
        changes(&emu).contains(&(MembershipChangeKind::Promoted, "cp-4".into()))
    })
    .await;
    let log = changes(&emu);
    assert_eq!(
        log[3..],
        [
            (MembershipChangeKind::LearnerAdded, "cp-4".into()),
            (MembershipChangeKind::Promoted, "cp-4".into())
        ],
        "{log:?}"
    );
    // Every control plane's answer is the same membership, cp-4 a voter now.
    for node in ["127.0.0.1", "127.0.0.4"] {
        let listed = members(&talosctl.on(node, &["etcd", "members"]).await);
        assert_eq!(listed.len(), 4, "{listed:?}");
        assert!(
            listed.iter().all(|(_, learner)| learner == "false"),
            "{listed:?}"
        );
    }
    let last = emu.membership_log().last().cloned().unwrap();
    assert_eq!((last.voters, last.healthy_voters), (4, 4), "{last:?}");
    // A worker runs no etcd.
    let run = talosctl.on("127.0.0.5", &["etcd", "status"]).await;
    assert!(!run.ok, "{run}");
    assert!(
        run.stderr.contains("only available on control plane"),
        "{run}"
    );
    assert_eq!(w1.hostname, "worker-1");
    assert_eq!(cp4.endpoint(), emu.endpoint(3));

    // A node still in maintenance mode takes a reset over its insecure API.
    emu.add_node(NodeSpec::maintenance("spare").with_address(IpAddr::from([127, 0, 0, 6])))
        .await
        .unwrap();
    let boot = emu.boot_id(5);
    let args = ["reset", "--insecure", "--reboot", "--wait=false"];
    let run = insecure(&emu, 5, dir.path(), &args).await;
    assert!(run.ok, "{run}");
    until("spare's reboot", || emu.boot_id(5) != boot).await;
    assert!(emu.in_maintenance(5));
    let resets = emu
        .writes()
        .into_iter()
        .filter(|w| matches!(w.action, WriteAction::Reset { .. }))
        .count();
    assert_eq!(resets, 1);
}

/// `etcd forfeit-leadership` hands the leadership on; with one node down,
/// `etcd remove-member` removes that node's member by id from a peer, and
/// a second time is NotFound; `etcd leave` takes the node's own member out
/// (its etcd stops); the last member can neither leave nor be
/// reset gracefully (etcd refuses: the reset aborts, the node keeps its
/// config); every write is in the write log.
/// Covers: R14.7
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_etcd_leave_remove_member_and_forfeit_leadership() {
    let emu = three_control_planes().await;
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());

    let run = talosctl
        .on("127.0.0.1", &["etcd", "forfeit-leadership"])
        .await;
    assert!(run.ok, "{run}");
    let status = talosctl.on("127.0.0.1", &["etcd", "status"]).await;
    assert!(status.ok, "{status}");

    // cp-3 is gone: a peer removes its member by id.
    let id = format!("{:x}", member_id(&talosctl, "cp-3").await);
    emu.set_fault(2, ichor_talemu::Fault::Down);
    let run = talosctl
        .on("127.0.0.1", &["etcd", "remove-member", &id])
        .await;
    assert!(run.ok, "{run}");
    let run = talosctl.on("127.0.0.1", &["etcd", "members"]).await;
    assert_eq!(names(&run), ["cp-1", "cp-2"]);
    let run = talosctl
        .on("127.0.0.1", &["etcd", "remove-member", &id])
        .await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("NotFound"), "{run}");
    assert!(run.stderr.contains("member not found"), "{run}");

    let run = talosctl.on("127.0.0.2", &["etcd", "leave"]).await;
    assert!(run.ok, "{run}");
    let run = talosctl.on("127.0.0.1", &["etcd", "members"]).await;
    assert_eq!(names(&run), ["cp-1"]);
    // Its etcd stopped: it answers no etcd call of its own.
    let run = talosctl.on("127.0.0.2", &["etcd", "status"]).await;
    assert!(!run.ok, "{run}");

    // The last member: etcd refuses, and the graceful reset aborts.
    let run = talosctl.on("127.0.0.1", &["etcd", "leave"]).await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("not enough started members"), "{run}");
    let run = talosctl
        .on(
            "127.0.0.1",
            &["reset", "--graceful", "--reboot", "--wait=false"],
        )
        .await;
    assert!(run.ok, "{run}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!emu.in_maintenance(0));
    let run = talosctl.on("127.0.0.1", &["etcd", "members"]).await;
    assert_eq!(names(&run), ["cp-1"]);

    let writes: Vec<(String, WriteAction)> = emu
        .writes()
        .into_iter()
        .map(|w| (w.node, w.action))
        .collect();
    let id = u64::from_str_radix(&id, 16).unwrap();
    assert_eq!(
        writes,
        [
            ("cp-1".into(), WriteAction::EtcdForfeitLeadership),
            (
                "cp-1".into(),
                WriteAction::EtcdRemoveMemberById { member_id: id }
            ),
            ("cp-2".into(), WriteAction::EtcdLeaveCluster),
            (
                "cp-1".into(),
                WriteAction::Reset {
                    graceful: true,
                    reboot: true,
                    wipe: vec![
                        "EFI".into(),
                        "META".into(),
                        "STATE".into(),
                        "EPHEMERAL".into()
                    ],
                }
            ),
        ]
    );
    assert_eq!(
        changes(&emu)[3..],
        [
            (MembershipChangeKind::RemovedById, "cp-3".into()),
            (MembershipChangeKind::Left, "cp-2".into())
        ]
    );
}

/// `talosctl reset --graceful --reboot --system-labels-to-wipe STATE
/// --system-labels-to-wipe EPHEMERAL` on a control plane: answered at
/// once; the node leaves etcd, is wiped, and comes back in maintenance
/// mode with a new boot id and a new identity; one Reset in the write log.
/// Given its config again, it joins again as a new member. A reset that
/// is not graceful and wipes EPHEMERAL alone leaves its member behind
/// until the node, back with its config, replaces it on joining.
/// Covers: R14.8
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_graceful_reset_leaves_etcd_and_returns_to_maintenance() {
    let emu = three_control_planes().await;
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());
    let before = member_id(&talosctl, "cp-3").await;
    let (boot, identity) = (emu.boot_id(2), emu.identity(2));

    let run = talosctl
        .on(
            "127.0.0.3",
            &[
                "reset",
                "--graceful",
                "--reboot",
                "--system-labels-to-wipe",
                "STATE",
                "--system-labels-to-wipe",
                "EPHEMERAL",
                "--wait=false",
            ],
        )
        .await;
    assert!(run.ok, "{run}");
    until("cp-3 back in maintenance mode", || {
        emu.in_maintenance(2) && emu.boot_id(2) != boot
    })
    .await;
    assert_ne!(emu.identity(2), identity);
    let run = talosctl.on("127.0.0.1", &["etcd", "members"]).await;
    assert_eq!(names(&run), ["cp-1", "cp-2"]);
    let resets: Vec<WriteAction> = emu
        .writes()
        .into_iter()
        .filter(|w| matches!(w.action, WriteAction::Reset { .. }))
        .map(|w| w.action)
        .collect();
    assert_eq!(
        resets,
        [WriteAction::Reset {
            graceful: true,
            reboot: true,
            wipe: vec!["STATE".into(), "EPHEMERAL".into()]
        }]
    );
    // Maintenance mode: the insecure API answers.
    let run = insecure(&emu, 2, dir.path(), &["get", "disks", "--insecure"]).await;
    assert!(run.ok, "{run}");

    let file = dir.path().join("cp.yaml");
    std::fs::write(&file, crate::common::cp_v112()).unwrap();
    let args = ["apply-config", "--insecure", "-f", file.to_str().unwrap()];
    let run = insecure(&emu, 2, dir.path(), &args).await;
    assert!(run.ok, "{run}");
    until("cp-3's promotion", || {
        changes(&emu).last() == Some(&(MembershipChangeKind::Promoted, "cp-3".into()))
    })
    .await;
    let after = member_id(&talosctl, "cp-3").await;
    assert_ne!(after, before, "a new member, not the old one");

    // Not graceful, EPHEMERAL only: cp-2's member stays behind, dead, until
    // cp-2 boots with its config and an empty etcd folder, removes the
    // member named like it and joins again.
    let stale = member_id(&talosctl, "cp-2").await;
    let run = talosctl
        .on(
            "127.0.0.2",
            &[
                "reset",
                "--graceful=false",
                "--reboot",
                "--system-labels-to-wipe",
                "EPHEMERAL",
                "--wait=false",
            ],
        )
        .await;
    assert!(run.ok, "{run}");
    until("cp-2's promotion", || {
        changes(&emu).last() == Some(&(MembershipChangeKind::Promoted, "cp-2".into()))
    })
    .await;
    let log = changes(&emu);
    assert_eq!(
        log[log.len() - 3..],
        [
            (MembershipChangeKind::ReplacedOnJoin, "cp-2".into()),
            (MembershipChangeKind::LearnerAdded, "cp-2".into()),
            (MembershipChangeKind::Promoted, "cp-2".into())
        ]
    );
    assert!(!emu.in_maintenance(1), "EPHEMERAL alone keeps the config");
    assert_ne!(member_id(&talosctl, "cp-2").await, stale);
    // Never fewer healthy voters than a majority of the voters.
    for c in emu.membership_log() {
        assert!(c.healthy_voters > c.voters / 2, "{c:?}");
    }
}

/// The id `talosctl etcd members` gives `hostname`'s member.
async fn member_id(talosctl: &Talosctl, hostname: &str) -> u64 {
    let run = talosctl.on("127.0.0.1", &["etcd", "members"]).await;
    assert!(run.ok, "{run}");
    let line = crate::common::talosctl::line_with(&run.stdout, &[hostname]);
    let id = line.split_whitespace().nth(1).unwrap();
    u64::from_str_radix(id, 16).unwrap()
}
