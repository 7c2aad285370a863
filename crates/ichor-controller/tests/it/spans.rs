//! The controller's tracing spans, recorded by a subscriber of the test's
//! own while the controller reconciles one machine on an emulated node.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ichor_api::{TalosCluster, TalosMachine};
use ichor_talemu::NodeSpec;
use ichor_testenv::TestEnv;
use kube::api::{Api, PostParams};
use serde_json::json;
use tracing::span;

use crate::common::{bundle_secret, config, crds, emulator, start, wait_for};

/// A span as opened: its name, fields and parent.
#[derive(Debug, Clone)]
struct Opened {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<u64>,
}

/// Records every span opened on this thread (the test runs on one).
#[derive(Default)]
struct Recorder {
    next: AtomicU64,
    spans: Mutex<BTreeMap<u64, Opened>>,
    entered: Mutex<Vec<u64>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Recorder>);

impl tracing::Subscriber for Shared {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &span::Attributes<'_>) -> span::Id {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = match attrs.parent() {
            Some(p) => Some(p.into_u64()),
            None if attrs.is_contextual() => self.0.entered.lock().unwrap().last().copied(),
            None => None,
        };
        self.0.spans.lock().unwrap().insert(
            id,
            Opened {
                name: attrs.metadata().name(),
                fields,
                parent,
            },
        );
        span::Id::from_u64(id)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, id: &span::Id) {
        self.0.entered.lock().unwrap().push(id.into_u64());
    }
    fn exit(&self, id: &span::Id) {
        let mut entered = self.0.entered.lock().unwrap();
        if let Some(i) = entered.iter().rposition(|e| *e == id.into_u64()) {
            entered.remove(i);
        }
    }
}

/// Every reconcile runs in a span naming its kind and object, and every
/// Talos API call in a child span naming the call and the endpoint.
/// Covers: R17.6
#[tokio::test(flavor = "current_thread")]
async fn reconciles_and_talos_calls_run_in_spans_that_name_the_object() {
    let recorder = Shared::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("spans").await;
    let rel = env.namespace("spans-kube").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let cfg = ichor_testenv::fixtures::cni_none("v1.12-cni-none-controlplane.yaml");
    let emu = emulator(vec![NodeSpec::new("cp-1", cfg)]).await;
    let cluster: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap();
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let machine: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "cp-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "controlplane", "address": emu.endpoint(0), "hold": true}
    }))
    .unwrap();
    Api::<TalosMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let running = start(client.clone(), config(&ns, &rel));

    let object = format!("{ns}/cp-1");
    let call_under_reconcile = |call: &str| {
        let spans = recorder.0.spans.lock().unwrap();
        spans.values().any(|s| {
            s.name == "talos"
                && s.fields.get("call").is_some_and(|c| c == call)
                && s.fields.get("endpoint").is_some_and(|e| !e.is_empty())
                && s.parent.and_then(|p| spans.get(&p)).is_some_and(|r| {
                    r.name == "reconcile"
                        && r.fields.get("kind").is_some_and(|k| k == "TalosMachine")
                        && r.fields.get("object") == Some(&object)
                })
        })
    };
    // Other tests of this binary run controllers on other threads at the
    // same time; a callsite they reach first while this thread's subscriber
    // is being registered can keep a cached "never" interest (tracing's
    // per-callsite cache), so the cache is rebuilt at each look.
    wait_for("a Talos call in the machine's reconcile span", || async {
        tracing::callsite::rebuild_interest_cache();
        call_under_reconcile("Version")
    })
    .await;
    let cluster_object = format!("{ns}/base");
    wait_for("the cluster's reconcile span", || async {
        tracing::callsite::rebuild_interest_cache();
        recorder.0.spans.lock().unwrap().values().any(|s| {
            s.name == "reconcile"
                && s.fields.get("kind").is_some_and(|k| k == "TalosCluster")
                && s.fields.get("object") == Some(&cluster_object)
        })
    })
    .await;
    drop(running);
}
