//! Maintenance windows end to end: a real kube-apiserver + etcd with
//! Ichor's CRDs, one `ichor-talemu` worker, and the controller in process.
//! An operation outside its window waits (phase Waiting, nextWindow) and
//! touches no node; when its window opens, it starts. Bad windows are
//! refused naming the field.

use std::time::Duration;

use crate::common::*;
use chrono::{DateTime, DurationRound as _, TimeDelta, Timelike as _, Utc};
use ichor_api::conditions::{self, reasons, types};
use ichor_api::operation::{MachineStep, OperationPhase, TalosOperation};
use ichor_api::window::OUTSIDE_MAINTENANCE_WINDOW;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_controller::operation::{CANCEL_ANNOTATION, OperationBounds};
use ichor_controller::webhook::{self, AdmissionReview};
use ichor_talemu::{NodeSpec, WriteAction};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// A daily window opening at `at` (UTC, whole minutes) for `duration`.
fn daily(at: DateTime<Utc>, duration: &str) -> Value {
    json!({"cron": format!("{} {} * * *", at.minute(), at.hour()), "duration": duration})
}

fn cluster(ns: &str, windows: Value) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.13.0", "kubernetesVersion": "v1.36.0",
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}, "maintenanceWindows": windows}
    }))
    .unwrap()
}

fn reboot(ns: &str, name: &str, windows: Option<Value>) -> TalosOperation {
    let mut spec = json!({"kind": "reboot", "target": {"clusterRef": {"name": "base"}}});
    if let Some(w) = windows {
        spec["maintenanceWindows"] = w;
    }
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": ns}, "spec": spec
    }))
    .unwrap()
}

/// The next whole minute at least 20 s away (time for the operation to be
/// seen waiting before its window opens).
fn next_minute(now: DateTime<Utc>) -> DateTime<Utc> {
    let t = now.duration_trunc(TimeDelta::minutes(1)).unwrap() + TimeDelta::minutes(1);
    if t - now < TimeDelta::seconds(20) {
        t + TimeDelta::minutes(1)
    } else {
        t
    }
}

async fn phase_is(ops: &Api<TalosOperation>, name: &str, phase: OperationPhase) -> TalosOperation {
    wait_for(
        &format!("TalosOperation {name} to be {phase:?}"),
        || async {
            ops.get(name)
                .await
                .unwrap()
                .status
                .is_some_and(|s| s.phase == Some(phase))
        },
    )
    .await;
    ops.get(name).await.unwrap()
}

