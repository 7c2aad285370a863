//! Upgrade paths, pre-pull, durations and Alertmanager silences of a
//! TalosOperation, on the emulated nodes of `operations` (the same lab:
//! a real kube-apiserver, `ichor-talemu` nodes, the controller in process).

use std::time::Duration;

use crate::common::*;
use crate::operations::{Lab, complete, finished, lab_talos, operation, quick};
use ichor_api::TalosCluster;
use ichor_api::operation::{
    MachineStep, OperationPhase, PRE_PULL_FAILED, PrePullPhase, TalosOperation,
};
use ichor_controller::operation::OperationBounds;
use ichor_controller::operation_decide::path;
use ichor_talemu::Fault;
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

struct Setup {
    ns: String,
    running: Running,
    lab: Lab,
    ops: Api<TalosOperation>,
    nodes: Api<Node>,
}

/// The lab of `machines` (name, role), each on the Talos version `talos`
/// names, and the controller.
async fn setup(
    prefix: &str,
    machines: &[(&str, &'static str)],
    talos: fn(&str) -> &'static str,
    bounds: OperationBounds,
) -> Setup {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace(prefix).await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &crate::operations::cluster(&ns))
        .await
        .unwrap();
    let lab = lab_talos(&client, &ns, machines, &[], |c| c, talos).await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = bounds;
    let running = start(client.clone(), config);
    Setup {
        ops: Api::namespaced(client.clone(), &ns),
        nodes: Api::all(client),
        ns,
        running,
        lab,
    }
}

/// Each Node's resourceVersion: unchanged means nothing was written to it
/// (no cordon).
async fn node_versions(lab: &Lab, nodes: &Api<Node>) -> Vec<String> {
    let mut versions = Vec::new();
    for (_, _, host) in &lab.machines {
        let n = nodes.get(host).await.unwrap();
        versions.push(n.metadata.resource_version.unwrap_or_default());
    }
    versions
}

/// A control plane on Talos 1.11 and a worker on 1.13 upgraded to 1.14:
/// 1.14 does not install over 1.11, so the control plane passes the newest
/// 1.13 first (the legacy upgrade of 1.11), and the worker waits for that
/// hop; then the 1.14 installer is pulled on both before either is
/// touched. Every machine's hops are in status, each machine and the
/// operation have their durations.
/// Covers: R15.3, R15.4, R15.9
#[tokio::test]
async fn a_talos_111_lab_to_114_passes_the_newest_113() {
    let newest_113 = path::release((1, 13)).unwrap().newest.unwrap();
    let machines = &[("cp-1", "controlplane"), ("w-1", "worker")];
    let talos = |m: &str| if m == "cp-1" { "v1.11.6" } else { "v1.13.9" };
    let s = setup("op-hops", machines, talos, quick()).await;
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "up", "talos-upgrade", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "up").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(status, "True", "{reason}: {message}");
    let st = op.status.clone().unwrap();
    let hops: Vec<(String, Vec<String>)> = st
        .machines
        .iter()
        .map(|p| (p.machine.clone(), p.hops.clone()))
        .collect();
    assert_eq!(
        hops,
        vec![
            (
                "cp-1".to_string(),
                vec![newest_113.to_string(), "v1.14.0".to_string()]
            ),
            ("w-1".to_string(), vec!["v1.14.0".to_string()]),
        ]
    );
    assert_eq!(st.current_hop.as_deref(), Some("v1.14.0"));
    s.running.stop().await.unwrap();
    assert_eq!(
        s.lab.upgrade_writes(),
        vec![
            "cp-1: legacy-upgrade",
            "cp-1: reboot",
            "cp-1: pull",
            "w-1: pull",
            "cp-1: upgrade",
            "cp-1: reboot",
            "w-1: upgrade",
            "w-1: reboot",
        ]
    );
    let legacy_image = s.lab.emu.writes().into_iter().find_map(|w| match w.action {
        ichor_talemu::WriteAction::Upgrade {
            image,
            legacy: true,
        } => Some(image),
        _ => None,
    });
    assert_eq!(
        legacy_image,
        Some(format!("ghcr.io/siderolabs/installer:{newest_113}"))
    );
    for (m, _, _) in &s.lab.machines {
        assert_eq!(s.lab.emu.talos_version(s.lab.index(m)), "v1.14.0");
    }
    for p in &st.machines {
        assert_eq!(p.step, MachineStep::Succeeded, "{p:?}");
        assert!(p.duration.is_some(), "{p:?}");
    }
    assert!(st.duration.is_some(), "{st:?}");
    let pulled: Vec<(String, PrePullPhase)> = st
        .pre_pull
        .iter()
        .map(|e| (e.machine.clone(), e.phase))
        .collect();
    assert_eq!(
        pulled,
        vec![
            ("cp-1".to_string(), PrePullPhase::Pulled),
            ("w-1".to_string(), PrePullPhase::Pulled)
        ]
    );
}

