//! How GitOps tools judge Ichor's kinds, by their own code: kstatus
//! (sigs.k8s.io/cli-utils, what Flux's `wait` and Helm 4's `--wait` use) and
//! Argo CD's health scripts (docs/argocd, run by gopher-lua with Argo's
//! contract), both through the go-peers binary that tools/testbin.sh builds.
//!
//! The kstatus test writes each state's status, as `conditions::gitops`
//! settles it, through the status subresource of a real API server, reads
//! the objects back (generation as the server keeps it) and judges them;
//! Argo CD's script for the kind judges the same objects.

// The table of verdicts is printed for the record (`--nocapture`).
#![allow(clippy::print_stdout)]

use std::io::Write as _;
use std::process::{Command, Stdio};

use ichor_api::backup::{BackupPhase, TalosBackupStatus};
use ichor_api::conditions::gitops::{self, Standing, Summary};
use ichor_api::conditions::{self, Status, flux, reasons, types};
use ichor_api::operation::{OperationPhase, TalosOperationStatus};
use ichor_api::{IchorInstallation, TalosBackup, TalosCluster, TalosMachine, TalosOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn go_peers() -> Command {
    Command::new(ichor_testenv::tools::Tool::GoPeers.path())
}

fn docs_argocd() -> std::path::PathBuf {
    ichor_testenv::tools::repo_root().join("docs/argocd")
}

/// Every health_test.yaml case of every kind passes in gopher-lua, and the
/// argocd-cm snippet carries each script as written beside its cases.
/// Covers: R17.1d
#[test]
fn argo_health_scripts_pass_their_cases_in_gopher_lua() {
    let out = go_peers()
        .args(["argolua", "test"])
        .arg(docs_argocd().join("ichor.maesh.dev"))
        .output()
        .expect("go-peers runs (tools/testbin.sh builds it)");
    let report = String::from_utf8_lossy(&out.stdout);
    println!("{report}");
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cm: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(docs_argocd().join("argocd-cm.yaml")).expect("argocd-cm.yaml"),
    )
    .expect("argocd-cm.yaml is YAML");
    for kind in KINDS {
        let script = std::fs::read_to_string(
            docs_argocd().join(format!("ichor.maesh.dev/{kind}/health.lua")),
        )
        .expect("health.lua");
        let key = format!("resource.customizations.health.ichor.maesh.dev_{kind}");
        assert_eq!(cm["data"][&key].as_str(), Some(script.as_str()), "{key}");
        let cases = std::fs::read_to_string(
            docs_argocd().join(format!("ichor.maesh.dev/{kind}/health_test.yaml")),
        )
        .expect("health_test.yaml");
        for status in ["Healthy", "Progressing", "Degraded"] {
            assert!(
                cases.contains(&format!("status: {status}")),
                "{kind}: no {status} case"
            );
        }
    }
}

const KINDS: [&str; 5] = [
    "TalosCluster",
    "TalosMachine",
    "TalosOperation",
    "TalosBackup",
    "IchorInstallation",
];

fn now() -> Time {
    Time(Timestamp::from_second(1_796_000_000).expect("time"))
}

fn cond(type_: &str, status: Status, reason: &str, message: &str) -> Condition {
    conditions::new(type_, status, reason, message, Some(1), now())
}

/// One object in one state, and what kstatus and Argo CD should say of it
/// (`kstatus|argo`).
struct Case {
    resource: ApiResource,
    name: String,
    state: &'static str,
    intended: &'static str,
}

/// A row of the table: kind, state, intended, verdict (each `kstatus|argo`),
/// kstatus's message.
type Row = (String, &'static str, &'static str, String, String);

struct Lab {
    client: kube::Client,
    ns: String,
}

