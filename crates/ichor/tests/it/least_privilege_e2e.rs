//! Least privilege, measured, and no secret in what Ichor says (R8.2,
//! R8.1), on the lab: the installed Ichor (its controller under its
//! ServiceAccount, its ichor-cni Job under its own) does its real work —
//! adopt end to end with a Cilium take-over (the Job), the hand-over, the
//! webhooks, a released machine's apply, scheduled backups into a real S3
//! server with retention, a reboot through `ichor reboot`, an `ichor
//! upgrade ichor` (the installer Job under the ichor-installer identity) —
//! and then:
//!
//! - every request its identities made (the API server's audit log) is set
//!   grant by grant against the roles of `dist/install.yaml` and of the chart
//!   (rendered by the real helm): nothing refused, no grant unused except a
//!   short list with reasons, no `*` in Ichor's own roles, Secrets only where
//!   needed; the installer identity, which holds cluster-admin (the install
//!   creates ClusterRoles and cluster-admin bindings), judged by what it did:
//!   only the kinds of the install manifest, no delete;
//! - the installed Ichor without a needed grant fails visibly (the API server
//!   refuses it, its log says so);
//! - secret markers seeded on the nodes and in a machine's patches reach
//!   none of: adopt's plan (`-o json`, `-o yaml`), its progress, `ichor
//!   cluster status` (text, json, yaml), the TalosMachine objects, the
//!   Events, the controller's and the Job's logs.

// The test prints every grant and request it compared, for the CI log.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use ichor_api::{OperationPhase, TalosMachine, TalosOperation};
use ichor_lab::{LabCni, LabOptions};
use ichor_testenv::Tool;
use ichor_testenv::leak::{markers_in, v1alpha1_node_secrets};
use ichor_testenv::rbac::{self, Grant};
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use crate::common::{LabHarness, NS, run, text};

const LIVE: &str = "LIVEMARK";
const DESIRED: &str = "WANTMARK";
const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/least-privilege: \"yes\"\n";

fn controller() -> String {
    format!(
        "system:serviceaccount:{NS}:{}",
        ichor_adopt::install::CONTROLLER
    )
}

fn cni() -> String {
    format!("system:serviceaccount:{NS}:ichor-cni")
}

fn installer() -> String {
    format!(
        "system:serviceaccount:{NS}:{}",
        ichor_adopt::install::INSTALLER_IDENTITY
    )
}