/// A downgrade Talos refuses is refused at plan time: the operation fails
/// naming the machine and both versions, and nothing is written.
/// Covers: R15.3
#[tokio::test]
async fn an_impossible_downgrade_is_refused_at_plan_time() {
    let machines = &[("w-1", "worker")];
    let s = setup("op-down", machines, |_| "v1.14.0", quick()).await;
    let mut op = operation(&s.ns, "down", "talos-upgrade", &[]);
    op.spec.version = Some("v1.12.11".into());
    op.spec.installer_image = Some("ghcr.io/siderolabs/installer:v1.12.11".into());
    s.ops.create(&PostParams::default(), &op).await.unwrap();
    let op = finished(&s.ops, "down").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        (
            "False",
            ichor_api::conditions::reasons::UNSUPPORTED_VERSION_PATH
        )
    );
    assert!(
        message.contains("TalosMachine w-1")
            && message.contains("v1.12.11 cannot be installed over v1.14.0"),
        "{message}"
    );
    s.running.stop().await.unwrap();
    assert!(s.lab.emu.writes().is_empty(), "{:?}", s.lab.emu.writes());
}

/// One node's pull fails (its registry is slower than the image bound):
/// the operation stops as PrePullFailed naming it, the other machines were
/// pulled, nothing was upgraded or rebooted (the write log) and no Node
/// was written (no cordon).
/// Covers: R15.4
#[tokio::test]
async fn a_failed_pull_cordons_nothing() {
    let machines = &[
        ("cp-1", "controlplane"),
        ("w-1", "worker"),
        ("w-2", "worker"),
    ];
    let bounds = OperationBounds {
        image: Duration::from_secs(1),
        ..quick()
    };
    let s = setup("op-prepull", machines, |_| "v1.13.9", bounds).await;
    let slow = s.lab.index("w-2");
    s.lab
        .emu
        .set_fault(slow, Fault::Slow(Duration::from_millis(1500)));
    let before = node_versions(&s.lab, &s.nodes).await;
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "up", "talos-upgrade", &[]),
        )
        .await
        .unwrap();
    let op = finished(&s.ops, "up").await;
    let (status, reason, message) = complete(&op);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", PRE_PULL_FAILED)
    );
    assert!(
        message.contains("pre-pull: w-2 could not pull")
            && message.contains("no machine was cordoned or drained"),
        "{message}"
    );
    let st = op.status.unwrap();
    assert_eq!(st.phase, Some(OperationPhase::Failed));
    let pulled: Vec<(String, PrePullPhase)> = st
        .pre_pull
        .iter()
        .map(|e| (e.machine.clone(), e.phase))
        .collect();
    assert_eq!(
        pulled,
        vec![
            ("cp-1".to_string(), PrePullPhase::Pulled),
            ("w-1".to_string(), PrePullPhase::Pulled),
            ("w-2".to_string(), PrePullPhase::Failed),
        ]
    );
    assert!(st.machines.iter().all(|p| p.step == MachineStep::Pending));
    s.running.stop().await.unwrap();
    assert_eq!(s.lab.upgrade_writes(), vec!["cp-1: pull", "w-1: pull"]);
    assert_eq!(
        node_versions(&s.lab, &s.nodes).await,
        before,
        "a Node was written"
    );
}

