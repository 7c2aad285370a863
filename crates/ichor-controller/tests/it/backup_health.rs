//! Backup health you can see: a backup taken by the controller from an
//! emulated control plane (streaming the test control plane's real etcd)
//! into the real S3 server turns the cluster's `BackupHealthy` True, shows
//! in `/metrics` and in Events on the backup and the cluster; a backup that
//! fails turns it False with the failure's reason, and no Event carries
//! the bucket's secret.

use crate::common::*;
use ichor_api::TalosCluster;
use ichor_api::backup::{BackupPhase, TalosBackup};
use ichor_api::conditions::{self, reasons, types};
use ichor_talemu::NodeSpec;
use ichor_testenv::TestEnv;
use ichor_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

/// An age recipient (public key only: nothing here decrypts).
const RECIPIENT: &str = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";

fn cluster(ns: &str, s3: &S3Server) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "bh", "namespace": ns},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "backup": {
                "destination": {"s3": {"endpoint": s3.endpoint(), "bucket": s3.bucket(),
                    "region": s3.region(), "prefix": "health", "allowHttp": true,
                    "credentialsSecretRef": {"name": "backup-s3"}}},
                "recipients": [RECIPIENT]}}
    }))
    .unwrap()
}

fn backup(ns: &str, name: &str) -> TalosBackup {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosBackup",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterRef": {"name": "bh"}, "reason": "manual"}
    }))
    .unwrap()
}

async fn credentials(client: &kube::Client, ns: &str, s3: &S3Server) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "backup-s3", "namespace": ns},
        "stringData": {"accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

/// `BackupHealthy` of the cluster: status, reason, message.
async fn healthy(clusters: &Api<TalosCluster>) -> Option<(String, String, String)> {
    let c = clusters.get("bh").await.ok()?;
    let s = c.status?;
    conditions::find(&s.conditions, types::BACKUP_HEALTHY)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits for the backup to finish and returns it.
async fn finished(backups: &Api<TalosBackup>, name: &str) -> TalosBackup {
    wait_for(&format!("TalosBackup {name} to finish"), || async {
        backups.get(name).await.is_ok_and(|b| {
            b.status
                .is_some_and(|s| matches!(s.phase, BackupPhase::Succeeded | BackupPhase::Failed))
        })
    })
    .await;
    backups.get(name).await.unwrap()
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The Events of `kind` in `ns`, as `reason: note`.
async fn events(client: &kube::Client, ns: &str, kind: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// Covers: R20.8, R20.9
#[tokio::test]
async fn a_backup_shows_in_the_condition_the_metrics_and_events() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("backup-health").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let s3 = tokio::task::spawn_blocking(S3Server::start)
        .await
        .unwrap()
        .expect("the S3 server starts");
    credentials(&client, &ns, &s3).await;
    let emu = emulator(vec![
        NodeSpec::new(
            "cp-1",
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-controlplane.yaml"),
        )
        .with_version("v1.12.1"),
    ])
    .await;
    emu.serve_etcd_at(env.etcd_url());

    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, &s3))
        .await
        .unwrap();
    let machine: ichor_api::TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "bh-cp-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "bh"}, "role": "controlplane", "address": emu.endpoint(0), "hold": true}
    }))
    .unwrap();
    Api::<ichor_api::TalosMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cfg = config(&ns, &ns);
    cfg.http_addr = Some(addr);
    let running = start(client.clone(), cfg);

    // Before the first backup: Unknown, waiting.
    wait_for("BackupHealthy to wait for the first backup", || async {
        healthy(&clusters)
            .await
            .is_some_and(|(s, r, _)| s == "Unknown" && r == reasons::WAITING_FOR_BACKUP)
    })
    .await;

    // A backup that succeeds: True, with its name.
    let backups = Api::<TalosBackup>::namespaced(client.clone(), &ns);
    backups
        .create(&PostParams::default(), &backup(&ns, "bh-first"))
        .await
        .unwrap();
    let first = finished(&backups, "bh-first").await;
    let st = first.status.clone().unwrap();
    assert_eq!(st.phase, BackupPhase::Succeeded, "{st:?}");
    wait_for("BackupHealthy True after the backup", || async {
        healthy(&clusters).await.is_some_and(|(s, r, m)| {
            s == "True" && r == reasons::BACKUP_SUCCEEDED && m.contains("bh-first")
        })
    })
    .await;

    // The metrics say when it finished, how big it was, and count it.
    wait_for("the HTTP server", || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    let metrics = http_get(addr, "/metrics").await;
    let id = format!("{ns}/bh");
    let finished_at = st.completion_time.as_ref().unwrap().0.as_second();
    for line in [
        format!("ichor_backup_last_success_timestamp_seconds{{cluster=\"{id}\"}} {finished_at}"),
        format!(
            "ichor_backup_last_size_bytes{{cluster=\"{id}\"}} {}",
            st.size.unwrap()
        ),
        format!("ichor_backups_total{{cluster=\"{id}\",result=\"succeeded\"}} 1"),
        "# TYPE ichor_backup_last_duration_seconds gauge".to_owned(),
        format!("ichor_backup_last_duration_seconds{{cluster=\"{id}\"}} "),
    ] {
        assert!(metrics.contains(&line), "{line} is not in:\n{metrics}");
    }

    // A backup that fails (its bucket's credentials are gone): False, with why.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("backup-s3", &DeleteParams::default())
        .await
        .unwrap();
    backups
        .create(&PostParams::default(), &backup(&ns, "bh-second"))
        .await
        .unwrap();
    let second = finished(&backups, "bh-second").await;
    assert_eq!(second.status.as_ref().unwrap().phase, BackupPhase::Failed);
    wait_for("BackupHealthy False after the failed backup", || async {
        healthy(&clusters).await.is_some_and(|(s, r, m)| {
            s == "False"
                && r == reasons::BACKUP_FAILED
                && m.starts_with("the newest backup, bh-second, failed: ")
                && m.contains("credentials Secret")
        })
    })
    .await;
    let metrics = http_get(addr, "/metrics").await;
    assert!(
        metrics.contains(&format!(
            "ichor_backups_total{{cluster=\"{id}\",result=\"failed\"}} 1"
        )),
        "{metrics}"
    );

    // Events on the backup and on the cluster, without the bucket's secret.
    let seen = std::sync::Mutex::new((Vec::new(), Vec::new()));
    wait_for("the backups' Events", || async {
        let got = (
            events(&client, &ns, "TalosCluster").await,
            events(&client, &ns, "TalosBackup").await,
        );
        let all = [&got.0, &got.1].iter().all(|evs| {
            ["BackupStarted: ", "BackupSucceeded: ", "BackupFailed: "]
                .iter()
                .all(|r| evs.iter().any(|e| e.starts_with(r)))
        });
        *seen.lock().unwrap() = got;
        all
    })
    .await;
    let (on_cluster, on_backups) = seen.into_inner().unwrap();
    let succeeded = on_cluster
        .iter()
        .find(|e| e.starts_with("BackupSucceeded: "))
        .unwrap();
    assert!(succeeded.contains("bh-first"), "{succeeded}");
    assert!(
        succeeded.contains(&format!("{} bytes", st.size.unwrap())),
        "{succeeded}"
    );
    assert!(succeeded.contains("etcd revision "), "{succeeded}");
    for e in on_cluster.iter().chain(&on_backups) {
        assert!(
            !e.contains(s3.secret_access_key()),
            "an Event carries the secret: {e}"
        );
    }
    running.stop().await.unwrap();
    emu.shutdown().await;
}

