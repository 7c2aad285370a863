//! `ichor reboot` / `ichor operation list|status|cancel` against the real
//! API server, with Ichor's controller running in process: the CLI creates
//! the TalosOperation, prints the plan the controller wrote to status, lists
//! it and cancels it; it never talks to a node (the machine's address is
//! unreachable, so any node call would fail the operation, not the CLI).

use std::process::Output;
use std::time::Duration;

use ichor_api::TalosOperation;
use ichor_testenv::{TestEnv, install};
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use serde_json::json;

async fn ichor(env: &TestEnv, args: &[&str]) -> Output {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("ichor answered within 120s")
        .expect("ichor runs")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Covers: the operation CLI, docs/guides/upgrades.md (the CLI creates TalosOperations, prints the plan from status, lists and cancels)
#[tokio::test]
async fn reboot_prints_the_plan_then_list_and_cancel() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("op-cli").await;
    install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();
    let ops = Api::<TalosOperation>::namespaced(client.clone(), &ns);
    let cluster: ichor_api::TalosCluster = serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "base", "namespace": ns},
        "spec": {"endpoint": "https://base:6443", "talosVersion": "v1.13.0", "kubernetesVersion": "v1.36.0",
            "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
            "cni": {"preset": "cilium", "kubeProxy": "enabled"},
            "secretsRef": {"name": "bundle"}}
    }))
    .unwrap();
    Api::<ichor_api::TalosCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    for (name, role, hold) in [("cp-1", "controlplane", false), ("w-1", "worker", true)] {
        let m: ichor_api::TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterRef": {"name": "base"}, "role": role, "address": "127.0.0.1:9", "hold": hold}
        }))
        .unwrap();
        Api::<ichor_api::TalosMachine>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &m)
            .await
            .unwrap();
    }
    let config = ichor_controller::Config {
        namespace: Some(ns.clone()),
        system_namespace: ns.clone(),
        leader_election: None,
        talos_call_timeout: Duration::from_secs(2),
        ..ichor_controller::Config::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(ichor_controller::run_with(client.clone(), config, async {
        let _ = stopped.await;
    }));

    let out = ichor(
        env,
        &[
            "reboot",
            "--cluster",
            "base",
            "-n",
            &ns,
            "--name",
            "rb",
            "cp-1",
            "w-1",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{ns}/rb  reboot")),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("    1  cp-1  controlplane  reboot"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("    1  w-1  worker  skipped (held)"),
        "{}",
        text(&out)
    );

    let out = ichor(env, &["operation", "list", "-n", &ns]).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{ns}/rb  reboot")));

    let out = ichor(env, &["operation", "status", "rb", "-n", &ns, "-o", "json"]).await;
    assert!(out.status.success(), "{}", text(&out));
    let parsed: TalosOperation = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(parsed.status.unwrap().plan.len(), 2);

    let out = ichor(env, &["operation", "cancel", "rb", "-n", &ns]).await;
    assert!(out.status.success(), "{}", text(&out));
    let rb = ops.get("rb").await.unwrap();
    assert!(
        rb.annotations()
            .contains_key(ichor_controller::operation::CANCEL_ANNOTATION)
    );

    // A kubernetes-upgrade checks the version path on the nodes before it
    // plans: a node that does not answer refuses it, naming the machine.
    let out = ichor(
        env,
        &[
            "upgrade",
            "kubernetes",
            "--to",
            "1.37.0",
            "--cluster",
            "base",
            "-n",
            &ns,
            "--name",
            "k8s",
        ],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Complete=False (Refused)"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("the Kubernetes version of TalosMachine cp-1 cannot be read"),
        "{}",
        text(&out)
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), controller).await;
}
