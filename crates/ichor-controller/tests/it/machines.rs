//! The TalosMachine controller end to end: a real kube-apiserver + etcd with
//! Ichor's CRDs, three `ichor-talemu` nodes (1 control plane + 2 workers)
//! per config shape, and the controller started in process.

use crate::common::*;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::{DriftClass, TalosCluster, TalosMachine};
use ichor_render::RenderInput;
use ichor_talemu::{NodeSpec, WriteAction};
use ichor_testenv::TestEnv;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pretty_assertions::assert_eq;
use serde_json::json;

/// A class B patch (node labels are applied without a reboot).
const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/test: \"yes\"\n";
/// A class B patch that appends to lists Talos appends to (ADR 0016: the
/// render adds its items once).
const APPEND: &str = "machine:\n  certSANs:\n    - w-1.example.com\n  time:\n    servers:\n      - time.cloudflare.com\n";
/// A class C patch (install settings take effect only on the next install).
const INSTALL: &str = "machine:\n  install:\n    image: ghcr.io/siderolabs/installer:v9.9.9\n";

struct Shape {
    name: &'static str,
    talos: &'static str,
    cp: &'static str,
    worker: &'static str,
}

const V112: Shape = Shape {
    name: "v112",
    talos: "v1.12.1",
    cp: "v1.12-cni-none-controlplane.yaml",
    worker: "v1.12-cni-none-worker.yaml",
};
const V114: Shape = Shape {
    name: "v114",
    talos: "v1.14.0",
    cp: "v1.14-cni-none-controlplane.yaml",
    worker: "v1.14-cni-none-worker.yaml",
};

fn cluster(ns: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.12.0", "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

fn machine(
    ns: &str,
    name: &str,
    role: &str,
    address: &str,
    patches: &[(&str, &str)],
) -> TalosMachine {
    let patches: Vec<_> = patches
        .iter()
        .map(|(n, p)| json!({"name": n, "inline": p}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": role, "address": address, "hold": true, "patches": patches}
    }))
    .unwrap()
}

fn cond<'a>(
    m: &'a TalosMachine,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, t))
}

/// The render the controller must have applied, computed here from the
/// objects as stored and the node's config before the apply.
fn expected_render(cluster: &TalosCluster, m: &TalosMachine, live: &str) -> String {
    let live = ichor_talos::config::MachineConfig::parse(live).unwrap();
    ichor_render::render(&RenderInput::from_objects(cluster, m, &live))
        .unwrap()
        .yaml()
        .unwrap()
}

