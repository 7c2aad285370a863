//! One malformed TalosMachine never stalls the watch. Its own test binary:
//! to store an object the current schema would refuse, the TalosMachine CRD
//! is loosened for a moment (as an older or newer CRD version would be), the
//! object created, and the real CRD put back — stored objects are not
//! validated again, exactly how a real cluster ends up holding one.

mod common;

use common::*;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_testenv::TestEnv;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource as _;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

async fn replace_crd(client: &kube::Client, crd: CustomResourceDefinition) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    let current = api.get(&name).await.unwrap();
    let mut crd = crd;
    crd.metadata.resource_version = current.metadata.resource_version;
    api.replace(&name, &PostParams::default(), &crd)
        .await
        .unwrap();
}

/// A TalosMachine whose role is not one Ichor knows is reported on that
/// object (an Event, reason Malformed) while the other machines of the
/// namespace keep reconciling.
/// Covers: R1.7a
#[tokio::test]
async fn a_malformed_machine_does_not_stop_the_others() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("malformed").await;
    crds(&client, &ns).await;

    // Loosen the TalosMachine schema, store a bad object, put the real CRD back.
    let real = TalosMachine::crd_for_test();
    let mut loose = real.clone();
    let schema = loose.spec.versions[0]
        .schema
        .as_mut()
        .unwrap()
        .open_api_v3_schema
        .as_mut()
        .unwrap();
    let props = schema.properties.as_mut().unwrap();
    props.insert(
        "spec".into(),
        serde_json::from_value(
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        )
        .unwrap(),
    );
    replace_crd(&client, loose).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ichor.maesh.dev", "v1alpha1", "TalosMachine"),
        "talosmachines",
    );
    let dynamic = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar);
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "bad", "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "master", "address": "10.0.0.9"}
    }))
    .unwrap();
    wait_for("the loosened CRD to accept the bad object", || async {
        dynamic.create(&PostParams::default(), &bad).await.is_ok()
    })
    .await;
    replace_crd(&client, real).await;

    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for name in ["good-a", "good-b"] {
        let m: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterRef": {"name": "missing"}, "role": "worker", "address": "10.0.0.8"}
        }))
        .unwrap();
        wait_for("the real CRD to accept a good object", || async {
            machines.create(&PostParams::default(), &m).await.is_ok()
        })
        .await;
    }
    // The typed list fails on the bad object: the store really holds one.
    assert!(machines.list(&ListParams::default()).await.is_err());

    let running = start(client.clone(), config(&ns, &ns));
    for name in ["good-a", "good-b"] {
        wait_for(&format!("{name} to be reconciled"), || async {
            dynamic.get(name).await.is_ok_and(|o| {
                let m: Result<TalosMachine, _> =
                    serde_json::from_value(serde_json::to_value(&o).unwrap());
                m.is_ok_and(|m| {
                    m.status.as_ref().is_some_and(|s| {
                        conditions::find(&s.conditions, types::READY)
                            .is_some_and(|c| c.reason == reasons::CLUSTER_NOT_FOUND)
                    })
                })
            })
        })
        .await;
    }
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    wait_for("an Event on the bad machine", || async {
        events.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("Malformed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("TalosMachine") && n.contains("bad"))
            })
        })
    })
    .await;
    // The cluster controller is not stalled either.
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let c: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "later", "namespace": ns},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"}, "cni": {"preset": "unmanaged"}}
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &c).await.unwrap();
    wait_for("a TalosCluster created later to be reconciled", || async {
        clusters.get("later").await.is_ok_and(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == Some(1))
        })
    })
    .await;
    running.stop().await.unwrap();
}

trait CrdForTest {
    fn crd_for_test() -> CustomResourceDefinition;
}

impl CrdForTest for TalosMachine {
    fn crd_for_test() -> CustomResourceDefinition {
        ichor_api::crds::all()
            .into_iter()
            .find(|c| c.spec.names.kind == TalosMachine::kind(&()))
            .unwrap()
    }
}
