//! R6.1 against the real prune: a Cilium that Talos applied from an inline
//! manifest (the lab plays Talos's bootstrap-manifest apply, inventory and
//! annotations as Talos writes them) is taken over as Ichor's Helm release;
//! the inline entry leaves the config; then the manifests step of
//! `talosctl upgrade-k8s` — go-kubernetes's inventory-backed server-side apply
//! with prune (`tools/ssa-prune-peer`) — runs with the bootstrap manifests
//! that no longer hold Cilium. With the hand-over's inventory step Cilium
//! survives; with that step skipped (a switch of this test only) the same
//! program deletes it, which proves the test can fail.
//!
//! Real parts: kube-apiserver and etcd (RBAC judging the inventory step, done
//! as the controller with the grants of the install manifest), the real
//! Cilium chart rendered by the real helm v4, Ichor's Helm engine,
//! go-kubernetes `kubernetes/ssa`.

use std::collections::BTreeMap;
use std::process::Command;

use ichor_cilium::{
    ApplyOptions, CiliumOptions, ClusterSettings, KubeProxyMode, Renderer, Tunnel,
    effective_values, offline_chart,
};
use ichor_controller::bootstrap_inventory;
use ichor_lab::bootstrap_manifests;
use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, OWNING_INVENTORY_ANNOTATION,
};
use ichor_talos::config::MachineConfig;
use ichor_testenv::tools::require_cilium_chart;
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The other bootstrap manifest the control plane carries (Talos's own
/// bootstrap manifests are not played by the lab): it stays in the set the
/// manifests step applies, so that set is never empty.
const EXTRA: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: talos-extra\n  namespace: kube-system\ndata:\n  a: b\n";

/// A control plane's v1alpha1 config with `inline` as its inline manifests.
fn control_plane(inline: &[(&str, &str)]) -> MachineConfig {
    let manifests: Vec<Value> = inline
        .iter()
        .map(|(name, contents)| json!({"name": name, "contents": contents}))
        .collect();
    let doc = json!({
        "version": "v1alpha1",
        "machine": {"type": "controlplane"},
        "cluster": {"network": {"cni": {"name": "none"}}, "inlineManifests": manifests},
    });
    MachineConfig::parse(&serde_yaml_ng::to_string(&doc).unwrap()).expect("config parses")
}

fn inventory_keys(cm: &ConfigMap) -> Vec<String> {
    cm.data.clone().unwrap_or_default().into_keys().collect()
}

fn annotations(meta: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations.clone().unwrap_or_default()
}

/// Runs the peer with `manifests` (one multi-document YAML); its output lines.
fn upgrade_k8s_manifests_step(env: &TestEnv, manifests: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bootstrap-manifests.yaml");
    std::fs::write(&file, manifests).unwrap();
    let out = Command::new(Tool::SsaPrunePeer.path())
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg(&file)
        .output()
        .expect("run ssa-prune-peer");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The identity the installed controller runs as.
const CONTROLLER: &str = "system:serviceaccount:ichor-system:ichor-controller";

/// A client that is Ichor's controller: the rules of the install manifest
/// (cluster-wide and in ichor-system) bound to its ServiceAccount, and the API server's RBAC judging
/// every request made as it (impersonation).
async fn as_the_controller(env: &TestEnv, admin: &kube::Client) -> kube::Client {
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "ichor-controller"},
        "rules": ichor_adopt::install::controller_cluster_rules(),
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "ichor-controller"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ichor-controller"},
        "subjects": [{"kind": "ServiceAccount", "name": "ichor-controller", "namespace": "ichor-system"}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // Its rights in its own namespace (its Cilium release's records).
    let ns_role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "ichor-controller", "namespace": "ichor-system"},
        "rules": ichor_adopt::install::controller_namespace_rules(),
    }))
    .unwrap();
    let ns_binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ichor-controller", "namespace": "ichor-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ichor-controller"},
        "subjects": [{"kind": "ServiceAccount", "name": "ichor-controller", "namespace": "ichor-system"}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "ichor-system")
        .create(&PostParams::default(), &ns_role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "ichor-system")
        .create(&PostParams::default(), &ns_binding)
        .await
        .unwrap();
    let mut config = env.kube_config().await.unwrap();
    config.auth_info.impersonate = Some(CONTROLLER.into());
    kube::Client::try_from(config).unwrap()
}

