//! Machines come and go on the lab (3 control planes, 2 workers, Ichor
//! adopted; the controller `ichor adopt` installed does the work, the lab
//! only plays the nodes):
//!
//! - a worker and a control plane added from maintenance mode are joined
//!   (their TalosMachines released), Member, their Nodes Ready, no drift,
//!   and etcd counts 4 healthy voters;
//! - a worker is removed: its drain waits on a PodDisruptionBudget that
//!   allows nothing (named in status) until the budget goes; the
//!   controller is SIGKILLed once the Reset is recorded, and the one it
//!   restarts finishes: one Reset in the write log, the node back in
//!   maintenance mode, its Node gone, the TalosMachine gone;
//! - an unreachable worker's removal is refused without force, nothing
//!   written to it; with `spec.removal.force` its Node is deleted;
//! - a control plane is replaced (`spec.replaces`): the new one joins
//!   first, the old one is removed (the controller SIGKILLed again once its
//!   Reset is recorded); the emulator's membership log never has
//!   fewer healthy voters than a majority, and a probe loop against the
//!   Kubernetes API counts its failures (printed).

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use ichor_api::{MembershipPhase, TalosMachine};
use ichor_lab::{NewNode, NodeRole};
use ichor_talemu::WriteAction;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, PostParams};

use crate::common::{LabHarness, NS, ready_pod, run, text};
use crate::operations_lab_e2e::controller_pid;

const WAIT: Duration = Duration::from_secs(120);

async fn wait_for<F, Fut>(h: &LabHarness, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(WAIT, async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited in vain for {what}\n{}", h.logs());
}

fn phase(m: &TalosMachine) -> Option<MembershipPhase> {
    m.status.as_ref()?.membership.as_ref().map(|s| s.phase)
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A released TalosMachine for a node added to the lab.
fn machine(name: &str, role: &str, address: &str, replaces: Option<&str>) -> TalosMachine {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterRef": {"name": "lab"}, "role": role, "address": address,
            "hold": false, "replaces": replaces}
    }))
    .unwrap()
}

async fn add(h: &mut LabHarness, role: NodeRole, replaces: Option<&str>) -> (String, usize) {
    let node = h
        .lab
        .add_node(NewNode { role, shape: None })
        .await
        .expect("a node in maintenance mode");
    let m = machine(
        &node.hostname,
        role.as_str(),
        &node.address.to_string(),
        replaces,
    );
    Api::<TalosMachine>::namespaced(h.client().await, NS)
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
    (node.hostname, node.index)
}

/// Member, its Node Ready, no drift.
async fn joined(h: &LabHarness, name: &str) {
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS);
    let nodes = Api::<Node>::all(h.client().await);
    wait_for(h, &format!("{name} joined, Ready, no drift"), || async {
        let m = machines.get(name).await.unwrap();
        let drift_read = m
            .status
            .as_ref()
            .is_some_and(|s| s.config_hash.is_some() && s.drift.is_empty());
        phase(&m) == Some(MembershipPhase::Member)
            && drift_read
            && nodes
                .get_opt(name)
                .await
                .unwrap()
                .is_some_and(|n| node_ready(&n))
    })
    .await;
}

async fn gone(h: &LabHarness, name: &str) {
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS);
    let nodes = Api::<Node>::all(h.client().await);
    wait_for(
        h,
        &format!("{name}'s TalosMachine and Node gone"),
        || async {
            machines.get_opt(name).await.unwrap().is_none()
                && nodes.get_opt(name).await.unwrap().is_none()
        },
    )
    .await;
}

fn resets(h: &LabHarness, node: &str) -> usize {
    h.lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == node && matches!(w.action, WriteAction::Reset { .. }))
        .count()
}