/// Grants kept on purpose though no request of the run needed them (unused,
/// or wider than the requests): (identity's short name, API group,
/// resource, verb) and why. Kept small; every entry is a path the run does
/// not take, or a right Kubernetes asks for in a form the requests do not show.
const JUSTIFIED_UNUSED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "ichor-installer",
        "*",
        "*",
        "*",
        "cluster-admin: the installer Job (a TalosOperation of kind ichor) applies the install manifest, which creates ClusterRoles and binds ichor-cni and itself to cluster-admin; Kubernetes lets a subject create a role only with every right in it or `escalate`, and bind cluster-admin only holding it or with `bind` on it, which is cluster-admin in effect (ADR 0014 item 9). What it did is measured instead: only the kinds of the install manifest (the_installer_requests_only_what_an_install_does)",
    ),
    (
        "ichor-cni",
        "*",
        "*",
        "*",
        "cluster-admin: the Job installs and upgrades Cilium, whose chart creates ClusterRoles; Kubernetes lets a subject create a role only with every right in it or with `escalate`, which is cluster-admin in effect (ADR 0007: the short-lived Job holds it so the long-lived controller does not)",
    ),
    (
        "ichor-controller",
        "batch",
        "jobs",
        "delete",
        "a failed ichor-cni Job is deleted before the next attempt; this run's Job succeeds",
    ),
    (
        "ichor-controller",
        "ichor.maesh.dev",
        "talosmachines",
        "delete",
        "a replaced control plane's TalosMachine is deleted once its replacement counts in etcd; this run replaces none (the replacement runs in crates/ichor/tests/it/membership_lab_e2e.rs)",
    ),
    (
        "ichor-controller",
        "ichor.maesh.dev",
        "ichorinstallations",
        "create",
        "under --deployed-by helm the controller creates the IchorInstallation; this run is the installer path, where adopt creates it",
    ),
    (
        "ichor-controller",
        "",
        "secrets",
        "update",
        "a machine's history Secret is replaced at its second apply; in this run each released machine is applied once (the revision store: ichor-reconcile's history::store tests)",
    ),
    (
        "ichor-controller",
        "",
        "secrets",
        "delete",
        "a deleted machine outside Ichor's namespace has its history Secret deleted (an owner reference cannot cross namespaces); this run's machines live in Ichor's namespace, their Secrets owned by them (ichor-controller's tests/history.rs)",
    ),
    (
        "ichor-controller",
        "apps",
        "deployments",
        "list",
        "a TalosOperation's health check may select Deployments by label; this run's operations have no health check (health gates: ichor-controller's tests/health_gates.rs)",
    ),
    (
        "ichor-controller",
        "apps",
        "statefulsets",
        "get",
        "a TalosOperation's health check may name a StatefulSet; this run's operations have no health check",
    ),
    (
        "ichor-controller",
        "apps",
        "statefulsets",
        "list",
        "a TalosOperation's health check may select StatefulSets by label; this run's operations have no health check",
    ),
    (
        "ichor-controller",
        "authorization.k8s.io",
        "subjectaccessreviews",
        "create",
        "the TalosOperation webhook asks whether an operation's creator may read what its health checks read; this run's operations have no health check (the review through the real API server: ichor-controller's tests/webhook.rs)",
    ),
    (
        "ichor-controller",
        "",
        "pods/eviction",
        "create",
        "the drain before a reboot evicts a Node's pods; the rebooted lab Node holds only DaemonSet pods, which a drain leaves (evictions and budgets: ichor-controller's tests/operations.rs)",
    ),
    (
        "ichor-controller",
        "policy",
        "poddisruptionbudgets",
        "list",
        "read to name the budget that blocks an eviction; this run's drain has nothing to evict",
    ),
    (
        "ichor-controller",
        "events.k8s.io",
        "events",
        "patch",
        "kube's Recorder patches an Event that repeats (its series) instead of creating another",
    ),
    (
        "ichor-controller",
        "",
        "configmaps",
        "update",
        "the CNI hand-over's inventory step (R6.1) reads and rewrites ConfigMap kube-system/talos-bootstrap-manifests-inventory (that name only); this run adopts a cluster without one",
    ),
    (
        "ichor-controller",
        "",
        "namespaces",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "",
        "serviceaccounts",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "",
        "configmaps",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "",
        "services",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "apps",
        "daemonsets",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "apps",
        "deployments",
        "patch",
        "the CNI hand-over's inventory step (R6.1) strips Talos's owning-inventory annotation from the Cilium release's objects; this run adopts a cluster without Talos's bootstrap-manifests inventory (the inline-Cilium case is init's: crates/ichor-lab/tests/it/cilium_handover_prune.rs)",
    ),
    (
        "ichor-controller",
        "",
        "serviceaccounts",
        "get",
        "the bootstrap-manifests sync that ends a kubernetes-upgrade reads each object of Talos's manifests before applying it (ADR 0014); this run has no kubernetes-upgrade (the sync runs against the real API server in ichor-controller's tests/operations.rs)",
    ),
    (
        "ichor-controller",
        "",
        "configmaps",
        "get",
        "the bootstrap-manifests sync that ends a kubernetes-upgrade reads each object of Talos's manifests before applying it (ADR 0014); this run has no kubernetes-upgrade (the sync runs against the real API server in ichor-controller's tests/operations.rs)",
    ),
    (
        "ichor-controller",
        "",
        "services",
        "get",
        "the bootstrap-manifests sync that ends a kubernetes-upgrade reads each object of Talos's manifests before applying it (ADR 0014); this run has no kubernetes-upgrade (the sync runs against the real API server in ichor-controller's tests/operations.rs)",
    ),
    (
        "ichor-controller",
        "apps",
        "deployments",
        "get",
        "the bootstrap-manifests sync that ends a kubernetes-upgrade reads each object of Talos's manifests before applying it (ADR 0014); this run has no kubernetes-upgrade (the sync runs against the real API server in ichor-controller's tests/operations.rs)",
    ),
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|d| serde_json::Value::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart's objects as the real helm renders them with its defaults.
fn chart_objects(h: &LabHarness) -> Vec<serde_json::Value> {
    let chart = repo_root().join("dist/chart");
    let out = h.helm(
        Tool::Helm4,
        &[
            "template",
            "ichor",
            chart.to_str().unwrap(),
            "--namespace",
            NS,
        ],
    );
    assert!(out.status.success(), "helm template: {}", text(&out));
    yaml_documents(&String::from_utf8_lossy(&out.stdout))
}

fn justified(g: &Grant) -> bool {
    JUSTIFIED_UNUSED
        .iter()
        .any(|(who, group, resource, verb, _)| {
            g.identity.ends_with(&format!(":{who}"))
                && g.api_group == *group
                && g.resource == *resource
                && g.verb == *verb
        })
}

