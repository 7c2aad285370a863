//! The TalosOperation controller end to end: a real kube-apiserver + etcd
//! with Ichor's CRDs, `ichor-talemu` nodes that learned upgrades (pull,
//! LifecycleService upgrade, reboot into the written slot, faults), and the
//! controller started in process. The test plays the kubelets: it registers
//! the Nodes Ready and places pods on them (grace period 0, so an accepted
//! eviction removes the pod at once, as a kubelet would after its grace).
//! Order is read from the emulator's write log.

use std::time::Duration;

use crate::common::*;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::operation::{ComponentPhase, MachineStep, OperationPhase, TalosOperation};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_controller::operation::manifests;
use ichor_controller::operation::{CANCEL_ANNOTATION, OperationBounds};
use ichor_talemu::{Emulator, NodeSpec, WriteAction};
use ichor_talos::bootstrap_inventory::{INVENTORY_NAME, OWNING_INVENTORY_ANNOTATION};
use ichor_talos_client::resources::KubernetesComponent;
use ichor_testenv::wait::{self, Seen};
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

const TARGET: &str = "v1.14.0";
const INSTALLER: &str = "ghcr.io/siderolabs/installer:v1.14.0";

pub(crate) fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.13.0", "kubernetesVersion": "v1.36.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

/// One emulated machine of a test: its TalosMachine name, role and node hostname.
pub(crate) struct Lab {
    pub(crate) emu: Emulator,
    /// (machine name, role, hostname = Node name)
    pub(crate) machines: Vec<(String, &'static str, String)>,
}

impl Lab {
    pub(crate) fn index(&self, machine: &str) -> usize {
        self.machines
            .iter()
            .position(|(m, _, _)| m == machine)
            .expect("machine of the lab")
    }

    pub(crate) fn host(&self, machine: &str) -> String {
        self.machines[self.index(machine)].2.clone()
    }

    /// The upgrade writes (pull, upgrade, forfeit, reboot) as `machine: action`, in order.
    pub(crate) fn upgrade_writes(&self) -> Vec<String> {
        self.emu
            .writes()
            .iter()
            .filter_map(|w| {
                let machine = self
                    .machines
                    .iter()
                    .find(|(_, _, h)| *h == w.node)
                    .map(|(m, _, _)| m.clone())?;
                let action = match &w.action {
                    WriteAction::ImagePull { .. } => "pull",
                    WriteAction::Upgrade { legacy: false, .. } => "upgrade",
                    WriteAction::Upgrade { legacy: true, .. } => "legacy-upgrade",
                    WriteAction::EtcdForfeitLeadership => "forfeit",
                    WriteAction::Reboot { .. } => "reboot",
                    _ => return None,
                };
                Some(format!("{machine}: {action}"))
            })
            .collect()
    }
}

/// Starts emulated nodes for `machines` (name, role), registers each as a
/// Ready Node named after its hostname (unique per test: the namespace's
/// suffix), and creates the TalosMachines (released unless listed in `held`).
async fn lab(
    client: &kube::Client,
    ns: &str,
    machines: &[(&str, &'static str)],
    held: &[&str],
) -> Lab {
    lab_with(client, ns, machines, held, |c| c).await
}

/// [`lab`], each node's config passed through `edit` first.
async fn lab_with(
    client: &kube::Client,
    ns: &str,
    machines: &[(&str, &'static str)],
    held: &[&str],
    edit: fn(String) -> String,
) -> Lab {
    lab_talos(client, ns, machines, held, edit, |_| "v1.13.9").await
}

/// [`lab_with`], each machine's node on the Talos version `talos` names.
pub(crate) async fn lab_talos(
    client: &kube::Client,
    ns: &str,
    machines: &[(&str, &'static str)],
    held: &[&str],
    edit: fn(String) -> String,
    talos: fn(&str) -> &'static str,
) -> Lab {
    let suffix = ns.rsplit('-').next().unwrap_or(ns).to_string();
    let cp = edit(ichor_testenv::fixtures::cni_none(
        "v1.12-cni-none-controlplane.yaml",
    ));
    let worker = edit(ichor_testenv::fixtures::cni_none(
        "v1.12-cni-none-worker.yaml",
    ));
    let mut specs = Vec::new();
    let mut named = Vec::new();
    for (i, (name, role)) in machines.iter().enumerate() {
        let host = format!("{name}-{suffix}");
        let config = if *role == "controlplane" {
            &cp
        } else {
            &worker
        };
        specs.push(
            NodeSpec::new(host.clone(), config.clone())
                .with_version(talos(name))
                .with_address(std::net::IpAddr::from([127, 0, 1, i as u8 + 1])),
        );
        named.push((name.to_string(), *role, host));
    }
    let emu = emulator(specs).await;
    let nodes = Api::<Node>::all(client.clone());
    let api = Api::<TalosMachine>::namespaced(client.clone(), ns);
    for (i, (name, role, host)) in named.iter().enumerate() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": host}
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        nodes
            .patch_status(
                host,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "played by the test",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
            )
            .await
            .unwrap();
        let m: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterRef": {"name": "base"}, "role": role, "address": emu.endpoint(i),
                "hold": held.contains(&name.as_str())}
        }))
        .unwrap();
        api.create(&PostParams::default(), &m).await.unwrap();
    }
    Lab {
        emu,
        machines: named,
    }
}

/// A pod on `node` (grace 0), optionally labelled.
async fn pod_on(client: &kube::Client, ns: &str, name: &str, node: &str, app: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

pub(crate) fn operation(ns: &str, name: &str, kind: &str, machines: &[&str]) -> TalosOperation {
    let mut spec =
        json!({"kind": kind, "target": {"clusterRef": {"name": "base"}, "machines": machines}});
    if kind == "talos-upgrade" {
        spec["version"] = json!(TARGET);
        spec["installerImage"] = json!(INSTALLER);
    }
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec
    }))
    .unwrap()
}

pub(crate) async fn finished(api: &Api<TalosOperation>, name: &str) -> TalosOperation {
    wait_for(&format!("TalosOperation {name} to finish"), || async {
        api.get(name).await.unwrap().status.is_some_and(|s| {
            matches!(
                s.phase,
                Some(OperationPhase::Succeeded | OperationPhase::Failed)
            )
        })
    })
    .await;
    api.get(name).await.unwrap()
}

