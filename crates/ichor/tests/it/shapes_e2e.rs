//! The lab's two machine-config shapes: nodes report the Talos version of the
//! shape they run and the Kubernetes version of the real API server, and E1
//! (a no-CNI cluster adopted end to end) passes on Talos v1.14's
//! multi-document shape too.

use std::time::Duration;

use ichor_api::{TalosCluster, TalosMachine};
use ichor_lab::LabShape;
use ichor_testenv::Tool;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

use crate::common::{LabHarness, NS, run, text};

async fn node_infos(h: &LabHarness) -> Vec<(String, String)> {
    Api::<Node>::all(h.client().await)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| {
            let info = n.status.unwrap().node_info.unwrap();
            (info.os_image, info.kubelet_version)
        })
        .collect()
}

/// Covers: the lab's config shapes — each shape's nodes report their Talos version
/// (the Talos API and the Node's osImage agree) and the API server's
/// Kubernetes version.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_report_the_talos_version_of_their_shape_and_the_api_servers_kubernetes() {
    for (shape, talos) in [
        (LabShape::V1alpha1, Tool::Talosctl.version()),
        (LabShape::Multidoc, "v1.14.0".to_string()),
    ] {
        let h = LabHarness::up(|o| *o = o.clone().with_shape(shape)).await;
        let kubernetes = Tool::KubeApiserver.version();
        for (os, kubelet) in node_infos(&h).await {
            assert_eq!(os, format!("Talos ({talos})"), "{shape:?}");
            assert_eq!(kubelet, kubernetes, "{shape:?}");
        }
        let out = Tool::Talosctl.path();
        let version = std::process::Command::new(out)
            .args(["version", "--talosconfig"])
            .arg(&h.lab.talosconfig)
            .args(["--nodes", &h.lab.addresses[0].to_string()])
            .output()
            .unwrap();
        let said = text(&version);
        assert!(version.status.success(), "{said}");
        let server = said.split("Server:").nth(1).unwrap_or_default();
        assert!(
            server.contains(&talos),
            "{shape:?}: talosctl version says\n{said}"
        );
        let config = String::from_utf8(h.lab.emulator.active_config(0).unwrap()).unwrap();
        match shape {
            LabShape::V1alpha1 => {
                assert!(!config.contains("kind: KubeClusterConfig"), "{config}")
            }
            LabShape::Multidoc => {
                assert!(config.contains("kind: KubeClusterConfig"), "{config}");
                assert!(
                    !config.contains("kind: KubeFlannelCNIConfig"),
                    "no CNI: {config}"
                );
            }
        }
        assert!(
            config.contains(&format!("kubelet:{kubernetes}")),
            "{shape:?}: {config}"
        );
    }
}

/// Covers: R1.1a, R1.5b, R1.5e, R1.5f — E1 on Talos v1.14's multi-document
/// shape: adopt installs Cilium, Ichor and the CRs, hands over, and releases
/// the holds, writing nothing to the nodes.
#[tokio::test(flavor = "multi_thread")]
async fn e1_on_the_multidoc_shape() {
    let h = LabHarness::up(|o| *o = o.clone().with_shape(LabShape::Multidoc)).await;
    let before: Vec<_> = (0..h.lab.hostnames.len())
        .map(|i| h.lab.emulator.active_config(i))
        .collect();
    let out = run(h.adopt(&[]));
    let said = text(&out);
    assert!(out.status.success(), "adopt failed:\n{said}\n{}", h.logs());
    assert!(
        said.contains("no CNI found: Ichor will install Cilium (tunnel vxlan, kube-proxy enabled)"),
        "{said}"
    );
    assert!(said.contains("CNIHandover=True"), "{said}");

    let client = h.client().await;
    let cluster = Api::<TalosCluster>::namespaced(client.clone(), NS)
        .get("lab")
        .await
        .unwrap();
    assert!(
        cluster
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "CNIHandover" && c.status == "True")
    );
    let machines: Api<TalosMachine> = Api::namespaced(client, NS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let list = machines.list(&ListParams::default()).await.unwrap();
        if list.items.len() == 2 && list.items.iter().all(|m| !m.spec.hold) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "holds not released: {:?}\n{}",
            list.items,
            h.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        h.lab.emulator.writes().is_empty(),
        "nothing was written to a node: {:?}",
        h.lab.emulator.writes()
    );
    let after: Vec<_> = (0..h.lab.hostnames.len())
        .map(|i| h.lab.emulator.active_config(i))
        .collect();
    assert_eq!(after, before);
}
