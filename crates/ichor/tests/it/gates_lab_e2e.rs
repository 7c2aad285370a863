//! Maintenance windows and health gates on the lab, judged by the controller
//! `ichor adopt` installed (its Deployment's pod, run by the lab as the local
//! `ichor` binary under its ServiceAccount's token, with the ClusterRole the
//! install grants). What the lab plays: the Talos nodes (the emulator; the
//! test holds a rebooted node down until it lets it come back), the
//! kubelets (Nodes Ready; a Deployment whose image is tagged `broken` stays
//! in ImagePullBackOff and is never Available, one that can pull is marked
//! Available), and, once the test annotates a Node, a kubelet that stopped
//! posting status (its Ready condition turns Unknown). What the test plays:
//! the clock's minute (it picks the window's start), the broken image and
//! its fix, and the stopped kubelet.

use std::time::{Duration, Instant, SystemTime};

use crate::common::{LabHarness, NS, run, text};
use chrono::{DateTime, Timelike as _, Utc};
use ichor_api::conditions::types;
use ichor_api::operation::HEALTH_CHECK_FAILED;
use ichor_api::window::OUTSIDE_MAINTENANCE_WINDOW;
use ichor_api::{MachineStep, OperationPhase, TalosOperation};
use ichor_lab::daemonsets::KUBELET_STOPPED_ANNOTATION;
use ichor_talemu::WriteAction;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The bound of each wait but the window's (the lab answers in seconds).
const WAIT: Duration = Duration::from_secs(60);

/// The zone the window is read in: a half-hour offset and no daylight
/// saving, so the cron's hour and minute are not the UTC ones.
const ZONE: &str = "Asia/Kolkata";
const ZONE_OFFSET_SECS: i64 = 5 * 3600 + 30 * 60;

/// The first whole minute at least `lead` from now: the window's start.
fn next_minute_after(now: DateTime<Utc>, lead: Duration) -> DateTime<Utc> {
    let earliest = now.timestamp() + lead.as_secs() as i64;
    DateTime::from_timestamp((earliest / 60 + 1) * 60, 0).expect("a time")
}

/// A daily cron of `opens`, read in [`ZONE`].
fn cron_at(opens: DateTime<Utc>) -> String {
    let local = DateTime::from_timestamp(opens.timestamp() + ZONE_OFFSET_SECS, 0).expect("a time");
    format!("{} {} * * *", local.minute(), local.hour())
}

fn reboot(name: &str, machines: &[&str], windows: Value, checks: Value) -> TalosOperation {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "lab"}, "machines": machines},
            "maintenanceWindows": windows, "healthChecks": checks}
    }))
    .expect("a TalosOperation")
}