/// A real Alertmanager (Debian's package) on loopback.
struct Alertmanager {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn alertmanager() -> Alertmanager {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: none\nreceivers:\n  - name: none\n",
    )
    .unwrap();
    let port = ichor_testenv::free_port();
    // Debian's build opens its default templates in the absolute
    // /usr/share/prometheus/alertmanager at every config load, whatever
    // the config's `templates:` say; tools/testbin.sh keeps a copy of the
    // binary naming that folder relatively, run here from the unpacked
    // package's root (no root, no user namespace).
    let binary = Tool::Alertmanager
        .path()
        .with_file_name("prometheus-alertmanager.relative-share");
    assert!(
        binary.is_file(),
        "{} is missing: run tools/testbin.sh",
        binary.display()
    );
    let package_root = binary
        .ancestors()
        .nth(3)
        .expect("<package>/usr/bin/prometheus-alertmanager");
    let child = std::process::Command::new(&binary)
        .current_dir(package_root)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prometheus-alertmanager starts (tools/testbin.sh)");
    let am = Alertmanager {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    let ready = format!("{}/-/ready", am.url);
    wait_for("the Alertmanager to be ready", || async {
        reqwest::get(&ready)
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    am
}

/// A silence as the Alertmanager's API v2 returns it.
async fn silence(am: &Alertmanager, id: &str) -> serde_json::Value {
    let body = reqwest::get(format!("{}/api/v2/silence/{id}", am.url))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .text()
        .await
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

/// The operation's silence: created for its nodes once the machines start,
/// extended while a reboot is held (less than half of its 4 s left), and
/// expired at the end, as the real Alertmanager's API reads them back.
/// Covers: R15.10
#[tokio::test]
async fn the_silence_is_created_extended_and_expired() {
    let am = alertmanager().await;
    let machines = &[("w-1", "worker"), ("w-2", "worker")];
    let s = setup("op-silence", machines, |_| "v1.13.9", quick()).await;
    let gate = s.lab.emu.hold_reboots(s.lab.index("w-1"));
    let mut op = operation(&s.ns, "rb", "reboot", &[]);
    op.spec.alertmanager = serde_json::from_value(json!({"url": am.url, "length": "4s"})).unwrap();
    s.ops.create(&PostParams::default(), &op).await.unwrap();
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("w-1 reboots");
    let silence_of = || async {
        s.ops
            .get("rb")
            .await
            .unwrap()
            .status
            .and_then(|st| st.silence)
    };
    let first = silence_of()
        .await
        .expect("a silence once the machines started");
    let created = silence(&am, &first.id).await;
    assert_eq!(created["status"]["state"], "active", "{created}");
    assert_eq!(created["createdBy"], "ichor");
    let matcher = &created["matchers"][0];
    assert_eq!(matcher["name"], "node");
    assert_eq!(matcher["isRegex"], true);
    let regex = matcher["value"].as_str().unwrap();
    for host in [s.lab.host("w-1"), s.lab.host("w-2")] {
        assert!(regex.contains(&host), "{regex}");
    }
    let first_end = first.ends_at.clone().unwrap();
    wait_for("the silence to be extended", || async {
        silence_of()
            .await
            .and_then(|s| s.ends_at)
            .is_some_and(|end| end.0 > first_end.0)
    })
    .await;
    let extended = silence_of().await.unwrap();
    let read = silence(&am, &extended.id).await;
    assert_eq!(read["status"]["state"], "active", "{read}");
    let ends: k8s_openapi::jiff::Timestamp = read["endsAt"].as_str().unwrap().parse().unwrap();
    assert!(ends > first_end.0, "{read} after {first_end:?}");
    gate.open();
    let op = finished(&s.ops, "rb").await;
    assert_eq!(complete(&op).0, "True");
    let last = op.status.unwrap().silence.unwrap();
    assert!(last.expired);
    let expired = silence(&am, &last.id).await;
    assert_eq!(expired["status"]["state"], "expired", "{expired}");
    s.running.stop().await.unwrap();
}

/// The TalosCluster's `spec.alertmanager` is the default of its
/// operations: an operation that names none silences its nodes there, with
/// the cluster's node label, and expires the silence at its end.
/// Covers: R15.10
#[tokio::test]
async fn the_clusters_alertmanager_is_the_default() {
    let am = alertmanager().await;
    let machines = &[("w-1", "worker")];
    let s = setup("op-silence-default", machines, |_| "v1.13.9", quick()).await;
    Api::<TalosCluster>::namespaced(s.ops.clone().into_client(), &s.ns)
        .patch(
            "base",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"alertmanager": {"url": am.url, "nodeLabel": "instance"}}}),
            ),
        )
        .await
        .unwrap();
    let gate = s.lab.emu.hold_reboots(s.lab.index("w-1"));
    s.ops
        .create(
            &PostParams::default(),
            &operation(&s.ns, "rb", "reboot", &[]),
        )
        .await
        .unwrap();
    tokio::time::timeout(WAIT, gate.reached())
        .await
        .expect("w-1 reboots");
    let id = s
        .ops
        .get("rb")
        .await
        .unwrap()
        .status
        .and_then(|st| st.silence)
        .expect("a silence once the machines started")
        .id;
    let created = silence(&am, &id).await;
    assert_eq!(created["status"]["state"], "active", "{created}");
    assert_eq!(created["matchers"][0]["name"], "instance", "{created}");
    assert_eq!(created["matchers"][0]["value"], s.lab.host("w-1"));
    gate.open();
    let op = finished(&s.ops, "rb").await;
    assert_eq!(complete(&op).0, "True");
    let last = op.status.unwrap().silence.unwrap();
    assert!(last.expired && last.id == id, "{last:?}");
    let expired = silence(&am, &id).await;
    assert_eq!(expired["status"]["state"], "expired", "{expired}");
    s.running.stop().await.unwrap();
}