impl Lab {
    fn api(&self, resource: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, resource)
    }

    async fn create(&self, resource: &ApiResource, name: &str, spec: Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("object");
        self.api(resource)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", resource.kind))
    }

    /// Writes `status` (conditions settled by `summary` at the object's
    /// generation) through the status subresource.
    async fn write_status(
        &self,
        resource: &ApiResource,
        name: &str,
        mut status: Value,
        mut conditions: Vec<Condition>,
        summary: &Summary,
    ) {
        let generation = self
            .api(resource)
            .get(name)
            .await
            .expect("read")
            .metadata
            .generation;
        gitops::settle(&mut conditions, summary, generation, &now());
        status["observedGeneration"] = json!(generation);
        status["conditions"] = serde_json::to_value(&conditions).expect("conditions");
        self.api(resource)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("writing the status of {} {name}: {e}", resource.kind));
    }

    async fn patch_spec(&self, resource: &ApiResource, name: &str, spec: Value) {
        self.api(resource)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await
            .unwrap_or_else(|e| panic!("changing the spec of {} {name}: {e}", resource.kind));
    }

    /// kstatus's and Argo CD's verdicts on each case (`kstatus|argo`, and
    /// kstatus's message), read back from the API server now; each object
    /// read back also keeps Flux's checker rules, unless its spec change is
    /// not observed yet (the controller's turn).
    async fn judge(&self, cases: &[Case]) -> Vec<(String, String)> {
        let dir = std::env::temp_dir().join(format!("ichor-gitops-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut items = Vec::new();
        let mut argo = Vec::new();
        for c in cases {
            let obj = self.api(&c.resource).get(&c.name).await.expect("read back");
            let v = serde_json::to_value(&obj).expect("json");
            let status = &v["status"];
            let conditions: Vec<Condition> =
                serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
            let observed = status["observedGeneration"].as_i64();
            if !conditions.is_empty() && observed == obj.metadata.generation {
                let broken = flux::ichor_violations(obj.metadata.generation, observed, &conditions);
                assert!(
                    broken.is_empty(),
                    "{} {}: {broken:?}",
                    c.resource.kind,
                    c.state
                );
            }
            argo.push(argo_health(&dir, &c.resource.kind, &v));
            items.push(v);
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        let mut child = go_peers()
            .arg("kstatus")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("go-peers runs (tools/testbin.sh builds it)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(list.to_string().as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("go-peers kstatus");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let verdicts: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON verdict"))
            .collect();
        assert_eq!(verdicts.len(), cases.len());
        std::fs::remove_dir_all(&dir).ok();
        verdicts
            .iter()
            .zip(argo)
            .map(|(v, argo)| {
                (
                    format!("{}|{argo}", v["status"].as_str().unwrap_or_default()),
                    v["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

/// The status docs/argocd's script for `kind` gives `obj` in gopher-lua.
fn argo_health(dir: &std::path::Path, kind: &str, obj: &Value) -> String {
    let path = dir.join("object.json");
    std::fs::write(&path, obj.to_string()).expect("write the object");
    let script = docs_argocd().join(format!("ichor.maesh.dev/{kind}/health.lua"));
    let out = go_peers()
        .args(["argolua", "run"])
        .arg(script)
        .arg(&path)
        .output()
        .expect("go-peers argolua");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let health: Value = serde_json::from_slice(&out.stdout).expect("a JSON health");
    health["status"].as_str().unwrap_or_default().to_owned()
}

fn case(resource: &ApiResource, name: &str, state: &'static str, intended: &'static str) -> Case {
    Case {
        resource: resource.clone(),
        name: name.to_owned(),
        state,
        intended,
    }
}

/// Every kind in every state Ichor writes, judged by kstatus from a real
/// API server: work under way and a spec change not yet observed are
/// InProgress, a stalled failure Failed, a retried failure InProgress, done
/// Current; a TalosCluster is InProgress through its hand-over, then
/// Current. Prints the table of verdicts.
/// Covers: R17.1a, R17.1b, R17.1c
#[tokio::test]
async fn kstatus_judges_every_kind_in_every_state_as_intended() {
    let env = ichor_testenv::TestEnv::shared();
    let client = env.client().await;
    ichor_testenv::install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let lab = Lab {
        client,
        ns: env.namespace("gitops").await,
    };
    let mut cases = Vec::new();
    let mut table: Vec<Row> = Vec::new();
    clusters(&lab, &mut cases, &mut table).await;
    machines(&lab, &mut cases).await;
    operations(&lab, &mut cases).await;
    backups(&lab, &mut cases).await;
    installation(&lab, &mut cases).await;
    let verdicts = lab.judge(&cases).await;
    for (c, (verdict, message)) in cases.iter().zip(verdicts) {
        table.push((
            c.resource.kind.clone(),
            c.state,
            c.intended,
            verdict,
            message,
        ));
    }
    // The spec changes, judged before anything observes them.
    let changed = spec_changes(&lab).await;
    let verdicts = lab.judge(&changed).await;
    for (c, (verdict, message)) in changed.iter().zip(verdicts) {
        table.push((
            c.resource.kind.clone(),
            c.state,
            c.intended,
            verdict,
            message,
        ));
    }
    println!(
        "| kind | state | intended (kstatus, Argo CD) | verdict (kstatus, Argo CD) | kstatus's message |"
    );
    println!("|---|---|---|---|---|");
    for (kind, state, intended, verdict, message) in &table {
        let (intended, verdict) = (intended.replace('|', " / "), verdict.replace('|', " / "));
        println!("| {kind} | {state} | {intended} | {verdict} | {message} |");
    }
    let disagreements: Vec<_> = table.iter().filter(|r| r.2 != r.3).collect();
    println!(
        "{} verdicts, {} disagreements",
        table.len(),
        disagreements.len()
    );
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

fn cluster_spec() -> Value {
    json!({
        "endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1",
        "kubernetesVersion": "v1.34.1", "secretsRef": {"name": "bundle"},
    })
}

async fn clusters(lab: &Lab, cases: &mut Vec<Case>, table: &mut Vec<Row>) {
    let r = ApiResource::erase::<TalosCluster>(&());
    let machines_ready = cond(
        types::READY,
        Status::True,
        reasons::RECONCILED,
        "all 3 machines are Ready",
    );
    let handover = |reason, message| cond(types::CNI_HANDOVER, Status::False, reason, message);
    let states = [
        (
            "hand-over: ichor-cni Job running",
            "InProgress|Progressing",
            machines_ready.clone(),
            Some(handover(
                reasons::JOB_RUNNING,
                "the ichor-cni Job is bringing the release to the effective values",
            )),
        ),
        (
            "hand-over: waiting for the Cilium DaemonSet",
            "InProgress|Progressing",
            machines_ready.clone(),
            Some(handover(
                reasons::WAITING_FOR_DAEMON_SET,
                "DaemonSet kube-system/cilium is not Ready",
            )),
        ),
        (
            "hand-over: removing the inline manifest",
            "InProgress|Progressing",
            machines_ready.clone(),
            Some(handover(
                reasons::REMOVING_INLINE_MANIFEST,
                "removing the inline Cilium entry",
            )),
        ),
        (
            "ichor-cni Job failed (retried)",
            "InProgress|Degraded",
            machines_ready.clone(),
            Some(handover(
                reasons::JOB_FAILED,
                "the ichor-cni Job failed; a new attempt starts in 30s",
            )),
        ),
        (
            "invalid Cilium values",
            "Failed|Degraded",
            machines_ready.clone(),
            Some(handover(
                reasons::INVALID_VALUES,
                "spec.cni.cilium.values gives no effective values",
            )),
        ),
        (
            "a machine not Ready",
            "InProgress|Degraded",
            cond(
                types::READY,
                Status::False,
                reasons::MACHINES_NOT_READY,
                "1 of 3 machines are not Ready",
            ),
            None,
        ),
        (
            "no machines yet",
            "InProgress|Degraded",
            cond(
                types::READY,
                Status::False,
                reasons::NO_MACHINES,
                "no TalosMachine refers to this cluster yet",
            ),
            None,
        ),
        (
            "CNI unmanaged, machines Ready",
            "Current|Healthy",
            machines_ready.clone(),
            Some(handover(reasons::UNMANAGED, "preset unmanaged")),
        ),
    ];
    for (i, (state, intended, ready, cni)) in states.into_iter().enumerate() {
        let name = format!("cluster-{i}");
        lab.create(&r, &name, cluster_spec()).await;
        let conditions: Vec<Condition> = cni.into_iter().collect();
        let summary = gitops::cluster(&ready, &conditions);
        lab.write_status(&r, &name, json!({}), conditions, &summary)
            .await;
        cases.push(case(&r, &name, state, intended));
    }
    // One cluster through its hand-over: under way, then done.
    lab.create(&r, "handover", cluster_spec()).await;
    let steps = [
        (
            "hand-over sequence: release not at the values yet",
            "InProgress|Progressing",
            handover(
                reasons::WAITING_FOR_RELEASE,
                "Helm release cilium is at another values hash",
            ),
        ),
        (
            "hand-over sequence: ichor-cni Job running",
            "InProgress|Progressing",
            handover(
                reasons::JOB_RUNNING,
                "the ichor-cni Job is bringing the release to the effective values",
            ),
        ),
        (
            "hand-over sequence: handed over",
            "Current|Healthy",
            cond(
                types::CNI_HANDOVER,
                Status::True,
                reasons::HANDED_OVER,
                "Helm release cilium is deployed and Ready",
            ),
        ),
    ];
    for (state, intended, cni) in steps {
        let summary = gitops::cluster(&machines_ready, std::slice::from_ref(&cni));
        lab.write_status(&r, "handover", json!({}), vec![cni], &summary)
            .await;
        let one = [case(&r, "handover", state, intended)];
        let (verdict, message) = lab.judge(&one).await.remove(0);
        table.push((r.kind.clone(), state, intended, verdict, message));
    }
}

fn machine_spec(hold: bool) -> Value {
    json!({"clusterRef": {"name": "c"}, "role": "worker", "address": "10.5.0.2", "hold": hold})
}

async fn machines(lab: &Lab, cases: &mut Vec<Case>) {
    let r = ApiResource::erase::<TalosMachine>(&());
    let states = [
        (
            "read, no drift",
            "Current|Healthy",
            false,
            Status::True,
            reasons::RECONCILED,
            None,
        ),
        (
            "held with class C drift",
            "Current|Suspended",
            true,
            Status::True,
            reasons::RECONCILED,
            Some(cond(
                types::DRIFTED,
                Status::True,
                reasons::UNSAFE_DRIFT,
                "class C drift at cluster.network",
            )),
        ),
        (
            "node unreachable (retried)",
            "InProgress|Degraded",
            false,
            Status::False,
            reasons::NODE_UNREACHABLE,
            None,
        ),
        (
            "bundle unavailable (retried)",
            "InProgress|Degraded",
            false,
            Status::False,
            reasons::BUNDLE_UNAVAILABLE,
            None,
        ),
        (
            "config cannot be rendered",
            "Failed|Degraded",
            false,
            Status::False,
            reasons::RENDER_FAILED,
            None,
        ),
    ];
    for (i, (state, intended, hold, ready, reason, extra)) in states.into_iter().enumerate() {
        let name = format!("machine-{i}");
        lab.create(&r, &name, machine_spec(hold)).await;
        let ready = cond(types::READY, ready, reason, "words");
        let mut conditions: Vec<Condition> = extra.into_iter().collect();
        conditions.push(ready.clone());
        lab.write_status(&r, &name, json!({}), conditions, &gitops::machine(&ready))
            .await;
        cases.push(case(&r, &name, state, intended));
    }
}

async fn operations(lab: &Lab, cases: &mut Vec<Case>) {
    let r = ApiResource::erase::<TalosOperation>(&());
    let states = [
        (OperationPhase::Pending, "pending", "InProgress|Progressing"),
        (OperationPhase::Running, "running", "InProgress|Progressing"),
        (
            OperationPhase::Waiting,
            "waiting for its window",
            "InProgress|Suspended",
        ),
        (
            OperationPhase::Paused,
            "paused by a failed health gate",
            "InProgress|Degraded",
        ),
        (OperationPhase::Succeeded, "succeeded", "Current|Healthy"),
        (OperationPhase::Failed, "failed", "Failed|Degraded"),
    ];
    for (i, (phase, state, intended)) in states.into_iter().enumerate() {
        let name = format!("operation-{i}");
        lab.create(
            &r,
            &name,
            json!({"kind": "reboot", "target": {"clusterRef": {"name": "c"}}}),
        )
        .await;
        let mut status = TalosOperationStatus {
            phase: Some(phase),
            message: Some(format!("the operation is {state}")),
            ..Default::default()
        };
        if matches!(phase, OperationPhase::Succeeded | OperationPhase::Failed) {
            let reason = if phase == OperationPhase::Failed {
                reasons::RETURN_TIMEOUT
            } else {
                reasons::SUCCEEDED
            };
            status
                .conditions
                .push(cond(types::COMPLETE, Status::True, reason, "done"));
        }
        let summary = gitops::operation(&status);
        let conditions = std::mem::take(&mut status.conditions);
        let value = serde_json::to_value(&status).expect("status");
        lab.write_status(&r, &name, value, conditions, &summary)
            .await;
        cases.push(case(&r, &name, state, intended));
    }
}

async fn backups(lab: &Lab, cases: &mut Vec<Case>) {
    let r = ApiResource::erase::<TalosBackup>(&());
    // Before the controller's first write there is no status at all, and
    // kstatus reads that as Current (its README's corner case): the row
    // says so rather than hide it.
    lab.create(&r, "backup-new", json!({"clusterRef": {"name": "c"}}))
        .await;
    cases.push(case(
        &r,
        "backup-new",
        "created, no status written yet",
        "Current|Progressing",
    ));
    let states = [
        (BackupPhase::Running, "running", "InProgress|Progressing"),
        (BackupPhase::Succeeded, "succeeded", "Current|Healthy"),
        (BackupPhase::Failed, "failed", "Failed|Degraded"),
    ];
    for (i, (phase, state, intended)) in states.into_iter().enumerate() {
        let name = format!("backup-{i}");
        lab.create(&r, &name, json!({"clusterRef": {"name": "c"}}))
            .await;
        let status = TalosBackupStatus {
            phase,
            message: (phase == BackupPhase::Failed).then(|| "the bucket refused".to_owned()),
            ..Default::default()
        };
        let summary = gitops::backup(&status);
        let value = serde_json::to_value(&status).expect("status");
        lab.write_status(&r, &name, value, Vec::new(), &summary)
            .await;
        cases.push(case(&r, &name, state, intended));
    }
}

async fn installation(lab: &Lab, cases: &mut Vec<Case>) {
    let r = ApiResource::erase::<IchorInstallation>(&());
    lab.create(&r, "ichor", json!({"version": "v0.1.0"})).await;
    let summary = Summary::new(
        Standing::Ready,
        reasons::RECONCILED,
        "the controller v0.1.0 runs",
    );
    lab.write_status(
        &r,
        "ichor",
        json!({"installedVersion": "v0.1.0"}),
        Vec::new(),
        &summary,
    )
    .await;
    cases.push(case(&r, "ichor", "the controller runs", "Current|Healthy"));
}

/// A Ready TalosCluster, TalosMachine and IchorInstallation get a spec
/// change that nothing has observed yet (TalosOperation and TalosBackup
/// specs are immutable).
async fn spec_changes(lab: &Lab) -> Vec<Case> {
    let cluster = ApiResource::erase::<TalosCluster>(&());
    let machine = ApiResource::erase::<TalosMachine>(&());
    let installation = ApiResource::erase::<IchorInstallation>(&());
    lab.patch_spec(
        &cluster,
        "cluster-7",
        json!({"kubernetesVersion": "v1.34.2"}),
    )
    .await;
    lab.patch_spec(&machine, "machine-0", json!({"hold": true}))
        .await;
    lab.patch_spec(&installation, "ichor", json!({"version": "v0.1.1"}))
        .await;
    vec![
        case(
            &cluster,
            "cluster-7",
            "Ready, then a spec change not yet observed",
            "InProgress|Progressing",
        ),
        case(
            &machine,
            "machine-0",
            "Ready, then a spec change not yet observed",
            "InProgress|Progressing",
        ),
        case(
            &installation,
            "ichor",
            "Ready, then a spec change not yet observed",
            "InProgress|Progressing",
        ),
    ]
}
