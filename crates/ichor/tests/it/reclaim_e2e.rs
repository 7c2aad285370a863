//! `ichor reclaim` end to end on the lab: a cluster adopted by the real
//! `ichor adopt` (its Cilium installed as Ichor's Helm release, Ichor
//! installed and running as its Deployment's pod), then reclaimed by the real
//! `ichor reclaim`; judged by the real helm (v3 and v4) and the real talosctl
//! against the emulated nodes, whose write log says no node was written to.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor_api::{IchorInstallation, TalosCluster, TalosMachine};
use ichor_lab::LabCni;
use ichor_testenv::Tool;
use ichor_testenv::tools::repo_root;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

use crate::common::{LabHarness, NS, run, text};

/// Every node's active config, to compare before and after.
fn configs(h: &LabHarness) -> Vec<Option<Vec<u8>>> {
    (0..h.lab.hostnames.len())
        .map(|i| h.lab.emulator.active_config(i))
        .collect()
}

/// `ichor reclaim --yes` against the lab.
fn reclaim(h: &LabHarness, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = h.ichor();
    cmd.args(["reclaim", "--yes", "--kubeconfig"])
        .arg(&h.lab.kubeconfig)
        .arg("--output-dir")
        .arg(out)
        .args(extra);
    cmd
}

/// Runs reclaim and SIGKILLs it as soon as it prints `line`.
fn reclaim_killed_after(h: &LabHarness, out: &Path, extra: &[&str], line: &str) -> String {
    let mut child = reclaim(h, out, extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = String::new();
    for l in BufReader::new(stderr).lines() {
        let l = l.unwrap();
        seen.push_str(&l);
        seen.push('\n');
        if l.contains(line) {
            child.kill().unwrap();
            break;
        }
    }
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "reclaim should have been killed at {line:?}:\n{seen}"
    );
    seen
}

fn adopt(h: &LabHarness, extra: &[&str]) {
    let out = run(h.adopt(extra));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
}