/// One probe of the API server: when, and whether it answered.
type Probe = (std::time::SystemTime, bool);

/// Probes the API server (`/version`) every 50 ms until the returned
/// sender is dropped or sent to.
fn probe_loop(
    client: kube::Client,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Vec<Probe>>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut probes = Vec::new();
        loop {
            let ok = tokio::time::timeout(Duration::from_secs(2), client.apiserver_version())
                .await
                .is_ok_and(|r| r.is_ok());
            probes.push((std::time::SystemTime::now(), ok));
            tokio::select! {
                _ = &mut stopped => return probes,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    (stop, task)
}

/// Probes that failed inside one of `spans` (start, end).
fn failed_within(
    probes: &[Probe],
    spans: &[(k8s_openapi::jiff::Timestamp, k8s_openapi::jiff::Timestamp)],
) -> (usize, usize) {
    let inside: Vec<&Probe> = probes
        .iter()
        .filter(|(at, _)| {
            let at = k8s_openapi::jiff::Timestamp::try_from(*at).expect("time");
            spans.iter().any(|(a, b)| *a <= at && at <= *b)
        })
        .collect();
    (inside.iter().filter(|(_, ok)| !ok).count(), inside.len())
}

/// The published upgrade figures (docs/benchmarks.md): on the emulated lab
/// of 3 control planes and 2 workers, a talos-upgrade v1.13.9 → v1.14.0,
/// then a kubernetes-upgrade v1.36.0 → v1.37.0, each end to end with the
/// controller's test bounds (poll 100 ms), while a probe loop asks the API
/// server for its version every 50 ms. Prints each machine's time, the
/// total, and the probes that failed during the control-plane steps.
/// Both operations must complete with a duration for every machine and in
/// all, and no probe may fail. The figures: `cargo test -p ichor-controller
/// --test it -- --nocapture upgrade_figures`.
/// Covers: R15.9, R15.11
#[tokio::test]
async fn upgrade_figures() {
    use crate::operations::{LAB, at_v1_36, finished_playing, kubernetes_operation};
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-bench").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    Api::<TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &crate::operations::cluster(&ns))
        .await
        .unwrap();
    let lab = lab_talos(&client, &ns, LAB, &[], at_v1_36, |_| "v1.13.9").await;
    let mut config = config(&ns, &ns);
    config.operation_bounds = quick();
    let running = start(client.clone(), config);
    let s = crate::operations::Setup {
        ops: Api::namespaced(client.clone(), &ns),
        client: client.clone(),
        ns,
        running,
        lab,
    };
    let mut report = vec![
        "| operation | machine | role | time |".to_string(),
        "|---|---|---|---|".to_string(),
    ];
    let runs = [
        (
            "talos-upgrade v1.13.9 → v1.14.0",
            operation(&s.ns, "bench-talos", "talos-upgrade", &[]),
        ),
        (
            "kubernetes-upgrade v1.36.0 → v1.37.0",
            kubernetes_operation(&s.ns, "bench-k8s", "v1.37.0", false),
        ),
    ];
    let mut probes_line = Vec::new();
    for (what, op) in runs {
        let name = op.metadata.name.clone().unwrap();
        let (stop, probes) = probe_loop(client.clone());
        s.ops.create(&PostParams::default(), &op).await.unwrap();
        let done = finished_playing(&s, &name).await;
        let _ = stop.send(());
        let probes = probes.await.unwrap();
        let (status, reason, message) = complete(&done);
        assert_eq!(status, "True", "{what}: {reason}: {message}");
        let st = done.status.unwrap();
        assert!(st.duration.is_some(), "{what}: no total duration");
        // A kubernetes-upgrade's machine records its times, not a duration.
        assert!(
            st.machines
                .iter()
                .all(|p| p.duration.is_some()
                    || (p.start_time.is_some() && p.completion_time.is_some())),
            "{what}: a machine without its duration: {:?}",
            st.machines
        );
        let role_of = |m: &str| {
            st.plan
                .iter()
                .find(|e| e.machine == m)
                .map(|e| e.role.as_str())
                .unwrap_or_default()
        };
        let mut cp_spans = Vec::new();
        for p in &st.machines {
            // A kubernetes-upgrade's machine time: its component steps.
            let (time, span) = match (&p.start_time, &p.completion_time) {
                (Some(a), Some(b)) => (
                    p.duration.clone().unwrap_or_else(|| {
                        ichor_controller::operation_decide::duration::words(
                            ichor_controller::operation_decide::duration::between(a, b),
                        )
                    }),
                    Some((a.0, b.0)),
                ),
                _ => (p.duration.clone().unwrap_or_default(), None),
            };
            if role_of(&p.machine) == "controlplane"
                && let Some(span) = span
            {
                cp_spans.push(span);
            }
            report.push(format!(
                "| {what} | {} | {} | {time} |",
                p.machine,
                role_of(&p.machine)
            ));
        }
        report.push(format!(
            "| {what} | **total** | | **{}** |",
            st.duration.unwrap_or_default()
        ));
        let (failed, during) = failed_within(&probes, &cp_spans);
        let all_failed = probes.iter().filter(|(_, ok)| !ok).count();
        assert_eq!(all_failed, 0, "{what}: the API server failed probes");
        probes_line.push(format!(
            "{what}: {failed} of {during} probes failed during the control-plane steps ({all_failed} of {} in all)",
            probes.len()
        ));
    }
    s.running.stop().await.unwrap();
    // The figures are this test's output.
    #[allow(clippy::print_stdout)]
    {
        println!("\n{}\n\n{}\n", report.join("\n"), probes_line.join("\n"));
    }
}