pub(crate) fn complete(op: &TalosOperation) -> (String, String, String) {
    let c = conditions::find(&op.status.as_ref().unwrap().conditions, types::COMPLETE)
        .expect("Complete condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

pub(crate) struct Setup {
    pub(crate) client: kube::Client,
    pub(crate) ns: String,
    pub(crate) running: Running,
    pub(crate) lab: Lab,
    pub(crate) ops: Api<TalosOperation>,
}

async fn setup(
    prefix: &str,
    machines: &[(&str, &'static str)],
    held: &[&str],
    controller_on: Option<&str>,
    bounds: OperationBounds,
) -> Setup {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(prefix).await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let lab = lab(&client, &ns, machines, held).await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = bounds;
    config.node_name = controller_on.map(|m| lab.host(m));
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    Setup {
        client,
        ns,
        running,
        lab,
        ops,
    }
}

pub(crate) fn quick() -> OperationBounds {
    OperationBounds {
        etcd: Duration::from_secs(60),
        drain: Duration::from_secs(60),
        node_return: Duration::from_secs(60),
        poll: Duration::from_millis(100),
        component: Duration::from_secs(60),
        image: Duration::from_secs(60),
    }
}

pub(crate) const LAB: &[(&str, &str)] = &[
    ("cp-1", "controlplane"),
    ("cp-2", "controlplane"),
    ("cp-3", "controlplane"),
    ("w-1", "worker"),
    ("w-2", "worker"),
];

/// A Talos upgrade of 3 control planes + 2 workers, one worker held and the
/// controller on the other: the plan is in status; the write log shows the
/// control planes one at a time (pull, upgrade, forfeit etcd leadership,
/// reboot), then the worker that runs Ichor last, and nothing written to the
/// held one; boot ids and versions before/after are recorded; the pod on a
/// control plane was evicted; the operation Succeeded with the skipped
/// machine named.
/// Covers: R11.1, R11.2, R11.4, R11.5 (order, Ichor's node last, holds, boot ids and versions)
#[tokio::test]
async fn talos_upgrade_in_order_skipping_the_held_worker() {
    let s = setup("op-order", LAB, &["w-2"], Some("w-1"), quick()).await;
    pod_on(&s.client, &s.ns, "web", &s.lab.host("cp-2"), "web").await;
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "up", "talos-upgrade", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "up").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::SUCCEEDED),
        "{message}"
    );
    let st = op.status.as_ref().unwrap();
    let plan: Vec<(String, u32, String)> = st
        .plan
        .iter()
        .map(|e| {
            (
                e.machine.clone(),
                e.batch,
                format!("{:?} {}", e.action, e.reason.clone().unwrap_or_default()),
            )
        })
        .collect();
    assert_eq!(
        plan,
        vec![
            ("cp-1".into(), 0, "Upgrade ".into()),
            ("cp-2".into(), 1, "Upgrade ".into()),
            ("cp-3".into(), 2, "Upgrade ".into()),
            ("w-2".into(), 2, "Skip held".into()),
            ("w-1".into(), 3, "Upgrade runs Ichor's controller".into()),
        ]
    );
    // The installer is pulled on every planned machine before the first
    // is touched (R15.4), then one machine after the other.
    let mut expected: Vec<String> = ["cp-1", "cp-2", "cp-3", "w-1"]
        .iter()
        .map(|m| format!("{m}: pull"))
        .collect();
    for cp in ["cp-1", "cp-2", "cp-3"] {
        for a in ["upgrade", "forfeit", "reboot"] {
            expected.push(format!("{cp}: {a}"));
        }
    }
    for a in ["upgrade", "reboot"] {
        expected.push(format!("w-1: {a}"));
    }
    assert_eq!(s.lab.upgrade_writes(), expected);
    let w2 = s.lab.host("w-2");
    assert!(
        s.lab.emu.writes().iter().all(|w| w.node != w2),
        "the held worker was written: {:?}",
        s.lab.emu.writes()
    );
    for p in &st.machines {
        if p.machine == "w-2" {
            assert_eq!(p.step, MachineStep::Skipped);
            assert_eq!(p.message.as_deref(), Some("skipped (held)"));
            continue;
        }
        assert_eq!(p.step, MachineStep::Succeeded, "{p:?}");
        assert_eq!(p.version_before.as_deref(), Some("v1.13.9"));
        assert_eq!(p.version_after.as_deref(), Some(TARGET));
        assert!(p.boot_id_before.is_some() && p.boot_id_after.is_some());
        assert_ne!(p.boot_id_before, p.boot_id_after);
        assert_eq!(p.image.as_deref(), Some(INSTALLER));
        assert_eq!(s.lab.emu.talos_version(s.lab.index(&p.machine)), TARGET);
    }
    let skipped = conditions::find(&st.conditions, types::SKIPPED).unwrap();
    assert_eq!(skipped.reason, reasons::MACHINES_SKIPPED);
    assert_eq!(skipped.message, "w-2 skipped (held)");
    // The pod on cp-2 was evicted, and every Node is schedulable again.
    assert!(
        Api::<Pod>::namespaced(s.client.clone(), &s.ns)
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
    );
    let nodes = Api::<Node>::all(s.client.clone());
    for (_, _, host) in &s.lab.machines {
        let n = nodes.get(host).await.unwrap();
        assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true), "{host}");
    }
    // The finalizer is gone once the operation is done (it is removed
    // right after the last status write).
    wait_for("the operation's finalizer to go", || async {
        s.ops
            .get("up")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    s.running.stop().await.unwrap();
}

/// A node that comes back from its upgrade on its old version (the
/// fallback boot slot) stops the operation as Failed with that reason; the
/// upgrade is written to it once and never again, and the next machine is
/// not touched.
/// Covers: R11.4 (fallback boot slot, never re-issued)
#[tokio::test]
async fn a_node_back_on_its_old_version_fails_the_operation() {
    let machines = &[("w-1", "worker"), ("w-2", "worker")];
    let s = setup("op-fallback", machines, &[], None, quick()).await;
    s.lab.emu.set_upgrade_fallback(0, true);
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "up", "talos-upgrade", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "up").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::BOOTED_OLD_VERSION)
    );
    assert!(
        message.contains("w-1 came back on v1.13.9 instead of v1.14.0"),
        "{message}"
    );
    let w1 = &op.status.as_ref().unwrap().machines[0];
    assert_eq!(w1.step, MachineStep::Failed);
    assert_eq!(w1.version_after.as_deref(), Some("v1.13.9"));
    // Stop the controller, then look: one upgrade, one reboot, nothing on
    // w-2 but the pull ahead of the first machine (R15.4).
    s.running.stop().await.unwrap();
    assert_eq!(
        s.lab.upgrade_writes(),
        vec!["w-1: pull", "w-2: pull", "w-1: upgrade", "w-1: reboot"]
    );
    assert_eq!(op.status.unwrap().machines[1].step, MachineStep::Pending);
}

