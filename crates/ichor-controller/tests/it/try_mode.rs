//! Try-mode applies (R16.3) with a real API server and emulated nodes:
//! the cluster sets `applyMode: try` with a 4s `tryTimeout`. What the lab
//! plays: each Node's Ready follows its node's active config by the lab's
//! rule (`ichor_lab::readiness`: a config whose nodeLabels carry
//! `lab.ichor.maesh.dev/unhealthy: "true"` leaves the node NotReady). What
//! Ichor does: a healthy change is confirmed by a no-reboot apply of the
//! same config; an unhealthy one is left to the emulator's timer, which
//! puts the previous config back, and the machine ends held (TryReverted)
//! with its single apply in the write log.

use std::time::Duration;

use crate::common::*;
use ichor_api::apply::TryPhase;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::history::{RevisionApplyMode, RevisionOutcome};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talemu::{Emulator, NodeSpec, WriteAction};
use ichor_testenv::TestEnv;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const HEALTHY: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/test: \"yes\"\n";
const UNHEALTHY: &str = "machine:\n  nodeLabels:\n    lab.ichor.maesh.dev/unhealthy: \"true\"\n";

fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"},
            "applyMode": "try", "tryTimeout": "4s"}
    }))
    .unwrap()
}

fn machine(ns: &str, name: &str, address: String, patch: &str) -> TalosMachine {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": address,
            "hold": true, "patches": [{"name": "change", "inline": patch}]}
    }))
    .unwrap()
}

/// Node `node`'s writes, without the config bytes.
fn writes_of(emu: &Emulator, node: &str) -> Vec<String> {
    emu.writes()
        .iter()
        .filter(|w| w.node == node)
        .map(|w| match &w.action {
            WriteAction::ApplyConfiguration { mode, .. } => format!("apply {mode}"),
            other => format!("{other:?}"),
        })
        .collect()
}

fn reason_of(m: &TalosMachine, type_: &str) -> Option<String> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
        .map(|c| c.reason.clone())
}

/// A healthy change is confirmed (TRY, then NO_REBOOT of the same config);
/// an unhealthy one is reverted by the emulator's timer and holds its
/// machine with reason TryReverted, with one apply in the write log and
/// none after it.
/// Covers: R16.3, R16.3b
#[tokio::test(flavor = "multi_thread")]
async fn try_mode_confirms_a_healthy_change_and_leaves_an_unhealthy_one_to_the_timer() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("tm-try").await;
    let rel = env.namespace("tm-try-kube").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let base = ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml");
    let emu = std::sync::Arc::new(
        emulator(vec![
            NodeSpec::new("try-ok", base.clone()).with_version("v1.12.1"),
            NodeSpec::new("try-bad", base.clone()).with_version("v1.12.1"),
        ])
        .await,
    );
    let nodes: Vec<String> = ["try-ok", "try-bad", "try-3"].map(String::from).into();
    let running = handed_over(&client, &ns, &rel, &cluster(&ns), &nodes).await;

    // The lab's kubelets: each Node's Ready follows its node's active config.
    let player = {
        let (client, emu) = (client.clone(), std::sync::Arc::clone(&emu));
        tokio::spawn(async move {
            loop {
                for (i, name) in ["try-ok", "try-bad"].iter().enumerate() {
                    let config = emu.active_config(i).unwrap_or_default();
                    let _ = ichor_lab::readiness::play(&client, name, &config).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for (i, (name, patch)) in [("try-ok", HEALTHY), ("try-bad", UNHEALTHY)]
        .into_iter()
        .enumerate()
    {
        machines
            .create(
                &PostParams::default(),
                &machine(&ns, name, emu.endpoint(i), patch),
            )
            .await
            .unwrap();
    }
    for name in ["try-ok", "try-bad"] {
        wait_for(
            &format!("{name} to show its class B drift while held"),
            || async {
                machines.get(name).await.is_ok_and(|m| {
                    reason_of(&m, types::DRIFTED).as_deref() == Some(reasons::SAFE_DRIFT)
                })
            },
        )
        .await;
    }
    for name in ["try-ok", "try-bad"] {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"hold": false}})),
            )
            .await
            .unwrap();
    }

    // The healthy change: tried, checked, confirmed.
    wait_for("try-ok's change confirmed", || async {
        machines.get("try-ok").await.is_ok_and(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.try_apply.is_none()
                    && s.revisions.last().is_some_and(|r| {
                        r.apply_mode == RevisionApplyMode::Try
                            && r.outcome == RevisionOutcome::Applied
                    })
            })
        })
    })
    .await;
    let ok = machines.get("try-ok").await.unwrap();
    assert_eq!(
        reason_of(&ok, types::APPLIED).as_deref(),
        Some(reasons::APPLIED)
    );
    assert_eq!(writes_of(&emu, "try-ok"), ["apply try", "apply no_reboot"]);
    assert_eq!(emu.active_config(0), emu.persistent_config(0));
    assert_ne!(emu.active_config(0).unwrap(), base.as_bytes());

    // The unhealthy change: NotReady while tried, put back by the timer,
    // recorded as reverted by try, the machine held.
    wait_for("try-bad held with TryReverted", || async {
        machines
            .get("try-bad")
            .await
            .is_ok_and(|m| reason_of(&m, types::HELD).as_deref() == Some(reasons::TRY_REVERTED))
    })
    .await;
    let bad = machines.get("try-bad").await.unwrap();
    let status = bad.status.clone().unwrap();
    let tried = status.try_apply.clone().expect("the reverted try is kept");
    assert_eq!(tried.phase, TryPhase::Reverted);
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
    assert_eq!(emu.active_config(1).unwrap(), base.as_bytes());
    assert_eq!(writes_of(&emu, "try-bad"), ["apply try", "TryRollback"]);

    // Held: not tried again over the next resyncs.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(writes_of(&emu, "try-bad"), ["apply try", "TryRollback"]);
    let bad = machines.get("try-bad").await.unwrap();
    assert_eq!(
        reason_of(&bad, types::HELD).as_deref(),
        Some(reasons::TRY_REVERTED)
    );
    player.abort();
    running.stop().await.unwrap();
}
