//! The disaster, on the lab: three control planes with Ichor adopted, a
//! manual backup lands in the real S3 server, the lab loses its etcd, and
//! the real `ichor` binary — from an environment holding only PATH, an
//! empty HOME, the bucket's credentials and the identity file — recovers
//! it: killed after `uploaded` and after `bootstrapped`, then run to the
//! end. The API serves the objects of backup time and not later ones, the
//! controller runs and its TalosCluster is Ready, the recovery node got
//! one Bootstrap (the emulator's count), a config change written after the
//! recovery reaches a released machine (the controller `ichor recover`
//! restarted applies it; the lab only plays the nodes), and a reboot of
//! the recovered control plane keeps the data.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};

use std::time::Duration;

use ichor_api::{TalosCluster, TalosMachine};
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

/// Whether the emulated node at `endpoint` is the one `address` names
/// (with or without the port).
fn at(endpoint: &str, address: &str) -> bool {
    endpoint == address
        || endpoint
            .strip_prefix(address)
            .is_some_and(|rest| rest.starts_with(':'))
}

const LABELS: &str = "machine:\n  nodeLabels:\n    ichor.maesh.dev/recovered: \"yes\"\n";

/// Covers: R20.17, R20.19, R13.5
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
        Api::<TalosCluster>::namespaced(client.clone(), NS)
            .get_opt("lab")
            .await
            .unwrap()
            .is_some()
    );

    // A change written after the recovery reaches a released machine.
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    let machine = machines
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|m| !m.spec.hold)
        .expect("adopt released the machines");
    let name = machine.metadata.name.clone().unwrap();
    let index = (0..3)
        .find(|&i| at(&h.lab.emulator.endpoint(i), &machine.spec.address))
        .unwrap_or_else(|| panic!("no emulated node at {}", machine.spec.address));
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"patches": [{"name": "recovered", "inline": LABELS}]}}),
            ),
        )
        .await
        .expect("patch the machine");
    ichor_testenv::wait::until(
        &format!("machine {name}'s patch applied to its node after the recovery"),
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            h.lab
                .emulator
                .active_config(index)
                .is_some_and(|c| String::from_utf8_lossy(&c).contains("ichor.maesh.dev/recovered"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", h.logs()));

    // A reboot of the recovered control plane keeps the data.
    let node = result["node"]
        .as_str()
        .expect("the recovery node")
        .to_string();
    let recovered = (0..3)
        .find(|&i| at(&h.lab.emulator.endpoint(i), &node))
        .unwrap_or_else(|| panic!("no emulated node at {node}"));
    let boot = h.lab.emulator.boot_id(recovered);
    h.lab
        .emulator
        .admin_client(recovered)
        .unwrap()
        .reboot("")
        .await
        .expect("reboot the recovered control plane");
    ichor_testenv::wait::until(
        "the recovered control plane back with etcd running",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let client = h.lab.emulator.admin_client(recovered).unwrap();
            h.lab.emulator.boot_id(recovered) != boot
                && client
                    .etcd_service("")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|s| s.is_running_and_healthy())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", h.logs()));
    assert!(cms.get_opt("before-backup").await.unwrap().is_some());
    let last: u32 = (0..3).map(|i| h.lab.emulator.bootstrap_calls(i)).sum();
    assert_eq!(last, after, "no Bootstrap after the reboot");
}