/// An etcd member that has not started: the control plane waits (the
/// Waiting condition names the member), then fails at its bound, naming the
/// member, and nothing is written to it.
/// Covers: R11.2 (etcd healthy through the Talos API, bounded wait)
#[tokio::test]
async fn unhealthy_etcd_fails_bounded_naming_the_member() {
    let machines = &[
        ("cp-1", "controlplane"),
        ("cp-2", "controlplane"),
        ("cp-3", "controlplane"),
    ];
    let bounds = OperationBounds {
        etcd: Duration::from_secs(2),
        ..quick()
    };
    let s = setup("op-etcd", machines, &[], None, bounds).await;
    s.lab.emu.set_etcd_unhealthy(2, true);
    let members = s
        .lab
        .emu
        .admin_client(0)
        .unwrap()
        .etcd_members("")
        .await
        .unwrap();
    let sick = members.iter().find(|m| m.name.is_empty()).unwrap().id;
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &["cp-1"]),
        )
        .await
        .unwrap();
    wait_for("the Waiting condition naming the member", || async {
        s.ops.get("rb").await.is_ok_and(|op| {
            op.status.as_ref().is_some_and(|st| {
                conditions::find(&st.conditions, types::WAITING).is_some_and(|c| {
                    c.reason == reasons::WAITING_FOR_ETCD
                        && c.message
                            .contains(&format!("etcd member {sick:x} has not started"))
                })
            })
        })
    })
    .await;
    let op = finished(&s.ops, "rb").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::ETCD_UNHEALTHY)
    );
    assert!(
        message.contains(&format!("etcd member {sick:x} has not started")),
        "{message}"
    );
    s.running.stop().await.unwrap();
    assert!(
        s.lab.upgrade_writes().is_empty(),
        "{:?}",
        s.lab.upgrade_writes()
    );
}

/// A PodDisruptionBudget that allows no eviction blocks the drain: the step
/// fails at its bound naming the PDB, the pod is still there (no forced
/// deletion), the node was not rebooted and is schedulable again.
/// Covers: R11.3 (drain through the Eviction API, bounded, PDB named)
#[tokio::test]
async fn a_pdb_blocks_the_drain_until_the_bound() {
    let machines = &[("w-1", "worker")];
    let bounds = OperationBounds {
        drain: Duration::from_secs(2),
        ..quick()
    };
    let s = setup("op-pdb", machines, &[], None, bounds).await;
    pod_on(&s.client, &s.ns, "db-0", &s.lab.host("w-1"), "db").await;
    // Playing the kubelet: the pod runs and is Ready (a Pending pod may be
    // evicted whatever its budget says).
    Api::<Pod>::namespaced(s.client.clone(), &s.ns)
        .patch_status(
            "db-0",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": s.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(s.client.clone(), &s.ns)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "rb").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::DRAIN_TIMEOUT)
    );
    assert!(
        message.contains(&format!("PodDisruptionBudget {}/db", s.ns)),
        "{message}"
    );
    s.running.stop().await.unwrap();
    assert!(
        s.lab.upgrade_writes().is_empty(),
        "{:?}",
        s.lab.upgrade_writes()
    );
    assert!(
        Api::<Pod>::namespaced(s.client.clone(), &s.ns)
            .get_opt("db-0")
            .await
            .unwrap()
            .is_some()
    );
    let node = Api::<Node>::all(s.client.clone())
        .get(&s.lab.host("w-1"))
        .await
        .unwrap();
    assert_ne!(node.spec.and_then(|s| s.unschedulable), Some(true));
}

/// The cancel annotation while the first worker is rebooting: that worker
/// finishes coming back (and is uncordoned), the operation stops as
/// Cancelled, and the second worker is never written.
/// Covers: R11.6 (cancel that stops)
#[tokio::test]
async fn cancel_stops_before_the_next_machine() {
    let machines = &[("w-1", "worker"), ("w-2", "worker")];
    let s = setup("op-cancel", machines, &[], None, quick()).await;
    let gate = s.lab.emu.hold_reboots(0);
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("w-1 reboots");
    s.ops
        .patch(
            "rb",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "yes"}}})),
        )
        .await
        .unwrap();
    gate.open();
    let op = finished(&s.ops, "rb").await;
    let (status, reason, _) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::CANCELLED)
    );
    let st = op.status.unwrap();
    assert_eq!(st.machines[0].step, MachineStep::Succeeded);
    assert_eq!(st.machines[1].step, MachineStep::Pending);
    s.running.stop().await.unwrap();
    assert_eq!(s.lab.upgrade_writes(), vec!["w-1: reboot"]);
}

/// A controller stopped while the second worker is rebooting, and a new one
/// started: it resumes from the status, waits for that worker's return, and
/// never repeats the first worker (one reboot each in the write log).
/// Covers: R11.6 (resume after a restart without repeating a finished machine)
#[tokio::test]
async fn a_restarted_controller_resumes_without_repeating() {
    let machines = &[("w-1", "worker"), ("w-2", "worker")];
    let s = setup("op-resume", machines, &[], None, quick()).await;
    let gate = s.lab.emu.hold_reboots(1);
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("w-2 reboots");
    wait_for("w-2 waiting for its return in status", || async {
        s.ops.get("rb").await.is_ok_and(|op| {
            op.status.is_some_and(|st| {
                st.machines[0].step == MachineStep::Succeeded
                    && st.machines[1].step == MachineStep::WaitingForReturn
            })
        })
    })
    .await;
    s.running.stop().await.unwrap();
    gate.open();
    let mut config = config(&s.ns, &s.ns);
    config.operation_bounds = quick();
    let again = start(s.client.clone(), config);
    let op = finished(&s.ops, "rb").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::SUCCEEDED),
        "{message}"
    );
    again.stop().await.unwrap();
    assert_eq!(s.lab.upgrade_writes(), vec!["w-1: reboot", "w-2: reboot"]);
}

/// A node that does not answer when its reboot is due is waited for, not
/// taken for rebooted: the lab makes the worker go silent while its drain
/// is blocked, then lets the drain finish (playing the kubelet: the pod is
/// gone). Ichor's reboot step waits, saying the node does not answer; once
/// the node answers again with the same boot id, Ichor reboots it and the
/// operation succeeds — before, the step counted the silence as a reboot,
/// and the node stayed drained and cordoned, never rebooted.
/// Covers: R11.4
#[tokio::test]
async fn a_silent_node_at_the_reboot_step_is_waited_for_not_taken_as_rebooted() {
    let machines = &[("w-1", "worker")];
    let s = setup("op-silent", machines, &[], None, quick()).await;
    pod_on(&s.client, &s.ns, "db-0", &s.lab.host("w-1"), "db").await;
    let pods = Api::<Pod>::namespaced(s.client.clone(), &s.ns);
    pods.patch_status(
        "db-0",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
    )
    .await
    .unwrap();
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": s.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(s.client.clone(), &s.ns)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    let step_is = |step: MachineStep, says: &'static str| {
        let ops = s.ops.clone();
        async move {
            ops.get("rb").await.is_ok_and(|op| {
                op.status.is_some_and(|st| {
                    st.machines.first().is_some_and(|m| {
                        m.step == step && m.message.as_deref().unwrap_or_default().contains(says)
                    })
                })
            })
        }
    };
    wait_for("w-1 to be draining", || step_is(MachineStep::Draining, "")).await;
    s.lab.emu.set_fault(0, ichor_talemu::Fault::Down);
    pods.delete(
        "db-0",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    wait_for("the reboot step to wait for the silent node", || {
        step_is(MachineStep::Rebooting, "does not answer")
    })
    .await;
    assert!(s.lab.upgrade_writes().is_empty());
    s.lab.emu.set_fault(0, ichor_talemu::Fault::None);
    let op = finished(&s.ops, "rb").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::SUCCEEDED),
        "{message}"
    );
    s.running.stop().await.unwrap();
    assert_eq!(s.lab.upgrade_writes(), vec!["w-1: reboot"]);
}

