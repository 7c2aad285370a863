//! `ichor machine history|diff|rollback`, the binary, against the real test
//! API server. No controller runs: the machine's status and its history
//! Secret are written here as the controller writes them; the CLI reads
//! them as the admin and as a user who may read and update TalosMachines
//! but not Secrets, refuses with nothing written, and writes a rollback.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use ichor_api::history::{
    ChangedBy, MachineRevision, RevisionApplyMode, RevisionOutcome, RevisionReason,
};
use ichor_api::{SYSTEM_NAMESPACE, TalosCluster, TalosMachine};
use ichor_reconcile::history::rollback::{ROLLBACK_OF_ANNOTATION, RollbackMark};
use ichor_reconcile::history::store::{self, RevisionRecord};
use ichor_testenv::{TestEnv, install};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const MARK: &str = "HISTORYCLIMARK";
/// A user the API server's RBAC lets read and update TalosMachines and
/// TalosClusters, and nothing else.
const READER: &str = "history-cli-reader";

async fn ichor(kubeconfig: &Path, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("ichor answered within 60s")
        .expect("ichor runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The test API server's kubeconfig, acting as `user` (the admin
/// impersonates it).
fn kubeconfig_as(env: &TestEnv, user: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let mut kc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    kc["users"][0]["user"]["as"] = serde_yaml_ng::Value::String(user.to_owned());
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, serde_yaml_ng::to_string(&kc).unwrap()).unwrap();
    path
}

async fn grant_reader(client: &kube::Client) {
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": READER},
        "rules": [{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines", "talosclusters"],
            "verbs": ["get", "list", "watch", "update", "patch"]}]
    }))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": READER}]
    }))
    .unwrap();
    let pp = PostParams::default();
    let _ = Api::<ClusterRole>::all(client.clone())
        .create(&pp, &role)
        .await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await;
}

/// A rendered config: a public value and a secret one that change, and
/// from the second on a path the first lacks.
fn config(sysctl: u32, token: &str) -> String {
    let added = if sysctl > 100 {
        "    vm.added: \"1\"\n"
    } else {
        ""
    };
    format!(
        "version: v1alpha1\nmachine:\n  type: worker\n  token: {MARK}-{token}\n  sysctls:\n    net.core.somaxconn: \"{sysctl}\"\n{added}"
    )
}

fn revision(number: u64, user: &str, paths: &[&str]) -> MachineRevision {
    MachineRevision {
        number,
        time: Time(
            k8s_openapi::jiff::Timestamp::from_second(1_796_198_400 + number as i64).unwrap(),
        ),
        config_hash_before: (number > 1).then(|| format!("sha256:{:064}", number - 1)),
        config_hash_after: format!("sha256:{number:064}"),
        apply_mode: RevisionApplyMode::NoReboot,
        reason: RevisionReason::Drift,
        operation: None,
        rollback_of: None,
        machine_generation: Some(number as i64),
        cluster_generation: Some(1),
        changed_by: Some(ChangedBy {
            user: user.to_owned(),
            at: "2026-12-02T07:00:00Z".to_owned(),
        }),
        changed_paths: paths.iter().map(|p| p.to_string()).collect(),
        outcome: RevisionOutcome::Applied,
    }
}

fn patches(n: usize) -> serde_json::Value {
    json!((1..=n)
        .map(|i| json!({"name": format!("p{i}"), "inline": format!("machine:\n  sysctls:\n    k{i}: \"{i}\"\n")}))
        .collect::<Vec<_>>())
}

