//! Config history on the lab, with the controller `ichor adopt` installed:
//! two ServiceAccounts each add a patch to a released worker (both carry
//! registry credentials with a leak marker, the second changes the
//! first's); each apply is a revision naming its writer; `ichor machine history` and `diff` show them
//! with no marker; `ichor machine rollback --to 1` writes revision 1's spec
//! back, and the node, read with the real talosctl, runs revision 1's
//! rendered config byte for byte, recorded as revision 3.

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ichor_api::history::{MachineRevision, RevisionReason};
use ichor_api::{MachineRole, TalosMachine};
use ichor_reconcile::history::store;
use ichor_testenv::Tool;
use ichor_testenv::leak::markers_in;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::{LabHarness, NS, run, text};

const MARK: &str = "HISTORYLABMARK";
const WAIT: Duration = Duration::from_secs(60);

/// A patch: a sysctl and registry credentials carrying leak markers.
fn patch(sysctl: u32, password: &str) -> String {
    format!(
        "machine:\n  sysctls:\n    net.core.somaxconn: \"{sysctl}\"\n  registries:\n    config:\n      registry.example:\n        auth:\n          username: {MARK}-user\n          password: {MARK}-{password}\n"
    )
}

fn editor(name: &str) -> String {
    format!("system:serviceaccount:{NS}:{name}")
}

/// Two ServiceAccounts that may read and update TalosMachines.
async fn editors(client: &kube::Client) {
    let pp = PostParams::default();
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "history-editor"},
        "rules": [{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"],
            "verbs": ["get", "list", "watch", "update", "patch"]}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&pp, &role)
        .await
        .unwrap();
    for name in ["editor-a", "editor-b"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": NS}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .create(&pp, &sa)
            .await
            .unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("history-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "history-editor"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&pp, &binding)
            .await
            .unwrap();
    }
}

/// A client of the lab acting as `user` (the lab's admin impersonates it:
/// the API server's RBAC and admission see `user`).
async fn client_as(h: &LabHarness, user: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&h.lab.kubeconfig).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).unwrap()
}

async fn revisions(machines: &Api<TalosMachine>, name: &str) -> Vec<MachineRevision> {
    machines
        .get(name)
        .await
        .unwrap()
        .status
        .map(|s| s.revisions)
        .unwrap_or_default()
}

/// Waits until the machine keeps `n` revisions; returns them.
async fn revision_count(h: &LabHarness, name: &str, n: usize) -> Vec<MachineRevision> {
    let machines = Api::<TalosMachine>::namespaced(h.client().await, NS);
    let deadline = Instant::now() + WAIT;
    loop {
        let kept = revisions(&machines, name).await;
        if kept.len() >= n {
            return kept;
        }
        assert!(
            Instant::now() < deadline,
            "waited in vain for revision {n} of {name}: {kept:#?}\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn set_patches(client: kube::Client, name: &str, patches: serde_json::Value) {
    Api::<TalosMachine>::namespaced(client, NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"patches": patches}})),
        )
        .await
        .unwrap();
}

fn ichor(h: &LabHarness, args: &[&str]) -> std::process::Output {
    let mut cmd = h.ichor();
    cmd.args(args)
        .args(["-n", NS, "--kubeconfig"])
        .arg(&h.lab.kubeconfig);
    run(cmd)
}

/// The configs the node keeps (`v1alpha1`, and `persistent` on a newer
/// Talos), as the real talosctl reads them.
fn talosctl_machineconfig(h: &LabHarness, index: usize) -> Vec<String> {
    let node = h.lab.addresses[index].to_string();
    let out = std::process::Command::new(Tool::Talosctl.path())
        .arg("--talosconfig")
        .arg(&h.lab.talosconfig)
        .args(["-n", &node, "get", "machineconfig", "-o", "yaml"])
        .env_remove("TALOSCONFIG")
        .env("HOME", h.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "talosctl: {}", text(&out));
    use serde::Deserialize as _;
    let specs: Vec<String> = serde_yaml_ng::Deserializer::from_slice(&out.stdout)
        .filter_map(|doc| serde_yaml_ng::Value::deserialize(doc).ok())
        .filter_map(|r| r["spec"].as_str().map(str::to_owned))
        .collect();
    assert!(!specs.is_empty(), "a machineconfig: {}", text(&out));
    specs
}

