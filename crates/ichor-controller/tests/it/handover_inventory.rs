//! The CNI hand-over after init, by the controller itself (R6.1, R10.4): a
//! control plane (an `ichor-talemu` node) carries Cilium as an inline
//! manifest, which the lab's play of Talos's bootstrap-manifest apply created
//! and recorded in Talos's inventory; Ichor's release takes the objects over;
//! the running controller removes the inline entry from the node's config
//! (its class B apply) and clears the inventory, and only then says
//! `CNIHandover=True`. Then the manifests step of `talosctl upgrade-k8s`
//! (go-kubernetes's real prune, `tools/ssa-prune-peer`) leaves Cilium in
//! place. In both config shapes.

use crate::common::*;
use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_lab::bootstrap_manifests;
use ichor_talemu::{NodeSpec, WriteAction};
use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, OWNING_INVENTORY_ANNOTATION,
};
use ichor_talos::config::MachineConfig;
use ichor_testenv::wait::{self, Seen};
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Another inline manifest of the control plane: Talos's, it stays.
const EXTRA: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: talos-extra\n  namespace: kube-system\ndata:\n  a: b\n";

fn cluster(ns: &str, talos: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": talos, "kubernetesVersion": "v1.28.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap()
}

/// `config` with inline manifests `inline` added, in the config's shape.
fn with_inline(config: &str, multidoc: bool, inline: &[(&str, &str)]) -> String {
    let mut docs: Vec<serde_yaml_ng::Value> = serde_yaml_ng::Deserializer::from_str(config)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_yaml_ng::Value| !v.is_null())
        .collect();
    for (name, contents) in inline {
        if multidoc {
            docs.push(
                serde_yaml_ng::to_value(json!({
                    "apiVersion": "v1alpha1", "kind": "KubeInlineManifestConfig",
                    "name": name, "manifest": contents,
                }))
                .unwrap(),
            );
        } else {
            let v1 = docs
                .iter_mut()
                .find(|d| d.get("version").and_then(|v| v.as_str()) == Some("v1alpha1"))
                .expect("a v1alpha1 document");
            let cluster = v1
                .as_mapping_mut()
                .unwrap()
                .entry("cluster".into())
                .or_insert_with(|| serde_yaml_ng::Value::Mapping(Default::default()));
            let list = cluster
                .as_mapping_mut()
                .unwrap()
                .entry("inlineManifests".into())
                .or_insert_with(|| serde_yaml_ng::Value::Sequence(Vec::new()));
            list.as_sequence_mut().unwrap().push(
                serde_yaml_ng::to_value(json!({"name": name, "contents": contents})).unwrap(),
            );
        }
    }
    docs.iter()
        .map(|d| serde_yaml_ng::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

async fn scenario(name: &str, talos: &str, fixture: &str, multidoc: bool) {
    // Its own API server: Talos's inventory is one ConfigMap per cluster, and
    // the peer's prune reads all of it, so two shapes on one API server would
    // prune each other's objects.
    let env = TestEnv::start().expect("test control plane");
    let client = env.client().await;
    let ns = env.namespace(&format!("r61-{name}")).await;
    let rel = env.namespace(&format!("r61-{name}-kube")).await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;

    // Init wrote Cilium inline (rendered by the real helm from the chart
    // with the release's effective values); Talos applied it at boot.
    let cluster = cluster(&ns, talos);
    let settings = ichor_cilium::ClusterSettings::from_cluster(&cluster, 1).unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut renderer =
        ichor_cilium::Renderer::new(Tool::Helm4.path()).kubeconfig(env.kubeconfig_path());
    for k in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        renderer = renderer.env(k, home.path().join(k).display().to_string());
    }
    let cilium = renderer
        .render(
            "cilium",
            &rel,
            &ichor_cilium::offline_chart(ichor_cilium::standin_chart_dir()),
            &serde_json::Value::Object(ichor_cilium::effective_values(&settings).unwrap()),
        )
        .await
        .unwrap()
        .manifest;
    let node_config = with_inline(
        &ichor_testenv::fixtures::cni_none(fixture),
        multidoc,
        &[("cilium", &cilium), ("extra", EXTRA)],
    );
    let played = bootstrap_manifests::apply(&client, &MachineConfig::parse(&node_config).unwrap())
        .await
        .unwrap();
    assert!(!played.created.is_empty());
    let ds_key = format!("{rel}_cilium_apps_DaemonSet");
    let inventories = Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE);
    let keys = |cm: ConfigMap| cm.data.unwrap_or_default().into_keys().collect::<Vec<_>>();
    assert!(keys(inventories.get(INVENTORY_NAME).await.unwrap()).contains(&ds_key));

    let emu = emulator(vec![
        NodeSpec::new("cp-1", node_config.clone()).with_version(talos),
    ])
    .await;
    // No Node registers: the effective values count the TalosMachines then.
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    let written = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let machine: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "cp-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "base"}, "role": "controlplane", "address": emu.endpoint(0), "hold": false}
    }))
    .unwrap();
    Api::<TalosMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();

    // Step 1: Ichor's release takes the objects over (the ichor-cni Job's
    // apply; here the same function), then the controller runs.
    seed_cilium(&client, &written, 1, &ns, &rel).await;
    let running = start(client.clone(), config(&ns, &rel));
    mark_daemonset_ready(&client, &rel).await;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    wait::until("CNIHandover=True", WAIT, POLL, || async {
        let c = clusters.get("base").await.unwrap();
        if c.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER))
        {
            return Seen::Done(());
        }
        let machine = machines.get("cp-1").await.unwrap().status;
        Seen::not_yet(format!("cluster {:#?}\nmachine {machine:#?}", c.status))
    })
    .await
    .unwrap();
    let handed = clusters.get("base").await.unwrap();
    let message = conditions::find(&handed.status.unwrap().conditions, types::CNI_HANDOVER)
        .unwrap()
        .message
        .clone();

    // All three hold at True: the inline entry is gone from the node's
    // config (one apply, by the controller), Talos's inventory names none of
    // the release's objects, the annotation is stripped.
    let live = String::from_utf8(emu.active_config(0).unwrap()).unwrap();
    let live_names: Vec<String> = MachineConfig::parse(&live)
        .unwrap()
        .facts()
        .inline_manifests
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(live_names, ["extra"], "{message}");
    let applies = emu
        .writes()
        .iter()
        .filter(|w| matches!(w.action, WriteAction::ApplyConfiguration { .. }))
        .count();
    assert_eq!(applies, 1, "{:?}", emu.writes());
    let left = keys(inventories.get(INVENTORY_NAME).await.unwrap());
    assert!(
        left.iter().all(|k| !k.starts_with(&format!("{rel}_"))),
        "{left:?}"
    );
    assert!(
        left.contains(&"kube-system_talos-extra__ConfigMap".to_string()),
        "{left:?}"
    );
    let ds = Api::<DaemonSet>::namespaced(client.clone(), &rel)
        .get("cilium")
        .await
        .unwrap();
    assert!(
        !ds.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(OWNING_INVENTORY_ANNOTATION)
    );
    // An Event on the TalosCluster says what left Talos's inventory.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns);
    wait_for("an InventoryReleased Event on the TalosCluster", || async {
        events.list(&Default::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(ichor_controller::cluster::INVENTORY_RELEASED)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("base")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains(INVENTORY_NAME))
            })
        })
    })
    .await;
    running.stop().await.unwrap();

    // `talosctl upgrade-k8s`'s manifests step with the node's manifests now.
    let plan = bootstrap_manifests::plan(&MachineConfig::parse(&live).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("manifests.yaml");
    std::fs::write(&file, bootstrap_manifests::manifest_documents(&plan)).unwrap();
    let out = std::process::Command::new(Tool::SsaPrunePeer.path())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("deleted"), "{text}");
    assert!(
        Api::<DaemonSet>::namespaced(client.clone(), &rel)
            .get_opt("cilium")
            .await
            .unwrap()
            .is_some_and(|d| d.metadata.deletion_timestamp.is_none()),
        "{text}"
    );
    emu.shutdown().await;
}

/// Covers: R6.1, R10.4 (v1alpha1 shape: `cluster.inlineManifests`)
#[tokio::test]
async fn v112_the_controller_hands_over_an_inline_cilium_that_talos_cannot_prune() {
    scenario("v112", "v1.12.1", "v1.12-cni-none-controlplane.yaml", false).await;
}

/// Covers: R6.1, R10.4 (v1.14 shape: `KubeInlineManifestConfig`)
#[tokio::test]
async fn v114_the_controller_hands_over_an_inline_cilium_that_talos_cannot_prune() {
    scenario("v114", "v1.14.0", "v1.14-cni-none-controlplane.yaml", true).await;
}
