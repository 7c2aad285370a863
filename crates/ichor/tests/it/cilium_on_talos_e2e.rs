//! The real Cilium chart (from Cilium's Go module, via the tools cache)
//! installed by the real `ichor` on the lab: a pod per node for each of its
//! DaemonSets, nodes Ready only behind Ready agents, and a Cilium whose
//! rendered configuration would not run on Talos keeping the nodes NotReady
//! until adopt's bounded wait ends with the reason (ADR 0008).

use std::collections::BTreeSet;
use std::process::Output;

use ichor_testenv::Tool;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::ListParams;

use crate::common::{LabHarness, NS, text};

/// A lab of two nodes whose Cilium chart must be the real one: what these
/// tests claim is about Cilium's own objects.
async fn lab(kube_proxy: bool) -> LabHarness {
    let h = LabHarness::up(|o| o.kube_proxy = kube_proxy).await;
    assert!(
        h.lab.options.cilium_chart.is_real(),
        "these tests need the real Cilium chart, the lab has {}",
        h.lab.options.cilium_chart.describe()
    );
    h
}

fn cni_bootstrap(h: &LabHarness, args: &[&str]) -> Output {
    h.ichor()
        .args(["cni", "bootstrap"])
        .args(args)
        .arg("--kubeconfig")
        .arg(&h.lab.kubeconfig)
        .arg("--helm")
        .arg(Tool::Helm4.path())
        .arg("--cilium-chart")
        .arg(h.cilium_chart())
        .output()
        .unwrap()
}

fn ready(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
}

fn not_ready_tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready"))
}

async fn pods_of(client: &kube::Client, daemonset: &str) -> Vec<Pod> {
    let ds = Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
        .get(daemonset)
        .await
        .unwrap();
    let uid = ds.metadata.uid.unwrap();
    Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default().labels(&format!(
            "{}={uid}",
            ichor_lab::daemonsets::DAEMONSET_UID_LABEL
        )))
        .await
        .unwrap()
        .items
}

/// The DaemonSet's status once every scheduled pod is Ready, or as it
/// stands after a minute.
async fn settled_status(
    client: &kube::Client,
    daemonset: &str,
) -> k8s_openapi::api::apps::v1::DaemonSetStatus {
    let api = Api::<DaemonSet>::namespaced(client.clone(), "kube-system");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = api.get(daemonset).await.unwrap().status.unwrap();
        let settled = status.desired_number_scheduled > 0
            && status.number_ready == status.desired_number_scheduled;
        if settled || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Covers: R1.5b, R1.4b, R7.3, R7.4: Ichor's engine installs the
/// real chart (its agent and envoy DaemonSets, `cilium-config`, the operator
/// Deployment); each DaemonSet gets one pod per node, and the nodes turn
/// Ready once the agent pod on each is Ready, losing the not-ready taint.
#[tokio::test(flavor = "multi_thread")]
async fn the_real_chart_runs_a_ready_agent_on_every_node() {
    let h = lab(false).await;
    let client = h.client().await;
    let nodes: BTreeSet<String> = h.lab.hostnames.iter().cloned().collect();
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert_eq!(
            ready(&n).unwrap().0,
            "False",
            "no CNI yet: {:?}",
            n.metadata.name
        );
    }

    let out = cni_bootstrap(&h, &["--kube-proxy", "replaced", "--wait-timeout", "3m"]);
    assert!(out.status.success(), "{}\n{}", text(&out), h.logs());
    assert!(text(&out).contains("every node is Ready"), "{}", text(&out));

    let config = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get("cilium-config")
        .await
        .unwrap();
    let data = config.data.unwrap();
    assert!(
        !config
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("ichor.maesh.dev/stand-in")
            && data.contains_key("enable-ipv4"),
        "the real chart's cilium-config: {data:?}"
    );
    assert_eq!(data["kube-proxy-replacement"], "true");
    assert_eq!(data["ipam"], "kubernetes");

    for daemonset in ["cilium", "cilium-envoy"] {
        let pods = pods_of(&client, daemonset).await;
        let on: BTreeSet<String> = pods
            .iter()
            .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
            .collect();
        assert_eq!(on, nodes, "{daemonset}: one pod per node");
        assert_eq!(pods.len(), nodes.len(), "{daemonset}");
        // `cni bootstrap` waits for the nodes, which wait for the agent only;
        // envoy's pods turn Ready on their own probes, so its status is read
        // until it settles (bounded), then asserted.
        let status = settled_status(&client, daemonset).await;
        assert_eq!(status.desired_number_scheduled, 2, "{daemonset}");
        assert_eq!(status.number_ready, 2, "{daemonset}");
    }
    let operator =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), "kube-system")
            .get("cilium-operator")
            .await
            .unwrap();
    assert_eq!(
        operator.spec.template.spec.unwrap().containers[0].name,
        "cilium-operator"
    );
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        assert_eq!(ready(&n).unwrap().0, "True", "{:?}", n.metadata.name);
        assert!(!not_ready_tainted(&n), "{:?}", n.metadata.name);
    }
}

/// Covers: R3.1, R1.5b, R7.3: a Cilium rendered with a value that
/// breaks it on Talos (a user value giving an init container SYS_MODULE)
/// leaves every agent pod not Ready with the reason in its status, keeps the
/// nodes NotReady, and `ichor adopt` ends its bounded Cilium wait with that
/// reason and installs nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_cilium_that_cannot_run_on_talos_keeps_nodes_not_ready_and_adopt_says_why() {
    let h = lab(true).await;
    let values = h.dir.path().join("cilium-values.yaml");
    std::fs::write(
        &values,
        "securityContext:\n  capabilities:\n    applySysctlOverwrites: [SYS_ADMIN, SYS_CHROOT, SYS_PTRACE, SYS_MODULE]\n",
    )
    .unwrap();
    let out = h
        .adopt(&[
            "--cilium-values",
            values.to_str().unwrap(),
            "--cilium-wait-timeout",
            "20s",
        ])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "adopt must fail:\n{said}");
    assert!(said.contains("Cilium is not Ready within 20s"), "{said}");
    assert!(
        said.contains("CreateContainerError")
            && said.contains("apply-sysctl-overwrites")
            && said.contains("SYS_MODULE"),
        "the reason is in adopt's error:\n{said}"
    );
    assert!(!said.contains("installing Ichor"), "{said}");

    let client = h.client().await;
    let pods = pods_of(&client, "cilium").await;
    assert_eq!(pods.len(), 2);
    for p in &pods {
        let s = p.status.as_ref().unwrap();
        assert_eq!(s.reason.as_deref(), Some("Init:CreateContainerError"));
        assert!(
            s.message.as_deref().unwrap().contains("SYS_MODULE"),
            "{s:?}"
        );
    }
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let (status, message) = ready(&n).unwrap();
        assert_eq!(status, "False", "{:?}", n.metadata.name);
        assert!(message.contains("cni plugin not initialized"), "{message}");
        assert!(not_ready_tainted(&n));
    }
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client, NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        deployments.items.is_empty(),
        "Ichor is not installed behind a Cilium that does not run: {:?}",
        deployments.items
    );
}
