//! A Talos upgrade on the lab, done by the controller `ichor adopt`
//! installed (running as its ServiceAccount), started by the real `ichor
//! upgrade talos --wait`: the order and the drains as the emulator's write
//! log and the API server saw them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::common::{LabHarness, NS, run, text};
use futures::StreamExt as _;
use ichor_api::{OperationPhase, TalosOperation};
use ichor_talemu::WriteAction;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;

/// On a lab of one control plane and two workers, with the controller on
/// the control plane and three pods under a budget of `maxUnavailable: 1`:
/// the plan puts the workers first and Ichor's node last; the write log
/// shows the installer pulled on every node, then one node at a time
/// (upgrade, reboot), in that order; each
/// node's pods were evicted before its reboot (the budget let them go one
/// at a time); every node comes back with a new boot id on the target
/// version, recorded in status; the controller, evicted with its node,
/// finishes the operation from its new node. Then a budget that allows no
/// disruption blocks a reboot's drain: the step fails at its bound naming
/// the budget, and nothing is rebooted.
/// Covers: R11.2, R11.4 (order, Ichor's node last, drains before reboots, boot ids and versions), R11.3 (a PDB blocks a drain: the step fails at its bound, naming it), the lab's drains (the lab evicts pods and honours PDBs), the operation CLI (ichor upgrade talos --wait)
#[tokio::test(flavor = "multi_thread")]
async fn the_installed_controller_upgrades_talos_node_by_node() {
    let h = LabHarness::up(|o| o.nodes = 3).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());
    let client = h.client().await;
    let hosts = h.lab.hostnames.clone();
    let (cp, w1, w2) = (hosts[0].clone(), hosts[1].clone(), hosts[2].clone());

    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap(),
        )
        .await
        .unwrap();
    for (name, node) in [("web-1", &w1), ("web-2", &w2), ("web-3", &w2)] {
        crate::common::ready_pod(&client, "demo", name, "web", node).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();

    // When each pod went (its deletion, as the API server shows it).
    let gone: std::sync::Arc<std::sync::Mutex<BTreeMap<String, SystemTime>>> = Default::default();
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

    let mut upgrade = h.ichor();
    upgrade
        .args([
            "upgrade",
            "talos",
            "--cluster",
            "lab",
            "-n",
            NS,
            "--to",
            "v1.14.0",
            "--name",
            "up",
            "--wait",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig);
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::from(upgrade).output(),
    )
    .await
    .expect("the upgrade ends within 10 minutes")
    .unwrap();
    let said = text(&out);
    assert!(
        out.status.success(),
        "ichor upgrade talos --wait: {said}\n{}",
        h.logs()
    );
    assert!(
        said.contains(&format!("[7/7] {w1} (node {w1}): Succeeded")),
        "{said}"
    );

    let op = Api::<TalosOperation>::namespaced(client.clone(), NS)
        .get("up")
        .await
        .unwrap();
    let st = op.status.unwrap();
    assert_eq!(st.phase, Some(OperationPhase::Succeeded));
    let order: Vec<&str> = st.plan.iter().map(|e| e.machine.as_str()).collect();
    assert_eq!(order, vec![w1.as_str(), w2.as_str(), cp.as_str()]);
    assert_eq!(
        st.plan[2].reason.as_deref(),
        Some("runs Ichor's controller")
    );
    for p in &st.machines {
        assert_eq!(p.version_before.as_deref(), Some("v1.13.9"), "{p:?}");
        assert_eq!(p.version_after.as_deref(), Some("v1.14.0"), "{p:?}");
        assert!(
            p.boot_id_before.is_some() && p.boot_id_before != p.boot_id_after,
            "{p:?}"
        );
    }

    let writes = h.lab.emulator.writes();
    let log: Vec<String> = writes
        .iter()
        .filter_map(|w| {
            let action = match &w.action {
                WriteAction::ImagePull { .. } => "pull",
                WriteAction::Upgrade { legacy: false, .. } => "upgrade",
                WriteAction::Reboot { .. } => "reboot",
                _ => return None,
            };
            Some(format!("{}: {action}", w.node))
        })
        .collect();
    // The installer is pulled on every node before the first is touched
    // (R15.4), then one node after another.
    let mut want: Vec<String> = [&w1, &w2, &cp]
        .iter()
        .map(|node| format!("{node}: pull"))
        .collect();
    for node in [&w1, &w2, &cp] {
        for a in ["upgrade", "reboot"] {
            want.push(format!("{node}: {a}"));
        }
    }
    assert_eq!(log, want);
    let reboot_of = |node: &str| {
        writes
            .iter()
            .find(|w| w.node == node && matches!(w.action, WriteAction::Reboot { .. }))
            .map(|w| w.at)
            .expect("rebooted")
    };
    let gone = gone.lock().unwrap().clone();
    for (pod, node) in [("web-1", &w1), ("web-2", &w2), ("web-3", &w2)] {
        let at = gone
            .get(pod)
            .copied()
            .unwrap_or_else(|| panic!("{pod} was not evicted: {gone:?}"));
        assert!(
            at < reboot_of(node),
            "{pod} was evicted after {node} rebooted"
        );
        // Nothing of the next node was drained before this one rebooted.
        if node == &w1 {
            assert!(gone.get("web-2").is_some_and(|t| *t > reboot_of(&w1)));
        }
    }
    // The controller was evicted with its node and runs elsewhere now.
    let controller_pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=ichor-controller"))
        .await
        .unwrap();
    assert!(
        controller_pods
            .items
            .iter()
            .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(cp.as_str())),
        "{:?}",
        controller_pods
            .items
            .iter()
            .map(|p| (
                p.metadata.name.clone(),
                p.spec.as_ref().and_then(|s| s.node_name.clone())
            ))
            .collect::<Vec<_>>()
    );
    watch.abort();

    // A budget that allows no disruption blocks the drain: the controller
    // runs with a short drain bound (its --drain-timeout), and the reboot
    // fails at it naming the budget; the pod stays, the node is not
    // rebooted and is uncordoned again.
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), NS);
    let mut d = deployments.get("ichor-controller").await.unwrap();
    let c = &mut d.spec.template.spec.as_mut().unwrap().containers[0];
    c.args
        .get_or_insert_with(Vec::new)
        .extend(["--drain-timeout".to_string(), "5s".to_string()]);
    deployments
        .replace("ichor-controller", &PostParams::default(), &d)
        .await
        .unwrap();
    let mut rolled = false;
    for _ in 0..300 {
        let d = deployments.get("ichor-controller").await.unwrap();
        let s = d.status.unwrap_or_default();
        if s.observed_generation == d.metadata.generation
            && s.ready_replicas == Some(1)
            && s.updated_replicas == Some(1)
        {
            rolled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        rolled,
        "the controller did not roll out with --drain-timeout\n{}",
        h.logs()
    );
    crate::common::ready_pod(&client, "demo", "db-1", "db", &w2).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "demo"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let reboots_before = h
        .lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == w2 && matches!(w.action, WriteAction::Reboot { .. }))
        .count();
    let mut reboot = h.ichor();
    reboot
        .args([
            "reboot",
            &w2,
            "--cluster",
            "lab",
            "-n",
            NS,
            "--name",
            "blocked",
            "--wait",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig);
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::from(reboot).output(),
    )
    .await
    .expect("the reboot ends")
    .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("Complete=False (DrainTimeout)"),
        "{said}\n{}",
        h.logs()
    );
    assert!(
        said.contains("PodDisruptionBudget demo/db does not allow evicting pod demo/db-1"),
        "{said}"
    );
    let reboots_after = h
        .lab
        .emulator
        .writes()
        .iter()
        .filter(|w| w.node == w2 && matches!(w.action, WriteAction::Reboot { .. }))
        .count();
    assert_eq!(
        reboots_after, reboots_before,
        "the blocked node was rebooted"
    );
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&w2)
        .await
        .unwrap();
    assert_ne!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "the node stays cordoned"
    );
    let db = Api::<Pod>::namespaced(client.clone(), "demo")
        .get("db-1")
        .await
        .unwrap();
    assert!(
        db.metadata.deletion_timestamp.is_none(),
        "the budget's pod was evicted"
    );
}