/// The comparison of one source of roles with the run's requests: every
/// request allowed, every unused grant printed and justified, no `*` but
/// the one justified binding, Secrets only as the controller needs them.
fn assert_least_privilege(what: &str, objects: &[serde_json::Value], requests: &[rbac::Request]) {
    let grants: Vec<Grant> = rbac::grants(objects)
        .into_iter()
        .filter(|g| g.identity == controller() || g.identity == cni() || g.identity == installer())
        .collect();
    assert!(
        grants.iter().any(|g| g.identity == controller()),
        "{what} grants the controller nothing"
    );
    // The chart has no installer identity: a Helm install is upgraded by
    // helm (R4.6a), so the installer's requests are judged against the
    // install manifest alone.
    let requests: Vec<rbac::Request> = requests
        .iter()
        .filter(|r| r.identity != installer() || grants.iter().any(|g| g.identity == installer()))
        .cloned()
        .collect();
    let comparison = rbac::compare(&grants, &requests);
    assert!(
        comparison.denied.is_empty(),
        "{what} does not allow what the installed Ichor did:\n{}",
        comparison
            .denied
            .iter()
            .map(|r| format!("  {r}\n"))
            .collect::<String>()
    );
    println!("{what}: {} grants, unused:", grants.len());
    for g in &comparison.unused {
        println!("  {g}{}", if justified(g) { "  [justified]" } else { "" });
    }
    let unjustified: Vec<String> = comparison
        .unused
        .iter()
        .filter(|g| !justified(g))
        .map(|g| format!("  {g}\n"))
        .collect();
    assert!(
        unjustified.is_empty(),
        "{what} grants what the installed Ichor never used:\n{}",
        unjustified.concat()
    );
    for g in rbac::wildcards(&grants) {
        assert!(
            (g.identity == cni() || g.identity == installer())
                && g.from == "ClusterRole/cluster-admin",
            "{what}: a `*` in Ichor's own roles: {g}"
        );
    }
    // Secrets: the controller reads one by name across the cluster (the
    // bundle beside its TalosCluster) and lists and watches only in its own
    // namespace (its Cilium release's records); it writes only there (the
    // machines' history Secrets, ADR 0022).
    for g in grants
        .iter()
        .filter(|g| g.identity == controller() && g.resource == "secrets")
    {
        match (&g.scope, g.verb.as_str()) {
            (rbac::Scope::Cluster, "get") => {}
            (rbac::Scope::Namespace(ns), "list" | "watch" | "create" | "update" | "delete")
                if ns == NS => {}
            _ => panic!("{what}: a Secrets grant wider than the controller needs: {g}"),
        }
    }
}

/// The installer identity holds cluster-admin, so the grants cannot bound
/// it; what it did can: every request is on a kind of the install manifest
/// of `version` (and its Secrets: the webhook certificate), in Ichor's
/// namespace or cluster-wide for cluster-scoped kinds, and it deletes
/// nothing.
fn the_installer_requests_only_what_an_install_does(version: &str, requests: &[rbac::Request]) {
    let image = ichor_adopt::install::controller_image(version);
    let mut kinds: BTreeSet<(String, String)> =
        ichor_adopt::install::install_objects(version, &image)
            .iter()
            .map(|o| {
                let api = o["apiVersion"].as_str().unwrap_or_default();
                let group = api.rsplit_once('/').map_or("", |(g, _)| g).to_string();
                let kind = o["kind"].as_str().unwrap_or_default().to_lowercase();
                let plural = if let Some(stem) = kind.strip_suffix('y') {
                    format!("{stem}ies")
                } else if kind.ends_with('s') {
                    format!("{kind}es")
                } else {
                    format!("{kind}s")
                };
                (group, plural)
            })
            .collect();
    kinds.insert((String::new(), "secrets".into()));
    // It reads the IchorInstallation and records the version in it.
    kinds.insert((ichor_api::GROUP.into(), "ichorinstallations".into()));
    kinds.insert((
        "admissionregistration.k8s.io".into(),
        "validatingwebhookconfigurations".into(),
    ));
    kinds.insert((
        "admissionregistration.k8s.io".into(),
        "mutatingwebhookconfigurations".into(),
    ));
    let mine: Vec<&rbac::Request> = requests
        .iter()
        .filter(|r| r.identity == installer())
        .collect();
    println!("the installer's requests:");
    for r in mine
        .iter()
        .map(|r| {
            format!(
                "  {} {}/{} {}",
                r.verb, r.api_group, r.resource, r.namespace
            )
        })
        .collect::<BTreeSet<_>>()
    {
        println!("{r}");
    }
    let outside: Vec<String> = mine
        .iter()
        .filter(|r| {
            let resource = r.resource.split('/').next().unwrap_or_default();
            !kinds.contains(&(r.api_group.clone(), resource.to_string()))
                || r.verb == "delete"
                || r.verb == "deletecollection"
                || !(r.namespace.is_empty() || r.namespace == NS)
        })
        .map(|r| format!("  {r}\n"))
        .collect();
    assert!(
        outside.is_empty(),
        "the installer did more than an install:\n{}",
        outside.concat()
    );
}