/// Covers: R16.1, R16.2, R16.6, R16.7
#[tokio::test(flavor = "multi_thread")]
async fn two_writers_two_revisions_then_a_rollback_restores_the_first_config_on_the_lab() {
    let started = Instant::now();
    let h = LabHarness::up(|_| {}).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let admin = h.client().await;
    let machines = Api::<TalosMachine>::namespaced(admin.clone(), NS);
    let worker = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| m.spec.role == MachineRole::Worker)
        .expect("a worker");
    let name = worker.metadata.name.clone().unwrap();
    let index = h.lab.hostnames.iter().position(|n| *n == name).unwrap();
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    editors(&admin).await;
    // The release settles first (its own apply, if any, is not ours).
    let deadline = Instant::now() + WAIT;
    while !machines.get(&name).await.unwrap().status.is_some_and(|s| {
        s.config_hash.is_some() && s.drift.iter().all(|d| d.class == ichor_api::DriftClass::A)
    }) {
        assert!(Instant::now() < deadline, "{name} settled\n{}", h.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let n0 = revisions(&machines, &name).await.len();
    let adopted = started.elapsed();

    // Two writers, one patch each, each applied: two revisions naming them.
    // Ichor renders over the node's live config, so the second patch
    // changes what the first set (a rollback restores the values revision
    // 1's inputs set; a path only a later patch added would stay).
    let a = json!({"name": "team-a", "inline": patch(1024, "a")});
    let b = json!({"name": "team-b", "inline": patch(2048, "b")});
    set_patches(client_as(&h, &editor("editor-a")).await, &name, json!([a])).await;
    revision_count(&h, &name, n0 + 1).await;
    set_patches(
        client_as(&h, &editor("editor-b")).await,
        &name,
        json!([a, b]),
    )
    .await;
    let kept = revision_count(&h, &name, n0 + 2).await;
    let kept = &kept[n0..];
    let (first, second) = (kept[0].number, kept[1].number);
    let users: Vec<&str> = kept
        .iter()
        .map(|r| r.changed_by.as_ref().map_or("", |b| b.user.as_str()))
        .collect();
    assert_eq!(users, [editor("editor-a"), editor("editor-b")], "{kept:#?}");
    assert!(
        kept[1]
            .changed_paths
            .iter()
            .any(|p| p.starts_with("machine.registries.config")),
        "{kept:#?}"
    );
    let two = started.elapsed();

    // The CLI shows them; diff names the paths, no marker anywhere.
    let mut said = BTreeMap::new();
    let out = ichor(&h, &["machine", "history", &name]);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("$ ichor machine history {name}\n{table}");
    assert!(table.contains(&editor("editor-a")) && table.contains(&editor("editor-b")));
    said.insert("history", text(&out));
    let out = ichor(&h, &["machine", "diff", &name]);
    assert!(out.status.success(), "{}", text(&out));
    let diff = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("$ ichor machine diff {name}\n{diff}");
    assert!(
        diff.contains(&format!("revision {first} → {second}")),
        "{diff}"
    );
    assert!(
        diff.contains("machine.sysctls[\"net.core.somaxconn\"]: 1024 → 2048"),
        "{diff}"
    );
    assert!(diff.contains("password: sha256:"), "{diff}");
    said.insert("diff", text(&out));
    let status = serde_json::to_string(&machines.get(&name).await.unwrap().status).unwrap();
    said.insert("status", status);
    let events = Api::<Event>::namespaced(admin.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    // The audit: the machine's Events name each revision's writer and reason.
    for (number, writer) in [(first, "editor-a"), (second, "editor-b")] {
        let told = format!(
            "revision {number} (Drift, spec changed by {})",
            editor(writer)
        );
        assert!(
            events
                .items
                .iter()
                .any(|e| e.message.as_deref().is_some_and(|m| m.contains(&told))),
            "an Event says {told:?}"
        );
    }
    said.insert("events", serde_json::to_string(&events.items).unwrap());
    for (what, text) in &said {
        let found = markers_in(text, MARK);
        assert!(found.is_empty(), "a marker in {what}: {found:?}");
    }
    let out = ichor(&h, &["machine", "diff", &name, "--show-secrets"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!markers_in(&text(&out), MARK).is_empty(), "{}", text(&out));

    // Rollback to the first: the node runs its config byte for byte.
    let to = first.to_string();
    let out = ichor(&h, &["machine", "rollback", &name, "--to", &to, "--yes"]);
    println!(
        "$ ichor machine rollback {name} --to {to} --yes\n{}",
        text(&out)
    );
    assert!(out.status.success(), "{}", text(&out));
    let kept = revision_count(&h, &name, n0 + 3).await;
    let kept = &kept[n0..];
    let third = &kept[2];
    assert_eq!(
        (third.number, third.reason, third.rollback_of),
        (second + 1, RevisionReason::Rollback, Some(first)),
        "{kept:#?}"
    );
    let secret = Api::<Secret>::namespaced(admin.clone(), NS)
        .get(&store::secret_name(NS, &name))
        .await
        .unwrap();
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, ByteString(v))| (k, v))
        .collect();
    let record = store::find(&data, first)
        .unwrap()
        .expect("the first's record");
    for config in talosctl_machineconfig(&h, index) {
        assert_eq!(config, record.rendered_config);
    }
    assert_eq!(third.config_hash_after, kept[0].config_hash_after);
    let out = ichor(&h, &["machine", "history", &name]);
    println!("$ ichor machine history {name}\n{}", text(&out));
    assert!(
        text(&out).contains(&format!("Rollback to {first}")),
        "{}",
        text(&out)
    );
    // The UI's way: editor-a asks for revision 2 with the request
    // annotation; the installed controller writes it back, and the
    // revision names editor-a, not the controller.
    Api::<TalosMachine>::namespaced(client_as(&h, &editor("editor-a")).await, NS)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                ichor_api::history::ROLLBACK_ANNOTATION: second.to_string()}}})),
        )
        .await
        .unwrap();
    let kept = revision_count(&h, &name, n0 + 4).await;
    let fourth = &kept[n0 + 3];
    assert_eq!(
        (fourth.reason, fourth.rollback_of),
        (RevisionReason::Rollback, Some(second)),
        "{kept:#?}"
    );
    assert_eq!(
        fourth.changed_by.as_ref().map(|by| by.user.clone()),
        Some(editor("editor-a")),
        "the rollback names who asked for it: {fourth:#?}"
    );
    println!(
        "history lab: adopted {adopted:?}, two revisions {two:?}, all {:?}",
        started.elapsed()
    );
}