/// A talos-upgrade whose `spec.installerImage` is not from Sidero Labs'
/// registries is refused before any machine is touched, unless an admin
/// opted it in (the annotation; its admission policy is tested in
/// webhook.rs).
/// Covers: R18.2
#[tokio::test]
async fn an_installer_image_from_elsewhere_is_refused_without_the_opt_in() {
    let machines = &[("w-1", "worker")];
    let s = setup("op-installer", machines, &[], None, quick()).await;
    let mut op = operation(&s.ns, "elsewhere", "talos-upgrade", &[]);
    op.spec.installer_image = Some("registry.example/installer:v1.14.0".into());
    s.ops.create(&PostParams::default(), &op).await.unwrap();
    let op = finished(&s.ops, "elsewhere").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::REFUSED)
    );
    assert!(
        message.contains(ichor_api::ANY_INSTALLER_IMAGE_ANNOTATION),
        "{message}"
    );
    assert!(op.status.unwrap().plan.is_empty());
    s.running.stop().await.unwrap();
    assert!(s.lab.upgrade_writes().is_empty());
}

/// Deleting a running operation cancels it (the finalizer keeps it until
/// the controller has stopped it), and it is then gone.
/// Covers: R11.6 (cancel by deletion)
#[tokio::test]
async fn deleting_a_running_operation_stops_it() {
    let machines = &[("w-1", "worker"), ("w-2", "worker")];
    let s = setup("op-delete", machines, &[], None, quick()).await;
    let gate = s.lab.emu.hold_reboots(0);
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("w-1 reboots");
    s.ops.delete("rb", &Default::default()).await.unwrap();
    gate.open();
    wait_for("the operation to be gone", || async {
        s.ops.get_opt("rb").await.unwrap().is_none()
    })
    .await;
    s.running.stop().await.unwrap();
    assert_eq!(s.lab.upgrade_writes(), vec!["w-1: reboot"]);
}

/// A kubernetes-upgrade is refused at plan time while a control plane is
/// held, with that reason, and nothing is written to any node.
/// Covers: R11.5 (held control plane refuses kubernetes-upgrade)
#[tokio::test]
async fn a_held_control_plane_refuses_a_kubernetes_upgrade() {
    let s = setup("op-k8s-held", LAB, &["cp-2"], None, quick()).await;
    let mut op = operation(&s.ns, "k8s", "kubernetes-upgrade", &[]);
    op.spec.version = Some("v1.37.0".into());
    s.ops.create(&PostParams::default(), &op).await.unwrap();
    let op = finished(&s.ops, "k8s").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::CONTROL_PLANE_HELD)
    );
    assert!(message.contains("control plane cp-2 is held"), "{message}");
    assert!(op.status.unwrap().plan.is_empty());
    s.running.stop().await.unwrap();
    assert!(s.lab.upgrade_writes().is_empty());
}

/// Kind ichor on a Helm install is refused with the `helm upgrade` command.
/// Covers: R4.6a, R11.7
#[tokio::test]
async fn kind_ichor_on_a_helm_install_prints_the_helm_command() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-ichor-helm").await;
    crds(&client).await;
    let mut config = config(&ns, &ns);
    config.deployed_by = ichor_controller::DeployedBy::Helm;
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    let mut op = operation(&ns, "self", "ichor", &[]);
    op.spec.version = Some("v0.2.0".into());
    ops.create(&PostParams::default(), &op).await.unwrap();
    let op = finished(&ops, "self").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::REFUSED)
    );
    assert!(
        message.contains(&format!(
            "helm upgrade ichor <chart> --namespace {ns} --version 0.2.0"
        )),
        "{message}"
    );
    running.stop().await.unwrap();
}

/// The lab's nodes run Kubernetes v1.36.0 (the fixtures' images retagged).
pub(crate) fn at_v1_36(config: String) -> String {
    config.replace(":v1.28.0", ":v1.36.0")
}

/// A stale inline copy of Cilium in the control planes' configs (the
/// talos#5640 case): an older agent image than the Helm release that owns
/// the live Cilium, and a ConfigMap that says so.
const INLINE_CILIUM: &str = "    inlineManifests:
        - name: cilium
          contents: |
            apiVersion: v1
            kind: ConfigMap
            metadata:
              name: cilium-config
              namespace: kube-system
            data:
              from: inline
            ---
            apiVersion: apps/v1
            kind: DaemonSet
            metadata:
              name: cilium
              namespace: kube-system
            spec:
              selector:
                matchLabels: {k8s-app: cilium}
              template:
                metadata:
                  labels: {k8s-app: cilium}
                spec:
                  containers:
                    - name: cilium-agent
                      image: quay.io/cilium/cilium:v1.16.0
";

/// [`at_v1_36`] with [`INLINE_CILIUM`] in the config.
fn at_v1_36_with_inline_cilium(config: String) -> String {
    at_v1_36(config).replacen(
        "    clusterName: base\n",
        &format!("    clusterName: base\n{INLINE_CILIUM}"),
        1,
    )
}

/// The Kubernetes version's machines: control planes on Talos 1.14 (which
/// runs Kubernetes up to 1.37), the workers on Talos 1.13 (up to 1.36).
fn talos_of(machine: &str) -> &'static str {
    if machine.starts_with("cp-") {
        "v1.14.0"
    } else {
        "v1.13.9"
    }
}

/// The live Cilium a Helm release owns (what Ichor's release holds after
/// the CNI hand-over): its agent at a newer image than the inline copy.
async fn helm_owned_cilium(client: &kube::Client) {
    let meta = |name: &str| {
        json!({"name": name, "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "cilium", "meta.helm.sh/release-namespace": "kube-system"}})
    };
    let cm: ConfigMap = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cilium-config"), "data": {"from": "helm"}}),
    )
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let ds: DaemonSet = serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("cilium"),
        "spec": {"selector": {"matchLabels": {"k8s-app": "cilium"}},
            "template": {"metadata": {"labels": {"k8s-app": "cilium"}},
                "spec": {"containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.18.0"}]}}}}))
    .unwrap();
    Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
}