/// A volume destination: with the claim mounted (here a folder), the real
/// take path writes the four parts there and the cluster is healthy; a
/// cluster naming a claim that is not mounted is told what to set.
/// Covers: R20.10
#[tokio::test]
async fn a_volume_destination_is_written_when_mounted_and_said_when_not() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("backup-volume").await;
    crds(&client).await;
    bundle_secret(&client, &ns).await;
    let emu = emulator(vec![
        NodeSpec::new(
            "cp-1",
            ichor_testenv::fixtures::cni_none("v1.12-cni-none-controlplane.yaml"),
        )
        .with_version("v1.12.1"),
    ])
    .await;
    emu.serve_etcd_at(env.etcd_url());
    let mounted = tempfile::tempdir().unwrap();
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    for (name, claim) in [("bh", "backups"), ("nas", "nas")] {
        let c: TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
                "secretsRef": {"name": "bundle"},
                "cni": {"preset": "cilium", "kubeProxy": "enabled"},
                "backup": {
                    "destination": {"volume": {"claimName": claim, "path": "homelab"}},
                    "recipients": [RECIPIENT]}}
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &c).await.unwrap();
    }
    let machine: ichor_api::TalosMachine = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": "bh-cp-1", "namespace": ns},
        "spec": {"clusterRef": {"name": "bh"}, "role": "controlplane", "address": emu.endpoint(0), "hold": true}
    }))
    .unwrap();
    Api::<ichor_api::TalosMachine>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut cfg = config(&ns, &ns);
    cfg.backup_volume = Some(ichor_controller::backup::volume::BackupVolume {
        claim_name: "backups".into(),
        root: mounted.path().to_path_buf(),
    });
    let running = start(client.clone(), cfg);

    // The claim that is not mounted: False, saying what to set.
    wait_for("BackupHealthy of the unmounted claim", || async {
        let Ok(c) = clusters.get("nas").await else {
            return false;
        };
        c.status.is_some_and(|s| {
            conditions::find(&s.conditions, types::BACKUP_HEALTHY).is_some_and(|h| {
                h.status == "False"
                    && h.reason == reasons::VOLUME_NOT_MOUNTED
                    && h.message.contains("backup.volume.claimName=nas")
            })
        })
    })
    .await;

    // The mounted one: the backup lands in its folder, complete.
    let backups = Api::<TalosBackup>::namespaced(client.clone(), &ns);
    backups
        .create(&PostParams::default(), &backup(&ns, "bh-volume"))
        .await
        .unwrap();
    let done = finished(&backups, "bh-volume").await;
    let st = done.status.clone().unwrap();
    assert_eq!(st.phase, BackupPhase::Succeeded, "{st:?}");
    let folder = mounted.path().join("homelab").join("bh");
    let mut files: Vec<String> = walk(&folder)
        .into_iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "bundle.yaml.age",
            "etcd.snapshot.age",
            "manifest.json.age",
            "objects.yaml.age"
        ],
        "under {}",
        folder.display()
    );
    assert!(
        st.location
            .as_deref()
            .unwrap_or_default()
            .contains("homelab"),
        "{st:?}"
    );
    wait_for("BackupHealthy True on the volume", || async {
        healthy(&clusters)
            .await
            .is_some_and(|(s, r, _)| s == "True" && r == reasons::BACKUP_SUCCEEDED)
    })
    .await;
    running.stop().await.unwrap();
    emu.shutdown().await;
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