/// The releases `helm list` shows in `namespace`, as JSON.
fn helm_list(h: &LabHarness, tool: Tool, namespace: &str) -> serde_json::Value {
    let out = h.helm(tool, &["list", "--namespace", namespace, "-o", "json"]);
    assert!(out.status.success(), "helm list: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Cilium is a deployed release `cilium` of `namespace` for helm `tool`,
/// and `helm get values` reads its values (Ichor's tunnel among them).
fn assert_helm_manages_cilium(h: &LabHarness, tool: Tool, namespace: &str) {
    let releases = helm_list(h, tool, namespace);
    let cilium = releases
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "cilium")
        .unwrap_or_else(|| panic!("{tool:?}: no cilium in helm -n {namespace} list: {releases}"));
    assert_eq!(cilium["status"], "deployed", "{releases}");
    assert_eq!(cilium["namespace"], "kube-system", "{releases}");
    let values = h.helm(
        tool,
        &[
            "get",
            "values",
            "cilium",
            "--namespace",
            namespace,
            "-o",
            "json",
        ],
    );
    assert!(values.status.success(), "{tool:?}: {}", text(&values));
    let values: serde_json::Value = serde_json::from_slice(&values.stdout).unwrap();
    assert_eq!(values["tunnelProtocol"], "vxlan", "{values}");
}

/// The real talosctl, with the talosconfig reclaim wrote and nothing else
/// (its endpoints and nodes as written), reads every node's version and
/// (os:admin only) node 0's machine config through the emulator.
fn assert_talosctl_takes_over(h: &LabHarness, talosconfig: &Path) {
    let node = h.lab.addresses[0].to_string();
    for args in [
        vec!["version"],
        vec!["-n", &node, "get", "machineconfig", "-o", "yaml"],
    ] {
        let out = Command::new(Tool::Talosctl.path())
            .arg("--talosconfig")
            .arg(talosconfig)
            .args(&args)
            .env_remove("TALOSCONFIG")
            .env("HOME", h.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "talosctl {args:?}: {}", text(&out));
        if args == ["version"] {
            for address in &h.lab.addresses {
                assert!(
                    text(&out).contains(&address.to_string()),
                    "every node answers: {}",
                    text(&out)
                );
            }
        }
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The bundle reclaim wrote is the lab's bundle, and the talosconfig is
/// made from it; both 0600.
fn assert_files(h: &LabHarness, out: &Path) -> PathBuf {
    let dir = out.join("lab");
    let bundle = dir.join("secrets.yaml");
    let talosconfig = dir.join("talosconfig");
    assert_eq!(mode(&bundle), 0o600);
    assert_eq!(mode(&talosconfig), 0o600);
    let written = ichor_talos::secrets::SecretsBundle::from_file(&bundle).unwrap();
    let lab = ichor_talos::secrets::SecretsBundle::from_file(&h.lab.bundle).unwrap();
    assert_eq!(written.to_yaml().unwrap(), lab.to_yaml().unwrap());
    let objects = std::fs::read_to_string(dir.join("ichor-objects.yaml")).unwrap();
    assert!(objects.contains("kind: TalosCluster"), "{objects}");
    assert!(objects.contains("kind: TalosMachine"), "{objects}");
    talosconfig
}

async fn crds(h: &LabHarness) -> usize {
    Api::<CustomResourceDefinition>::all(h.client().await)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.spec.group == ichor_api::GROUP)
        .count()
}

/// Ichor's cluster objects are gone (their CRDs may stay).
async fn assert_cluster_objects_gone(h: &LabHarness) {
    let client = h.client().await;
    if crds(h).await > 0 {
        assert!(
            Api::<TalosCluster>::all(client.clone())
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert!(
            Api::<TalosMachine>::all(client.clone())
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
    assert!(
        Api::<Secret>::namespaced(client, NS)
            .get_opt("lab-talos-secrets")
            .await
            .unwrap()
            .is_none(),
        "the bundle Secret is gone (it is on disk)"
    );
}

/// What `ichor adopt` installed is gone.
async fn assert_ichor_uninstalled(h: &LabHarness) {
    let client = h.client().await;
    assert!(
        Api::<Deployment>::namespaced(client.clone(), NS)
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .get_opt(ichor_adopt::install::WEBHOOK_CONFIGURATION)
            .await
            .unwrap()
            .is_none()
    );
    if crds(h).await > 0 {
        assert!(
            Api::<IchorInstallation>::all(client)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
}

/// Covers: R10.5, R6.2
///
/// Adopted by the real `ichor adopt`, then reclaimed: the nodes' configs are
/// byte-identical and the emulator took no write; Cilium is a plain Helm
/// release of kube-system for helm v3 and v4 (`list`, `get values`, and a
/// v4 `upgrade` that applies server-side as helm without a conflict);
/// Ichor's objects and install are gone, its CRDs kept; the bundle and
/// talosconfig written (0600) let the real talosctl read the nodes. A rerun
/// finds nothing to do.
#[tokio::test(flavor = "multi_thread")]
async fn reclaim_hands_the_cluster_to_talosctl_and_helm_without_touching_a_node() {
    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let before = configs(&h);
    let writes_before = h.lab.emulator.writes().len();
    let out_dir = h.dir.path().join("reclaimed");
    // No finalizer of the controller's but a released machine's membership
    // one, which reclaim drops (so deleting them runs nothing on a node).
    let client = h.client().await;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(machines.items.len(), 2);
    let cluster = Api::<TalosCluster>::namespaced(client, NS)
        .get("lab")
        .await
        .unwrap();
    for finalizers in machines
        .items
        .iter()
        .map(|m| &m.metadata.finalizers)
        .chain([&cluster.metadata.finalizers])
    {
        assert!(
            finalizers
                .as_deref()
                .unwrap_or_default()
                .iter()
                .all(|f| f == ichor_api::machine::MEMBERSHIP_FINALIZER),
            "{finalizers:?}"
        );
    }

    let plan = run(reclaim(&h, &out_dir, &["-o", "json"]));
    assert!(plan.status.success(), "{}", text(&plan));
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan["cilium"]["action"], "handBack", "{plan}");
    assert_eq!(plan["ichor"]["action"], "uninstall", "{plan}");
    assert!(!out_dir.exists(), "the plan alone writes nothing");

    let out = run(reclaim(&h, &out_dir, &[]));
    let said = text(&out);
    assert!(
        out.status.success(),
        "reclaim failed:\n{said}\n{}",
        h.logs()
    );
    let order = [
        "Ichor will leave this cluster",
        "wrote the secrets bundle and talosconfig of TalosCluster ichor-system/lab",
        "held every TalosMachine",
        "deleted TalosCluster ichor-system/lab, its 2 TalosMachines",
        "handed Cilium back",
        "uninstalled Ichor",
        "kept Ichor's CRDs",
        "reclaimed: Ichor holds nothing in this cluster any more",
        "  helm -n kube-system list",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|s| {
            said.find(s)
                .unwrap_or_else(|| panic!("{s:?} missing:\n{said}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "out of order:\n{said}"
    );

    assert_eq!(configs(&h), before, "the nodes' configs are byte-identical");
    assert_eq!(
        h.lab.emulator.writes().len(),
        writes_before,
        "no node took a write during reclaim: {:?}",
        h.lab.emulator.writes()
    );
    for tool in [Tool::Helm3, Tool::Helm4] {
        assert_helm_manages_cilium(&h, tool, "kube-system");
        let in_ichors = helm_list(&h, tool, NS);
        assert_eq!(in_ichors, serde_json::json!([]), "no record left in {NS}");
    }
    assert_cluster_objects_gone(&h).await;
    assert_ichor_uninstalled(&h).await;
    assert_eq!(
        crds(&h).await,
        ichor_api::crds::all().len(),
        "the CRDs are kept by default"
    );
    let talosconfig = assert_files(&h, &out_dir);
    assert_talosctl_takes_over(&h, &talosconfig);

    // helm v4 upgrades server-side as `helm`: the fields Ichor applied are helm's now.
    let chart = h.cilium_chart().to_str().unwrap().to_string();
    let upgrade = h.helm(
        Tool::Helm4,
        &[
            "upgrade",
            "cilium",
            &chart,
            "--namespace",
            "kube-system",
            "--reuse-values",
            "--set",
            "hubble.enabled=false",
        ],
    );
    assert!(upgrade.status.success(), "helm upgrade: {}", text(&upgrade));
    let history = h.helm(
        Tool::Helm3,
        &[
            "history",
            "cilium",
            "--namespace",
            "kube-system",
            "-o",
            "json",
        ],
    );
    assert!(history.status.success(), "{}", text(&history));
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(
        history.as_array().unwrap().last().unwrap()["status"],
        "deployed",
        "{history}"
    );

    let again = run(reclaim(&h, &out_dir, &[]));
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("nothing to reclaim"),
        "{}",
        text(&again)
    );
    assert_eq!(configs(&h), before);
}

/// Covers: R10.5
///
/// Reclaim SIGKILLed after its files phase, after it deleted the cluster
/// objects, and after it handed Cilium back; each rerun goes on and the last
/// finishes (the files already written are kept, the deletes accept what is
/// gone, the records already moved are not moved twice). With --delete-crds
/// Ichor's CRDs are gone. No node is written to.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_reclaim_is_finished_by_a_rerun_and_deletes_the_crds_when_asked() {
    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let before = configs(&h);
    let writes_before = h.lab.emulator.writes().len();
    let out_dir = h.dir.path().join("reclaimed");
    let flags = ["--delete-crds"];

    reclaim_killed_after(&h, &out_dir, &flags, "wrote the secrets bundle");
    assert!(out_dir.join("lab/secrets.yaml").exists());
    reclaim_killed_after(
        &h,
        &out_dir,
        &flags,
        "deleted TalosCluster ichor-system/lab, its 2 TalosMachines",
    );
    reclaim_killed_after(&h, &out_dir, &flags, "handed Cilium back");
    let out = run(reclaim(&h, &out_dir, &flags));
    let said = text(&out);
    assert!(out.status.success(), "the rerun:\n{said}\n{}", h.logs());
    assert!(said.contains("deleted Ichor's CRDs"), "{said}");

    assert_eq!(configs(&h), before);
    assert_eq!(h.lab.emulator.writes().len(), writes_before);
    for tool in [Tool::Helm3, Tool::Helm4] {
        assert_helm_manages_cilium(&h, tool, "kube-system");
    }
    assert_eq!(crds(&h).await, 0, "--delete-crds deleted them");
    assert_cluster_objects_gone(&h).await;
    assert_ichor_uninstalled(&h).await;
    let talosconfig = assert_files(&h, &out_dir);
    assert_talosctl_takes_over(&h, &talosconfig);
}

/// Covers: R10.5
///
/// A reclaim killed between copying Cilium's records to kube-system and
/// deleting Ichor's leaves both (made here as the copy leaves them); the
/// rerun finds the copies equal and finishes. With --keep-cilium-record
/// instead, the records stay in ichor-system, helm -n ichor-system manages
/// Cilium, and the namespace stays.
#[tokio::test(flavor = "multi_thread")]
async fn records_left_in_both_namespaces_are_joined_and_keep_cilium_record_leaves_them() {
    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let client = h.client().await;
    let ichors = ichor_helm::SecretStorage::new(client.clone(), NS);
    let plain = ichor_helm::SecretStorage::new(client.clone(), "kube-system");
    for stored in ichors.history("cilium").await.unwrap() {
        plain.create(&stored.release).await.unwrap();
    }
    let out_dir = h.dir.path().join("reclaimed");
    let out = run(reclaim(&h, &out_dir, &[]));
    assert!(out.status.success(), "{}\n{}", text(&out), h.logs());
    assert_helm_manages_cilium(&h, Tool::Helm4, "kube-system");
    assert!(ichors.history("cilium").await.unwrap().is_empty());
    drop(h);

    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let out_dir = h.dir.path().join("reclaimed");
    let out = run(reclaim(&h, &out_dir, &["--keep-cilium-record"]));
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    assert!(
        said.contains("stay in ichor-system (--keep-cilium-record)"),
        "{said}"
    );
    assert!(said.contains("  helm -n ichor-system list"), "{said}");
    for tool in [Tool::Helm3, Tool::Helm4] {
        assert_helm_manages_cilium(&h, tool, NS);
        assert_eq!(helm_list(&h, tool, "kube-system"), serde_json::json!([]));
    }
    assert_cluster_objects_gone(&h).await;
    assert_ichor_uninstalled(&h).await;
    assert_eq!(crds(&h).await, ichor_api::crds::all().len());
}

/// A different file where reclaim writes is refused, and nothing is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_different_file_in_the_output_dir_is_refused_with_nothing_deleted() {
    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let out_dir = h.dir.path().join("reclaimed");
    std::fs::create_dir_all(out_dir.join("lab")).unwrap();
    std::fs::write(out_dir.join("lab/secrets.yaml"), "someone else's\n").unwrap();
    let out = run(reclaim(&h, &out_dir, &[]));
    assert!(!out.status.success());
    assert!(
        text(&out).contains("refusing to overwrite it"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("nothing was deleted"), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("lab/secrets.yaml")).unwrap(),
        "someone else's\n"
    );
    assert!(
        Api::<TalosCluster>::namespaced(h.client().await, NS)
            .get_opt("lab")
            .await
            .unwrap()
            .is_some()
    );
}

/// `helm package` of dist/chart with helm v4.
fn package_chart(h: &LabHarness) -> PathBuf {
    let dest = h.dir.path().join("chart");
    let out = Command::new(Tool::Helm4.path())
        .env("HELM_CACHE_HOME", h.dir.path().join("pkg/cache"))
        .env("HELM_CONFIG_HOME", h.dir.path().join("pkg/config"))
        .env("HELM_DATA_HOME", h.dir.path().join("pkg/data"))
        .arg("package")
        .arg(repo_root().join("dist/chart"))
        .arg("--destination")
        .arg(&dest)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm package: {}", text(&out));
    std::fs::read_dir(&dest)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .unwrap()
}

/// Covers: R10.5, R4.6b
///
/// On a Helm-installed Ichor reclaim removes the cluster objects, touches
/// nothing of the chart, and prints the exact `helm uninstall` command; the
/// real helm runs that command, and nothing of the chart's is left running.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_helm_install_reclaim_prints_the_helm_uninstall_command() {
    let h = LabHarness::up(|o| o.cni = LabCni::Cilium).await;
    let archive = package_chart(&h);
    let out = h.helm(
        Tool::Helm3,
        &[
            "install",
            "ichor",
            archive.to_str().unwrap(),
            "--namespace",
            NS,
            "--create-namespace",
        ],
    );
    assert!(out.status.success(), "helm install: {}", text(&out));
    adopt(&h, &["--cni-unmanaged"]);
    let before = configs(&h);
    let out_dir = h.dir.path().join("reclaimed");
    let out = run(reclaim(&h, &out_dir, &["--delete-crds"]));
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    let command = "helm uninstall ichor --namespace ichor-system";
    assert!(
        said.contains(&format!("Uninstall it with: {command}")),
        "{said}"
    );
    assert!(said.contains("kubectl delete crd "), "{said}");
    assert_eq!(configs(&h), before);
    assert!(h.lab.emulator.writes().is_empty());
    assert_cluster_objects_gone(&h).await;
    assert!(
        Api::<Deployment>::namespaced(h.client().await, NS)
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .is_some(),
        "the chart's controller is the chart's to remove"
    );
    assert_eq!(
        crds(&h).await,
        ichor_api::crds::all().len(),
        "on Helm the CRDs are the chart's"
    );
    let words: Vec<&str> = command.split(' ').skip(1).collect();
    let out = h.helm(Tool::Helm4, &words);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(helm_list(&h, Tool::Helm4, NS), serde_json::json!([]));
    let talosconfig = assert_files(&h, &out_dir);
    assert_talosctl_takes_over(&h, &talosconfig);
}

/// Covers: R10.5
///
/// The way out works when Ichor's controller does not run: its webhooks
/// cannot answer (failurePolicy Fail), so the machines cannot be held, and
/// need not be — nothing can write to a node. Reclaim says so and finishes.
#[tokio::test(flavor = "multi_thread")]
async fn reclaim_finishes_when_ichors_controller_does_not_run() {
    let h = LabHarness::up(|_| {}).await;
    adopt(&h, &[]);
    let before = configs(&h);
    let client = h.client().await;
    Api::<Deployment>::namespaced(client.clone(), NS)
        .patch(
            "ichor-controller",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, NS);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(90);
    while !pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=ichor-controller"))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller's pod did not stop"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let out_dir = h.dir.path().join("reclaimed");
    let out = run(reclaim(&h, &out_dir, &[]));
    let said = text(&out);
    assert!(out.status.success(), "{said}\n{}", h.logs());
    assert!(
        said.contains("Ichor's controller is not running, so nothing can write to a node"),
        "{said}"
    );
    assert_eq!(configs(&h), before);
    assert!(h.lab.emulator.writes().is_empty());
    assert_cluster_objects_gone(&h).await;
    assert_ichor_uninstalled(&h).await;
    assert_helm_manages_cilium(&h, Tool::Helm3, "kube-system");
}