/// The manifests control plane `i` serves, as JSON objects.
async fn served_manifests(lab: &Lab, i: usize) -> Vec<(String, Vec<serde_json::Value>)> {
    let talos = lab.emu.admin_client(i).unwrap();
    talos
        .manifests("")
        .await
        .unwrap()
        .iter()
        .map(|(id, objects)| {
            (
                id.clone(),
                objects.iter().map(manifests::struct_to_json).collect(),
            )
        })
        .collect()
}

/// Plays Talos's apply at boot of the manifests control plane `i` renders
/// (as its ManifestApplyController does): each missing object created and
/// stamped with the owning-inventory annotation, an existing one left as it
/// is. Returns the names of the objects it created.
async fn play_talos_apply(client: &kube::Client, lab: &Lab, i: usize) -> Vec<String> {
    let mut created = Vec::new();
    for (_, objects) in served_manifests(lab, i).await {
        for mut v in objects {
            v["metadata"]["annotations"][OWNING_INVENTORY_ANNOTATION] = json!(INVENTORY_NAME);
            let obj: DynamicObject = serde_json::from_value(v).unwrap();
            let types = obj.types.clone().unwrap();
            let (group, version) = types
                .api_version
                .split_once('/')
                .unwrap_or(("", &types.api_version));
            let gvk = kube::api::GroupVersionKind::gvk(group, version, &types.kind);
            let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
            let api: Api<DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => Api::namespaced_with(
                    client.clone(),
                    obj.metadata.namespace.as_deref().unwrap_or("default"),
                    &resource,
                ),
                kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => created.push(format!(
                    "{} {}",
                    types.kind,
                    obj.metadata.name.unwrap_or_default()
                )),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("creating {}: {e}", types.kind),
            }
        }
    }
    created
}

/// The resource version of an object of kube-system.
async fn version_of<K>(client: &kube::Client, name: &str) -> String
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), "kube-system")
        .get(name)
        .await
        .unwrap()
        .meta()
        .resource_version
        .clone()
        .unwrap()
}

fn first_image_of(ds: &DaemonSet) -> String {
    ds.spec.template.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

const COMPONENTS: &[(KubernetesComponent, &str)] = &[
    (KubernetesComponent::ApiServer, "kube-apiserver"),
    (
        KubernetesComponent::ControllerManager,
        "kube-controller-manager",
    ),
    (KubernetesComponent::Scheduler, "kube-scheduler"),
    (KubernetesComponent::KubeProxy, "kube-proxy"),
    (KubernetesComponent::Kubelet, "kubelet"),
];

/// The image of each component a config names (`kube-apiserver` → its image).
fn images_of(config: &[u8]) -> std::collections::BTreeMap<&'static str, String> {
    let text = String::from_utf8_lossy(config);
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(image) = line.trim().strip_prefix("image: ") else {
            continue;
        };
        for (_, name) in COMPONENTS {
            let repo = image.rsplit('/').next().unwrap_or(image);
            if repo.split(':').next() == Some(*name) {
                out.insert(*name, image.to_string());
            }
        }
    }
    out
}

impl Lab {
    /// The kubelets' and static pods' part, from each node's active config:
    /// the control-plane components' mirror pods (`kube-system`, label
    /// `k8s-app`) run the image the node's config names and are Ready; the
    /// Node reports the kubelet version its config names.
    async fn play_kubelets(&self, client: &kube::Client) {
        let pods = Api::<Pod>::namespaced(client.clone(), "kube-system");
        let nodes = Api::<Node>::all(client.clone());
        for (i, (_, role, host)) in self.machines.iter().enumerate() {
            let Some(config) = self.emu.active_config(i) else {
                continue;
            };
            let images = images_of(&config);
            if let Some(kubelet) = images.get("kubelet") {
                let version = kubelet.rsplit(':').next().unwrap_or_default();
                nodes
                    .patch_status(
                        host,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": {"nodeInfo": {"kubeletVersion": version,
                            "kubeProxyVersion": "", "osImage": "Talos", "operatingSystem": "linux",
                            "architecture": "amd64", "kernelVersion": "", "containerRuntimeVersion": "containerd://2.1.5",
                            "machineID": "", "systemUUID": "", "bootID": ""}}})),
                    )
                    .await
                    .unwrap();
            }
            if *role != "controlplane" {
                continue;
            }
            for name in [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
            ] {
                let Some(image) = images.get(name) else {
                    continue;
                };
                let pod_name = format!("{name}-{host}");
                let current = pods.get_opt(&pod_name).await.unwrap();
                let runs = current.as_ref().is_some_and(|p| {
                    p.spec
                        .as_ref()
                        .is_some_and(|s| s.containers[0].image.as_deref() == Some(image))
                });
                if runs {
                    continue;
                }
                // A static pod restarted with the new image: a new mirror pod.
                if current.is_some() {
                    pods.delete(
                        &pod_name,
                        &kube::api::DeleteParams::default().grace_period(0),
                    )
                    .await
                    .unwrap();
                    wait_for("the old mirror pod to go", || async {
                        pods.get_opt(&pod_name).await.unwrap().is_none()
                    })
                    .await;
                }
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod_name, "namespace": "kube-system",
                        "labels": {"k8s-app": name, "tier": "control-plane"},
                        "annotations": {"kubernetes.io/config.mirror": "played by the test"}},
                    "spec": {"nodeName": host, "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": name, "image": image}]}
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
                pods.patch_status(
                    &pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
                )
                .await
                .unwrap();
            }
        }
    }

    /// The component each config apply changed, in write order, as
    /// `machine: component`: the write log's applies compared one after
    /// the other, per node.
    fn component_writes(&self) -> Vec<String> {
        let mut last: std::collections::BTreeMap<
            String,
            std::collections::BTreeMap<&'static str, String>,
        > = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        for w in self.emu.writes() {
            let WriteAction::ApplyConfiguration { config, .. } = &w.action else {
                continue;
            };
            let Some((machine, _, _)) = self.machines.iter().find(|(_, _, h)| *h == w.node) else {
                continue;
            };
            let now = images_of(config);
            let before = last.get(&w.node).cloned().unwrap_or_default();
            for (name, image) in &now {
                if !before.is_empty() && before.get(name) != Some(image) {
                    out.push(format!(
                        "{machine}: {name} {}",
                        image.rsplit(':').next().unwrap_or_default()
                    ));
                } else if before.is_empty() && image.ends_with(":v1.37.0") {
                    out.push(format!("{machine}: {name} v1.37.0"));
                }
            }
            last.insert(w.node.clone(), now);
        }
        out
    }
}

