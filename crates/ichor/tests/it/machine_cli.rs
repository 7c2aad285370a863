//! `ichor machine list|add|remove|replace`, the binary, against the real
//! test API server and emulated Talos nodes (fresh ones in maintenance
//! mode, one configured, one on an older Talos). No controller runs: the
//! CLI's own refusals are shown, each with nothing written — the
//! TalosMachines (names and resource versions) as they were, and no write
//! in the emulator's log — then what it writes when it may.

use std::collections::BTreeMap;
use std::process::{Output, Stdio};
use std::time::Duration;

use ichor_api::{MachineRole, RemovalMode, TalosMachine};
use ichor_talemu::{Emulator, NodeSpec};
use ichor_testenv::{TestEnv, install};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::text;

/// Nothing listens on port 9 (discard) here: a node that does not answer.
const DEAD: &str = "127.0.0.1:9";

async fn ichor(env: &TestEnv, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("ichor answered within 60s")
        .expect("ichor runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The namespace's TalosMachines as name → resource version: equal before
/// and after means nothing was written.
async fn written(api: &Api<TalosMachine>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|m| (m.name_any(), m.resource_version().unwrap_or_default()))
        .collect()
}

async fn machine(
    api: &Api<TalosMachine>,
    name: &str,
    cluster: &str,
    role: &str,
    address: &str,
    ready: bool,
) {
    let m: TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "finalizers": ["test.ichor.maesh.dev/keep"]},
        "spec": {"clusterRef": {"name": cluster}, "role": role, "address": address, "hold": false}
    }))
    .unwrap();
    api.create(&PostParams::default(), &m).await.unwrap();
    let status = json!({"status": {
        "talosVersion": "v1.13.9",
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
            "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn cluster(client: &kube::Client, ns: &str, name: &str) {
    let c: ichor_api::TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"endpoint": "https://127.0.0.1:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.36.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap();
    Api::<ichor_api::TalosCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &c)
        .await
        .unwrap();
}

/// Two fresh nodes (v1.13.9), a configured one, a fresh one on v1.12.0.
async fn nodes() -> Emulator {
    Emulator::start(vec![
        NodeSpec::maintenance("fresh-1"),
        NodeSpec::maintenance("fresh-2"),
        NodeSpec::new(
            "configured",
            ichor_testenv::fixtures::talos_bytes("stability-v1.12/base-worker.yaml"),
        ),
        NodeSpec::maintenance("old").with_version("v1.12.0"),
    ])
    .await
    .unwrap()
}

/// Refused with `says` in stderr, and nothing written.
async fn refused(
    env: &TestEnv,
    api: &Api<TalosMachine>,
    emu: &Emulator,
    args: &[&str],
    says: &[&str],
) {
    let before = written(api).await;
    let out = ichor(env, args).await;
    assert!(
        !out.status.success(),
        "{args:?} should be refused\n{}",
        text(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("nothing was written"), "{args:?}\n{err}");
    for s in says {
        assert!(err.contains(s), "{args:?} should say {s:?}\n{err}");
    }
    assert_eq!(written(api).await, before, "{args:?} wrote a TalosMachine");
    assert!(emu.writes().is_empty(), "{args:?} wrote to a node");
}

/// Covers: R14.20, R14.21, R14.22, R14.23
#[tokio::test(flavor = "multi_thread")]
async fn machine_commands_refuse_with_nothing_written_then_write_what_the_controller_needs() {
    let started = std::time::Instant::now();
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("machine-cli").await;
    install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let emu = nodes().await;
    let at = |i: usize| emu.endpoint(i);
    let (fresh1, fresh2, configured, old) = (at(0), at(1), at(2), at(3));
    let api = Api::<TalosMachine>::namespaced(client.clone(), &ns);
    cluster(&client, &ns, "lab").await;
    cluster(&client, &ns, "solo").await;
    for (name, cluster, role, address, ready) in [
        ("cp-1", "lab", "controlplane", configured.as_str(), false),
        ("cp-2", "lab", "controlplane", configured.as_str(), true),
        ("cp-3", "lab", "controlplane", configured.as_str(), true),
        ("w-1", "lab", "worker", configured.as_str(), true),
        ("w-dead", "lab", "worker", DEAD, false),
        ("w-stuck", "lab", "worker", DEAD, false),
        ("only", "solo", "controlplane", configured.as_str(), true),
    ] {
        machine(&api, name, cluster, role, address, ready).await;
    }
    let n = ns.as_str();

    // list: every machine of the cluster, as a table and as data.
    let out = ichor(env, &["machine", "list", "-n", n, "--cluster", "lab"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert_eq!(table.lines().count(), 7, "{table}");
    assert!(!table.contains("only"), "{table}");
    let out = ichor(env, &["machine", "list", "-n", n, "-o", "json"]).await;
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(rows.as_array().unwrap().len(), 7);
    assert_eq!(rows[0]["phase"], "Member");

    // add: every problem at once.
    let add = |extra: &[&str]| {
        let mut v: Vec<String> = [
            "machine",
            "add",
            "-n",
            n,
            "--cluster",
            "lab",
            "--role",
            "worker",
            "--yes",
        ]
        .map(String::from)
        .to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let args = add(&[&configured, DEAD, &fresh1, &fresh1, &old]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(
        env,
        &api,
        &emu,
        &args,
        &[
            &format!("node {configured} is not in maintenance mode"),
            &format!("node {configured} is already a member: TalosMachine cp-1 has that address"),
            &format!("node {DEAD} is unreachable"),
            &format!("node {fresh1} is given twice"),
            &format!("node {old} runs Talos v1.12.0, which cluster lab does not run (v1.13.9)"),
        ],
    )
    .await;
    let args = add(&[&fresh1, "--name", "w-1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(env, &api, &emu, &args, &["the name w-1 (for node"]).await;

    // replace: a worker is not replaced, and the new node is checked as add checks it.
    refused(
        env,
        &api,
        &emu,
        &[
            "machine", "replace", "w-1", "--with", &fresh2, "-n", n, "--yes",
        ],
        &["TalosMachine w-1 is a worker"],
    )
    .await;
    refused(
        env,
        &api,
        &emu,
        &[
            "machine",
            "replace",
            "cp-3",
            "--with",
            &configured,
            "-n",
            n,
            "--yes",
        ],
        &["is not in maintenance mode"],
    )
    .await;

    // remove: quorum (cp-1 is not Ready), the last control plane, a dead node without --force.
    refused(
        env,
        &api,
        &emu,
        &["machine", "remove", "cp-2", "-n", n, "--yes"],
        &["removing cp-2 would leave 1 healthy of 2 etcd voters"],
    )
    .await;
    refused(
        env,
        &api,
        &emu,
        &["machine", "remove", "only", "-n", n, "--yes"],
        &["removing only would leave no control plane"],
    )
    .await;
    refused(
        env,
        &api,
        &emu,
        &["machine", "remove", "w-dead", "-n", n, "--yes"],
        &["does not answer", "pass --force"],
    )
    .await;
    // Off a terminal without --yes: nothing written either.
    refused(
        env,
        &api,
        &emu,
        &["machine", "remove", "w-1", "-n", n],
        &["pass --yes"],
    )
    .await;

    // The plan alone, as data: nothing written.
    let before = written(&api).await;
    let out = ichor(
        env,
        &[
            "machine",
            "add",
            &fresh1,
            &fresh2,
            "-n",
            n,
            "--cluster",
            "lab",
            "--role",
            "worker",
            "-o",
            "json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON plan");
    assert_eq!(plan[0]["name"], "fresh-1");
    assert_eq!(plan[1]["talosVersion"], "v1.13.9");
    assert_eq!(written(&api).await, before);

    // Now with consent: one released TalosMachine per node, named after its hostname.
    let out = ichor(
        env,
        &[
            "machine",
            "add",
            &fresh1,
            "-n",
            n,
            "--cluster",
            "lab",
            "--role",
            "worker",
            "--yes",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let added = api.get("fresh-1").await.unwrap();
    assert_eq!(added.spec.address, fresh1);
    assert_eq!(added.spec.role, MachineRole::Worker);
    assert!(!added.spec.hold);

    let out = ichor(
        env,
        &[
            "machine", "replace", "cp-3", "--with", &fresh2, "--name", "cp-4", "-n", n, "--yes",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let new = api.get("cp-4").await.unwrap();
    assert_eq!(new.spec.replaces.as_deref(), Some("cp-3"));
    assert_eq!(new.spec.role, MachineRole::Controlplane);

    // A forced removal of the dead worker: spec.removal written, then deleted
    // (the test's finalizer keeps it to be read).
    let out = ichor(
        env,
        &[
            "machine",
            "remove",
            "w-dead",
            "--force",
            "--keep-node",
            "-n",
            n,
            "--yes",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let gone = api.get("w-dead").await.unwrap();
    assert!(gone.metadata.deletion_timestamp.is_some());
    let removal = gone.spec.removal.expect("spec.removal");
    assert_eq!(removal.mode, RemovalMode::KeepNode);
    assert!(removal.force);
    let out = ichor(env, &["machine", "list", "-n", n, "--cluster", "lab"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("w-dead") && l.contains("Leaving")),
        "{table}"
    );
    // A removal refused by the controller for a node that stopped
    // answering (a plain delete) goes on once forced from the CLI.
    api.delete("w-stuck", &DeleteParams::default())
        .await
        .unwrap();
    let out = ichor(
        env,
        &["machine", "remove", "w-stuck", "--force", "-n", n, "--yes"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let stuck = api.get("w-stuck").await.unwrap();
    assert!(
        stuck
            .spec
            .removal
            .is_some_and(|r| r.force && r.mode == RemovalMode::Wipe)
    );
    assert!(emu.writes().is_empty(), "the CLI never writes to a node");

    let unkeep = json!({"metadata": {"finalizers": null}});
    for m in api.list(&ListParams::default()).await.unwrap() {
        let _ = api
            .patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&unkeep),
            )
            .await;
        let _ = api.delete(&m.name_any(), &DeleteParams::default()).await;
    }
    emu.shutdown().await;
    // Its budget: a few seconds (no controller, no lab).
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}
