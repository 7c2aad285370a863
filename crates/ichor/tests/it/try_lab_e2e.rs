//! Try-mode applies on the lab, with the controller `ichor adopt` installed
//! (its Deployment, under its own ServiceAccount).
//!
//! What the lab plays: each Node's Ready condition follows the active config
//! of its emulated node (`ichor_lab::readiness`): a config whose
//! `machine.nodeLabels` carry `lab.ichor.maesh.dev/unhealthy: "true"` leaves
//! the Node NotReady, as a change that broke the kubelet would; the
//! emulator's `TRY` timer puts the previous config back when no confirmation
//! came.
//!
//! What Ichor does: a released worker set to `applyMode: try` with an 8s
//! `tryTimeout` gets a healthy patch applied in `TRY` mode, judged healthy
//! (Talos services, Node Ready) and confirmed with a `NO_REBOOT` apply of the
//! same config: two writes, the revision Applied. Then a patch adding the
//! unhealthy label, with a 20s `tryTimeout`: applied in `TRY` mode once,
//! never confirmed while the Node is NotReady; the emulator's timer reverts it (the `TryRollback` in
//! the write log is the emulator's own entry, not a write by Ichor) and the
//! controller holds the machine with reason TryReverted, writing nothing
//! more. Its `/metrics` counts two tries, one confirmed, one reverted.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use ichor_api::apply::TryPhase;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::history::{RevisionApplyMode, RevisionOutcome};
use ichor_api::{MachineRole, TalosMachine};
use ichor_lab::readiness::{UNHEALTHY_LABEL, UNHEALTHY_MESSAGE};
use ichor_talemu::WriteAction;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::common::{LabHarness, NS, metrics_forward, run, scrape, text};

const WAIT: Duration = Duration::from_secs(90);

/// Node `node`'s writes from the `from`th on, without the config bytes.
fn writes_of(h: &LabHarness, node: &str, from: usize) -> Vec<String> {
    h.lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == node)
        .skip(from)
        .map(|w| match &w.action {
            WriteAction::ApplyConfiguration { mode, .. } => format!("apply {mode}"),
            other => format!("{other:?}"),
        })
        .collect()
}

fn count_writes(h: &LabHarness, node: &str) -> usize {
    h.lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == node)
        .count()
}

fn reason_of(m: &TalosMachine, type_: &str) -> Option<String> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
        .map(|c| c.reason.clone())
}

/// The Node's Ready condition: status and message.
async fn node_ready(nodes: &Api<Node>, name: &str) -> Option<(String, String)> {
    nodes
        .get(name)
        .await
        .ok()?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status, c.message.unwrap_or_default()))
}

