//! The lab grows and shrinks: nodes added to a running lab (one through
//! the control socket `ichor-lab node add` uses) boot in maintenance mode;
//! given the lab's configs over the insecure API, as `ichor init` gives
//! them, their kubelets register their Nodes, which turn Ready with the
//! lab's CNI, the control plane's static pods show, and it joins the one
//! etcd membership. The
//! real talosctl resets the worker back to maintenance mode; its Node
//! stays, the lab deletes nothing.

use std::time::Duration;

use ichor_lab::{LabCni, LabOptions, LabShape, NewNode, NodeRole, control, node_configs};
use ichor_talemu::{MembershipChangeKind, WriteAction};
use ichor_talos_client::{ApplyMode, ApplyRequest, ClientOptions, TalosClient};
use ichor_testenv::Tool;
use k8s_openapi::api::core::v1::Node;

/// Waits (bounded) until `check` gives a value.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    check: impl Fn() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within 30s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Covers: R14.9, R14.10
#[tokio::test(flavor = "multi_thread")]
async fn nodes_added_to_a_running_lab_join_register_and_stay_registered_once_wiped() {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(dir.path());
    options.nodes = 2;
    options.control_planes = 1;
    options.cni = LabCni::Flannel;
    options.components = true;
    let mut lab = ichor_lab::Lab::up(options.clone()).await.unwrap();
    let nodes: kube::Api<Node> = kube::Api::all(lab.client().await);

    // `ichor-lab node add --role controlplane`, through the control socket.
    let listener = control::bind(lab.state_dir()).unwrap();
    let state_dir = lab.state_dir().to_path_buf();
    let (cp, ()) = tokio::join!(
        control::node_add(&state_dir, NodeRole::ControlPlane, None),
        async {
            let (stream, _) = listener.accept().await.unwrap();
            control::answer(&mut lab, stream).await;
        }
    );
    let cp = cp.unwrap();
    let worker = lab
        .add_node(NewNode {
            role: NodeRole::Worker,
            shape: Some(LabShape::V1alpha1),
        })
        .await
        .unwrap();
    assert_eq!((cp.hostname.as_str(), cp.index), ("lab-cp-2", 2));
    assert_eq!(worker.hostname, "lab-worker-2");
    assert_eq!(worker.talos_version, LabShape::V1alpha1.talos_version());
    assert!(lab.emulator.in_maintenance(cp.index));
    assert!(nodes.get_opt(&cp.hostname).await.unwrap().is_none());

    // The lab's own configs, applied over the insecure API as `ichor init` does.
    let configs = node_configs(&options, &lab.addresses[..2]).unwrap();
    for (node, config) in [(&cp, &configs[0]), (&worker, &configs[1])] {
        let insecure = TalosClient::maintenance(&node.endpoint, ClientOptions::default()).unwrap();
        insecure
            .apply_configuration(
                "",
                &ApplyRequest::new(config.as_bytes().to_vec(), ApplyMode::Auto),
            )
            .await
            .unwrap();
    }
    for name in [&cp.hostname, &worker.hostname] {
        until(&format!("{name}'s Node Ready"), || async {
            nodes.get_opt(name).await.unwrap().filter(ready).map(|_| ())
        })
        .await;
    }
    // Its kubelet runs the control plane's static pods, as the others'.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(lab.client().await, "kube-system");
    until("lab-cp-2's mirror pods", || async {
        pods.get_opt("kube-apiserver-lab-cp-2")
            .await
            .unwrap()
            .map(|_| ())
    })
    .await;
    let log = until("lab-cp-2's promotion", || async {
        let log = lab.emulator.membership_log();
        log.iter()
            .any(|c| c.kind == MembershipChangeKind::Promoted && c.hostname == "lab-cp-2")
            .then_some(log)
    })
    .await;
    let last = log.last().unwrap();
    assert_eq!((last.voters, last.healthy_voters), (2, 2), "{log:?}");

    // The real talosctl resets the worker: back to maintenance mode, its
    // Node still there.
    let out = tokio::process::Command::new(Tool::Talosctl.path())
        .arg("--talosconfig")
        .arg(&lab.talosconfig)
        .args(["-e", &lab.addresses[0].to_string()])
        .args(["-n", &worker.address.to_string()])
        .args(["reset", "--graceful", "--reboot", "--wait=false"])
        .args(["--system-labels-to-wipe", "STATE"])
        .args(["--system-labels-to-wipe", "EPHEMERAL"])
        .env_remove("TALOSCONFIG")
        .env("HOME", dir.path())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    until("the worker back in maintenance mode", || async {
        lab.emulator.in_maintenance(worker.index).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(nodes.get_opt(&worker.hostname).await.unwrap().is_some());
    let resets = lab
        .emulator
        .writes()
        .into_iter()
        .filter(|w| matches!(w.action, WriteAction::Reset { .. }))
        .map(|w| w.node)
        .collect::<Vec<_>>();
    assert_eq!(resets, std::slice::from_ref(&worker.hostname));
    tracing::info!(took = ?started.elapsed(), "the growing lab");
}
