//! Ichor's metrics, alerts and dashboard against a real Prometheus, on the
//! lab.
//!
//! What Ichor did: the controller `ichor adopt` installed (a lab pod under
//! its own ServiceAccount) served `/metrics`, read at scrape time from its
//! watch caches. What the test played: a Service selecting the controller's
//! pod as the chart's metrics Service does, and Prometheus (Debian's
//! package) scraping it through that Service every second, loaded with the
//! chart's own rule file (only each alert's `for` shortened to a second).
//! The judges: `promtool check metrics` on what the controller served, and
//! Prometheus's own `ALERTS` series and query results.

// The panels' results and the timings are printed: the report lists them.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ichor_api::backup::{BackupPhase, TalosBackup};
use ichor_api::{OperationPhase, TalosCluster, TalosMachine, TalosOperation};
use ichor_testenv::Tool;
use ichor_testenv::s3::S3Server;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::{LabHarness, METRICS_SERVICE, NS, metrics_forward, run, scrape, text};

/// A class B change (applied without a reboot).
const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/observed: \"yes\"\n";
/// The bound on every wait of this test.
const WAIT: Duration = Duration::from_secs(90);

/// A Prometheus process, stopped when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The chart's rule file with every `for` at one second: the alerts fire
/// as soon as their expression holds, as they would after their `for`.
fn rules_for_the_test(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo_file("dist/chart/files/prometheus-rules.yaml"))
        .expect("the chart's rule file");
    let mut rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    for group in rules["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            if rule.get("for").is_some() {
                rule["for"] = "1s".into();
            }
        }
    }
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&rules).unwrap()).unwrap();
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Prometheus scraping `target` every second as the job the chart's
/// ServiceMonitor makes (named after the Service), with `rules`.
fn start_prometheus(dir: &Path, target: std::net::SocketAddr, rules: &Path) -> Prometheus {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n  - job_name: {METRICS_SERVICE}\n    honor_labels: true\n    \
             static_configs:\n      - targets: ['{target}']\n",
        ),
    )
    .unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(Tool::Prometheus.path())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus starts");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// An instant query through the real promtool: the result's samples.
async fn query(p: &Prometheus, expr: &str) -> Option<Vec<serde_json::Value>> {
    let out = tokio::process::Command::new(Tool::Promtool.path())
        .args(["query", "instant", "-o", "json", &p.url, expr])
        .output()
        .await
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

async fn firing(p: &Prometheus, alert: &str) -> bool {
    query(
        p,
        &format!("ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}}"),
    )
    .await
    .is_some_and(|s| !s.is_empty())
}

/// Polls `done` every half second until it holds, bounded by [`WAIT`].
async fn until<F, Fut>(h: &LabHarness, p: &Prometheus, what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !done().await {
        if Instant::now() > deadline {
            let alerts = query(p, "ALERTS").await;
            panic!(
                "waited in vain for {what}\nALERTS: {alerts:?}\n{}",
                h.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `promtool check metrics` on `body`: its complaints, empty when none.
fn promtool_check_metrics(body: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(Tool::Promtool.path())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        String::new()
    } else {
        text(&out)
    }
}

async fn create<K>(api: &Api<K>, obj: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).expect("an object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {obj:?}: {e}"));
}

/// The lab's secrets bundle with its aggregator CA replaced by a
/// certificate valid for seven days.
fn bundle_expiring_soon(bundle: &str) -> String {
    let mut b: serde_yaml_ng::Value = serde_yaml_ng::from_str(bundle).unwrap();
    let short = ichor_testenv::TestCa::new("kubernetes-aggregator");
    b["certs"]["k8saggregator"]["crt"] = ichor_talos::pem::b64(&short.cert_pem()).into();
    serde_yaml_ng::to_string(&b).unwrap()
}

fn bundle_secret(name: &str, bundle: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"bundle": bundle}
    })
}

/// The lab's one-node-each machines: (the one whose node runs the
/// controller, the other).
async fn machines_by_controller(client: &kube::Client) -> (String, String) {
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("app.kubernetes.io/name=ichor-controller"))
        .await
        .unwrap();
    let node = pods
        .items
        .iter()
        .find_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .expect("the controller runs on a node");
    let names: Vec<String> = Api::<TalosMachine>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    assert!(names.contains(&node), "{node} in {names:?}");
    let other = names.into_iter().find(|n| *n != node).unwrap();
    (node, other)
}