/// The hand-over after init, with or without its inventory step, then the
/// real prune; returns the live Cilium DaemonSet afterwards and the peer's output.
async fn hand_over_then_prune(inventory_step: bool) -> (Option<DaemonSet>, String) {
    let env = TestEnv::start().expect("test control plane");
    let client = env.client().await;
    let settings = ClusterSettings::new(Tunnel::Vxlan, KubeProxyMode::Enabled, 1);
    let values = effective_values(&settings).unwrap();
    let chart = require_cilium_chart();

    // Init wrote Cilium inline, rendered from the pinned chart with the
    // release's effective values by the real helm; Talos applied it at boot.
    let home = tempfile::tempdir().unwrap();
    let mut renderer = Renderer::new(Tool::Helm4.path()).kubeconfig(env.kubeconfig_path());
    for k in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        renderer = renderer.env(k, home.path().join(k).display().to_string());
    }
    let cilium = renderer
        .render(
            "cilium",
            "kube-system",
            &offline_chart(&chart),
            &Value::Object(values.clone()),
        )
        .await
        .expect("helm renders the pinned chart")
        .manifest;
    let with_cilium = control_plane(&[("cilium", &cilium), ("extra", EXTRA)]);
    let played = bootstrap_manifests::apply(&client, &with_cilium)
        .await
        .expect("the lab plays Talos's bootstrap-manifest apply");
    assert!(played.found.is_empty(), "{played:?}");
    let inventory = Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
        .get(INVENTORY_NAME)
        .await
        .unwrap();
    let keys = inventory_keys(&inventory);
    assert!(
        keys.contains(&"kube-system_cilium_apps_DaemonSet".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"kube-system_talos-extra__ConfigMap".to_string()),
        "{keys:?}"
    );
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), "kube-system");
    let before = daemonsets.get("cilium").await.unwrap();
    assert_eq!(
        annotations(&before.metadata)
            .get(OWNING_INVENTORY_ANNOTATION)
            .map(String::as_str),
        Some(INVENTORY_NAME)
    );
    // A second play (Talos at the next boot) creates nothing.
    let again = bootstrap_manifests::apply(&client, &with_cilium)
        .await
        .unwrap();
    assert!(again.created.is_empty(), "{again:?}");

    // Step 1: Ichor's Helm release takes the objects over (record in
    // ichor-system, objects in kube-system), not recreating them.
    let mut opts = CiliumOptions::new(renderer).chart(offline_chart(&chart));
    opts.apply = ApplyOptions {
        wait: false,
        ..ApplyOptions::default()
    };
    ichor_cilium::ensure_namespace(&client, &opts.storage_namespace)
        .await
        .unwrap();
    ichor_cilium::apply_for_cluster(client.clone(), &opts, &settings)
        .await
        .expect("Ichor's release takes Cilium over");
    let taken = daemonsets.get("cilium").await.unwrap();
    assert_eq!(
        taken.metadata.uid, before.metadata.uid,
        "taken over, not recreated"
    );
    assert_eq!(
        annotations(&taken.metadata)["meta.helm.sh/release-name"],
        "cilium"
    );

    // Step 2: the inline entry leaves the control plane's config (the
    // machine controller's class B apply; here its result).
    let without_cilium = control_plane(&[("extra", EXTRA)]);

    // Step 3: the release's objects leave Talos's inventory, done as the
    // controller (its grants, judged by the API server).
    if inventory_step {
        let admin = client.clone();
        let client = as_the_controller(&env, &admin).await;
        let release = ichor_cilium::deployed_release(client.clone(), &opts.storage_namespace)
            .await
            .unwrap()
            .expect("a deployed release");
        let objects =
            bootstrap_inventory::release_objects(&release.manifest, &opts.release_namespace)
                .unwrap();
        let cm = bootstrap_inventory::read(&client).await.unwrap().unwrap();
        let step = bootstrap_inventory::decide(&objects, cm.data.as_ref())
            .expect("the inventory names the release's objects");
        bootstrap_inventory::release(&client, &cm, &step)
            .await
            .unwrap();
        // Idempotent: run again, nothing is left to do.
        let cm = bootstrap_inventory::read(&client).await.unwrap().unwrap();
        assert_eq!(
            bootstrap_inventory::decide(&objects, cm.data.as_ref()),
            None
        );
        assert_eq!(inventory_keys(&cm), ["kube-system_talos-extra__ConfigMap"]);
        let stripped = daemonsets.get("cilium").await.unwrap();
        assert!(
            !annotations(&stripped.metadata).contains_key(OWNING_INVENTORY_ANNOTATION),
            "{:?}",
            stripped.metadata.annotations
        );
        // The objects the controller may not write keep the annotation: a
        // role it does not hold cannot be updated by it at all.
        let role = Api::<ClusterRole>::all(admin.clone())
            .get("cilium")
            .await
            .unwrap();
        assert!(annotations(&role.metadata).contains_key(OWNING_INVENTORY_ANNOTATION));
        let refused = Api::<ClusterRole>::all(client.clone())
            .patch(
                "cilium",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({"metadata": {"annotations": {"a": "b"}}})),
            )
            .await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
            "{refused:?}"
        );
    }

    // `talosctl upgrade-k8s`'s manifests step with the manifests of the
    // config as it now is.
    let plan = bootstrap_manifests::plan(&without_cilium).unwrap();
    let (ok, output) =
        upgrade_k8s_manifests_step(&env, &bootstrap_manifests::manifest_documents(&plan));
    assert!(ok, "the manifests step failed: {output}");
    let extra = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("talos-extra")
        .await
        .unwrap();
    assert!(extra.is_some(), "Talos's own manifest stays: {output}");
    let ds = daemonsets
        .get_opt("cilium")
        .await
        .unwrap()
        .filter(|d| d.metadata.deletion_timestamp.is_none());
    env.stop();
    (ds, output)
}

/// After Ichor's hand-over (release, inline entry gone, inventory step), the
/// real prune of `talosctl upgrade-k8s` leaves Cilium in place.
/// Covers: R6.1, R10.4
#[tokio::test]
async fn after_the_hand_over_the_real_prune_leaves_cilium_in_place() {
    let (ds, output) = hand_over_then_prune(true).await;
    assert!(ds.is_some(), "Cilium was pruned: {output}");
    assert!(!output.contains("deleted"), "{output}");
}

/// With the inventory step skipped, the same program deletes Cilium: the
/// test above can fail.
/// Covers: R6.1
#[tokio::test]
async fn without_the_inventory_step_the_real_prune_deletes_cilium() {
    let (ds, output) = hand_over_then_prune(false).await;
    assert!(
        ds.is_none(),
        "Cilium survived without the inventory step: {output}"
    );
    assert!(output.contains("DaemonSet"), "{output}");
}
