//! One malformed TalosMachine never stalls the watch. Its own test binary:
//! to store an object the current schema would refuse, the TalosMachine CRD
//! is loosened for a moment (as an older or newer CRD version would be), the
//! object created, and the real CRD put back — stored objects are not
//! validated again, exactly how a real cluster ends up holding one.

use crate::common::*;
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
    crds(&client).await;

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

/// A bundle Secret crafted so that its OS certificate's END marker sits
/// inside the BEGIN line (the shape that once made the PEM reader slice
/// backwards and took the whole process down) fails its own cluster's
/// machines, with the reason, while a machine of another cluster in the
/// same namespace is reconciled on to its node. Ichor did: read both
/// bundles, reconcile both machines; the test played: the crafted Secret.
/// Covers: R18.1
#[tokio::test]
async fn a_poisoned_bundle_fails_its_own_cluster_only() {
    use k8s_openapi::api::core::v1::Secret;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("poisoned").await;
    crds(&client).await;

    let good = bundle_text();
    let crafted_pem = ichor_talos::pem::b64("-----BEGIN X-----END X-----");
    let mut lines = good.lines().map(str::to_owned).collect::<Vec<_>>();
    let os = lines
        .iter()
        .position(|l| l.trim() == "os:")
        .expect("the bundle has certs.os");
    let crt = &mut lines[os + 1];
    let indent = &crt[..crt.find("crt:").unwrap()];
    *crt = format!("{indent}crt: {crafted_pem}");
    let poisoned = lines.join("\n") + "\n";

    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    for (name, text) in [("poisoned", &poisoned), ("good", &good)] {
        let s: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns},
            "stringData": {"secrets.yaml": text},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        let c: TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
                "secretsRef": {"name": name}, "cni": {"preset": "unmanaged"}}
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &c).await.unwrap();
        let m: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": format!("{name}-w1"), "namespace": ns},
            "spec": {"clusterRef": {"name": name}, "role": "worker", "address": "127.0.0.1:1", "hold": true}
        }))
        .unwrap();
        machines.create(&PostParams::default(), &m).await.unwrap();
    }

    let running = start(client.clone(), config(&ns, &ns));
    let ready_reason = |name: &'static str, reason: &'static str| {
        let machines = machines.clone();
        async move {
            machines.get(name).await.is_ok_and(|m| {
                m.status.as_ref().is_some_and(|s| {
                    conditions::find(&s.conditions, types::READY)
                        .is_some_and(|c| c.status == "False" && c.reason == reason)
                })
            })
        }
    };
    wait_for(
        "the poisoned cluster's machine to say its bundle is unusable",
        || ready_reason("poisoned-w1", reasons::BUNDLE_UNAVAILABLE),
    )
    .await;
    wait_for(
        "the other cluster's machine to be reconciled on to its node",
        || ready_reason("good-w1", reasons::NODE_UNREACHABLE),
    )
    .await;
    let m = machines.get("poisoned-w1").await.unwrap();
    let status = m.status.unwrap();
    let message = &conditions::find(&status.conditions, types::READY)
        .unwrap()
        .message;
    assert!(message.contains("Secret poisoned"), "{message}");
    assert!(!message.contains(&crafted_pem), "{message}");

    // The machines of the poisoned cluster still take the brake and its release.
    for hold in [false, true] {
        let patch = json!({"spec": {"hold": hold}});
        machines
            .patch(
                "poisoned-w1",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    // The controller is still running: a machine reconciled again after the
    // poisoned one was.
    let m = machines.get("good-w1").await.unwrap();
    let seen = m.status.as_ref().and_then(|s| s.observed_generation);
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}, "spec": {"hold": false}});
    machines
        .patch(
            "good-w1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    wait_for(
        "the other machine's next generation to be observed",
        || async {
            machines
                .get("good-w1")
                .await
                .is_ok_and(|m| m.status.as_ref().and_then(|s| s.observed_generation) > seen)
        },
    )
    .await;
    running.stop().await.unwrap();
}
