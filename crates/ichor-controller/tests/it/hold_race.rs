//! The hold race (R8.3): a hold taken back while the controller
//! is between its read of a released TalosMachine and its apply. The
//! emulated node pauses its config read (a gate in `ichor-talemu`, no
//! timing), the test sets `spec.hold: true` while the controller waits on
//! it, then lets the read through.

use std::sync::{Arc, Mutex};

use crate::common::*;
use futures::StreamExt as _;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talemu::NodeSpec;
use ichor_testenv::TestEnv;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/test: \"yes\"\n";

fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

/// The writes a node took, without the config bytes (they hold the fixture's keys).
fn node_writes(emu: &ichor_talemu::Emulator) -> Vec<String> {
    emu.writes()
        .iter()
        .map(|w| match &w.action {
            ichor_talemu::WriteAction::ApplyConfiguration { mode, .. } => {
                format!("{}: ApplyConfiguration ({mode})", w.node)
            }
            other => format!("{}: {other:?}", w.node),
        })
        .collect()
}

fn applied(m: &TalosMachine) -> Option<(String, String)> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::APPLIED))
        .map(|c| (c.reason.clone(), c.message.clone()))
}

async fn set_hold(api: &Api<TalosMachine>, name: &str, hold: bool) -> TalosMachine {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"hold": hold}})),
    )
    .await
    .unwrap()
}

/// A hold taken back between the controller's read of a released machine
/// and its apply: the node is never written, and `Applied=False` with
/// reason HoldTakenBack (and an Event) says why.
/// Covers: R8.3 (hold race), R1.5e
#[tokio::test]
async fn a_hold_taken_back_before_the_apply_writes_nothing_to_the_node() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("tm-race").await;
    let rel = env.namespace("tm-race-kube").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let w_cfg = ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml");
    let emu = emulator(vec![
        NodeSpec::new("w-1", w_cfg.clone()).with_version("v1.12.1"),
    ])
    .await;

    // The hand-over first (as in machines.rs), so the only drift is the
    // class B label patch.
    let names: Vec<String> = ["race-1", "race-2", "race-3"].map(String::from).into();
    let running = handed_over(&client, &ns, &rel, &cluster(&ns), &names).await;

    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    let m: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "w-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": emu.endpoint(0),
            "hold": true, "patches": [{"name": "labels", "inline": LABELS}]}
    }))
    .unwrap();
    machines.create(&PostParams::default(), &m).await.unwrap();
    wait_for("w-1 to show its class B drift while held", || async {
        machines.get("w-1").await.is_ok_and(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.observed_generation == m.metadata.generation
                    && conditions::find(&s.conditions, types::DRIFTED)
                        .is_some_and(|c| c.reason == reasons::SAFE_DRIFT)
            })
        })
    })
    .await;
    assert!(node_writes(&emu).is_empty(), "{:?}", node_writes(&emu));

    // Every version of w-1 from here on, as the API server stores them.
    let from = machines.get("w-1").await.unwrap().resource_version();
    let seen: Arc<Mutex<Vec<TalosMachine>>> = Arc::default();
    let watch = {
        let (machines, seen) = (machines.clone(), Arc::clone(&seen));
        let mut stream = machines
            .watch(
                &WatchParams::default().fields("metadata.name=w-1"),
                from.as_deref().unwrap_or("0"),
            )
            .await
            .unwrap()
            .boxed();
        tokio::spawn(async move {
            while let Some(Ok(ev)) = stream.next().await {
                if let WatchEvent::Modified(m) = ev {
                    seen.lock().unwrap().push(m);
                }
            }
        })
    };

    // Release; the controller reads the released machine and stops at the
    // node's config read; the hold is taken back; the read goes on.
    let gate = emu.pause_reads(0);
    let released = set_hold(&machines, "w-1", false).await;
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("the controller reads the node's config after the release");
    let held_again = set_hold(&machines, "w-1", true).await;
    assert!(held_again.metadata.generation > released.metadata.generation);
    gate.open();

    // Whatever the controller did with the release shows in an Applied
    // condition (True had it written, as it did before the race was closed).
    wait_for("an Applied condition on w-1 after the release", || async {
        seen.lock().unwrap().iter().any(|m| applied(m).is_some())
    })
    .await;
    let (reason, message) = seen
        .lock()
        .unwrap()
        .iter()
        .find_map(applied)
        .expect("an Applied condition");
    assert!(
        node_writes(&emu).is_empty(),
        "the node was written after its hold was taken back: {:?}",
        node_writes(&emu)
    );
    assert_eq!(reason, reasons::HOLD_TAKEN_BACK, "{message}");
    assert!(
        message.contains("spec.hold") && message.contains("nothing was written"),
        "{message}"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    wait_for("a HoldTakenBack Event on w-1", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(reasons::HOLD_TAKEN_BACK)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w-1")
            })
        })
    })
    .await;

    // The reconcile of the held machine that follows writes nothing either.
    let generation = held_again.metadata.generation;
    wait_for("w-1 reconciled as held", || async {
        machines.get("w-1").await.is_ok_and(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.observed_generation == generation
                    && conditions::find(&s.conditions, types::HELD)
                        .is_some_and(|c| c.reason == reasons::HOLD_SET)
            })
        })
    })
    .await;
    running.stop().await.unwrap();
    watch.abort();
    assert!(node_writes(&emu).is_empty(), "{:?}", node_writes(&emu));
    assert_eq!(
        String::from_utf8(emu.active_config(0).unwrap()).unwrap(),
        w_cfg
    );
}