async fn scenario(shape: &Shape) {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(&format!("tm-{}", shape.name)).await;
    let rel = env.namespace(&format!("tm-{}-kube", shape.name)).await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;

    let cp_cfg = ichor_testenv::fixtures::cni_none(shape.cp);
    let w_cfg = ichor_testenv::fixtures::cni_none(shape.worker);
    let emu = emulator(vec![
        NodeSpec::new("cp-1", cp_cfg.clone()).with_version(shape.talos),
        NodeSpec::new("w-1", w_cfg.clone()).with_version(shape.talos),
        NodeSpec::new("w-2", w_cfg.clone()).with_version(shape.talos),
    ])
    .await;

    // The order of R1.5b–f: Cilium first (R1.5b, with three Nodes registered),
    // the TalosCluster (R1.5d), the hand-over (R1.5e), then the held machines
    // are rendered with CNIHandover=True already set.
    let names: Vec<String> = ["cp-1", "w-1", "w-2"]
        .map(|n| format!("{}-{n}", shape.name))
        .into();
    let running = handed_over(&client, &ns, &rel, &cluster(&ns), &names).await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    let specs = [
        ("cp-1", "controlplane", vec![("labels", LABELS)]),
        (
            "w-1",
            "worker",
            vec![("labels", LABELS), ("append", APPEND)],
        ),
        (
            "w-2",
            "worker",
            vec![("labels", LABELS), ("install", INSTALL)],
        ),
    ];
    for (i, (name, role, patches)) in specs.iter().enumerate() {
        machines
            .create(
                &PostParams::default(),
                &machine(&ns, name, role, &emu.endpoint(i), patches),
            )
            .await
            .unwrap();
    }

    // Held: drift in status, nothing written.
    let reconciled = |m: &TalosMachine| {
        m.status.as_ref().is_some_and(|s| {
            s.observed_generation == m.metadata.generation && s.config_hash.is_some()
        }) && cond(m, types::READY).is_some_and(|c| c.status == "True")
    };
    for (name, _, _) in &specs {
        wait_for(
            &format!("TalosMachine {name} to show its drift"),
            || async { machines.get(name).await.is_ok_and(|m| reconciled(&m)) },
        )
        .await;
    }
    for (name, _, _) in &specs {
        let m = machines.get(name).await.unwrap();
        let st = m.status.clone().unwrap();
        assert_eq!(st.talos_version.as_deref(), Some(shape.talos), "{name}");
        assert!(!st.drift.is_empty(), "{name}: no drift");
        // R1.6: with CNIHandover=True the render of a `cni.name: none`
        // node equals it on every path the patches do not touch, the CNI
        // paths included.
        assert!(
            st.drift
                .iter()
                .all(|e| e.path.starts_with("machine.nodeLabels")
                    || e.path.starts_with("machine.install")
                    || (*name == "w-1"
                        && (e.path.starts_with("machine.certSANs")
                            || e.path.starts_with("machine.time")))),
            "{name}: {:#?}",
            st.drift
        );
        assert!(
            st.drift
                .iter()
                .any(|e| e.path.starts_with("machine.nodeLabels") && e.class == DriftClass::B),
            "{name}: {:#?}",
            st.drift
        );
        assert_eq!(
            cond(&m, types::HELD).unwrap().reason,
            reasons::HOLD_SET,
            "{name}"
        );
        let drifted = cond(&m, types::DRIFTED).unwrap();
        if *name == "w-2" {
            assert!(
                st.drift
                    .iter()
                    .any(|e| e.path.starts_with("machine.install") && e.class == DriftClass::C),
                "{:#?}",
                st.drift
            );
            assert_eq!(drifted.reason, reasons::UNSAFE_DRIFT);
            assert!(
                drifted.message.contains("machine.install"),
                "{}",
                drifted.message
            );
        } else {
            assert!(
                st.drift.iter().all(|e| e.class == DriftClass::B),
                "{name}: {:#?}",
                st.drift
            );
            assert_eq!(drifted.reason, reasons::SAFE_DRIFT, "{name}");
        }
    }
    assert!(
        emu.writes().is_empty(),
        "held machines were written: {:?}",
        emu.writes()
    );

    // Release w-1: only w-1 is written, no reboot, read-back = render.
    machines
        .patch(
            "w-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    wait_for("w-1 to be applied", || async {
        machines
            .get("w-1")
            .await
            .is_ok_and(|m| cond(&m, types::APPLIED).is_some_and(|c| c.status == "True"))
    })
    .await;
    let w1 = machines.get("w-1").await.unwrap();
    let c = clusters.get("base").await.unwrap();
    let expected = expected_render(&c, &w1, &w_cfg);
    let writes = emu.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].node, "w-1");
    match &writes[0].action {
        WriteAction::ApplyConfiguration { mode, config } => {
            assert_eq!(mode, "no_reboot");
            assert_eq!(String::from_utf8_lossy(config), expected);
        }
        other => panic!("unexpected write {other:?}"),
    }
    assert_eq!(
        String::from_utf8(emu.active_config(1).unwrap()).unwrap(),
        expected
    );
    let st = w1.status.clone().unwrap();
    assert!(st.drift.is_empty(), "{:#?}", st.drift);
    // The apply is revision 1 (R16.1): why, the paths (no values), the hash
    // applied; its inputs and the rendered config in the history Secret.
    assert_eq!(st.revisions.len(), 1, "{:#?}", st.revisions);
    let revision = &st.revisions[0];
    assert_eq!(revision.number, 1);
    assert_eq!(revision.reason, ichor_api::history::RevisionReason::Drift);
    assert!(!revision.changed_paths.is_empty());
    assert_eq!(Some(&revision.config_hash_after), st.config_hash.as_ref());
    let history = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .get(&ichor_reconcile::history::store::secret_name(&ns, "w-1"))
        .await
        .unwrap();
    let data = history
        .data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let record = ichor_reconcile::history::store::find(&data, 1)
        .unwrap()
        .unwrap();
    assert_eq!(record.rendered_config, expected);
    assert_eq!(record.machine_spec["hold"], false);
    assert_eq!(cond(&w1, types::DRIFTED).unwrap().reason, reasons::NO_DRIFT);
    assert!(
        cond(&w1, types::APPLIED)
            .unwrap()
            .message
            .contains("read back equals the render")
    );
    // An Event on the machine says what was applied.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    wait_for("an Applied Event on w-1", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(reasons::APPLIED)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w-1")
            })
        })
    })
    .await;

    // ADR 0016: the node now carries the appending patch; rendered over it,
    // the patch adds nothing again. Held again, w-1 shows no drift; released
    // again, nothing more is written.
    for hold in [true, false] {
        let m = machines
            .patch(
                "w-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"hold": hold}})),
            )
            .await
            .unwrap();
        let generation = m.metadata.generation;
        wait_for(
            &format!("w-1 to be reconciled with hold {hold}"),
            || async {
                machines.get("w-1").await.is_ok_and(|m| {
                    m.status
                        .as_ref()
                        .is_some_and(|s| s.observed_generation == generation)
                })
            },
        )
        .await;
        let w1 = machines.get("w-1").await.unwrap();
        let st = w1.status.clone().unwrap();
        assert!(st.drift.is_empty(), "hold {hold}: {:#?}", st.drift);
        assert_eq!(cond(&w1, types::DRIFTED).unwrap().reason, reasons::NO_DRIFT);
        assert_eq!(emu.writes().len(), 1, "hold {hold}: {:?}", emu.writes());
        assert_eq!(
            String::from_utf8(emu.active_config(1).unwrap()).unwrap(),
            expected
        );
    }
    let applied_config = |c: &str, path: &[&str]| {
        let docs = ichor_talos::config::MachineConfig::parse(c)
            .unwrap()
            .to_mappings()
            .unwrap();
        let mut v = serde_yaml_ng::Value::Mapping(docs[0].clone());
        for k in path {
            v = v.get(*k).cloned().unwrap_or(serde_yaml_ng::Value::Null);
        }
        v
    };
    assert_eq!(
        applied_config(&expected, &["machine", "time", "servers"]),
        serde_yaml_ng::Value::Sequence(vec!["time.cloudflare.com".into()])
    );
    assert_eq!(
        applied_config(&expected, &["machine", "certSANs"]),
        serde_yaml_ng::Value::Sequence(vec!["w-1.example.com".into()])
    );

    // Release w-2: its class C drift stays unapplied, with a condition that says why.
    let w2 = machines
        .patch(
            "w-2",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    let gen2 = w2.metadata.generation;
    wait_for("w-2 to be reconciled after its release", || async {
        machines.get("w-2").await.is_ok_and(|m| {
            m.status
                .as_ref()
                .is_some_and(|s| s.observed_generation == gen2)
                && cond(&m, types::APPLIED).is_some_and(|c| c.reason == reasons::UNSAFE_DRIFT)
        })
    })
    .await;
    let w2 = machines.get("w-2").await.unwrap();
    let applied = cond(&w2, types::APPLIED).unwrap();
    assert_eq!(applied.status, "False");
    assert!(
        applied.message.contains("machine.install"),
        "{}",
        applied.message
    );
    assert!(applied.message.contains("talosctl"), "{}", applied.message);
    assert_eq!(cond(&w2, types::HELD).unwrap().reason, reasons::RELEASED);
    assert_eq!(emu.writes().len(), 1, "{:?}", emu.writes());
    assert_eq!(
        String::from_utf8(emu.active_config(2).unwrap()).unwrap(),
        w_cfg
    );

    // The controller never wrote spec: spec and generation are what the test left.
    let before: Vec<TalosMachine> =
        futures_get(&machines, &specs.iter().map(|s| s.0).collect::<Vec<_>>()).await;
    running.stop().await.unwrap();
    let after: Vec<TalosMachine> =
        futures_get(&machines, &specs.iter().map(|s| s.0).collect::<Vec<_>>()).await;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.spec, b.spec);
        assert_eq!(a.metadata.generation, b.metadata.generation);
    }
    assert!(after[0].spec.hold);
    assert_eq!(
        after[0].metadata.generation,
        Some(1),
        "cp-1 was never edited"
    );
    assert_eq!(emu.writes().len(), 1);
    let fields = after[0].metadata.managed_fields.clone().unwrap_or_default();
    for f in fields
        .iter()
        .filter(|f| f.manager.as_deref() == Some(ichor_controller::FIELD_MANAGER))
    {
        assert_eq!(
            f.subresource.as_deref(),
            Some("status"),
            "the controller wrote outside status: {f:?}"
        );
    }
}

