//! Membership through the controller on real peers: a released
//! TalosMachine of the only control plane is deleted, and the controller
//! refuses its removal (status Refused with the reason, a RemovalRefused
//! Event), nothing written to its node, the machine kept by its finalizer.

use crate::common::*;
use ichor_api::{MembershipPhase, TalosCluster, TalosMachine};
use ichor_talemu::NodeSpec;
use ichor_testenv::TestEnv;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "solo", "namespace": ns},
        "spec": {"endpoint": "https://solo:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

/// Covers: R14.3, R14.12, R14.13 (the last control plane's removal refused
/// by the controller, nothing written to its node)
#[tokio::test]
async fn the_last_control_plane_is_never_removed() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("membership-solo").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let emu = emulator(vec![
        NodeSpec::new(
            "solo-cp-1",
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-controlplane.yaml"),
        )
        .with_version("v1.12.1"),
    ])
    .await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    let machine: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "solo-cp-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "solo"}, "role": "controlplane",
            "address": emu.endpoint(0), "hold": false}
    }))
    .unwrap();
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let running = start(client.clone(), config(&ns, &ns));
    wait_for("the membership finalizer on solo-cp-1", || async {
        machines.get("solo-cp-1").await.is_ok_and(|m| {
            m.finalizers()
                .iter()
                .any(|f| f == ichor_controller::membership::FINALIZER)
        })
    })
    .await;
    let writes_before = emu.writes().len();
    machines
        .delete("solo-cp-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("solo-cp-1's removal refused", || async {
        machines.get("solo-cp-1").await.is_ok_and(|m| {
            m.status
                .and_then(|s| s.membership)
                .is_some_and(|s| s.phase == MembershipPhase::Refused)
        })
    })
    .await;
    let message = machines
        .get("solo-cp-1")
        .await
        .unwrap()
        .status
        .and_then(|s| s.membership)
        .and_then(|s| s.message)
        .unwrap_or_default();
    assert!(
        message.contains("would leave no control plane")
            && message.contains("add a control plane first"),
        "{message}"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    wait_for("a RemovalRefused Event on solo-cp-1", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("RemovalRefused")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("solo-cp-1")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("no control plane"))
            })
        })
    })
    .await;
    assert_eq!(
        emu.writes().len(),
        writes_before,
        "nothing written to the node: {:?}",
        emu.writes()
    );
    let kept = machines.get("solo-cp-1").await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_some(),
        "kept by its finalizer"
    );
    assert_eq!(emu.membership_log().last().map(|c| c.voters), Some(1));
    running.stop().await.unwrap();
    // Let the namespace go: the machine's finalizer is dropped by hand.
    machines
        .patch(
            "solo-cp-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
}
