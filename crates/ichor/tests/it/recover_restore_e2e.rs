//! `ichor recover`, the binary, restores a real etcd: a test control plane
//! of its own (real etcd and kube-apiserver) stands behind an emulated
//! control plane that trusts the backup's bundle; a backup is taken through
//! the Talos API into the real S3 server, etcd is lost, and recover — killed
//! right after each phase and run again — brings back what the snapshot
//! held with one `Bootstrap` (the emulator's count).

use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt as _;
use std::sync::Arc;

use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt as _;
use ichor_backup::crypt::Recipients;
use ichor_backup::manifest::{ClusterRef, Layout, Reason};
use ichor_backup::take::{Inputs, take};
use ichor_talemu::{Emulator, EmulatorOptions, EtcdRestore, NodeSpec, Pki};
use ichor_talos::config::MachineConfig;
use ichor_talos::secrets::SecretsBundle;
use ichor_testenv::s3::S3Server;
use ichor_testenv::{TestEnv, Tool};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

use crate::common::text;
use crate::recover_cli::{keygen, recover_with, store};

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

/// Covers: R20.17, R20.18
#[tokio::test(flavor = "multi_thread")]
async fn recover_brings_a_lost_etcd_back_with_one_bootstrap_across_kills() {
    let path = ichor_testenv::fixtures::talos_dir().join("stability-v1.12/base-controlplane.yaml");
    let cp = std::fs::read_to_string(&path).unwrap();
    let bundle =
        SecretsBundle::from_machine_config(&MachineConfig::parse(&cp).unwrap(), "fixture").unwrap();
    let (ca, key) = bundle.os_ca_pem().unwrap();
    let key = ichor_talos::pem::relabel(&key, "PRIVATE KEY").unwrap_or(key);
    let env = Arc::new(
        tokio::task::spawn_blocking(TestEnv::start)
            .await
            .unwrap()
            .expect("a test control plane"),
    );
    let emu = Emulator::start_with(
        vec![NodeSpec::new("cp-1", cp.into_bytes()).with_address(IpAddr::from([127, 0, 14, 2]))],
        EmulatorOptions {
            pki: Some(Pki::from_pem(&ca, &key).unwrap()),
            etcd_url: Some(env.etcd_url().to_string()),
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap();
    let starter = env.etcd_starter();
    emu.restore_etcd_with(EtcdRestore {
        etcdutl: Tool::Etcdutl.path(),
        member_args: env.etcd_member_args(),
        start: Arc::new(move |data_dir| {
            let starter = starter.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || starter.start_from(&data_dir))
                    .await
                    .map_err(|e| Box::new(e) as ichor_talemu::RestoreHookError)?
                    .map_err(|e| Box::new(e) as ichor_talemu::RestoreHookError)
            })
        }),
    });
    let address = emu.endpoint(0);
    let kube = env.client().await;

    // A backup taken as the controller takes one: the snapshot through the
    // Talos API, checked and encrypted into the bucket.
    let s3 = S3Server::start().expect("the S3 server starts");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (identity, recipient) = keygen(dir.path(), "backup.key");
    let recipients = Recipients::parse(&[recipient]).unwrap();
    config_map(&kube, "before-backup").await;
    let talos = emu.admin_client(0).unwrap();
    let stream = talos.etcd_snapshot("").await.unwrap();
    let chunks: Vec<Result<Bytes, ichor_talos_client::Error>> = stream.collect().await;
    let objects = format!(
        "---\nkind: TalosCluster\nmetadata: {{name: lab, namespace: default}}\n---\nkind: TalosMachine\nmetadata: {{name: cp-1, namespace: default}}\nspec: {{clusterRef: {{name: lab}}, role: controlplane, address: \"{address}\"}}\n"
    );
    let started = Utc::now();
    take(
        &store(&s3),
        &Layout::new(""),
        &recipients,
        Inputs {
            cluster: ClusterRef {
                name: "lab".into(),
                uid: "uid-1".into(),
            },
            backup: ichor_backup::manifest::backup_name("lab", started, None),
            reason: Reason::Manual,
            started,
            talos_version: "v1.12.0".into(),
            kubernetes_version: "v1.36.0".into(),
            member: "cp-1".into(),
            revision: 1,
            bundle: bundle.to_yaml().unwrap().into_bytes(),
            objects: objects.into_bytes(),
        },
        futures::stream::iter(chunks),
        Utc::now,
    )
    .await
    .expect("the backup is taken");
    config_map(&kube, "after-backup").await;

    let e = Arc::clone(&env);
    tokio::task::spawn_blocking(move || e.lose_etcd())
        .await
        .unwrap()
        .expect("etcd lost");
    emu.lose_etcd();
    let before = emu.bootstrap_calls(0);

    let out_dir = dir.path().join("out");
    let args = [
        "--cluster",
        "lab",
        "--identity",
        identity.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
        "--yes",
        "--etcd-timeout",
        "4m",
    ];
    for phase in ["files", "uploaded", "bootstrapped", "etcd-running"] {
        let o = recover_with(&s3, &home, &args, &[("ICHOR_RECOVER_KILL_AFTER", phase)]);
        assert_eq!(
            o.status.signal(),
            Some(9),
            "killed after {phase}: {}",
            text(&o)
        );
    }
    assert_eq!(emu.bootstrap_calls(0), before + 1, "one Bootstrap");

    // The apiserver serves what the snapshot held, not what came after.
    let kube = env.client().await;
    let cms = Api::<ConfigMap>::namespaced(kube, "default");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        match cms.get_opt("before-backup").await {
            Ok(Some(_)) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the restored API serves before-backup: {other:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(cms.get_opt("after-backup").await.unwrap().is_none());
}
