//! The disaster, on the lab: three control planes with Ichor adopted, a
//! manual backup lands in the real S3 server, the lab loses its etcd, and
//! the real `ichor` binary — from an environment holding only PATH, an
//! empty HOME, the bucket's credentials and the identity file — recovers
//! it: killed after `uploaded` and after `bootstrapped`, then run to the
//! end. The API serves the objects of backup time and not later ones, the
//! controller runs and its TalosCluster is Ready, and the recovery node got
//! one Bootstrap (the emulator's count).

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};

use ichor_api::TalosCluster;
use ichor_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::common::{LabHarness, NS, run, text};
use crate::recover_cli::keygen;

async fn config_map(client: &kube::Client, name: &str) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// Covers: R20.17, R20.19
#[tokio::test(flavor = "multi_thread")]
async fn recover_brings_the_lab_back_after_it_lost_etcd() {
    let h = LabHarness::up(|o| {
        o.nodes = 3;
        o.control_planes = 3;
    })
    .await;
    let out = run(h.adopt(&[]));
    assert!(out.status.success(), "adopt failed:\n{}", text(&out));
    let client = h.client().await;
    let s3 = S3Server::start().expect("the S3 server starts");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "backup-s3", "namespace": NS},
        "stringData": {"accessKeyId": s3.access_key_id(), "secretAccessKey": s3.secret_access_key()}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let (identity, recipient) = keygen(h.dir.path(), "backup.key");
    Api::<TalosCluster>::namespaced(client.clone(), NS)
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"backup": {
                "destination": {"s3": {
                    "endpoint": s3.endpoint(), "bucket": s3.bucket(), "prefix": "lab-backups",
                    "region": s3.region(), "allowHttp": true,
                    "credentialsSecretRef": {"name": "backup-s3"}}},
                "recipients": [recipient],
            }}})),
        )
        .await
        .expect("the backup spec is accepted");
    config_map(&client, "before-backup").await;
    let mut now = h.ichor();
    now.args([
        "backup",
        "now",
        "--cluster",
        "lab",
        "-n",
        NS,
        "--wait",
        "--kubeconfig",
    ])
    .arg(&h.lab.kubeconfig);
    let out = run(now);
    assert!(
        out.status.success(),
        "backup now:\n{}\n{}",
        text(&out),
        h.logs()
    );
    config_map(&client, "after-backup").await;

    tokio::task::block_in_place(|| h.lab.lose_etcd()).expect("etcd lost");
    let before: u32 = (0..3).map(|i| h.lab.emulator.bootstrap_calls(i)).sum();

    let home = h.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let out_dir = h.dir.path().join("recovered");
    let recover = |kill: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("AWS_ACCESS_KEY_ID", s3.access_key_id())
            .env("AWS_SECRET_ACCESS_KEY", s3.secret_access_key())
            .args(["recover", "--cluster", "lab", "--yes", "-o", "json"])
            .args([
                "--endpoint",
                &s3.endpoint(),
                "--allow-http",
                "--bucket",
                s3.bucket(),
            ])
            .args([
                "--region",
                s3.region(),
                "--prefix",
                "lab-backups",
                "--identity",
            ])
            .arg(&identity)
            .arg("--out")
            .arg(&out_dir)
            .stdin(Stdio::null());
        if let Some(phase) = kill {
            cmd.env("ICHOR_RECOVER_KILL_AFTER", phase);
        }
        cmd.output().expect("ichor runs")
    };
    for phase in ["uploaded", "bootstrapped"] {
        let o = recover(Some(phase));
        assert_eq!(
            o.status.signal(),
            Some(9),
            "killed after {phase}: {}",
            text(&o)
        );
    }
    let o = recover(None);
    assert!(o.status.success(), "recover:\n{}\n{}", text(&o), h.logs());
    let result: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(result["phase"], "reconciled", "{result}");
    let after: u32 = (0..3).map(|i| h.lab.emulator.bootstrap_calls(i)).sum();
    assert_eq!(after, before + 1, "one Bootstrap in all");

    let client = h.client().await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    assert!(cms.get_opt("before-backup").await.unwrap().is_some());
    assert!(cms.get_opt("after-backup").await.unwrap().is_none());
    assert!(
        Api::<TalosCluster>::namespaced(client, NS)
            .get_opt("lab")
            .await
            .unwrap()
            .is_some()
    );
}