/// Covers: R16.6, R16.7
#[tokio::test(flavor = "multi_thread")]
async fn history_diff_and_rollback_read_status_and_the_history_secret_and_refuse_with_nothing_written()
 {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("history-cli").await;
    install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let system: Namespace =
        serde_json::from_value(json!({"metadata": {"name": SYSTEM_NAMESPACE}})).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &system)
        .await;
    grant_reader(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = env.kubeconfig_path().to_path_buf();
    let reader = kubeconfig_as(env, READER, dir.path());

    // A cluster and a machine two applies have gone through: revision 1
    // (one patch, by alice) and revision 2 (two patches, by bob).
    let cluster_spec = json!({"endpoint": "https://127.0.0.1:6443", "talosVersion": "v1.13.9",
        "kubernetesVersion": "v1.36.0",
        "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
        "cni": {"preset": "cilium", "kubeProxy": "enabled"}, "secretsRef": {"name": "bundle"}});
    let cluster: TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "lab"}, "spec": cluster_spec}))
    .unwrap();
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let machine_spec = |n: usize| {
        json!({"clusterRef": {"name": "lab"}, "role": "worker", "address": "10.5.0.2",
            "hold": false, "patches": patches(n)})
    };
    let machine: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "w-1"}, "spec": machine_spec(2)}))
    .unwrap();
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let kept = vec![
        revision(1, "alice", &["machine.sysctls.k1"]),
        revision(2, "bob", &["machine.sysctls.k2", "machine.token"]),
    ];
    machines
        .patch_status(
            "w-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"revisions": kept}})),
        )
        .await
        .unwrap();
    let mut data = BTreeMap::new();
    // As the controller records it: the spec as stored, defaults and all.
    let stored = clusters.get("lab").await.unwrap();
    let mut cluster_then = serde_json::to_value(&stored.spec).unwrap();
    cluster_then["talosVersion"] = json!("v1.13.8");
    for (r, (n, token)) in kept.iter().zip([(1usize, "one"), (2, "two")]) {
        let record = RevisionRecord {
            revision: r.clone(),
            machine_spec: machine_spec(n),
            cluster_spec: cluster_then.clone(),
            rendered_config: config(n as u32 * 100, token),
        };
        store::append(&mut data, &record, 10, store::MAX_BYTES).unwrap();
    }
    let secret_name = store::secret_name(&ns, "w-1");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret_name, "namespace": SYSTEM_NAMESPACE},
        "type": "ichor.maesh.dev/history",
        "data": data.into_iter().map(|(k, v)| (k, ByteString(v))).collect::<BTreeMap<_, _>>()}))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // history: the table, and the data as status has it.
    let out = ichor(&admin, &["machine", "history", "w-1", "-n", &ns]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("REV  TIME"), "{table}");
    assert!(
        lines[1].contains("alice") && lines[1].contains("Drift"),
        "{table}"
    );
    assert!(
        lines[2].contains("bob") && lines[2].contains("  2  "),
        "{table}"
    );
    let out = ichor(
        &admin,
        &["machine", "history", "w-1", "-n", &ns, "-o", "json"],
    )
    .await;
    let data: Vec<MachineRevision> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(data, kept);
    let out = ichor(&admin, &["machine", "history", "nope", "-n", &ns]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("there is no TalosMachine"),
        "{}",
        stderr(&out)
    );

    // diff, as the admin: the values, the secret one redacted.
    let out = ichor(&admin, &["machine", "diff", "w-1", "-n", &ns]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(said.contains("revision 1 → 2"), "{said}");
    assert!(
        said.contains("machine.sysctls[\"net.core.somaxconn\"]: 100 → 200"),
        "{said}"
    );
    assert!(said.contains("machine.token: sha256:"), "{said}");
    assert!(
        !said.contains(MARK) && !stderr(&out).contains(MARK),
        "{said}"
    );
    assert!(!stderr(&out).contains("showing secret values"));
    let out = ichor(
        &admin,
        &[
            "machine",
            "diff",
            "w-1",
            "-n",
            &ns,
            "--show-secrets",
            "-o",
            "json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("showing secret values").count(),
        1,
        "{}",
        stderr(&out)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["redacted"], false);
    assert!(
        shown.to_string().contains(&format!("{MARK}-two")),
        "{shown}"
    );
    let out = ichor(&admin, &["machine", "diff", "w-1", "-n", &ns, "--to", "1"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("first one kept"), "{}", stderr(&out));

    // diff, as a user who may not read Secrets: the paths from status, and
    // --show-secrets refused.
    let out = ichor(&reader, &["machine", "diff", "w-1", "-n", &ns]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("paths only, from status"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stdout(&out).lines().map(str::trim).collect::<Vec<_>>(),
        ["revision 1 → 2:", "machine.sysctls.k2", "machine.token"]
    );
    let out = ichor(
        &reader,
        &["machine", "diff", "w-1", "-n", &ns, "--show-secrets"],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!(
            "--show-secrets needs get on the history Secret {SYSTEM_NAMESPACE}/{secret_name}"
        )),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("showing secret values"));

    // rollback: refused with nothing written.
    let before = machines.get("w-1").await.unwrap().resource_version();
    let cluster_before = clusters.get("lab").await.unwrap().resource_version();
    for (kubeconfig, args, says) in [
        (
            &reader,
            vec!["--to", "1", "--yes"],
            "which this kubeconfig may not read",
        ),
        (
            &admin,
            vec!["--to", "9", "--yes"],
            "keeps no revision 9 (it keeps: 1, 2)",
        ),
        (&admin, vec!["--to", "1"], "asks for consent on a terminal"),
    ] {
        let mut all = vec!["machine", "rollback", "w-1", "-n", &ns];
        all.extend(args);
        let out = ichor(kubeconfig, &all).await;
        assert!(!out.status.success(), "{all:?}");
        assert!(stderr(&out).contains(says), "{all:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("nothing was written"),
            "{}",
            stderr(&out)
        );
        assert_eq!(
            machines.get("w-1").await.unwrap().resource_version(),
            before
        );
    }
    let out = ichor(
        &admin,
        &[
            "machine", "rollback", "w-1", "-n", &ns, "--to", "2", "--yes",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is revision 2's already; nothing was written"),
        "{}",
        stderr(&out)
    );

    // rollback to 1: the machine's patches written back and marked; the
    // cluster's differing field listed and left alone.
    let generation = machines
        .get("w-1")
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    let out = ichor(
        &admin,
        &[
            "machine", "rollback", "w-1", "-n", &ns, "--to", "1", "--yes",
        ],
    )
    .await;
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "plan: roll TalosMachine {ns}/w-1 back to revision 1"
        )),
        "{said}"
    );
    assert!(said.contains("write back spec.patches"), "{said}");
    // Ichor renders over the node's config: a path only revision 2 has stays.
    assert!(
        said.contains("machine.sysctls[\"vm.added\"] came after revision 1 and stay"),
        "{said}"
    );
    assert!(
        said.contains("spec.talosVersion differ from revision 1 and stay as they are"),
        "{said}"
    );
    let m = machines.get("w-1").await.unwrap();
    assert_eq!(serde_json::to_value(&m.spec.patches).unwrap(), patches(1));
    let mark: RollbackMark =
        serde_json::from_str(&m.annotations()[ROLLBACK_OF_ANNOTATION]).unwrap();
    assert_eq!(
        mark,
        RollbackMark {
            revision: 1,
            machine_generation: generation + 1,
            cluster_generation: 1
        }
    );
    assert_eq!(m.metadata.generation, Some(generation + 1));
    assert_eq!(
        clusters.get("lab").await.unwrap().resource_version(),
        cluster_before
    );

    // With --include-cluster the cluster's field goes back too, listed.
    let out = ichor(
        &admin,
        &[
            "machine",
            "rollback",
            "w-1",
            "-n",
            &ns,
            "--to",
            "1",
            "--include-cluster",
            "--yes",
        ],
    )
    .await;
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "TalosCluster {ns}/lab: write back spec.talosVersion"
        )),
        "{said}"
    );
    let c = clusters.get("lab").await.unwrap();
    assert_eq!(c.spec.talos_version, "v1.13.8");
    let m = machines.get("w-1").await.unwrap();
    let mark: RollbackMark =
        serde_json::from_str(&m.annotations()[ROLLBACK_OF_ANNOTATION]).unwrap();
    assert_eq!(mark.cluster_generation, c.metadata.generation.unwrap());
    assert_eq!(Some(mark.machine_generation), m.metadata.generation);
}