/// Waits for an operation to finish while playing the kubelets.
pub(crate) async fn finished_playing(s: &Setup, name: &str) -> TalosOperation {
    let what = format!("TalosOperation {name} to finish");
    wait::until(
        what,
        Duration::from_secs(240),
        Duration::from_millis(100),
        || async {
            s.lab.play_kubelets(&s.client).await;
            let op = s.ops.get(name).await.unwrap();
            let ended = op.status.as_ref().is_some_and(|st| {
                matches!(
                    st.phase,
                    Some(OperationPhase::Succeeded | OperationPhase::Failed)
                )
            });
            if ended {
                Seen::Done(op)
            } else {
                Seen::not_yet(format!("{:?}", op.status))
            }
        },
    )
    .await
    .unwrap()
}

pub(crate) fn kubernetes_operation(
    ns: &str,
    name: &str,
    version: &str,
    dry_run: bool,
) -> TalosOperation {
    let mut op = operation(ns, name, "kubernetes-upgrade", &[]);
    op.spec.version = Some(version.into());
    op.spec.dry_run = dry_run;
    op
}

/// A kubernetes-upgrade of 3 control planes + 2 workers (one held) from
/// v1.36.0 to v1.37.0, after refusals at plan time: a version two minors
/// ahead, then a worker whose Talos (1.13) does not run 1.37 — named with
/// its version; the held worker, also on 1.13, is not named since it keeps
/// its kubelet. The worker's Talos is upgraded (a talos-upgrade), then a dry
/// run writes the plan and its component steps and touches nothing. Then
/// the upgrade: the write log shows kube-apiserver on each control plane
/// one at a time, then kube-controller-manager, kube-scheduler and
/// kube-proxy the same way, then each kubelet node by node, every step a
/// no-reboot apply; nothing is written to the held worker; every node's
/// Talos API reports each component's new image, and its pods and Node show
/// it. Last, the bootstrap-manifests sync: kube-proxy's DaemonSet (created
/// by the test playing Talos's apply at boot) runs the new image, while the
/// Cilium a Helm release owns — whose stale inline copy is in the
/// manifests — is not written at all; a rerun of the sync (a controller
/// killed mid-step) changes nothing. The real peer of talosctl's manifests
/// step, run on the same manifests after, shows the difference: it reverts
/// that Cilium to the inline copy.
/// Covers: R11.1, R11.5, kubernetes-upgrade, ADR 0014 (kubernetes-upgrade end to end, dry-run plan,
/// version path, each node's Talos supports the target, the bootstrap-manifests
/// sync never overwrites Ichor's Cilium), R6.1, R16.1 (each step a revision
/// of its machine)
#[tokio::test]
async fn kubernetes_upgrade_component_by_component() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-k8s").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let lab = lab_talos(
        &client,
        &ns,
        LAB,
        &["w-2"],
        at_v1_36_with_inline_cilium,
        talos_of,
    )
    .await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = quick();
    config.node_name = Some(lab.host("cp-1"));
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    let s = Setup {
        client,
        ns,
        running,
        lab,
        ops,
    };

    // Two minors ahead: refused, naming the step between.
    s.ops
        .create(
            &PostParams::default(),
            &kubernetes_operation(&s.ns, "skip", "v1.38.0", false),
        )
        .await
        .unwrap();
    let op = finished_playing(&s, "skip").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::UNSUPPORTED_VERSION_PATH),
        "{message}"
    );
    assert!(
        message.contains("v1.36.0") && message.contains("v1.37.x first"),
        "{message}"
    );

    // w-1 runs Talos 1.13, which does not run Kubernetes 1.37: refused,
    // naming it and its version (the held w-2 keeps its kubelet: not named).
    s.ops
        .create(
            &PostParams::default(),
            &kubernetes_operation(&s.ns, "old-talos", "v1.37.0", false),
        )
        .await
        .unwrap();
    let op = finished_playing(&s, "old-talos").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::UNSUPPORTED_BY_TALOS),
        "{message}"
    );
    assert!(
        message.contains("TalosMachine w-1 (Talos v1.13.9)")
            && message.contains("runs Kubernetes 1.31 to 1.36.x")
            && !message.contains("w-2")
            && !message.contains("cp-"),
        "{message}"
    );
    assert!(s.lab.component_writes().is_empty());

    // As the refusal says: Talos first.
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "talos-w1", "talos-upgrade", &["w-1"]),
        )
        .await
        .unwrap();
    let op = finished_playing(&s, "talos-w1").await;
    assert_eq!(complete(&op).1, reasons::SUCCEEDED, "{:?}", op.status);
    assert_eq!(s.lab.emu.talos_version(s.lab.index("w-1")), TARGET);
    let mark = s.lab.emu.writes().len();

    // The removed-API check lists workloads.v1alpha2.scheduling.k8s.io and
    // podgroups.v1alpha2.scheduling.k8s.io: this API server does not serve
    // them (404), so nothing uses them and the plan goes on. (A CRD cannot
    // stand in for them: the API server keeps a built-in group's paths.)
    assert!(s.lab.component_writes().is_empty());

    // The dry run: the plan and its steps, nothing touched.
    s.ops
        .create(
            &PostParams::default(),
            &kubernetes_operation(&s.ns, "preview", "v1.37.0", true),
        )
        .await
        .unwrap();
    let op = finished_playing(&s, "preview").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::DRY_RUN),
        "{message}"
    );
    let st = op.status.unwrap();
    let steps: Vec<String> = st
        .components
        .iter()
        .map(|c| format!("{}: {}", c.machine, c.component.as_str()))
        .collect();
    let mut want = Vec::new();
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ] {
        for m in ["cp-2", "cp-3", "cp-1"] {
            want.push(format!("{m}: {c}"));
        }
    }
    for m in ["cp-2", "cp-3", "cp-1", "w-1"] {
        want.push(format!("{m}: kubelet"));
    }
    let mut planned = want.clone();
    planned.push("cp-2: bootstrap-manifests".to_string());
    assert_eq!(steps, planned);
    assert!(
        st.components
            .iter()
            .all(|c| c.phase == ComponentPhase::Pending)
    );
    assert!(s.lab.component_writes().is_empty());

    // The cluster as Talos and Helm left it: Cilium owned by a Helm release
    // (created first), then Talos's apply at boot of cp-2's manifests, which
    // creates kube-proxy's and CoreDNS's objects and finds Cilium's.
    helm_owned_cilium(&s.client).await;
    let created = play_talos_apply(&s.client, &s.lab, s.lab.index("cp-2")).await;
    assert!(
        created.contains(&"DaemonSet kube-proxy".to_string())
            && !created.iter().any(|c| c.contains("cilium")),
        "{created:?}"
    );
    let daemonsets = Api::<DaemonSet>::namespaced(s.client.clone(), "kube-system");
    assert_eq!(
        first_image_of(&daemonsets.get("kube-proxy").await.unwrap()),
        "registry.k8s.io/kube-proxy:v1.36.0"
    );
    let cilium_versions = (
        version_of::<DaemonSet>(&s.client, "cilium").await,
        version_of::<ConfigMap>(&s.client, "cilium-config").await,
    );

    // The upgrade.
    s.ops
        .create(
            &PostParams::default(),
            &kubernetes_operation(&s.ns, "k8s", "v1.37.0", false),
        )
        .await
        .unwrap();
    let op = finished_playing(&s, "k8s").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::SUCCEEDED),
        "{message}"
    );
    assert!(message.contains("w-2 skipped (held)"), "{message}");
    assert!(message.contains("spec.kubernetesVersion"), "{message}");
    let written: Vec<String> = want.iter().map(|w| format!("{w} v1.37.0")).collect();
    assert_eq!(s.lab.component_writes(), written);
    let st = op.status.unwrap();
    for c in &st.components {
        assert_eq!(c.phase, ComponentPhase::Succeeded, "{c:?}");
        let name = match c.component.as_str() {
            // The sync's image is kube-proxy's DaemonSet's.
            "bootstrap-manifests" => "kube-proxy",
            other => other,
        };
        assert!(
            c.image_before
                .as_deref()
                .is_some_and(|i| i.ends_with(&format!("{name}:v1.36.0"))),
            "{c:?}"
        );
        assert!(
            c.image
                .as_deref()
                .is_some_and(|i| i.ends_with(&format!("{name}:v1.37.0"))),
            "{c:?}"
        );
    }
    for p in &st.machines {
        let want = if p.machine == "w-2" {
            MachineStep::Skipped
        } else {
            MachineStep::Succeeded
        };
        assert_eq!(p.step, want, "{p:?}");
    }
    let w2 = s.lab.host("w-2");
    assert!(
        s.lab.emu.writes().iter().all(|w| w.node != w2),
        "the held worker was written"
    );
    // Every node's Talos API reports every component at the new version
    // (the held worker keeps its kubelet); each write was a no-reboot apply.
    for (i, (machine, role, _)) in s.lab.machines.iter().enumerate() {
        let talos = s.lab.emu.admin_client(i).unwrap();
        let components: &[(KubernetesComponent, &str)] = if *role == "controlplane" {
            COMPONENTS
        } else {
            &COMPONENTS[4..]
        };
        for (c, name) in components {
            let image = talos
                .component_image("", *c)
                .await
                .unwrap()
                .unwrap_or_default();
            let want = if machine == "w-2" {
                "v1.36.0"
            } else {
                "v1.37.0"
            };
            assert!(
                image.ends_with(&format!("{name}:{want}")),
                "{machine} {name}: {image}"
            );
        }
    }
    assert!(
        s.lab.emu.writes()[mark..].iter().all(|w| match &w.action {
            WriteAction::ApplyConfiguration { mode, .. } => mode == "no_reboot",
            WriteAction::Reboot { .. } | WriteAction::Upgrade { .. } => false,
            _ => true,
        }),
        "a write of the kubernetes-upgrade that is not a no-reboot apply"
    );
    // Each component step is a revision of its machine (R16.1): the
    // operation named, no spec writer, digests before and after, the one
    // image path changed (its value not kept); none on the held worker.
    let machines = Api::<TalosMachine>::namespaced(s.client.clone(), &s.ns);
    for (machine, _, _) in &s.lab.machines {
        let m = machines.get(machine).await.unwrap();
        let revisions: Vec<_> = m
            .status
            .map(|st| st.revisions)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.reason == ichor_api::history::RevisionReason::Operation)
            .collect();
        if *machine == "w-2" {
            assert!(revisions.is_empty(), "{machine}: {revisions:?}");
            continue;
        }
        assert!(
            !revisions.is_empty(),
            "{machine}: no revision of the upgrade"
        );
        for r in &revisions {
            assert_eq!(r.operation.as_deref(), Some("k8s"), "{machine}: {r:?}");
            assert!(r.changed_by.is_none(), "{machine}: {r:?}");
            assert_eq!(r.changed_paths.len(), 1, "{machine}: {r:?}");
            assert!(!r.changed_paths[0].contains("v1.37.0"), "{machine}: {r:?}");
            assert_ne!(r.config_hash_before.as_ref(), Some(&r.config_hash_after));
        }
    }

    // The bootstrap-manifests sync: kube-proxy's DaemonSet runs the new
    // image and keeps Talos's owning-inventory annotation; Cilium, whose
    // inline copy is among the manifests, is not written (same resource
    // versions, Helm's image and data), and the step says why.
    let proxy = daemonsets.get("kube-proxy").await.unwrap();
    assert_eq!(first_image_of(&proxy), "registry.k8s.io/kube-proxy:v1.37.0");
    assert_eq!(
        proxy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNING_INVENTORY_ANNOTATION))
            .map(String::as_str),
        Some(INVENTORY_NAME)
    );
    assert_eq!(
        (
            version_of::<DaemonSet>(&s.client, "cilium").await,
            version_of::<ConfigMap>(&s.client, "cilium-config").await,
        ),
        cilium_versions,
        "Ichor's sync wrote the Cilium a Helm release owns"
    );
    assert_eq!(
        first_image_of(&daemonsets.get("cilium").await.unwrap()),
        "quay.io/cilium/cilium:v1.18.0"
    );
    let sync = st.components.last().unwrap();
    let said = sync.message.clone().unwrap_or_default();
    assert!(
        said.contains("DaemonSet kube-system/cilium (Helm release kube-system/cilium)")
            && said
                .contains("ConfigMap kube-system/cilium-config (Helm release kube-system/cilium)")
            && said.contains("nothing pruned"),
        "{said}"
    );
    // Nothing was deleted: every object Talos's apply created is there.
    assert!(
        Api::<Deployment>::namespaced(s.client.clone(), "kube-system")
            .get_opt("coredns")
            .await
            .unwrap()
            .is_some()
    );

    // A controller killed mid-step reruns the step's apply: the same
    // objects applied again change nothing.
    let before = (
        version_of::<DaemonSet>(&s.client, "kube-proxy").await,
        version_of::<Deployment>(&s.client, "coredns").await,
        version_of::<ConfigMap>(&s.client, "coredns").await,
    );
    let objects = manifests::objects(&served_manifests(&s.lab, s.lab.index("cp-2")).await).unwrap();
    let plan = manifests::read(&s.client, objects).await.unwrap();
    assert_eq!(
        plan.kube_proxy_image().as_deref(),
        Some("registry.k8s.io/kube-proxy:v1.37.0")
    );
    manifests::sync(&s.client, &plan).await.unwrap();
    let after = (
        version_of::<DaemonSet>(&s.client, "kube-proxy").await,
        version_of::<Deployment>(&s.client, "coredns").await,
        version_of::<ConfigMap>(&s.client, "coredns").await,
    );
    assert_eq!(
        before, after,
        "a rerun of the sync changed what it had applied"
    );
    s.running.stop().await.unwrap();

    // The contrast, with the real peer: talosctl upgrade-k8s's manifests
    // step (go-kubernetes's server-side apply, `tools/ssa-prune-peer`, prune
    // off) applied to the same manifests puts kube-proxy where Ichor's sync
    // did, and reverts the Helm-owned Cilium to the stale inline copy
    // (talos#5640) — what Ichor's sync never does.
    let documents: String = served_manifests(&s.lab, s.lab.index("cp-2"))
        .await
        .iter()
        .flat_map(|(_, objects)| objects.iter())
        .map(|o| serde_yaml_ng::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("---\n");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, documents).unwrap();
    let out = std::process::Command::new(Tool::SsaPrunePeer.path())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg("--no-prune")
        .arg(&file)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert_eq!(
        first_image_of(&daemonsets.get("kube-proxy").await.unwrap()),
        "registry.k8s.io/kube-proxy:v1.37.0",
        "{said}"
    );
    assert_eq!(
        first_image_of(&daemonsets.get("cilium").await.unwrap()),
        "quay.io/cilium/cilium:v1.16.0",
        "the peer was expected to overwrite Helm's Cilium: {said}"
    );
}

