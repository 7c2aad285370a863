//! Config history through the controller on real peers: a machine outside
//! Ichor's namespace keeps its history Secret there, held by the history
//! finalizer, and the Secret goes when the machine does.

use crate::common::*;
use ichor_api::history::{HISTORY_FINALIZER, HISTORY_OF_ANNOTATION, RevisionReason};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::history::store;
use ichor_talemu::NodeSpec;
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A value that must never show outside the history Secret.
const MARKER: &str = "history-marker-5f1c";

fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "hist", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "unmanaged", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

fn machine(ns: &str, address: &str) -> TalosMachine {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "hist-w-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "hist"}, "role": "worker", "address": address, "hold": true,
            "patches": [{"name": "labels", "inline": format!("machine:\n  nodeLabels:\n    marker: {MARKER}\n")}]}
    }))
    .unwrap()
}

/// A machine in another namespace than Ichor's: its apply is revision 1,
/// the history Secret in Ichor's namespace names it and has no owner (one
/// cannot cross namespaces), the machine carries the history finalizer, the
/// Applied Event names the revision with paths only. Held, it keeps the
/// history finalizer alone; deleting it deletes the Secret, then lets the
/// machine go.
/// Covers: R16.1, R16.5
#[tokio::test]
async fn a_machine_outside_ichors_namespace_takes_its_history_secret_with_it() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("hist-m").await;
    let system = env.namespace("hist-sys").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let emu = emulator(vec![
        NodeSpec::new(
            "hist-w-1",
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-worker.yaml"),
        )
        .with_version("v1.12.1"),
    ])
    .await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    machines
        .create(&PostParams::default(), &machine(&ns, &emu.endpoint(0)))
        .await
        .unwrap();
    let mut config = config(&ns, &ns);
    config.system_namespace = system.clone();
    let running = start(client.clone(), config);
    machines
        .patch(
            "hist-w-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    wait_for("revision 1 of hist-w-1", || async {
        machines.get("hist-w-1").await.is_ok_and(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.revisions.iter().any(|r| r.number == 1))
        })
    })
    .await;
    let m = machines.get("hist-w-1").await.unwrap();
    let revision = &m.status.as_ref().unwrap().revisions[0];
    assert_eq!(revision.reason, RevisionReason::Drift);
    assert!(
        revision
            .changed_paths
            .iter()
            .any(|p| p.starts_with("machine.nodeLabels")),
        "{revision:?}"
    );
    assert!(m.finalizers().iter().any(|f| f == HISTORY_FINALIZER));
    let secrets = Api::<Secret>::namespaced(client.clone(), &system);
    let name = store::secret_name(&ns, "hist-w-1");
    let secret = secrets.get(&name).await.unwrap();
    assert!(secret.metadata.owner_references.is_none(), "{secret:?}");
    assert_eq!(
        secret.annotations()[HISTORY_OF_ANNOTATION],
        format!("{ns}/hist-w-1")
    );
    let data = secret
        .data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let record = store::find(&data, 1).unwrap().unwrap();
    assert!(record.rendered_config.contains(MARKER));
    // The Event names the revision and its paths; the value stays in the
    // Secret, as it stays out of status.
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    wait_for("the Applied Event naming revision 1", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("revision 1 (Drift"))
            })
        })
    })
    .await;
    for e in events.list(&Default::default()).await.unwrap().items {
        let note = e.note.unwrap_or_default();
        assert!(!note.contains(MARKER), "{note}");
    }
    let status = serde_json::to_string(&m.status).unwrap();
    assert!(!status.contains(MARKER), "{status}");

    // Held again (no removal runs for a held machine, as `ichor reclaim`
    // holds them): only the history finalizer keeps it.
    machines
        .patch(
            "hist-w-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hold": true}})),
        )
        .await
        .unwrap();
    wait_for("hist-w-1 without its membership finalizer", || async {
        machines
            .get("hist-w-1")
            .await
            .is_ok_and(|m| m.finalizers() == [HISTORY_FINALIZER.to_owned()])
    })
    .await;
    machines
        .delete("hist-w-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("hist-w-1 and its history Secret gone", || async {
        machines
            .get_opt("hist-w-1")
            .await
            .is_ok_and(|m| m.is_none())
            && secrets.get_opt(&name).await.is_ok_and(|s| s.is_none())
    })
    .await;
    running.stop().await.unwrap();
}

/// A worker that answers in maintenance mode is joined: the join's apply is
/// revision 1 (reason Join, over the maintenance API, no config before it,
/// the digest of the config applied), its rendered config in the history
/// Secret is the config the node now runs, and a Revision Event names it.
/// Covers: R16.9
#[tokio::test]
async fn a_joins_apply_is_a_revision() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("hist-join").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let emu = emulator(vec![NodeSpec::maintenance("hist-w-1")]).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    let mut m = machine(&ns, &emu.endpoint(0));
    m.spec.hold = false;
    machines.create(&PostParams::default(), &m).await.unwrap();
    let running = start(client.clone(), config(&ns, &ns));
    wait_for("the join's revision of hist-w-1", || async {
        machines.get("hist-w-1").await.is_ok_and(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.revisions.iter().any(|r| r.reason == RevisionReason::Join))
        })
    })
    .await;
    let m = machines.get("hist-w-1").await.unwrap();
    let revision = m.status.unwrap().revisions[0].clone();
    assert_eq!(revision.number, 1);
    assert_eq!(
        revision.apply_mode,
        ichor_api::history::RevisionApplyMode::Maintenance
    );
    assert_eq!(revision.config_hash_before, None);
    assert!(!revision.changed_paths.is_empty());
    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
        .get(&store::secret_name(&ns, "hist-w-1"))
        .await
        .unwrap();
    assert!(secret.metadata.owner_references.is_some());
    let data = secret
        .data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let record = store::find(&data, 1).unwrap().unwrap();
    assert_eq!(
        record.rendered_config,
        String::from_utf8(emu.active_config(0).unwrap()).unwrap()
    );
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    wait_for("a Revision Event naming the join", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("Revision")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("revision 1 (Join") && n.contains("config "))
            })
        })
    })
    .await;
    for e in events.list(&Default::default()).await.unwrap().items {
        let note = e.note.unwrap_or_default();
        assert!(!note.contains(MARKER), "{note}");
    }
    // The join's later looks (their status writes) keep the revision.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let kept = machines.get("hist-w-1").await.unwrap().status.unwrap();
    assert_eq!(kept.revisions.first(), Some(&revision), "{kept:#?}");
    running.stop().await.unwrap();
}