/// Covers: R14.1, R14.2, R14.4, R14.11, R14.12, R14.13
#[tokio::test(flavor = "multi_thread")]
async fn machines_join_leave_and_a_control_plane_is_replaced_on_the_lab() {
    let started = Instant::now();
    let mut h = LabHarness::up(|o| {
        o.nodes = 5;
        o.control_planes = 3;
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let client = h.client().await;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    for name in ["lab-worker-1", "lab-worker-2", "lab-cp-3"] {
        machines
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"hold": false}})),
            )
            .await
            .unwrap();
    }
    let adopted = started.elapsed();

    // Join: a worker and a control plane from maintenance mode.
    let (worker, _) = add(&mut h, NodeRole::Worker, None).await;
    let (cp, _) = add(&mut h, NodeRole::ControlPlane, None).await;
    joined(&h, &worker).await;
    joined(&h, &cp).await;
    let last = h.lab.emulator.membership_log().last().cloned().unwrap();
    assert_eq!((last.voters, last.healthy_voters), (4, 4), "{last:?}");
    let joins = started.elapsed();

    // Remove a worker: its pod under a budget that allows nothing.
    let victim = "lab-worker-1";
    let victim_index = h.lab.hostnames.iter().position(|n| n == victim).unwrap();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "apps"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    ready_pod(&client, "apps", "web-1", "web", victim).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    let pdbs = Api::<PodDisruptionBudget>::namespaced(client.clone(), "apps");
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let gate = h.lab.emulator.hold_reboots(victim_index);
    machines
        .delete(victim, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&h, "the drain to name the budget", || async {
        machines
            .get(victim)
            .await
            .unwrap()
            .status
            .and_then(|s| s.membership)
            .is_some_and(|m| {
                m.phase == MembershipPhase::Leaving
                    && m.step.as_deref() == Some("Drain")
                    && m.plan == ["Cordon", "Drain", "Reset", "DeleteNode"]
            })
    })
    .await;
    let nodes = Api::<Node>::all(client.clone());
    assert!(
        nodes
            .get(victim)
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable
            .unwrap_or(false)
    );
    pdbs.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for(&h, "the Reset recorded as sent", || async {
        machines
            .get(victim)
            .await
            .unwrap()
            .status
            .and_then(|s| s.membership)
            .is_some_and(|m| m.reset_sent_boot_id.is_some())
    })
    .await;
    // SIGKILL the controller with the node down in its reset; the lab's
    // kubelet starts it again and it resumes from status.
    let pid = controller_pid(&h).expect("the controller's process");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for(&h, "the killed controller to be gone", || async {
        controller_pid(&h) != Some(pid)
    })
    .await;
    gate.open();
    gone(&h, victim).await;
    assert_eq!(resets(&h, victim), 1, "one Reset\n{}", h.logs());
    assert!(
        h.lab.emulator.in_maintenance(victim_index),
        "back in maintenance mode"
    );
    let removal = started.elapsed();

    // An unreachable worker: refused without force, nothing written to it;
    // with spec.removal.force, its Node is deleted and it is forgotten.
    let down = "lab-worker-2";
    let down_index = h.lab.hostnames.iter().position(|n| n == down).unwrap();
    h.lab
        .emulator
        .set_fault(down_index, ichor_talemu::Fault::Down);
    let writes_before = h
        .lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == down)
        .count();
    machines
        .delete(down, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&h, "the removal of an unreachable node refused", || async {
        machines
            .get(down)
            .await
            .unwrap()
            .status
            .and_then(|s| s.membership)
            .is_some_and(|m| {
                m.phase == MembershipPhase::Refused
                    && m.message
                        .as_deref()
                        .is_some_and(|t| t.contains("does not answer") && t.contains("--force"))
            })
    })
    .await;
    assert!(
        nodes.get_opt(down).await.unwrap().is_some(),
        "its Node stays"
    );
    machines
        .patch(
            down,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"removal": {"force": true}}})),
        )
        .await
        .unwrap();
    gone(&h, down).await;
    let writes_after = h
        .lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == down)
        .count();
    assert_eq!(
        writes_before, writes_after,
        "nothing written to the unreachable node"
    );
    let forced = started.elapsed();

    // Replace lab-cp-3, with a probe loop against the Kubernetes API.
    let log_from = h.lab.emulator.membership_log().len();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let probe = {
        let (client, answered, failed) = (client.clone(), answered.clone(), failed.clone());
        tokio::spawn(async move {
            loop {
                let counter = match Api::<Namespace>::all(client.clone())
                    .get_opt("default")
                    .await
                {
                    Ok(_) => &answered,
                    Err(_) => &failed,
                };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let old_index = h
        .lab
        .hostnames
        .iter()
        .position(|n| n == "lab-cp-3")
        .unwrap();
    let gate = h.lab.emulator.hold_reboots(old_index);
    let (new_cp, _) = add(&mut h, NodeRole::ControlPlane, Some("lab-cp-3")).await;
    joined(&h, &new_cp).await;
    // SIGKILL the controller again with the old control plane down in its
    // reset, after it left etcd.
    wait_for(&h, "lab-cp-3's Reset recorded as sent", || async {
        machines
            .get_opt("lab-cp-3")
            .await
            .unwrap()
            .and_then(|m| m.status)
            .and_then(|s| s.membership)
            .is_some_and(|m| m.reset_sent_boot_id.is_some())
    })
    .await;
    let pid = controller_pid(&h).expect("the controller's process");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for(&h, "the killed controller to be gone", || async {
        controller_pid(&h) != Some(pid)
    })
    .await;
    gate.open();
    gone(&h, "lab-cp-3").await;
    probe.abort();
    let ok = answered.load(std::sync::atomic::Ordering::Relaxed);
    let failed = failed.load(std::sync::atomic::Ordering::Relaxed);
    assert!(ok > 0, "the probe ran");
    let log = h.lab.emulator.membership_log();
    for change in &log[log_from..] {
        assert!(
            change.healthy_voters >= ichor_reconcile::membership::majority(change.voters),
            "below a majority: {change:?}\n{log:?}"
        );
    }
    let last = log.last().unwrap();
    assert_eq!((last.voters, last.healthy_voters), (4, 4), "{log:?}");
    assert_eq!(resets(&h, "lab-cp-3"), 1);
    println!(
        "membership lab: adopted {adopted:?}, joined {:?}, worker removed {:?}, unreachable worker refused then forced {:?}, replaced {:?} (total {:?}); API probe during the replacement: {ok} answered, {failed} failed",
        joins - adopted,
        removal - joins,
        forced - removal,
        started.elapsed() - forced,
        started.elapsed()
    );
}

fn writes_to(h: &LabHarness, node: &str) -> usize {
    h.lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == node)
        .count()
}

fn index_of(h: &LabHarness, node: &str) -> usize {
    h.lab.hostnames.iter().position(|n| n == node).unwrap()
}

/// The machine's membership message once its phase is `phase` and the
/// message has each of `has`.
async fn message_in(h: &LabHarness, name: &str, phase: MembershipPhase, has: &[&str]) -> String {
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS);
    let read = || async {
        let m = machines.get_opt(name).await.unwrap();
        m.and_then(|m| m.status)
            .and_then(|s| s.membership)
            .map(|s| (s.phase, s.message.unwrap_or_default()))
    };
    wait_for(h, &format!("{name} {phase:?} saying {has:?}"), || async {
        read()
            .await
            .is_some_and(|(p, m)| p == phase && has.iter().all(|t| m.contains(t)))
    })
    .await;
    read().await.map(|(_, m)| m).unwrap_or_default()
}

/// An Event of `reason` on TalosMachine `name` whose note has `has`: its note.
async fn event_on(h: &LabHarness, name: &str, reason: &str, has: &str) -> String {
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(h.client().await, NS);
    let find = || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let on = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name);
            let note = e.note.filter(|n| n.contains(has))?;
            (on && e.reason.as_deref() == Some(reason)).then_some(note)
        })
    };
    wait_for(h, &format!("a {reason} Event on {name}"), || async {
        find().await.is_some()
    })
    .await;
    find().await.unwrap_or_default()
}