/// Polls `done` on the operation until it holds, bounded by `bound`.
async fn until(
    h: &LabHarness,
    ops: &Api<TalosOperation>,
    name: &str,
    what: &str,
    bound: Duration,
    done: impl Fn(&TalosOperation) -> bool,
) -> TalosOperation {
    let deadline = Instant::now() + bound;
    loop {
        let op = ops.get(name).await.expect("the operation");
        if done(&op) {
            return op;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {bound:?}; status {:#?}\n{}",
            op.status,
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn phase(op: &TalosOperation) -> Option<OperationPhase> {
    op.status.as_ref().and_then(|s| s.phase)
}

fn reboots_of(h: &LabHarness, node: &str) -> Vec<SystemTime> {
    h.lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == node && matches!(w.action, WriteAction::Reboot { .. }))
        .map(|w| w.at)
        .collect()
}

/// The Deployment `web/api`, its image tagged `broken`: the lab's kubelet
/// never pulls it, so the Deployment is never Available.
async fn unavailable_deployment(client: &kube::Client) -> Api<Deployment> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}})).unwrap(),
        )
        .await
        .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), "web");
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "api", "namespace": "web"},
                "spec": {"selector": {"matchLabels": {"app": "api"}},
                    "template": {"metadata": {"labels": {"app": "api"}},
                        "spec": {"containers": [{"name": "api", "image": "registry.local/api:broken"}]}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    deployments
}

/// The test stops (`true`) or starts again the lab kubelet of `node`, and
/// waits for the Node's Ready condition to show it.
async fn kubelet_stopped(client: &kube::Client, node: &str, stopped: bool) {
    let value = stopped.then_some("played by the test");
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {KUBELET_STOPPED_ANNOTATION: value}}}),
            ),
        )
        .await
        .unwrap();
    // The lab's kubelet acts on its next pass: the test goes on once the
    // Node's Ready condition says so, as a real silent kubelet is seen only
    // once the node lifecycle controller marks it.
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = Api::<Node>::all(client.clone())
            .get(node)
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status);
        if (ready.as_deref() == Some("Unknown")) == stopped {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Node {node}: Ready is {ready:?} {WAIT:?} after its kubelet was {}",
            if stopped { "stopped" } else { "started" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On a lab of one control plane and two workers, a reboot of the two
/// workers created outside its maintenance window (a daily window read in
/// Asia/Kolkata, opening at the next whole minute) waits in phase Waiting
/// with `status.nextWindow` and the message naming that instant; at the
/// window it starts judging its gates: its CEL check on the Deployment
/// web/api, not Available (the lab never pulls its `broken` image), pauses
/// it before anything is touched, naming the check, the object and the
/// value. The test changes the image, the lab's kubelet marks the
/// Deployment Available, and the operation runs: the first worker reboots,
/// no earlier than the window's start. While it is down (held by the
/// test), the control plane's kubelet stops posting status (played by the
/// test): once the worker is back, the built-in gate `nodes-ready` pauses
/// the operation before the second worker, naming the Node and its
/// Ready=Unknown. The kubelet reports again and the operation ends
/// Succeeded. Meanwhile (while the first waits for its window) a check on
/// a kind the installed controller may not read (CronJobs: the install
/// grants Deployments, StatefulSets and DaemonSets) pauses another
/// operation with the API server's refusal, and the controller keeps
/// running.
/// Covers: R15.1 (waits outside its window, starts at it), R15.2, R15.5 (a failing CEL check pauses before the first machine, naming check, object and value; resumes when it passes; a target the controller may not read pauses saying so), R15.6 (a NotReady Node pauses it between machines)
#[tokio::test(flavor = "multi_thread")]
async fn an_operation_waits_for_its_window_and_pauses_at_its_gates() {
    let h = LabHarness::up(|o| o.nodes = 3).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());
    let client = h.client().await;
    let hosts = h.lab.hostnames.clone();
    let (cp, w1, w2) = (hosts[0].clone(), hosts[1].clone(), hosts[2].clone());
    let deployments = unavailable_deployment(&client).await;
    // The first worker's reboot stays down until the test lets it back.
    let held = h.lab.emulator.hold_reboots(1);

    let ops = Api::<TalosOperation>::namespaced(client.clone(), NS);
    // Far enough ahead that the controller's first look, however late on a
    // loaded machine, comes before the window.
    let opens = next_minute_after(Utc::now(), Duration::from_secs(20));
    let windows = json!([{"cron": cron_at(opens), "duration": "1h", "timeZone": ZONE}]);
    let checks = json!([{"name": "api-available",
        "expression": "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "web", "name": "api"}}]);
    ops.create(
        &PostParams::default(),
        &reboot("gated", &[&w1, &w2], windows, checks),
    )
    .await
    .expect("the webhook admits the operation");

    // (a) Outside its window: Waiting, saying when the window opens.
    let op = until(&h, &ops, "gated", "Waiting", WAIT, |op| {
        phase(op) == Some(OperationPhase::Waiting)
    })
    .await;
    let st = op.status.clone().unwrap();
    let next = st.next_window.as_ref().expect("status.nextWindow").0;
    assert_eq!(next.as_second(), opens.timestamp(), "{st:#?}");
    let at = opens.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        st.message.as_deref().is_some_and(|m| m.contains(&at)),
        "{st:#?}"
    );
    let waiting = ichor_api::conditions::find(&st.conditions, types::WAITING).expect("Waiting");
    assert_eq!(waiting.reason, OUTSIDE_MAINTENANCE_WINDOW);
    assert_eq!(
        st.plan
            .iter()
            .map(|e| e.machine.as_str())
            .collect::<Vec<_>>(),
        [w1.as_str(), w2.as_str()]
    );

    // Meanwhile a check on a kind the installed controller may not read
    // pauses another operation (no window: any time) with the API server's
    // refusal, before it touches anything.
    let checks = json!([{"name": "nightly-backup",
        "expression": "has(object.status.lastSuccessfulTime)",
        "target": {"apiVersion": "batch/v1", "kind": "CronJob", "namespace": "web", "name": "nightly"}}]);
    ops.create(
        &PostParams::default(),
        &reboot("unreadable", &[&w2], json!([]), checks),
    )
    .await
    .unwrap();
    let op = until(
        &h,
        &ops,
        "unreadable",
        "Paused by nightly-backup",
        WAIT,
        |op| phase(op) == Some(OperationPhase::Paused),
    )
    .await;
    let gate = op.status.unwrap().health_gate.unwrap();
    assert_eq!(gate.check, "nightly-backup");
    assert_eq!(gate.object.as_deref(), Some("CronJob web/nightly"));
    let value = gate.value.unwrap_or_default();
    let controller = format!(
        "system:serviceaccount:{NS}:{}",
        ichor_adopt::install::CONTROLLER
    );
    assert!(
        value.starts_with("reading failed: ")
            && value.contains("forbidden")
            && value.contains(&controller)
            && value.contains("cronjobs"),
        "{value}"
    );

    // (b) At the window the gates are judged: the CEL check fails on the
    // Deployment and pauses the operation, nothing touched.
    let op = until(
        &h,
        &ops,
        "gated",
        "Paused by api-available",
        WAIT + Duration::from_secs(70),
        |op| phase(op) == Some(OperationPhase::Paused),
    )
    .await;
    assert!(Utc::now() >= opens, "left Waiting before its window");
    let st = op.status.clone().unwrap();
    assert_eq!(st.next_window, None, "{st:#?}");
    let gate = st.health_gate.clone().expect("status.healthGate");
    assert_eq!(gate.check, "api-available");
    assert_eq!(gate.object.as_deref(), Some("Deployment web/api"));
    let value = gate.value.clone().unwrap_or_default();
    // No controller-manager writes the Deployment's status in the lab: the
    // expression fails on the missing conditions, and that is the value.
    assert!(
        value.starts_with("error: ") && value.contains("conditions"),
        "{gate:?}"
    );
    let waiting = ichor_api::conditions::find(&st.conditions, types::WAITING).expect("Waiting");
    assert_eq!(waiting.reason, HEALTH_CHECK_FAILED);
    assert!(
        waiting.message.contains("api-available") && waiting.message.contains("Deployment web/api"),
        "{waiting:?}"
    );
    assert!(reboots_of(&h, &w1).is_empty() && reboots_of(&h, &w2).is_empty());

    // The image is fixed; the lab's kubelet pulls it and marks the
    // Deployment Available: the operation runs, the first worker reboots.
    deployments
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "api", "image": "registry.local/api:1"}]}}}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(WAIT, held.reached())
        .await
        .unwrap_or_else(|_| panic!("{w1} was not rebooted\n{}", h.logs()));
    let first = reboots_of(&h, &w1);
    assert_eq!(first.len(), 1);
    assert!(
        first[0] >= SystemTime::from(opens),
        "{w1} rebooted before the window"
    );

    // (c) While the worker is down, the control plane's kubelet stops
    // posting status; the worker comes back, and the built-in gate pauses
    // the operation before the second worker.
    kubelet_stopped(&client, &cp, true).await;
    held.open();
    let op = until(&h, &ops, "gated", "Paused by nodes-ready", WAIT, |op| {
        op.status.as_ref().is_some_and(|s| {
            s.phase == Some(OperationPhase::Paused)
                && s.health_gate
                    .as_ref()
                    .is_some_and(|g| g.check == "nodes-ready")
        })
    })
    .await;
    let st = op.status.clone().unwrap();
    let gate = st.health_gate.clone().unwrap();
    assert_eq!(gate.object, Some(format!("Node {cp}")), "{gate:?}");
    assert_eq!(
        gate.value.as_deref(),
        Some("Ready=Unknown (NodeStatusUnknown)")
    );
    let step = |machine: &str| {
        st.machines
            .iter()
            .find(|m| m.machine == machine)
            .map(|m| m.step)
    };
    assert_eq!(step(&w1), Some(MachineStep::Succeeded), "{st:#?}");
    assert_eq!(step(&w2), Some(MachineStep::Pending), "{st:#?}");
    assert!(reboots_of(&h, &w2).is_empty(), "{w2} rebooted while paused");

    kubelet_stopped(&client, &cp, false).await;
    let op = until(&h, &ops, "gated", "Succeeded", WAIT, |op| {
        matches!(
            phase(op),
            Some(OperationPhase::Succeeded | OperationPhase::Failed)
        )
    })
    .await;
    assert_eq!(phase(&op), Some(OperationPhase::Succeeded), "{op:#?}");
    assert_eq!(reboots_of(&h, &w2).len(), 1);
    assert!(reboots_of(&h, &cp).is_empty());
}