/// Where a marker must not be: (what, text).
fn assert_no_marker(found: &mut Vec<String>, what: &str, text: &str) {
    for mark in [LIVE, DESIRED] {
        for m in markers_in(text, mark) {
            found.push(format!("{what}: …{m}…"));
        }
    }
}

async fn wait_for(what: &str, h: &LabHarness, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn every_log(h: &LabHarness) -> Vec<(String, String)> {
    std::fs::read_dir(h.lab.state_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap_or_default(),
            )
        })
        .collect()
}

/// Covers: R5.1, R8.2 (least privilege from the audit log), R8.1 (no secret
/// in Events, logs, adopt's plan and progress, `ichor cluster status`), the
/// operations of ADR 0014 (the ichor-installer identity of a kind ichor
/// operation, measured)
#[tokio::test(flavor = "multi_thread")]
async fn the_installed_ichor_uses_every_grant_it_has_and_leaks_no_secret() {
    let mut h = LabHarness::up(|o: &mut LabOptions| {
        o.cni = LabCni::Cilium;
        // Everything Ichor's processes trace, to search for markers.
        o.ichor_log = Some("debug".into());
    })
    .await;
    // The nodes carry credentials, keys and contents with LIVE markers.
    let seed = ichor_talos::patch::ConfigPatch::parse(&v1alpha1_node_secrets(LIVE), "seed")
        .expect("the seed parses");
    for i in 0..h.lab.hostnames.len() {
        let live = h.lab.emulator.active_config(i).expect("a config");
        let config = ichor_talos::config::MachineConfig::parse(&String::from_utf8_lossy(&live))
            .expect("the node's config parses");
        let seeded = seed.apply(&config, "seed").expect("the seed applies");
        let yaml = seeded.to_yaml().expect("serialises");
        assert!(yaml.contains(&format!("{LIVE}-6")), "seeded");
        h.lab.emulator.set_config(i, yaml);
    }

    let mut leaks = Vec::new();
    for format in ["json", "yaml"] {
        let out = run(h.adopt(&["-o", format]));
        assert!(out.status.success(), "adopt -o {format}: {}", text(&out));
        assert_no_marker(&mut leaks, &format!("adopt -o {format}"), &text(&out));
    }
    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(out.status.success(), "adopt: {said}\n{}", h.logs());
    assert!(said.contains("Ichor will take it over"), "{said}");
    assert_no_marker(&mut leaks, "adopt's progress", &said);

    let client = h.client().await;
    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), NS);
    let names: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let first = names[0].clone();

    // A released machine gets a class B patch: the controller applies it.
    let patches = |extra: Option<&str>| {
        let mut list = vec![serde_json::json!({"name": "labels", "inline": LABELS})];
        if let Some(p) = extra {
            list.push(serde_json::json!({"name": "credentials", "inline": p}));
        }
        Patch::Merge(serde_json::json!({"spec": {"patches": list}}))
    };
    machines
        .patch(&first, &PatchParams::default(), &patches(None))
        .await
        .unwrap();
    wait_for(
        "the controller's apply to the released node",
        &h,
        async || !h.lab.emulator.writes().is_empty(),
    )
    .await;

    // Then a patch with DESIRED markers on the seeded fields: drift shows
    // them changed (two digests), never their values.
    let desired = v1alpha1_node_secrets(DESIRED);
    machines
        .patch(&first, &PatchParams::default(), &patches(Some(&desired)))
        .await
        .unwrap();
    wait_for(
        "drift of the changed credentials in status",
        &h,
        async || {
            machines.get(&first).await.is_ok_and(|m| {
                m.status.is_some_and(|s| {
                    s.drift
                        .iter()
                        .any(|d| d.path.starts_with("machine.registries.config"))
                })
            })
        },
    )
    .await;
    let machine = machines.get(&first).await.unwrap();
    let status = serde_json::to_string_pretty(&machine.status).unwrap();
    assert!(status.contains("sha256:"), "drift shows digests: {status}");
    crate::common::assert_the_webhook_refuses_through_its_service(&h).await;

    // Backups: a schedule every minute into a real S3 server, one kept. The
    // controller creates each TalosBackup, takes it (the bundle Secret, the
    // credentials Secret, the node's etcd snapshot), records its status and,
    // from the second on, deletes the older one. They run while the rest of
    // the day goes on; the end waits for a deletion.
    let s3 = ichor_testenv::s3::S3Server::start().expect("the S3 server starts");
    let _backups = start_backups(&h, &client, &s3).await;

    // Day 2: `ichor reboot` creates a TalosOperation (the CLI touches no
    // node); the installed controller, as itself, plans it, cordons and
    // drains the Node through the Eviction API, reboots the node through the
    // Talos API, waits for the new boot and uncordons. The lab plays the
    // node (the emulator's reboot) and the kubelet (Node Ready); the
    // second machine, whose Node does not run the controller's pod.
    let second = names[1].clone();
    let reboots_before = h.lab.emulator.writes().len();
    let mut reboot = h.ichor();
    reboot
        .args([
            "reboot",
            &second,
            "--cluster",
            "lab",
            "-n",
            NS,
            "--name",
            "lp-reboot",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig);
    let out = run(reboot);
    assert!(out.status.success(), "ichor reboot: {}", text(&out));
    let operations: Api<TalosOperation> = Api::namespaced(client.clone(), NS);
    wait_for("the reboot operation to finish", &h, async || {
        operations.get("lp-reboot").await.is_ok_and(|o| {
            o.status
                .and_then(|s| s.phase)
                .is_some_and(|p| matches!(p, OperationPhase::Succeeded | OperationPhase::Failed))
        })
    })
    .await;
    let op = operations.get("lp-reboot").await.unwrap();
    let op_status = op.status.clone().unwrap_or_default();
    assert!(
        matches!(op_status.phase, Some(OperationPhase::Succeeded)),
        "the reboot operation: {}",
        serde_json::to_string_pretty(&op.status).unwrap()
    );
    assert!(
        h.lab.emulator.writes().len() > reboots_before,
        "the node was rebooted through the Talos API"
    );

    // Day 2: machines come and go. A worker added to the lab in maintenance
    // mode is joined by the controller (its released TalosMachine gets the
    // membership finalizer, its config over the maintenance API), then
    // removed: cordoned, drained, reset back to maintenance mode, its Node
    // deleted, the finalizer dropped.
    let added = h
        .lab
        .add_node(ichor_lab::NewNode::default())
        .await
        .expect("a node in maintenance mode");
    let joining: TalosMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": added.hostname, "namespace": NS},
        "spec": {"clusterRef": {"name": "lab"}, "role": "worker",
            "address": added.address.to_string(), "hold": false}
    }))
    .unwrap();
    machines
        .create(&Default::default(), &joining)
        .await
        .unwrap();
    wait_for("the added worker to join", &h, async || {
        machines.get(&added.hostname).await.is_ok_and(|m| {
            m.status
                .and_then(|s| s.membership)
                .is_some_and(|m| m.phase == ichor_api::MembershipPhase::Member)
        })
    })
    .await;
    machines
        .delete(&added.hostname, &Default::default())
        .await
        .unwrap();
    wait_for("the added worker to be removed", &h, async || {
        machines
            .get_opt(&added.hostname)
            .await
            .is_ok_and(|m| m.is_none())
    })
    .await;
    assert!(h.lab.emulator.in_maintenance(added.index), "reset");

    // Day 2 again: `ichor upgrade ichor` to the version installed, so the
    // installer Job (the controller starts it, the lab runs it as the local
    // binary under the ichor-installer identity) applies every object of
    // the install manifest and nothing changes that the lab would restart.
    let installed = Api::<ichor_api::IchorInstallation>::namespaced(client.clone(), NS)
        .get(ichor_api::INSTALLATION_NAME)
        .await
        .unwrap()
        .spec
        .version;
    let mut upgrade = h.ichor();
    upgrade
        .args([
            "upgrade",
            "ichor",
            "--to",
            &installed,
            "--cluster",
            "lab",
            "-n",
            NS,
            "--name",
            "lp-ichor",
            "--kubeconfig",
        ])
        .arg(&h.lab.kubeconfig);
    let out = run(upgrade);
    assert!(out.status.success(), "ichor upgrade ichor: {}", text(&out));
    wait_for("the ichor operation to finish", &h, async || {
        operations.get("lp-ichor").await.is_ok_and(|o| {
            o.status
                .and_then(|s| s.phase)
                .is_some_and(|p| matches!(p, OperationPhase::Succeeded | OperationPhase::Failed))
        })
    })
    .await;
    let op = operations.get("lp-ichor").await.unwrap();
    assert!(
        matches!(
            op.status.as_ref().and_then(|s| s.phase),
            Some(OperationPhase::Succeeded)
        ),
        "the ichor operation: {}\n{}",
        serde_json::to_string_pretty(&op.status).unwrap(),
        h.logs()
    );

    // The markers are where the user put them (the search can find them).
    assert!(
        !markers_in(&serde_json::to_string(&machine.spec).unwrap(), DESIRED).is_empty(),
        "the DESIRED markers are in the machine's spec"
    );

    wait_for(
        "a scheduled backup deleted by retention (keepLast 1)",
        &h,
        async || {
            Api::<Event>::namespaced(client.clone(), NS)
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| {
                    l.items
                        .iter()
                        .any(|e| e.reason.as_deref() == Some("BackupDeleted"))
                })
        },
    )
    .await;

    // What Ichor says about it.
    for list in [machines.list(&ListParams::default()).await.unwrap()] {
        for m in list.items {
            // The spec is the user's own text (the patch they wrote);
            // everything Ichor writes is the status.
            assert_no_marker(
                &mut leaks,
                "a TalosMachine's status",
                &serde_json::to_string(&m.status).unwrap(),
            );
        }
    }
    for extra in [&[][..], &["-o", "json"], &["-o", "yaml"]] {
        let mut status = h.ichor();
        status
            .args(["cluster", "status", "--kubeconfig"])
            .arg(&h.lab.kubeconfig)
            .args(extra);
        let out = run(status);
        assert!(out.status.success(), "{}", text(&out));
        assert_no_marker(
            &mut leaks,
            &format!("ichor cluster status {extra:?}"),
            &text(&out),
        );
    }
    let events = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let core_events = Api::<CoreEvent>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(!events.items.is_empty(), "the controller records Events");
    assert_no_marker(
        &mut leaks,
        "Events",
        &serde_json::to_string(&events).unwrap(),
    );
    assert_no_marker(
        &mut leaks,
        "Events (core)",
        &serde_json::to_string(&core_events).unwrap(),
    );
    let logs = every_log(&h);
    assert!(
        logs.iter()
            .any(|(p, t)| p.contains("ichor-controller") && !t.is_empty()),
        "the controller's log was captured: {:?}",
        logs.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    for (path, log) in &logs {
        assert_no_marker(&mut leaks, path, log);
    }
    assert!(
        leaks.is_empty(),
        "secret markers reached what Ichor says:\n{}",
        leaks.join("\n")
    );

    // Least privilege: what the identities did, against what they hold.
    let requests = rbac::requests(
        &h.lab.env.audit_events(),
        &[controller(), cni(), installer()],
    );
    let by = |who: &str| requests.iter().filter(|r| r.identity == who).count();
    assert!(
        by(&controller()) > 0 && by(&cni()) > 0 && by(&installer()) > 0,
        "{requests:#?}"
    );
    the_installer_requests_only_what_an_install_does(&installed, &requests);
    let refused: Vec<_> = requests.iter().filter(|r| r.code == 403).collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    println!("requests made:");
    for r in requests
        .iter()
        .map(|r| {
            format!(
                "  {} {} {}/{} {}",
                r.identity.rsplit(':').next().unwrap(),
                r.verb,
                r.api_group,
                r.resource,
                r.namespace
            )
        })
        .collect::<BTreeSet<_>>()
    {
        println!("{r}");
    }
    let install = std::fs::read_to_string(repo_root().join("dist/install.yaml")).unwrap();
    assert_least_privilege("dist/install.yaml", &yaml_documents(&install), &requests);
    assert_least_privilege("the chart", &chart_objects(&h), &requests);
    // The comparison can fail: the shipped manifest with one needed rule
    // taken out (the status writes) leaves the run's status writes denied.
    let mut trimmed = yaml_documents(&install);
    for o in &mut trimmed {
        if o["kind"] == "ClusterRole" && o["metadata"]["name"] == ichor_adopt::install::CONTROLLER {
            o["rules"]
                .as_array_mut()
                .unwrap()
                .retain(|r| !r["resources"].to_string().contains("/status"));
        }
    }
    let grants: Vec<Grant> = rbac::grants(&trimmed)
        .into_iter()
        .filter(|g| g.identity == controller())
        .collect();
    let denied = rbac::compare(&grants, &requests).denied;
    assert!(
        !denied.is_empty()
            && denied
                .iter()
                .all(|r| r.resource.ends_with("/status") || r.identity != controller()),
        "{denied:#?}"
    );

    // Without a needed grant the installed Ichor fails visibly: take the
    // status writes away, change a machine, and the API server refuses the
    // controller, which says so in its log.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut role = roles.get(ichor_adopt::install::CONTROLLER).await.unwrap();
    let rules = role.rules.get_or_insert_default();
    for rule in rules.iter_mut() {
        if let Some(resources) = &mut rule.resources {
            resources.retain(|r| !r.ends_with("/status") && r != "*");
        }
    }
    rules.retain(|r| r.resources.as_ref().is_some_and(|r| !r.is_empty()));
    role.metadata.managed_fields = None;
    roles
        .replace(ichor_adopt::install::CONTROLLER, &Default::default(), &role)
        .await
        .unwrap();
    machines
        .patch(&first, &PatchParams::default(), &patches(None))
        .await
        .unwrap();
    wait_for(
        "the API server refusing the controller's status write",
        &h,
        async || {
            rbac::requests(&h.lab.env.audit_events(), &[controller()])
                .iter()
                .any(|r| r.code == 403 && r.resource == "talosmachines/status")
        },
    )
    .await;
    wait_for("the controller saying it was refused", &h, async || {
        every_log(&h).iter().any(|(p, t)| {
            p.contains("ichor-controller") && t.contains("forbidden") && t.contains("talosmachines")
        })
    })
    .await;
}