/// In the multi-document shape (Talos v1.14), on a lab of 3 control
/// planes with Ichor adopted: a worker joins; a control plane whose node
/// went down is replaced (`spec.replaces`): its member is removed by id
/// from a healthy peer first, its Node deleted, nothing written to it (no
/// Reset), then the new control plane joins; the emulator's membership log
/// never has fewer healthy voters than a majority. Then, with another
/// control plane down, removing a healthy one is refused by the controller
/// (status Refused, a RemovalRefused Event with the reason), nothing
/// written to its node.
///
/// Covers: R14.1, R14.3, R14.13, R14.14, R14.15
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_control_plane_is_replaced_in_the_multidoc_shape() {
    let started = Instant::now();
    let mut h = LabHarness::up(|o| {
        *o = o.clone().with_shape(ichor_lab::LabShape::Multidoc);
        o.nodes = 3;
        o.control_planes = 3;
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS);
    for name in ["lab-cp-1", "lab-cp-2", "lab-cp-3"] {
        machines
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"hold": false}})),
            )
            .await
            .unwrap();
    }
    let adopted = started.elapsed();

    // lab-cp-3's node goes down; a worker and its replacement are added.
    let log_from = h.lab.emulator.membership_log().len();
    let failed = "lab-cp-3";
    h.lab
        .emulator
        .set_fault(index_of(&h, failed), ichor_talemu::Fault::Down);
    let failed_writes = writes_to(&h, failed);
    let (worker, _) = add(&mut h, NodeRole::Worker, None).await;
    let (new_cp, _) = add(&mut h, NodeRole::ControlPlane, Some(failed)).await;
    let failed_note = event_on(&h, &new_cp, "Leaving", "has failed").await;
    joined(&h, &worker).await;
    gone(&h, failed).await;
    joined(&h, &new_cp).await;
    let replaced = started.elapsed();
    assert_eq!(
        writes_to(&h, failed),
        failed_writes,
        "nothing written to the failed node"
    );
    let log = h.lab.emulator.membership_log();
    let changes = &log[log_from..];
    for change in changes {
        assert!(
            change.healthy_voters >= ichor_reconcile::membership::majority(change.voters),
            "below a majority: {change:?}\n{log:?}"
        );
    }
    let kinds: Vec<(ichor_talemu::MembershipChangeKind, &str)> = changes
        .iter()
        .filter(|c| c.kind != ichor_talemu::MembershipChangeKind::Health)
        .map(|c| (c.kind, c.hostname.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (ichor_talemu::MembershipChangeKind::RemovedById, failed),
            (
                ichor_talemu::MembershipChangeKind::LearnerAdded,
                new_cp.as_str()
            ),
            (
                ichor_talemu::MembershipChangeKind::Promoted,
                new_cp.as_str()
            ),
        ],
        "{changes:#?}"
    );
    let last = log.last().unwrap();
    assert_eq!((last.voters, last.healthy_voters), (3, 3), "{log:?}");

    // lab-cp-1 goes down too: removing lab-cp-2 would leave 1 healthy of
    // 2 voters, so the controller refuses it and writes nothing.
    h.lab
        .emulator
        .set_fault(index_of(&h, "lab-cp-1"), ichor_talemu::Fault::Down);
    let kept = "lab-cp-2";
    let kept_writes = writes_to(&h, kept);
    machines
        .delete(kept, &DeleteParams::default())
        .await
        .unwrap();
    let why = message_in(&h, kept, MembershipPhase::Refused, &["majority"]).await;
    assert!(
        why.contains("1 healthy of 2 etcd voters"),
        "the refusal says why: {why}"
    );
    let refused = event_on(&h, kept, "RemovalRefused", "majority").await;
    assert_eq!(
        writes_to(&h, kept),
        kept_writes,
        "nothing written to {kept}"
    );
    let node = Api::<Node>::all(h.client().await).get(kept).await.unwrap();
    assert!(
        !node.spec.unwrap().unschedulable.unwrap_or(false),
        "{kept} is not cordoned"
    );
    println!("{new_cp} Leaving Event: {failed_note}\n{kept} RemovalRefused Event: {refused}");
    println!(
        "membership lab (multidoc): adopted {adopted:?}, failed control plane replaced and a worker joined {:?}, quorum refusal {:?} (total {:?})",
        replaced - adopted,
        started.elapsed() - replaced,
        started.elapsed()
    );
}