async fn futures_get(api: &Api<TalosMachine>, names: &[&str]) -> Vec<TalosMachine> {
    let mut out = Vec::new();
    for n in names {
        out.push(api.get(n).await.unwrap());
    }
    out
}

/// v1.12-shaped nodes: held machines show drift per path with classes and
/// nothing is written; releasing one hold writes only that node, in
/// no-reboot mode, and the read-back equals the render; class C stays
/// unapplied with a condition; spec and generation never change by the
/// controller's hand.
/// The apply becomes revision 1, its inputs kept in the history Secret.
/// Covers: R1.7a, R1.5e, R1.5f, R1.6, R16.1
#[tokio::test]
async fn v112_held_drift_then_release_applies_only_that_node() {
    scenario(&V112).await;
}

/// The same on v1.14-shaped (multi-document) nodes.
/// Covers: R1.7a, R1.5e, R1.5f, R1.6, R16.1
#[tokio::test]
async fn v114_held_drift_then_release_applies_only_that_node() {
    scenario(&V114).await;
}

/// Failures are conditions on the machine that name the object and say what
/// to do: no TalosCluster, no bundle Secret, an unreachable node. Nothing is
/// written to any node.
#[tokio::test]
async fn failures_become_conditions_that_say_what_to_do() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("tm-fail").await;
    crds(&client).await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns))
        .await
        .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    machines
        .create(
            &PostParams::default(),
            &machine(&ns, "down", "worker", "127.0.0.1:1", &[]),
        )
        .await
        .unwrap();
    let mut lost = machine(&ns, "lost", "worker", "127.0.0.1:1", &[]);
    lost.spec.cluster_ref.name = "nope".into();
    machines
        .create(&PostParams::default(), &lost)
        .await
        .unwrap();
    let running = start(client.clone(), config(&ns, &ns));
    let ready_reason = |name: &'static str, reason: &'static str| {
        let machines = machines.clone();
        async move {
            machines.get(name).await.is_ok_and(|m| {
                cond(&m, types::READY).is_some_and(|c| c.status == "False" && c.reason == reason)
            })
        }
    };
    wait_for("BundleUnavailable", || {
        ready_reason("down", reasons::BUNDLE_UNAVAILABLE)
    })
    .await;
    let m = machines.get("down").await.unwrap();
    let msg = &cond(&m, types::READY).unwrap().message;
    assert!(
        msg.contains("Secret bundle") && msg.contains("recreate"),
        "{msg}"
    );

    wait_for("ClusterNotFound", || {
        ready_reason("lost", reasons::CLUSTER_NOT_FOUND)
    })
    .await;
    let m = machines.get("lost").await.unwrap();
    let msg = &cond(&m, types::READY).unwrap().message;
    assert!(
        msg.contains("nope") && msg.contains("spec.clusterRef"),
        "{msg}"
    );

    bundle_secret(&client, &ns).await;
    wait_for("NodeUnreachable", || {
        ready_reason("down", reasons::NODE_UNREACHABLE)
    })
    .await;
    let m = machines.get("down").await.unwrap();
    let msg = &cond(&m, types::READY).unwrap().message;
    assert!(
        msg.contains("127.0.0.1:1") && msg.contains("spec.address"),
        "{msg}"
    );
    running.stop().await.unwrap();
}