/// A kube client of the lab acting as `user` (the lab's admin impersonates
/// it; the API server's RBAC and admission see `user`).
/// Points the lab's TalosCluster at `s3` with a schedule every minute and
/// one backup kept; returns the identity file's folder (the identity stays
/// out of the cluster).
async fn start_backups(
    h: &LabHarness,
    client: &kube::Client,
    s3: &ichor_testenv::s3::S3Server,
) -> tempfile::TempDir {
    let keys = tempfile::tempdir().unwrap();
    let identity = keys.path().join("backup.key");
    let out = std::process::Command::new(Tool::AgeKeygen.path())
        .arg("-o")
        .arg(&identity)
        .output()
        .unwrap();
    assert!(out.status.success(), "age-keygen: {}", text(&out));
    let out = std::process::Command::new(Tool::AgeKeygen.path())
        .arg("-y")
        .arg(&identity)
        .output()
        .unwrap();
    let recipient = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "backup-s3", "namespace": NS},
        "stringData": {"accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .expect("the credentials Secret");
    Api::<ichor_api::TalosCluster>::namespaced(client.clone(), NS)
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"backup": {
                "destination": {"s3": {"endpoint": s3.endpoint(), "bucket": s3.bucket(),
                    "region": s3.region(), "allowHttp": true,
                    "credentialsSecretRef": {"name": "backup-s3"}}},
                "recipients": [recipient],
                "schedule": {"cron": "* * * * *"},
                "retention": {"keepLast": 1}
            }}})),
        )
        .await
        .unwrap_or_else(|e| panic!("the backup spec: {e}\n{}", h.logs()));
    keys
}