/// The lab's nodes at Kubernetes v1.35.0, kube-apiserver given a feature
/// gate Kubernetes 1.36 removes.
fn at_v1_35_with_a_removed_gate(config: String) -> String {
    config.replace(":v1.28.0", ":v1.35.0").replacen(
        "        image: registry.k8s.io/kube-apiserver:v1.35.0\n",
        "        image: registry.k8s.io/kube-apiserver:v1.35.0\n        extraArgs:\n            feature-gates: WatchFromStorageWithoutResourceVersion=true,Other=false\n",
        1,
    )
}

/// A kubernetes-upgrade from 1.35 to 1.36 while a control plane's config
/// still gives kube-apiserver a feature gate 1.36 removes: refused at plan
/// time, naming the machine and the gate, nothing written.
/// Covers: kubernetes-upgrade, ADR 0014 (talosctl's removed flags / admission plugins / feature gates check)
#[tokio::test]
async fn a_removed_feature_gate_refuses_a_kubernetes_upgrade() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-gate").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let machines: &[(&str, &str)] = &[("cp-1", "controlplane"), ("w-1", "worker")];
    let lab = lab_talos(
        &client,
        &ns,
        machines,
        &[],
        at_v1_35_with_a_removed_gate,
        |_| "v1.13.9",
    )
    .await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = quick();
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    ops.create(
        &PostParams::default(),
        &kubernetes_operation(&ns, "gate", "v1.36.0", false),
    )
    .await
    .unwrap();
    let op = finished(&ops, "gate").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::REMOVED_SETTING_IN_USE),
        "{message}"
    );
    assert!(
        message.contains("TalosMachine cp-1: kube-apiserver feature gate WatchFromStorageWithoutResourceVersion (removed in Kubernetes 1.36)")
            && !message.contains("Other")
            && !message.contains("w-1"),
        "{message}"
    );
    assert!(
        lab.emu.writes().is_empty(),
        "nothing is written at plan time"
    );
    running.stop().await.unwrap();
}

