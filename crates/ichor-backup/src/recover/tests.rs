use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::run::EtcdRunError;
use super::*;
use crate::restore::RestoreError;

fn state() -> State {
    State::new("lab", "lab-20261202010000", "10.5.0.2", "ab")
}

fn seen(boot: &str, etcd: Etcd) -> Seen {
    Seen {
        boot_id: boot.to_string(),
        etcd,
    }
}

const RUNNING: Etcd = Etcd::Running { healthy: true };

/// Covers: R20.17
#[test]
fn the_steps_follow_the_state_and_the_node() {
    let mut s = state();
    assert_eq!(etcd_step(&s, &seen("b1", Etcd::Waiting)), Step::Upload);
    assert_eq!(etcd_step(&s, &seen("b1", RUNNING)), Step::Refuse);
    s.uploaded_at_boot = Some("b1".into());
    assert_eq!(etcd_step(&s, &seen("b1", Etcd::Waiting)), Step::Bootstrap);
    s.bootstraps.push("b1".into());
    assert!(matches!(
        etcd_step(&s, &seen("b1", Etcd::Waiting)),
        Step::Wait(_)
    ));
    // Lost intent: a new boot with etcd still waiting: upload, then one
    // more Bootstrap at that boot.
    assert_eq!(etcd_step(&s, &seen("b2", Etcd::Waiting)), Step::Upload);
    s.uploaded_at_boot = Some("b2".into());
    assert_eq!(etcd_step(&s, &seen("b2", Etcd::Waiting)), Step::Bootstrap);
    assert!(matches!(
        etcd_step(&s, &seen("b1", Etcd::Running { healthy: false })),
        Step::Wait(_)
    ));
    assert_eq!(etcd_step(&s, &seen("b9", RUNNING)), Step::Done);
}

/// Covers: R20.17
#[test]
fn once_etcd_started_no_step_sends_a_bootstrap() {
    let mut s = state();
    s.uploaded_at_boot = Some("b1".into());
    s.bootstraps.push("b1".into());
    for boot in ["b1", "b2", "b3"] {
        for healthy in [true, false] {
            let step = etcd_step(&s, &seen(boot, Etcd::Running { healthy }));
            assert!(!matches!(step, Step::Bootstrap | Step::Upload), "{step:?}");
        }
    }
}

/// Covers: R20.16
#[test]
fn etcd_running_or_a_node_unreachable_refuses() {
    let r = |node: &str, seen| Reading {
        node: node.to_string(),
        seen,
    };
    assert!(preflight(&[r("a", Ok(Etcd::Waiting)), r("b", Ok(Etcd::Waiting))]).is_empty());
    let refusals = preflight(&[
        r("a", Ok(Etcd::Waiting)),
        r("b", Ok(Etcd::Running { healthy: false })),
        r("c", Err(Unreachable("connection refused".into()))),
    ]);
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(matches!(&refusals[0], Refusal::EtcdRuns { node } if node == "b"));
    assert!(matches!(&refusals[1], Refusal::Unreachable { node, .. } if node == "c"));
    assert_eq!(preflight(&[]), vec![Refusal::NoControlPlane]);
}

#[test]
fn phases_round_trip_their_names_in_order() {
    for w in Phase::ALL.windows(2) {
        assert!(w[0] < w[1]);
    }
    for p in Phase::ALL {
        assert_eq!(Phase::parse(p.as_str()), Some(p));
    }
    let mut s = state();
    s.reach(Phase::Bootstrapped);
    s.reach(Phase::Files);
    assert_eq!(s.phase, Phase::Bootstrapped, "a phase is never undone");
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"phase\":\"bootstrapped\""), "{json}");
    assert_eq!(serde_json::from_str::<State>(&json).unwrap(), s);
}

#[test]
fn a_state_of_another_run_is_refused() {
    let s = state();
    assert!(same_run(&s, &s).is_ok());
    let mut other = s.clone();
    other.backup = "lab-20261203010000".into();
    assert!(matches!(
        same_run(&other, &s),
        Err(StateMismatch::Other { .. })
    ));
    let mut other = s.clone();
    other.node = "10.5.0.3".into();
    assert!(matches!(
        same_run(&other, &s),
        Err(StateMismatch::Node { .. })
    ));
}

/// Covers: R20.16
#[test]
fn control_planes_come_from_the_backups_machines_by_name() {
    let doc = |kind: &str, name: &str, cluster: &str, role: &str, address: &str| {
        serde_json::json!({"kind": kind, "metadata": {"name": name},
            "spec": {"clusterRef": {"name": cluster}, "role": role, "address": address}})
    };
    let objects = [
        doc("TalosCluster", "lab", "", "", ""),
        doc("TalosMachine", "cp-b", "lab", "controlplane", "10.5.0.3"),
        doc("TalosMachine", "w-1", "lab", "worker", "10.5.0.9"),
        doc(
            "TalosMachine",
            "cp-a",
            "lab",
            "controlplane",
            "10.5.0.2:50001",
        ),
        doc("TalosMachine", "cp-0", "other", "controlplane", "10.9.0.2"),
    ];
    let cps = control_planes(&objects, "lab");
    let addrs: Vec<&str> = cps.iter().map(|c| c.address.as_str()).collect();
    assert_eq!(addrs, ["10.5.0.2:50001", "10.5.0.3"]);
}