/// Waits until `done` holds for the machine; returns it.
async fn machine_until(
    h: &LabHarness,
    machines: &Api<TalosMachine>,
    name: &str,
    what: &str,
    done: impl Fn(&TalosMachine) -> bool,
) -> TalosMachine {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = machines.get(name).await.unwrap();
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "waited in vain for {what}: {:#?}\n{}",
            m.status,
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Covers: R16.3b, R16.3c
#[tokio::test(flavor = "multi_thread")]
async fn try_mode_confirms_a_healthy_patch_and_the_timer_reverts_an_unhealthy_one_on_the_lab() {
    let started = Instant::now();
    let h = LabHarness::up(|_| {}).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let admin = h.client().await;
    let machines = Api::<TalosMachine>::namespaced(admin.clone(), NS);
    let nodes = Api::<Node>::all(admin.clone());
    let name = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| m.spec.role == MachineRole::Worker)
        .and_then(|m| m.metadata.name)
        .expect("a worker");
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    // The release settles first (its own apply, if any, is not ours), and
    // the Node is Ready (the checks need it).
    machine_until(&h, &machines, &name, "the release to settle", |m| {
        m.status.as_ref().is_some_and(|s| {
            s.config_hash.is_some() && s.drift.iter().all(|d| d.class == ichor_api::DriftClass::A)
        })
    })
    .await;
    let deadline = Instant::now() + WAIT;
    while node_ready(&nodes, &name).await.map(|r| r.0).as_deref() != Some("True") {
        assert!(Instant::now() < deadline, "{name} Ready\n{}", h.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let adopted = started.elapsed();

    // (a) A healthy patch in try mode: tried, judged, confirmed.
    let healthy = json!({"name": "label", "inline": "machine:\n  nodeLabels:\n    ichor.maesh.dev/try: \"yes\"\n"});
    let before = count_writes(&h, &name);
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"applyMode": "try", "tryTimeout": "8s",
                "patches": [healthy]}})),
        )
        .await
        .unwrap();
    let ok = machine_until(&h, &machines, &name, "the healthy try confirmed", |m| {
        m.status.as_ref().is_some_and(|s| {
            s.try_apply.is_none()
                && s.revisions.last().is_some_and(|r| {
                    r.apply_mode == RevisionApplyMode::Try && r.outcome == RevisionOutcome::Applied
                })
        })
    })
    .await;
    assert_eq!(
        reason_of(&ok, types::APPLIED).as_deref(),
        Some(reasons::APPLIED)
    );
    assert_eq!(
        writes_of(&h, &name, before),
        ["apply try", "apply no_reboot"]
    );
    let confirmed = started.elapsed();

    // (b) An unhealthy patch: the lab plays the Node NotReady, Ichor never
    // confirms, the emulator's timer reverts, the machine is held.
    let unhealthy = json!({"name": "unhealthy",
        "inline": format!("machine:\n  nodeLabels:\n    {UNHEALTHY_LABEL}: \"true\"\n")});
    let before = count_writes(&h, &name);
    machines
        .patch(
            &name,
            &PatchParams::default(),
            // A longer timeout: judging starts at half of it, and the lab
            // plays the Node NotReady only on a later pass (seconds on a
            // loaded machine).
            &Patch::Merge(json!({"spec": {"tryTimeout": "20s", "patches": [healthy, unhealthy]}})),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let mut played_not_ready = false;
    let bad = loop {
        let m = machines.get(&name).await.unwrap();
        if reason_of(&m, types::HELD).as_deref() == Some(reasons::TRY_REVERTED) {
            break m;
        }
        played_not_ready |= node_ready(&nodes, &name)
            .await
            .is_some_and(|(s, m)| s == "False" && m == UNHEALTHY_MESSAGE);
        assert!(
            Instant::now() < deadline,
            "waited in vain for TryReverted: {:#?}\n{}",
            m.status,
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(played_not_ready, "the lab played {name} NotReady");
    let status = bad.status.clone().unwrap();
    let tried = status.try_apply.clone().expect("the reverted try is kept");
    assert_eq!(tried.phase, TryPhase::Reverted, "{tried:?}");
    assert!(
        tried
            .message
            .as_deref()
            .is_some_and(|m| m.contains("Ready=False")),
        "{tried:?}"
    );
    let revision = status.revisions.last().unwrap();
    assert_eq!(
        (revision.apply_mode, revision.outcome),
        (RevisionApplyMode::Try, RevisionOutcome::RevertedByTry)
    );
    // One apply by Ichor; the TryRollback is the emulator's timer.
    assert_eq!(writes_of(&h, &name, before), ["apply try", "TryRollback"]);
    let reverted = started.elapsed();

    // Held: the node is Ready again on its previous config, and nothing is
    // written over the next resyncs.
    let deadline = Instant::now() + WAIT;
    while node_ready(&nodes, &name).await.map(|r| r.0).as_deref() != Some("True") {
        assert!(
            Instant::now() < deadline,
            "{name} Ready again on its previous config\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(writes_of(&h, &name, before), ["apply try", "TryRollback"]);
    let m = machines.get(&name).await.unwrap();
    assert_eq!(
        reason_of(&m, types::HELD).as_deref(),
        Some(reasons::TRY_REVERTED)
    );
    // What the controller counted, read from its /metrics through a
    // Service as the chart's: two tries, one confirmed, one reverted.
    let forward = metrics_forward(&h, &admin).await;
    let served = scrape(forward.addr).await;
    for (outcome, count) in [("tried", 2), ("confirmed", 1), ("reverted", 1)] {
        let line = format!("ichor_try_applies_total{{outcome=\"{outcome}\"}} {count}");
        assert!(
            served.lines().any(|l| l == line),
            "{line} is not served:\n{served}"
        );
    }
    println!(
        "try lab: adopted {adopted:?}, confirmed {confirmed:?}, reverted {reverted:?}, all {:?}",
        started.elapsed()
    );
}