/// Kind ichor on an install-manifest install: a dry run names the installer
/// Job and starts nothing; the operation starts the installer Job (Ichor's
/// own image at the target tag, `ichor install --to`, the
/// ichor-installer identity) and follows it: the test plays the Job
/// controller, and the operation ends as the Job does.
/// Covers: the `ichor` operation kind on an install-manifest install (ADR 0014): through the installer Job
#[tokio::test]
async fn kind_ichor_on_an_installer_install_runs_the_installer_job() {
    use k8s_openapi::api::batch::v1::Job;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-ichor-job").await;
    crds(&client).await;
    let mut config = config(&ns, &ns);
    config.cni_job_image = Some("ghcr.io/maeshinshin/ichor-controller:v0.1.0".into());
    let running = start(client.clone(), config);
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);

    let mut preview = operation(&ns, "preview", "ichor", &[]);
    preview.spec.version = Some("v0.2.0".into());
    preview.spec.dry_run = true;
    ops.create(&PostParams::default(), &preview).await.unwrap();
    let op = finished(&ops, "preview").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reasons::DRY_RUN),
        "{message}"
    );
    assert!(message.contains(&format!("installer Job {ns}/ichor-upgrade-preview runs ghcr.io/maeshinshin/ichor-controller:v0.2.0")), "{message}");
    assert!(
        jobs.get_opt("ichor-upgrade-preview")
            .await
            .unwrap()
            .is_none()
    );

    for (name, ok) in [("self", true), ("broken", false)] {
        let mut op = operation(&ns, name, "ichor", &[]);
        op.spec.version = Some("v0.2.0".into());
        ops.create(&PostParams::default(), &op).await.unwrap();
        let job_name = format!("ichor-upgrade-{name}");
        wait_for("the installer Job", || async {
            jobs.get_opt(&job_name).await.unwrap().is_some()
        })
        .await;
        let job = jobs.get(&job_name).await.unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("ichor-installer"));
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some("ghcr.io/maeshinshin/ichor-controller:v0.2.0")
        );
        assert_eq!(
            pod.containers[0].args,
            Some(vec!["install".into(), "--to".into(), "v0.2.0".into()])
        );
        wait_for("the operation to follow the Job", || async {
            ops.get(name).await.unwrap().status.is_some_and(|s| {
                s.phase == Some(OperationPhase::Running)
                    && s.message.as_deref().is_some_and(|m| m.contains(&job_name))
            })
        })
        .await;
        let end = "2026-01-01T00:00:10Z";
        let outcome = if ok {
            json!({"status": {"startTime": "2026-01-01T00:00:00Z", "active": 0, "succeeded": 1, "completionTime": end, "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "lastProbeTime": end, "lastTransitionTime": end},
                {"type": "Complete", "status": "True", "lastProbeTime": end, "lastTransitionTime": end}]}})
        } else {
            json!({"status": {"startTime": "2026-01-01T00:00:00Z", "active": 0, "failed": 1, "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastProbeTime": end, "lastTransitionTime": end},
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastProbeTime": end, "lastTransitionTime": end}]}})
        };
        jobs.patch_status(&job_name, &PatchParams::default(), &Patch::Merge(&outcome))
            .await
            .unwrap();
        let op = finished(&ops, name).await;
        let (status, reason, message) = complete(&op);
        if ok {
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("True", reasons::SUCCEEDED),
                "{message}"
            );
            assert!(message.contains("Ichor v0.2.0 is installed"), "{message}");
        } else {
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", reasons::JOB_FAILED),
                "{message}"
            );
            assert!(
                message.contains("backoff limit")
                    && message.contains(&format!("kubectl -n {ns} logs job/{job_name}")),
                "{message}"
            );
        }
    }
    running.stop().await.unwrap();
}

mod kstatus;