/// The chart's dashboard: each panel's title and queries, with its
/// variables set (`$cluster` to the lab's cluster).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_file("dist/chart/files/dashboards/ichor.json"))
        .expect("the chart's dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                let expr = expr
                    .replace("$__rate_interval", "1m")
                    .replace("$cluster", "lab");
                out.push((panel["title"].as_str().unwrap_or("").to_owned(), expr));
            }
        }
    }
    out
}

/// On a lab of a control plane and a worker adopted by the real `ichor
/// adopt`, Prometheus scraping the controller through a Service:
///
/// - `promtool check metrics` passes on what the controller serves;
/// - a held machine with a class B change: IchorMachineHeld fires, and stops
///   once the machine is released and the change applied;
/// - a TalosCluster whose bundle's aggregator CA expires in seven days:
///   IchorCertificateExpiringSoon fires, and stops once the bundle carries a
///   CA valid for ten years;
/// - a TalosOperation that fails (a machine the cluster does not have):
///   IchorOperationFailed fires, and stops once it is deleted;
/// - with a reboot done and a backup in S3, every query of the chart's
///   dashboard returns data (the panels and their results are printed);
/// - the controller scaled to 0: IchorControllerDown fires, and stops once
///   it runs again.
///
/// Covers: R17.2, R17.2d, R17.4, R17.5
#[tokio::test(flavor = "multi_thread")]
async fn alerts_fire_and_stop_and_the_dashboard_has_data() {
    let started = Instant::now();
    let h = LabHarness::up(|_| {}).await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let client = h.client().await;
    let adopted = started.elapsed();

    // The metrics Service, as the chart's, and Prometheus behind it.
    let forward = metrics_forward(&h, &client).await;
    let rules = rules_for_the_test(h.dir.path());
    let p = start_prometheus(h.dir.path(), forward.addr, &rules);
    until(&h, &p, "both machines in the scraped metrics", || async {
        query(&p, "ichor_machine_info{cluster=\"lab\"}")
            .await
            .is_some_and(|s| s.len() == 2)
    })
    .await;
    let served = scrape(forward.addr).await;
    let lint = promtool_check_metrics(&served);
    assert!(lint.is_empty(), "promtool check metrics: {lint}\n{served}");

    // The causes, all at once.
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    let (held, rebooted) = machines_by_controller(&client).await;
    machines
        .patch(
            &held,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": true, "patches": [{"name": "observed", "inline": LABELS}]}})),
        )
        .await
        .unwrap();
    let lab_bundle = std::fs::read_to_string(&h.lab.bundle).unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    create(
        &secrets,
        bundle_secret("soon-bundle", &bundle_expiring_soon(&lab_bundle)),
    )
    .await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), NS);
    let mut spec = serde_json::to_value(&clusters.get("lab").await.unwrap().spec).unwrap();
    spec["secretsRef"] = json!({"name": "soon-bundle", "key": "bundle"});
    create(
        &clusters,
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
               "metadata": {"name": "soon", "namespace": NS}, "spec": spec}),
    )
    .await;
    // A machine nobody answers for: its reconcile reads the bundle, then fails.
    create(
        &machines,
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
               "metadata": {"name": "soon-1", "namespace": NS},
               "spec": {"clusterRef": {"name": "soon"}, "role": "worker", "address": "127.0.0.1:1"}}),
    )
    .await;
    let ops = Api::<TalosOperation>::namespaced(client.clone(), NS);
    create(
        &ops,
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
               "metadata": {"name": "doomed", "namespace": NS},
               "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "lab"}, "machines": ["no-such-machine"]}}}),
    )
    .await;
    create(
        &ops,
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
               "metadata": {"name": "reboot-one", "namespace": NS},
               "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "lab"}, "machines": [rebooted]}}}),
    )
    .await;
    let s3 = S3Server::start().expect("the S3 server starts");
    create(
        &secrets,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "backup-s3", "namespace": NS},
               "stringData": {"accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()}}),
    )
    .await;
    let recipient = age_recipient(h.dir.path());
    clusters
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"backup": {
                "destination": {"s3": {
                    "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": "observed",
                    "region": s3.region(), "allowHttp": true,
                    "credentialsSecretRef": {"name": "backup-s3"}}},
                "recipients": [recipient]
            }}})),
        )
        .await
        .unwrap();
    let backups = Api::<TalosBackup>::namespaced(client.clone(), NS);
    create(
        &backups,
        json!({"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosBackup",
               "metadata": {"name": "observed", "namespace": NS},
               "spec": {"clusterRef": {"name": "lab"}, "reason": "manual"}}),
    )
    .await;

    for alert in [
        "IchorMachineHeld",
        "IchorCertificateExpiringSoon",
        "IchorOperationFailed",
    ] {
        until(&h, &p, &format!("{alert} firing"), || firing(&p, alert)).await;
    }
    let fired = started.elapsed();

    // The held machine released: its change is applied, the alert stops.
    machines
        .patch(
            &held,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hold": false}})),
        )
        .await
        .unwrap();
    until(&h, &p, "IchorMachineHeld to stop", || async {
        !firing(&p, "IchorMachineHeld").await
            && query(&p, "ichor_node_applies_total{outcome=\"applied\"}")
                .await
                .is_some_and(|s| !s.is_empty())
    })
    .await;
    until(&h, &p, "the reboot and the backup to succeed", || async {
        let op = ops.get("reboot-one").await.ok().and_then(|o| o.status);
        let backup = backups.get("observed").await.ok().and_then(|b| b.status);
        if let Some(phase) = op.as_ref().and_then(|s| s.phase) {
            assert_ne!(phase, OperationPhase::Failed, "{op:?}");
        }
        if let Some(b) = &backup {
            assert_ne!(b.phase, BackupPhase::Failed, "{backup:?}");
        }
        op.and_then(|s| s.phase) == Some(OperationPhase::Succeeded)
            && backup.is_some_and(|b| b.phase == BackupPhase::Succeeded)
    })
    .await;

    // Every dashboard query has data (rates need two scrapes of a series).
    let panels = dashboard_queries();
    let mut results = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        results.clear();
        for (title, expr) in &panels {
            let n = query(&p, expr).await.map(|s| s.len());
            results.push((title.clone(), expr.clone(), n));
        }
        if results.iter().all(|(_, _, n)| n.is_some_and(|n| n > 0)) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("dashboard panels and their series:");
    for (title, expr, n) in &results {
        println!("  {title}: {n:?} series ({expr})");
    }
    let empty: Vec<_> = results
        .iter()
        .filter(|(_, _, n)| !n.is_some_and(|n| n > 0))
        .collect();
    assert!(empty.is_empty(), "panels without data: {empty:#?}");

    // The failed operation deleted: its alert stops.
    ops.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    until(&h, &p, "IchorOperationFailed to stop", || async {
        !firing(&p, "IchorOperationFailed").await
    })
    .await;

    // The bundle renewed (a CA valid for ten years): the alert stops once
    // the controller reads it again (a change to the machine reconciles it).
    secrets
        .patch(
            "soon-bundle",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"bundle": lab_bundle}})),
        )
        .await
        .unwrap();
    let mut nudge = 0;
    until(&h, &p, "IchorCertificateExpiringSoon to stop", || {
        nudge += 1;
        let machines = machines.clone();
        let p = &p;
        async move {
            if nudge % 6 == 0 {
                let _ = machines
                    .patch(
                        "soon-1",
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {"test/nudge": nudge.to_string()}}}),
                        ),
                    )
                    .await;
            }
            !firing(p, "IchorCertificateExpiringSoon").await
        }
    })
    .await;

    // The controller stopped, then started again.
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS);
    let scale = |n: i32| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    ichor_adopt::install::CONTROLLER,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap();
        }
    };
    scale(0).await;
    until(&h, &p, "IchorControllerDown firing", || {
        firing(&p, "IchorControllerDown")
    })
    .await;
    scale(1).await;
    until(&h, &p, "IchorControllerDown to stop", || async {
        !firing(&p, "IchorControllerDown").await
    })
    .await;
    println!(
        "observability lab: adopted after {adopted:?}, alerts fired after {fired:?}, done after {:?}",
        started.elapsed()
    );
}

/// A recipient from the reference `age-keygen`.
fn age_recipient(dir: &Path) -> String {
    let path = dir.join("observed.key");
    let out = Command::new(Tool::AgeKeygen.path())
        .arg("-o")
        .arg(&path)
        .output()
        .expect("age-keygen runs");
    assert!(out.status.success(), "age-keygen: {}", text(&out));
    let out = Command::new(Tool::AgeKeygen.path())
        .arg("-y")
        .arg(&path)
        .output()
        .expect("age-keygen -y runs");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