/// A control plane as Talos behaves: Bootstrap{recover_etcd} keeps the
/// intent in memory; etcd starts a few looks later; a reboot loses the
/// intent (and the upload, to be strict).
#[derive(Default)]
struct FakeNode {
    inner: Mutex<Fake>,
}

#[derive(Default)]
struct Fake {
    boot: u32,
    uploaded: bool,
    intent: bool,
    looks_until_start: u32,
    running: bool,
    uploads: u32,
    bootstraps: u32,
    bootstraps_while_running: u32,
    /// Reboot when the intent is set, once (the node lost the intent).
    reboot_after_bootstrap: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("fake")]
struct FakeError;

impl Nodes for FakeNode {
    type Error = FakeError;

    async fn boot_id(&self, _node: &str) -> Result<String, FakeError> {
        let mut f = self.inner.lock().unwrap();
        if f.intent && f.reboot_after_bootstrap {
            f.reboot_after_bootstrap = false;
            f.boot += 1;
            f.intent = false;
            f.uploaded = false;
        }
        Ok(format!("boot-{}", f.boot))
    }

    async fn etcd(&self, _node: &str) -> Result<Etcd, FakeError> {
        let mut f = self.inner.lock().unwrap();
        if f.intent && !f.running {
            if f.looks_until_start == 0 {
                f.running = true;
            } else {
                f.looks_until_start -= 1;
            }
        }
        Ok(if f.running { RUNNING } else { Etcd::Waiting })
    }

    async fn upload(
        &self,
        _node: &str,
        mut snapshot: BoxStream<'static, Result<Bytes, RestoreError>>,
    ) -> Result<(), FakeError> {
        while snapshot.next().await.is_some() {}
        let mut f = self.inner.lock().unwrap();
        f.uploads += 1;
        f.uploaded = true;
        Ok(())
    }

    async fn bootstrap(&self, _node: &str, _skip: bool) -> Result<(), FakeError> {
        let mut f = self.inner.lock().unwrap();
        f.bootstraps += 1;
        if f.running {
            f.bootstraps_while_running += 1;
        }
        if f.uploaded {
            f.intent = true;
            f.looks_until_start = 2;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("killed after {0}")]
struct Killed(Phase);

/// Runs the restore; when `kill_after` is recorded, the run dies right
/// there (the state as saved is what a rerun finds).
async fn run_once(
    node: &FakeNode,
    saved: &mut State,
    kill_after: Option<Phase>,
) -> Result<(), EtcdRunError<FakeError, Killed>> {
    let mut state = saved.clone();
    let cell = Mutex::new(saved.clone());
    let r = run_etcd(
        node,
        &mut state,
        false,
        || async { Ok(futures::stream::iter([Ok(Bytes::from_static(b"db"))]).boxed()) },
        |s: &State| {
            *cell.lock().unwrap() = s.clone();
            match kill_after {
                Some(p) if s.phase == p => Err(Killed(p)),
                _ => Ok(()),
            }
        },
        |_| {},
        Duration::ZERO,
        Duration::from_secs(30),
    )
    .await
    .map(|_| ());
    *saved = cell.into_inner().unwrap();
    r
}

/// Covers: R20.17
#[tokio::test]
async fn a_kill_at_each_phase_then_a_rerun_sends_exactly_one_bootstrap() {
    for phase in [Phase::Uploaded, Phase::Bootstrapped, Phase::EtcdRunning] {
        let node = FakeNode::default();
        let mut saved = state();
        let first = run_once(&node, &mut saved, Some(phase)).await;
        assert!(
            matches!(first, Err(EtcdRunError::Save { .. })),
            "{phase}: {first:?}"
        );
        assert_eq!(saved.phase, phase);
        run_once(&node, &mut saved, None)
            .await
            .expect("the rerun finishes");
        // And a third run once all is done changes nothing.
        run_once(&node, &mut saved, None)
            .await
            .expect("a run after the end");
        let f = node.inner.lock().unwrap();
        assert_eq!(f.bootstraps, 1, "killed after {phase}");
        assert_eq!(f.uploads, 1, "killed after {phase}");
        assert_eq!(f.bootstraps_while_running, 0);
        assert!(f.running);
        assert_eq!(saved.phase, Phase::EtcdRunning);
    }
}

/// Covers: R20.17
#[tokio::test]
async fn a_node_that_lost_the_intent_gets_one_more_bootstrap() {
    let node = FakeNode::default();
    node.inner.lock().unwrap().reboot_after_bootstrap = true;
    let mut saved = state();
    run_once(&node, &mut saved, None)
        .await
        .expect("the restore finishes");
    let f = node.inner.lock().unwrap();
    assert_eq!(f.bootstraps, 2, "one per boot");
    assert_eq!(f.uploads, 2);
    assert_eq!(f.bootstraps_while_running, 0);
    assert_eq!(saved.bootstraps, ["boot-0", "boot-1"]);
}

/// Covers: R20.16
#[tokio::test]
async fn etcd_running_that_recover_never_started_is_not_touched() {
    let node = FakeNode::default();
    node.inner.lock().unwrap().running = true;
    let mut saved = state();
    let r = run_once(&node, &mut saved, None).await;
    assert!(matches!(r, Err(EtcdRunError::NotOurs { .. })), "{r:?}");
    let f = node.inner.lock().unwrap();
    assert_eq!((f.uploads, f.bootstraps), (0, 0));
}