/// Outside the cluster's window an operation waits with the next window's
/// start and touches no node (a cancel ends it there); an operation whose
/// own window opens a minute later waits, then reboots the worker once the
/// window is open.
/// Covers: R15.1
#[tokio::test]
async fn an_operation_waits_for_its_window_then_starts() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-window").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let now = Utc::now();
    let far = (now + TimeDelta::hours(12))
        .duration_trunc(TimeDelta::minutes(1))
        .unwrap();
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &cluster(&ns, json!([daily(far, "1h")])),
        )
        .await
        .unwrap();
    let suffix = ns.rsplit('-').next().unwrap_or(&ns).to_string();
    let host = format!("w-1-{suffix}");
    let emu = emulator(vec![
        NodeSpec::new(
            host.clone(),
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml"),
        )
        .with_version("v1.13.9"),
    ])
    .await;
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": host}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            &host,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "played by the test",
                "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let machine: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "w-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": emu.endpoint(0), "hold": false}
    }))
    .unwrap();
    Api::<TalosMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut config = config(&ns, &ns);
    config.operation_bounds = OperationBounds {
        etcd: Duration::from_secs(60),
        drain: Duration::from_secs(60),
        node_return: Duration::from_secs(60),
        poll: Duration::from_millis(100),
        component: Duration::from_secs(60),
        image: Duration::from_secs(60),
    };
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);

    // The cluster's window is 12 hours away: the operation waits for it.
    ops.create(&PostParams::default(), &reboot(&ns, "later", None))
        .await
        .unwrap();
    let op = phase_is(&ops, "later", OperationPhase::Waiting).await;
    let st = op.status.unwrap();
    assert_eq!(
        st.next_window.map(|t| t.0.as_second()),
        Some(far.timestamp()),
        "nextWindow is the cluster's next start"
    );
    assert!(
        st.message
            .as_deref()
            .unwrap_or_default()
            .contains("TalosCluster spec.maintenanceWindows"),
        "{:?}",
        st.message
    );
    let waiting = conditions::find(&st.conditions, types::WAITING).expect("Waiting condition");
    assert_eq!(
        (waiting.status.as_str(), waiting.reason.as_str()),
        ("True", OUTSIDE_MAINTENANCE_WINDOW)
    );
    assert_eq!(st.machines[0].step, MachineStep::Pending);
    ops.patch(
        "later",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "yes"}}})),
    )
    .await
    .unwrap();
    let op = phase_is(&ops, "later", OperationPhase::Failed).await;
    let done = conditions::find(&op.status.as_ref().unwrap().conditions, types::COMPLETE).unwrap();
    assert_eq!(done.reason, reasons::CANCELLED);

    // Its own window (overriding the cluster's) opens at the next minute.
    let opens = next_minute(Utc::now());
    ops.create(
        &PostParams::default(),
        &reboot(&ns, "soon", Some(json!([daily(opens, "30m")]))),
    )
    .await
    .unwrap();
    let op = phase_is(&ops, "soon", OperationPhase::Waiting).await;
    assert_eq!(
        op.status.unwrap().next_window.map(|t| t.0.as_second()),
        Some(opens.timestamp())
    );
    assert!(
        emu.writes().is_empty(),
        "no node is touched outside the window: {:?}",
        emu.writes()
    );
    let op = phase_is(&ops, "soon", OperationPhase::Succeeded).await;
    let st = op.status.unwrap();
    assert!(st.next_window.is_none());
    let started = st.machines[0].start_time.as_ref().expect("w-1 started").0;
    assert!(
        started.as_second() >= opens.timestamp(),
        "w-1 started inside the window"
    );
    running.stop().await.unwrap();
    let reboots = emu
        .writes()
        .iter()
        .filter(|w| matches!(w.action, WriteAction::Reboot { .. }))
        .count();
    assert_eq!(reboots, 1);
}

/// Through the real API server, the CRD's rules refuse a window of the
/// wrong shape naming the field; the webhook refuses a cluster's window
/// whose cron, time zone or blackout date means nothing.
/// Covers: R15.1
#[tokio::test]
async fn bad_windows_are_refused_naming_the_field() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("bad-window").await;
    crds(&client).await;
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    for (window, field) in [
        (
            json!({"cron": "0 2 * *", "duration": "2h"}),
            "spec.maintenanceWindows[0].cron",
        ),
        (
            json!({"cron": "0 2 * * *", "duration": "2 hours"}),
            "spec.maintenanceWindows[0].duration",
        ),
        (
            json!({"cron": "0 2 * * *", "duration": "2h", "timeZone": "+02:00"}),
            "spec.maintenanceWindows[0].timeZone",
        ),
        (
            json!({"cron": "0 2 * * *", "duration": "2h", "blackoutDates": ["24.12.2026"]}),
            "spec.maintenanceWindows[0].blackoutDates",
        ),
    ] {
        let err = ops
            .create(
                &PostParams::default(),
                &reboot(&ns, "bad", Some(json!([window]))),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    // An explicit empty list is accepted: any time.
    ops.create(&PostParams::default(), &reboot(&ns, "any", Some(json!([]))))
        .await
        .unwrap();
    assert_eq!(
        ops.get("any").await.unwrap().spec.maintenance_windows,
        Some(vec![])
    );

    // What the CRD cannot know, the webhook refuses (in process here).
    let bad = serde_json::to_value(cluster(
        &ns,
        json!([
            {"cron": "0 2 * * *", "duration": "2h"},
            {"cron": "61 2 * * *", "duration": "2h", "timeZone": "Europe/Berlinn", "blackoutDates": ["2026-02-30"]}
        ]),
    ))
    .unwrap();
    let review: AdmissionReview = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "object": bad}
    }))
    .unwrap();
    let out = serde_json::to_value(webhook::review(review)).unwrap();
    assert_eq!(out["response"]["allowed"], false);
    let msg = out["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.maintenanceWindows[1].cron \"61 2 * * *\": not a cron expression"),
        "{msg}"
    );
}
