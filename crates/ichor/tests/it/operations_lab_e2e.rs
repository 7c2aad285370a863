//! TalosOperations on the lab with three control planes and two workers,
//! done by the controller `ichor adopt` installed (its Deployment's pod, run
//! by the lab as the local `ichor` binary under its ServiceAccount's token)
//! and started by the real `ichor` commands. What the lab plays: the Talos
//! nodes (the emulator: one etcd member per control plane, every control
//! plane's Talos API listing all three; faults injected by the test), the
//! kubelets (pods end when evicted, Nodes Ready; with `components`, the
//! control-plane mirror pods and kubelet versions from each node's Talos
//! API). What it does not: one kube-apiserver stands in for the three
//! control planes' (it is never restarted), and no container runs.

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::common::{LabHarness, NS, run, text};
use futures::StreamExt as _;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::{MachineRole, MachineStep, OperationPhase, PlannedAction, TalosOperation};
use ichor_talemu::WriteAction;
use ichor_talos_client::resources::KubernetesComponent as Wire;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;

/// The bound of every wait here (the operations take seconds on the lab).
const WAIT: Duration = Duration::from_secs(300);

/// A lab of 3 control planes + 2 workers, adopted by the real `ichor adopt`;
/// `versions`: the Talos and Kubernetes versions its nodes run, else the
/// lab's.
async fn adopted_lab(components: bool, versions: Option<(&str, &str)>) -> LabHarness {
    let h = LabHarness::up(|o| {
        o.nodes = 5;
        o.control_planes = 3;
        o.components = components;
        if let Some((talos, kubernetes)) = versions {
            o.talos_version = talos.into();
            o.kubernetes_version = kubernetes.into();
        }
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());
    h
}

/// The real `ichor` with `args` and the lab's kubeconfig, to its end (bounded).
async fn ichor(h: &LabHarness, args: &[&str]) -> Output {
    let mut cmd = h.ichor();
    cmd.args(args)
        .args(["-n", NS, "--kubeconfig"])
        .arg(&h.lab.kubeconfig);
    tokio::time::timeout(WAIT * 3, tokio::process::Command::from(cmd).output())
        .await
        .unwrap_or_else(|_| panic!("ichor {args:?} did not end\n{}", h.logs()))
        .unwrap()
}

async fn operation(h: &LabHarness, name: &str) -> TalosOperation {
    Api::<TalosOperation>::namespaced(h.client().await, NS)
        .get(name)
        .await
        .unwrap()
}

/// Polls `done` until it holds, bounded by [`WAIT`].
async fn wait_for<F, Fut>(h: &LabHarness, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(WAIT, async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited in vain for {what}\n{}", h.logs());
}

/// Waits until operation `name` has ended and returns it.
async fn finished(h: &LabHarness, name: &str) -> TalosOperation {
    let ops = Api::<TalosOperation>::namespaced(h.client().await, NS);
    wait_for(h, &format!("operation {name} to end"), || async {
        ops.get(name).await.is_ok_and(|op| {
            op.status.as_ref().is_some_and(|s| {
                matches!(
                    s.phase,
                    Some(OperationPhase::Succeeded | OperationPhase::Failed)
                )
            })
        })
    })
    .await;
    ops.get(name).await.unwrap()
}

/// The Complete condition: (status, reason, message).
fn complete(op: &TalosOperation) -> (String, String, String) {
    let st = op.status.as_ref().expect("a status");
    let c = conditions::find(&st.conditions, types::COMPLETE).expect("a Complete condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// The node-touching writes from the `from`th on, as `node: action`.
fn node_writes(h: &LabHarness, from: usize) -> Vec<String> {
    h.lab.emulator.writes()[from..]
        .iter()
        .filter_map(|w| {
            let action = match &w.action {
                WriteAction::ImagePull { .. } => "pull",
                WriteAction::Upgrade { legacy: false, .. } => "upgrade",
                WriteAction::Upgrade { legacy: true, .. } => "legacy-upgrade",
                WriteAction::EtcdForfeitLeadership => "forfeit",
                WriteAction::Reboot { .. } => "reboot",
                _ => return None,
            };
            Some(format!("{}: {action}", w.node))
        })
        .collect()
}

/// The nodes written to (any write) from the `from`th write on.
fn written_nodes(h: &LabHarness, from: usize) -> std::collections::BTreeSet<String> {
    h.lab.emulator.writes()[from..]
        .iter()
        .map(|w| w.node.clone())
        .collect()
}

fn index(h: &LabHarness, host: &str) -> usize {
    h.lab.hostnames.iter().position(|n| n == host).unwrap()
}

/// Sets `spec.hold` of TalosMachine `name` (the machines are named after
/// their nodes).
async fn hold(h: &LabHarness, name: &str, on: bool) {
    Api::<ichor_api::TalosMachine>::namespaced(h.client().await, NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": on}})),
        )
        .await
        .unwrap();
}

/// The node the controller's (one) running pod is on.
async fn controller_node(h: &LabHarness) -> String {
    let pods = Api::<Pod>::namespaced(h.client().await, NS)
        .list(&ListParams::default().labels("app.kubernetes.io/name=ichor-controller"))
        .await
        .unwrap();
    pods.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .expect("the controller runs on a node")
}

/// The pid of the lab's process for Ichor's controller pod: the `ichor
/// controller` process whose KUBECONFIG is the one the lab wrote for a pod
/// in `ichor-system` (the lab runs each pod as a child process so).
pub(crate) fn controller_pid(h: &LabHarness) -> Option<u32> {
    let prefix = h.lab.state_dir().join(format!("pod-{NS}-ichor-controller"));
    let prefix = prefix.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if !args.iter().any(|a| *a == b"controller") {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ
            .split(|b| *b == 0)
            .any(|v| {
                v.strip_prefix(b"KUBECONFIG=")
                    .is_some_and(|p| p.starts_with(prefix.as_bytes()))
            })
            .then_some(pid)
    })
}

/// On 3 control planes + 2 workers, one worker held, a pod on every node
/// under a budget of `maxUnavailable: 1`, `ichor upgrade talos --wait`:
///
/// - the lab: every control plane's Talos API lists the three etcd members;
/// - the plan: the control planes one at a time, then the free worker,
///   Ichor's node last, the held worker "skipped (held)"; the operation
///   Succeeded with the Skipped condition naming it, and the held worker
///   never written to;
/// - the emulator's write log, exactly: the installer pulled on every
///   planned node, then per node upgrade, (control
///   planes: etcd leadership forfeited), reboot — one node after another in
///   plan order; each node's pod evicted (the API server's deletion) before
///   that node's reboot and after the previous one's;
/// - boot ids and versions before/after in status for every upgraded node.
///
/// Then, on the same lab:
/// - the first control plane comes back on its old version (the emulator's
///   fallback boot slot): the operation fails `BootedOldVersion` naming it;
///   it had one upgrade and one reboot, never re-issued, and no other node
///   was written to;
/// - a reboot of three machines cancelled by `ichor operation cancel` while
///   the first is down: it finishes coming back, the operation ends
///   `Cancelled`, nothing is written to the other two;
/// - a reboot of three machines whose controller is SIGKILLed while the
///   second is down: the lab's kubelet restarts the process, which resumes
///   from status — every machine rebooted exactly once, the finished one
///   never again.
///
/// Covers: R11.2, R11.3, R11.4, R11.5, R11.6 and the operation CLI, on 3 control planes + 2 workers (Talos upgrade order, drains before reboots, boot ids and versions; node on its old version; held worker skipped; cancel mid-operation; controller SIGKILLed resumes)
#[tokio::test(flavor = "multi_thread")]
async fn talos_upgrade_on_three_control_planes_then_stops() {
    let h = adopted_lab(false, None).await;
    let client = h.client().await;
    let hosts = h.lab.hostnames.clone();
    let cps: Vec<String> = hosts[..3].to_vec();
    assert_eq!(cps, ["lab-cp-1", "lab-cp-2", "lab-cp-3"]);

    // What the lab plays: one etcd cluster, seen alike from every control plane.
    for (i, cp) in cps.iter().enumerate() {
        let mut members: Vec<String> = h
            .lab
            .emulator
            .admin_client(i)
            .unwrap()
            .etcd_members("")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        members.sort();
        assert_eq!(members, cps, "the etcd members {cp} lists");
    }
    // Adopt found the three control planes (from the Nodes and Talos).
    let machines = Api::<ichor_api::TalosMachine>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut roles: Vec<(String, MachineRole)> = machines
        .items
        .iter()
        .map(|m| (m.metadata.name.clone().unwrap(), m.spec.role))
        .collect();
    roles.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        roles.iter().map(|r| r.1).collect::<Vec<_>>(),
        [
            MachineRole::Controlplane,
            MachineRole::Controlplane,
            MachineRole::Controlplane,
            MachineRole::Worker,
            MachineRole::Worker
        ],
        "{roles:?}"
    );

    let ichors_node = controller_node(&h).await;
    let held = ["lab-worker-2", "lab-worker-1"]
        .into_iter()
        .find(|w| *w != ichors_node)
        .unwrap()
        .to_string();
    hold(&h, &held, true).await;

    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap(),
        )
        .await
        .unwrap();
    for node in &hosts {
        crate::common::ready_pod(&client, "demo", &format!("app-{node}"), "app", node).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "app", "namespace": "demo"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "app"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    // When each pod went (its deletion, as the API server shows it).
    let gone: Arc<Mutex<BTreeMap<String, SystemTime>>> = Default::default();
    let seen = gone.clone();
    let pods = Api::<Pod>::namespaced(client.clone(), "demo");
    let watch = tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default())
            .touched_objects()
            .boxed();
        while let Some(Ok(pod)) = events.next().await {
            if pod.metadata.deletion_timestamp.is_some() {
                seen.lock()
                    .unwrap()
                    .entry(pod.metadata.name.clone().unwrap_or_default())
                    .or_insert_with(SystemTime::now);
            }
        }
    });

    let start = h.lab.emulator.writes().len();
    let out = ichor(
        &h,
        &[
            "upgrade",
            "talos",
            "--cluster",
            "lab",
            "--to",
            "v1.14.0",
            "--name",
            "up",
            "--wait",
        ],
    )
    .await;
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    watch.abort();

    let op = operation(&h, "up").await;
    let st = op.status.clone().unwrap();
    assert_eq!(st.phase, Some(OperationPhase::Succeeded), "{said}");
    // The plan: control planes one at a time, then workers, Ichor's node
    // last, the held worker skipped.
    let acting: Vec<_> = st
        .plan
        .iter()
        .filter(|e| e.action != PlannedAction::Skip)
        .collect();
    let order: Vec<String> = acting.iter().map(|e| e.machine.clone()).collect();
    assert_eq!(order.len(), 4, "{:?}", st.plan);
    assert_eq!(order.last(), Some(&ichors_node), "Ichor's node last");
    let roles: Vec<MachineRole> = acting.iter().map(|e| e.role).collect();
    let first_worker = roles
        .iter()
        .position(|r| *r == MachineRole::Worker)
        .unwrap_or(roles.len());
    assert!(
        roles[..first_worker]
            .iter()
            .all(|r| *r == MachineRole::Controlplane)
            && roles[first_worker..3]
                .iter()
                .all(|r| *r == MachineRole::Worker),
        "control planes first, then workers (Ichor's node last): {order:?}"
    );
    for pair in acting.windows(2) {
        assert!(
            pair[0].batch < pair[1].batch,
            "one at a time: {:?}",
            st.plan
        );
    }
    let skipped = st.plan.iter().find(|e| e.machine == held).unwrap();
    assert_eq!(skipped.action, PlannedAction::Skip);
    let c = conditions::find(&st.conditions, types::SKIPPED).expect("a Skipped condition");
    assert_eq!(c.reason, reasons::MACHINES_SKIPPED);
    assert!(
        c.message.contains(&format!("{held} skipped (held)")),
        "{c:?}"
    );

    // The write log: the installer pulled on every planned node first
    // (R15.4), then one node after another, nothing to the held worker.
    let mut want: Vec<String> = order.iter().map(|m| format!("{m}: pull")).collect();
    for m in &order {
        want.push(format!("{m}: upgrade"));
        if cps.contains(m) {
            want.push(format!("{m}: forfeit"));
        }
        want.push(format!("{m}: reboot"));
    }
    assert_eq!(node_writes(&h, start), want);
    assert!(!written_nodes(&h, start).contains(&held));
    assert_eq!(h.lab.emulator.talos_version(index(&h, &held)), "v1.13.9");
    // Drains: each pod evicted before its node's reboot, after the previous one's.
    let writes = h.lab.emulator.writes();
    let reboot_of = |node: &str| {
        writes[start..]
            .iter()
            .find(|w| w.node == node && matches!(w.action, WriteAction::Reboot { .. }))
            .map(|w| w.at)
            .expect("rebooted")
    };
    let gone = gone.lock().unwrap().clone();
    for (i, node) in order.iter().enumerate() {
        let pod = format!("app-{node}");
        let at = *gone
            .get(&pod)
            .unwrap_or_else(|| panic!("{pod} was not evicted: {gone:?}"));
        assert!(at < reboot_of(node), "{pod} evicted after {node} rebooted");
        if i > 0 {
            assert!(
                at > reboot_of(&order[i - 1]),
                "{pod} evicted before {} rebooted: one node at a time",
                order[i - 1]
            );
        }
    }
    assert!(!gone.contains_key(&format!("app-{held}")), "{gone:?}");
    // Boot ids and versions, before and after.
    for p in st.machines.iter().filter(|p| p.machine != held) {
        assert_eq!(p.step, MachineStep::Succeeded, "{p:?}");
        assert_eq!(p.version_before.as_deref(), Some("v1.13.9"), "{p:?}");
        assert_eq!(p.version_after.as_deref(), Some("v1.14.0"), "{p:?}");
        assert!(
            p.boot_id_before.is_some()
                && p.boot_id_after.is_some()
                && p.boot_id_before != p.boot_id_after,
            "{p:?}"
        );
    }
    let h_progress = st.machines.iter().find(|p| p.machine == held).unwrap();
    assert_eq!(h_progress.step, MachineStep::Skipped);
    assert!(h_progress.boot_id_after.is_none());

    // The fallback boot slot: the first control plane of the next plan (the
    // controller moved when its node was drained) comes back on v1.14.0.
    let ichors_node = controller_node(&h).await;
    let first = cps.iter().find(|c| **c != ichors_node).unwrap().clone();
    h.lab.emulator.set_upgrade_fallback(index(&h, &first), true);
    let start = h.lab.emulator.writes().len();
    let out = ichor(
        &h,
        &[
            "upgrade",
            "talos",
            "--cluster",
            "lab",
            "--to",
            "v1.14.1",
            "--name",
            "fallback",
            "--wait",
        ],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out));
    let op = finished(&h, "fallback").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::BOOTED_OLD_VERSION),
        "{message}"
    );
    assert!(
        message.contains(&format!("{first} came back on v1.14.0 instead of v1.14.1")),
        "{message}"
    );
    let p = &op.status.as_ref().unwrap().machines;
    let fp = p.iter().find(|p| p.machine == first).unwrap();
    assert_eq!(fp.step, MachineStep::Failed);
    assert_eq!(fp.version_after.as_deref(), Some("v1.14.0"));
    // Every planned machine pulled the installer before the first was
    // touched (R15.4); only the first was upgraded.
    let planned: Vec<String> = op
        .status
        .as_ref()
        .unwrap()
        .plan
        .iter()
        .filter(|e| e.action != PlannedAction::Skip)
        .map(|e| e.machine.clone())
        .collect();
    let mut once: Vec<String> = planned.iter().map(|m| format!("{m}: pull")).collect();
    once.extend([
        format!("{first}: upgrade"),
        format!("{first}: forfeit"),
        format!("{first}: reboot"),
    ]);
    assert_eq!(node_writes(&h, start), once);
    // Nudge the controller (a change to the object) and look again: the
    // upgrade is never re-issued, no other node is written.
    Api::<TalosOperation>::namespaced(client.clone(), NS)
        .patch(
            "fallback",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nudged": "yes"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(node_writes(&h, start), once);
    assert_eq!(
        written_nodes(&h, start),
        planned
            .iter()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    );
    h.lab
        .emulator
        .set_upgrade_fallback(index(&h, &first), false);

    // Cancel while the first machine is down: it finishes, the rest wait.
    let ichors_node = controller_node(&h).await;
    let three: Vec<String> = hosts
        .iter()
        .filter(|n| **n != ichors_node && **n != held)
        .take(3)
        .cloned()
        .collect();
    let reboot = |name: &'static str| {
        let mut args = vec!["reboot".to_string()];
        args.extend(three.iter().cloned());
        args.extend(["--cluster", "lab", "--name", name].map(String::from));
        args
    };
    let first = three[0].clone();
    let gate = h.lab.emulator.hold_reboots(index(&h, &first));
    let start = h.lab.emulator.writes().len();
    let args = reboot("stop");
    let out = ichor(&h, &args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", text(&out));
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .unwrap_or_else(|_| panic!("{first} was not rebooted\n{}", h.logs()));
    let out = ichor(&h, &["operation", "cancel", "stop"]).await;
    assert!(out.status.success(), "{}", text(&out));
    gate.open();
    let op = finished(&h, "stop").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::CANCELLED),
        "{message}"
    );
    let st = op.status.unwrap();
    let step_of = |m: &str| st.machines.iter().find(|p| p.machine == m).unwrap().step;
    assert_eq!(step_of(&first), MachineStep::Succeeded, "{:?}", st.machines);
    for m in &three[1..] {
        assert_eq!(step_of(m), MachineStep::Pending, "{:?}", st.machines);
    }
    let mut want = vec![];
    if cps.contains(&first) {
        want.push(format!("{first}: forfeit"));
    }
    want.push(format!("{first}: reboot"));
    assert_eq!(node_writes(&h, start), want);

    // SIGKILL the controller while the second machine is down; the lab's
    // kubelet restarts it and it resumes from status.
    let second = three[1].clone();
    let gate = h.lab.emulator.hold_reboots(index(&h, &second));
    let start = h.lab.emulator.writes().len();
    let args = reboot("resume");
    let out = ichor(&h, &args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", text(&out));
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .unwrap_or_else(|_| panic!("{second} was not rebooted\n{}", h.logs()));
    // Status says so too: the first done, the second waiting for its return.
    let ops = Api::<TalosOperation>::namespaced(client.clone(), NS);
    wait_for(&h, "the second machine waiting in status", || async {
        ops.get("resume").await.is_ok_and(|op| {
            op.status.is_some_and(|st| {
                let step_of = |m: &str| st.machines.iter().find(|p| p.machine == m).map(|p| p.step);
                step_of(&three[0]) == Some(MachineStep::Succeeded)
                    && step_of(&second) == Some(MachineStep::WaitingForReturn)
            })
        })
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
    let op = finished(&h, "resume").await;
    assert_eq!(
        op.status.as_ref().unwrap().phase,
        Some(OperationPhase::Succeeded),
        "{:?}\n{}",
        complete(&op),
        h.logs()
    );
    // A new process did it (the kubelet's restart), and no machine twice.
    let now = controller_pid(&h).expect("the controller runs again");
    assert_ne!(now, pid);
    let mut want = vec![];
    for m in &three {
        if cps.contains(m) {
            want.push(format!("{m}: forfeit"));
        }
        want.push(format!("{m}: reboot"));
    }
    assert_eq!(node_writes(&h, start), want);
}

/// The image of `component` node `i`'s Talos API reports.
async fn image_on(h: &LabHarness, i: usize, component: Wire) -> Option<String> {
    h.lab
        .emulator
        .admin_client(i)
        .unwrap()
        .component_image("", component)
        .await
        .unwrap()
}

/// The nodes of the kubernetes-upgrade test: Talos v1.14 runs Kubernetes
/// 1.32–1.37, so from 1.36 the next minor is one every node supports (the
/// plan refuses a target a node's Talos does not run).
const TALOS_FOR_UPGRADE: &str = "v1.14.0";
const KUBERNETES_BEFORE_UPGRADE: &str = "v1.36.4";

/// The next minor of a Kubernetes version, `.0` (v1.36.4 → 1.37.0).
fn next_minor(version: &str) -> String {
    let mut parts = version.trim_start_matches('v').split('.');
    let major: u64 = parts.next().unwrap().parse().unwrap();
    let minor: u64 = parts.next().unwrap().parse().unwrap();
    format!("{major}.{}.0", minor + 1)
}

/// On 3 control planes + 2 workers (the lab playing each control plane's
/// mirror pods and each kubelet's version from its node's Talos API), with
/// the controller's etcd and drain bounds short (`--etcd-timeout 5s
/// --drain-timeout 5s` added to the installed Deployment):
///
/// - a held control plane: `ichor upgrade kubernetes` is refused at plan
///   time (`ControlPlaneHeld`, naming it), nothing written;
/// - one control plane's etcd member not started (emulator fault): a reboot
///   of another control plane waits (the Waiting condition names the
///   member), then fails `EtcdUnhealthy` naming it; nothing written, the
///   node not cordoned;
/// - a budget of `minAvailable: 1` over a worker's one pod: `ichor reboot`
///   of that worker fails `DrainTimeout` naming the budget; the pod stays,
///   nothing written, the node uncordoned;
/// - `ichor upgrade kubernetes --dry-run`: the plan's steps printed and in
///   status, nothing written;
/// - `ichor upgrade kubernetes --to` the next minor `--wait`: every
///   component step Succeeded, each a no-reboot apply, control planes one at
///   a time; then every node's Talos API reports each component's new image
///   (apiserver, controller-manager, scheduler, kube-proxy on control
///   planes; kubelet everywhere), and Kubernetes shows it (mirror pods,
///   Nodes' kubelet versions).
///
/// Versions: the nodes run Talos v1.14.0 and Kubernetes v1.36.4 (their
/// configs, mirror pods and kubelets); the target is the next minor's `.0`,
/// 1.37.0 (the version path allows +1, and Talos v1.14 runs it). The lab's
/// own kube-apiserver stays at its version (v1.37.2): it stands in for the
/// control planes and is not restarted.
///
/// Covers: R11.2, R11.3, R11.5 and kubernetes-upgrade, ADR 0014, on 3 control planes + 2 workers (Kubernetes upgrade end to end with every component's image changed per node, and a dry-run plan; etcd unhealthy waits then fails bounded; PDB blocks a drain; held control plane refuses kubernetes-upgrade)
#[tokio::test(flavor = "multi_thread")]
async fn kubernetes_upgrade_and_refusals_on_three_control_planes() {
    let h = adopted_lab(true, Some((TALOS_FOR_UPGRADE, KUBERNETES_BEFORE_UPGRADE))).await;
    let client = h.client().await;
    let hosts = h.lab.hostnames.clone();
    let cps: Vec<String> = hosts[..3].to_vec();
    let from = h.lab.options.kubernetes_version.clone();
    let to = next_minor(&from);

    // The controller's etcd bound, short, in the installed Deployment.
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), NS);
    let mut d = deployments.get("ichor-controller").await.unwrap();
    d.spec.template.spec.as_mut().unwrap().containers[0]
        .args
        .get_or_insert_with(Vec::new)
        .extend(["--etcd-timeout", "5s", "--drain-timeout", "5s"].map(String::from));
    deployments
        .replace("ichor-controller", &PostParams::default(), &d)
        .await
        .unwrap();
    wait_for(
        &h,
        "the controller rolled out with its short bounds",
        || async {
            let d = deployments.get("ichor-controller").await.unwrap();
            let s = d.status.unwrap_or_default();
            s.observed_generation == d.metadata.generation
                && s.ready_replicas == Some(1)
                && s.updated_replicas == Some(1)
                && s.replicas == Some(1)
        },
    )
    .await;
    // The lab's mirror pods show the images the nodes run.
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system");
    wait_for(&h, "the control planes' mirror pods", || async {
        pods.list(&ListParams::default().labels("tier=control-plane"))
            .await
            .is_ok_and(|l| l.items.len() == 9)
    })
    .await;

    // A held control plane refuses a kubernetes-upgrade at plan time.
    let start = h.lab.emulator.writes().len();
    hold(&h, &cps[1], true).await;
    let out = ichor(
        &h,
        &[
            "upgrade",
            "kubernetes",
            "--cluster",
            "lab",
            "--to",
            &to,
            "--name",
            "held",
            "--wait",
        ],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out));
    let op = finished(&h, "held").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::CONTROL_PLANE_HELD),
        "{message}"
    );
    assert!(
        message.contains(&format!("control plane {} is held", cps[1])),
        "{message}"
    );
    assert!(op.status.unwrap().plan.is_empty());
    assert!(written_nodes(&h, start).is_empty());
    hold(&h, &cps[1], false).await;

    // etcd: the third control plane's member has not started.
    let sick_node = index(&h, &cps[2]);
    h.lab.emulator.set_etcd_unhealthy(sick_node, true);
    let sick = h
        .lab
        .emulator
        .admin_client(0)
        .unwrap()
        .etcd_members("")
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.name.is_empty())
        .expect("a member not started")
        .id;
    let named = format!("etcd member {sick:x} has not started");
    let out = ichor(
        &h,
        &["reboot", &cps[0], "--cluster", "lab", "--name", "etcd"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let ops = Api::<TalosOperation>::namespaced(client.clone(), NS);
    wait_for(&h, "the Waiting condition naming the member", || async {
        ops.get("etcd").await.is_ok_and(|op| {
            op.status.as_ref().is_some_and(|st| {
                conditions::find(&st.conditions, types::WAITING).is_some_and(|c| {
                    c.reason == reasons::WAITING_FOR_ETCD && c.message.contains(&named)
                }) || st.phase == Some(OperationPhase::Failed)
            })
        })
    })
    .await;
    let op = finished(&h, "etcd").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::ETCD_UNHEALTHY),
        "{message}"
    );
    assert!(message.contains(&named), "{message}");
    assert!(
        written_nodes(&h, start).is_empty(),
        "{:?}",
        node_writes(&h, start)
    );
    let node = Api::<Node>::all(client.clone()).get(&cps[0]).await.unwrap();
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
    h.lab.emulator.set_etcd_unhealthy(sick_node, false);

    // A budget that allows no disruption blocks a worker's drain: the step
    // fails at the bound naming the budget; the pod stays, nothing written.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap(),
        )
        .await
        .unwrap();
    let worker = hosts[3].clone();
    crate::common::ready_pod(&client, "demo", "db-1", "db", &worker).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "demo"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let out = ichor(
        &h,
        &[
            "reboot",
            &worker,
            "--cluster",
            "lab",
            "--name",
            "blocked",
            "--wait",
        ],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out));
    let op = finished(&h, "blocked").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::DRAIN_TIMEOUT),
        "{message}"
    );
    assert!(
        message.contains("PodDisruptionBudget demo/db does not allow evicting pod demo/db-1"),
        "{message}"
    );
    assert!(
        written_nodes(&h, start).is_empty(),
        "{:?}",
        node_writes(&h, start)
    );
    let node = Api::<Node>::all(client.clone()).get(&worker).await.unwrap();
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
    let db = Api::<Pod>::namespaced(client.clone(), "demo")
        .get("db-1")
        .await
        .unwrap();
    assert!(
        db.metadata.deletion_timestamp.is_none(),
        "the budget's pod was evicted"
    );

    // The dry run: the plan, nothing touched.
    let out = ichor(
        &h,
        &[
            "upgrade",
            "kubernetes",
            "--cluster",
            "lab",
            "--to",
            &to,
            "--name",
            "plan",
            "--dry-run",
        ],
    )
    .await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let op = finished(&h, "plan").await;
    let (_, reason, _) = complete(&op);
    assert_eq!(reason, reasons::DRY_RUN);
    let st = op.status.unwrap();
    assert_eq!(st.plan.len(), 5, "{:?}", st.plan);
    for cp in &cps {
        assert!(said.contains(cp.as_str()), "the plan names {cp}: {said}");
    }
    assert!(written_nodes(&h, start).is_empty());

    // The upgrade, end to end.
    let images_before: Vec<Vec<Option<String>>> = {
        let mut all = Vec::new();
        for i in 0..hosts.len() {
            let mut per = Vec::new();
            for c in COMPONENTS {
                per.push(image_on(&h, i, c).await);
            }
            all.push(per);
        }
        all
    };
    let out = ichor(
        &h,
        &[
            "upgrade",
            "kubernetes",
            "--cluster",
            "lab",
            "--to",
            &to,
            "--name",
            "k8s",
            "--wait",
        ],
    )
    .await;
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    let op = operation(&h, "k8s").await;
    let st = op.status.unwrap();
    assert_eq!(st.phase, Some(OperationPhase::Succeeded), "{said}");
    assert!(!st.components.is_empty());
    for c in &st.components {
        assert_eq!(c.phase, ichor_api::ComponentPhase::Succeeded, "{c:?}");
    }
    // Every write a no-reboot apply; no reboot, no upgrade.
    let writes = h.lab.emulator.writes();
    let applies: Vec<&ichor_talemu::WriteRecord> = writes[start..]
        .iter()
        .filter(|w| matches!(w.action, WriteAction::ApplyConfiguration { .. }))
        .collect();
    assert!(
        node_writes(&h, start).is_empty(),
        "{:?}",
        node_writes(&h, start)
    );
    for w in &applies {
        let WriteAction::ApplyConfiguration { mode, .. } = &w.action else {
            unreachable!()
        };
        assert_eq!(mode, "no_reboot", "{}", w.node);
    }
    // One write per component step, in the steps' order (machines are
    // named after their nodes); the last step, the bootstrap-manifests
    // sync, writes to Kubernetes, not to a node.
    use ichor_api::KubernetesComponent;
    assert_eq!(
        st.components.last().map(|c| c.component),
        Some(KubernetesComponent::BootstrapManifests)
    );
    assert_eq!(
        applies.iter().map(|w| w.node.as_str()).collect::<Vec<_>>(),
        st.components
            .iter()
            .filter(|c| c.component != KubernetesComponent::BootstrapManifests)
            .map(|c| c.machine.as_str())
            .collect::<Vec<_>>()
    );
    // The sync brought kube-proxy's DaemonSet (Talos's bootstrap manifest,
    // created with the lab) to the target's image.
    let proxy =
        Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), "kube-system")
            .get("kube-proxy")
            .await
            .unwrap();
    let proxy_image = proxy.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert!(proxy_image.ends_with(&format!(":v{to}")), "{proxy_image}");
    // One step at a time: each component on each control plane (three
    // kube-apiserver steps), each finished before the next started.
    let api_steps = st
        .components
        .iter()
        .filter(|c| c.component == ichor_api::KubernetesComponent::ApiServer)
        .count();
    assert_eq!(api_steps, 3);
    for pair in st.components.windows(2) {
        assert!(
            pair[0].completion_time.as_ref().unwrap().0 <= pair[1].start_time.as_ref().unwrap().0,
            "{pair:?}"
        );
    }
    // Each node's Talos API reports the new image of every component it runs.
    let tag = format!(":v{to}");
    for (i, host) in hosts.iter().enumerate() {
        for (k, c) in COMPONENTS.into_iter().enumerate() {
            let now = image_on(&h, i, c).await;
            match (&images_before[i][k], &now) {
                (Some(before), Some(now)) => {
                    assert!(
                        before.ends_with(&format!(":{from}")),
                        "{host} {c:?}: {before}"
                    );
                    assert!(now.ends_with(&tag), "{host} {c:?}: {now}");
                    assert_eq!(
                        before.rsplit_once(':').unwrap().0,
                        now.rsplit_once(':').unwrap().0,
                        "{host} {c:?}: the same repository"
                    );
                }
                // A worker runs only the kubelet; kube-proxy's image lives
                // in a control plane's bootstrap manifests.
                (None, None) => assert!(
                    c == Wire::KubeProxy || (!cps.contains(host) && c != Wire::Kubelet),
                    "{host} runs no {c:?}"
                ),
                other => panic!("{host} {c:?}: {other:?}"),
            }
        }
    }
    // Kubernetes shows it: mirror pods on the new images, kubelets on `to`.
    for p in pods
        .list(&ListParams::default().labels("tier=control-plane"))
        .await
        .unwrap()
        .items
    {
        let image = p.spec.unwrap().containers[0].image.clone().unwrap();
        assert!(image.ends_with(&tag), "{image}");
    }
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let v = n.status.unwrap().node_info.unwrap().kubelet_version;
        assert_eq!(v, format!("v{to}"));
    }
}

const COMPONENTS: [Wire; 5] = [
    Wire::ApiServer,
    Wire::ControllerManager,
    Wire::Scheduler,
    Wire::KubeProxy,
    Wire::Kubelet,
];