async fn lab_client_as(h: &LabHarness, user: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&h.lab.kubeconfig).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).unwrap()
}

/// Polls `done` for up to two minutes; the lab's logs in the failure.
async fn lab_wait<F, Fut>(h: &LabHarness, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited in vain for {what}\n{}",
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Privilege boundaries on the lab, against the Ichor `ichor adopt`
/// installed (its controller and webhooks as the lab runs them, under their
/// ServiceAccount). The lab played: a team namespace with a crafted bundle
/// Secret (its OS certificate's END marker inside the BEGIN line) and a
/// cluster and machine using it, and a user who may only create
/// TalosOperations in that namespace. Ichor did the rest:
/// - the poisoned cluster's machine fails on its bundle, while the adopted
///   cluster's machines keep reconciling and the controller never panics
///   out; its machines still take `spec.hold` through the webhooks;
/// - that user's TalosOperation of kind `ichor` starts nothing: it ends
///   Failed saying kind ichor is obeyed only in ichor-system, and no
///   installer Job exists.
/// Covers: R18.1, R18.2
#[tokio::test(flavor = "multi_thread")]
async fn a_poisoned_bundle_and_a_team_operation_reach_nothing_on_the_lab() {
    use ichor_api::conditions::{self, reasons, types};
    use ichor_api::{TalosCluster, TalosOperationSpec};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    use kube::api::PostParams;
    let h = LabHarness::up(|o: &mut LabOptions| o.cni = LabCni::Cilium).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt: {}\n{}", text(&out), h.logs());
    let admin = h.client().await;
    let team = "team-a";
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": team}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    // The crafted bundle: the lab's own, with the OS certificate replaced.
    let good = std::fs::read_to_string(&h.lab.bundle).unwrap();
    let crafted = ichor_talos::pem::b64("-----BEGIN X-----END X-----");
    let mut lines: Vec<String> = good.lines().map(str::to_owned).collect();
    let os = lines
        .iter()
        .position(|l| l.trim() == "os:")
        .expect("certs.os");
    let indent = lines[os + 1][..lines[os + 1].find("crt:").unwrap()].to_owned();
    lines[os + 1] = format!("{indent}crt: {crafted}");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "poisoned", "namespace": team},
        "stringData": {"secrets.yaml": lines.join("\n") + "\n"}}))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), team)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "poisoned", "namespace": team},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "poisoned"}, "cni": {"preset": "unmanaged"}}}))
    .unwrap();
    Api::<TalosCluster>::namespaced(admin.clone(), team)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let machine: TalosMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "poisoned-w1", "namespace": team},
        "spec": {"clusterRef": {"name": "poisoned"}, "role": "worker", "address": "127.0.0.1:1", "hold": true}}))
    .unwrap();
    let team_machines = Api::<TalosMachine>::namespaced(admin.clone(), team);
    team_machines
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    lab_wait(
        &h,
        "the poisoned cluster's machine to say its bundle is unusable",
        || async {
            team_machines.get("poisoned-w1").await.is_ok_and(|m| {
                m.status.as_ref().is_some_and(|s| {
                    conditions::find(&s.conditions, types::READY)
                        .is_some_and(|c| c.reason == reasons::BUNDLE_UNAVAILABLE)
                })
            })
        },
    )
    .await;
    // The brake and its release still pass the webhooks.
    for hold in [false, true] {
        team_machines
            .patch(
                "poisoned-w1",
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"spec": {"hold": hold}})),
            )
            .await
            .expect("spec.hold is accepted on the poisoned cluster's machine");
    }
    // The adopted cluster's machines are reconciled after the poisoned one was.
    let lab_machines = Api::<TalosMachine>::namespaced(admin.clone(), NS);
    let name = lab_machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let seen = lab_machines
        .get(&name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.observed_generation);
    lab_machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({"spec": {"patches": [{"name": "touch", "inline": LABELS}]}}),
            ),
        )
        .await
        .unwrap();
    lab_wait(
        &h,
        "the adopted cluster's machine to be reconciled again",
        || async {
            lab_machines
                .get(&name)
                .await
                .is_ok_and(|m| m.status.and_then(|s| s.observed_generation) > seen)
        },
    )
    .await;

    // A user who may only create TalosOperations in the team namespace.
    let user = "team-a-operator";
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "operations", "namespace": team},
        "rules": [{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosoperations"], "verbs": ["create"]}]}))
    .unwrap();
    let binding: k8s_openapi::api::rbac::v1::RoleBinding =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "operations", "namespace": team},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operations"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
        .unwrap();
    Api::namespaced(admin.clone(), team)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::namespaced(admin.clone(), team)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let spec: TalosOperationSpec = serde_json::from_value(serde_json::json!({
        "kind": "ichor", "version": "v9.9.9", "target": {"clusterRef": {"name": "poisoned"}}}))
    .unwrap();
    Api::<TalosOperation>::namespaced(lab_client_as(&h, user).await, team)
        .create(
            &PostParams::default(),
            &TalosOperation::new("take-over", spec),
        )
        .await
        .expect("the user may create the operation");
    let ops = Api::<TalosOperation>::namespaced(admin.clone(), team);
    lab_wait(&h, "the team's ichor operation to end", || async {
        ops.get("take-over").await.is_ok_and(|o| {
            o.status
                .and_then(|s| s.phase)
                .is_some_and(|p| matches!(p, OperationPhase::Failed | OperationPhase::Succeeded))
        })
    })
    .await;
    let op = ops.get("take-over").await.unwrap();
    let status = op.status.unwrap();
    assert_eq!(status.phase, Some(OperationPhase::Failed));
    let message = status.message.unwrap_or_default();
    assert!(message.contains("obeyed only in ichor-system"), "{message}");
    let jobs = Api::<Job>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        jobs.items.iter().all(|j| !j
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .starts_with("ichor-upgrade-")),
        "no installer Job was started"
    );
    let logs = h.logs();
    assert!(
        !logs.contains("panicked at"),
        "the controller panicked:\n{logs}"
    );
}
