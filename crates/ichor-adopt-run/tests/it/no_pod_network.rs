//! E6, second half: a cluster whose Cilium disappears after adopt's Cilium
//! step. Ichor's pods cannot be scheduled and every node is NotReady for the
//! network plugin, so the webhook wait fails early — after two minutes, not
//! fifteen — with the text of R3.3.

use std::sync::Arc;
use std::time::Duration;

use ichor_adopt::plan::Plan;
use ichor_adopt_run::{AdoptError, AdoptOptions, Operator, SecretsSource};
use ichor_lab::{Lab, LabOptions};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// Deletes Cilium's DaemonSet the moment adopt says Cilium is installed, and
/// waits until the simulated kubelets report the lost network, before adopt
/// goes on to install Ichor.
struct RemovesCilium {
    kubeconfig: std::path::PathBuf,
    said: std::sync::Mutex<Vec<String>>,
}

impl Operator for RemovesCilium {
    fn say(&self, line: &str) {
        self.said.lock().unwrap().push(line.to_string());
        if !line.starts_with("Cilium is installed") {
            return;
        }
        let kubeconfig = self.kubeconfig.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .unwrap();
                let client = kube::Client::try_from(config).unwrap();
                Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
                    .delete("cilium", &Default::default())
                    .await
                    .unwrap();
                let nodes: Api<Node> = Api::all(client);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let list = nodes.list(&Default::default()).await.unwrap();
                    let all_down = list.items.iter().all(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "False")
                            })
                    });
                    if all_down {
                        break;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "nodes never lost their network"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        })
        .join()
        .unwrap();
    }

    fn consent(&self, _plan: &Plan) -> bool {
        true
    }
}

/// Covers: R3.3, R3.1
#[tokio::test(flavor = "multi_thread")]
async fn e6_no_pod_network_fails_early_with_the_specs_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = LabOptions::new(dir.path().join("lab"));
    options.nodes = 2;
    let lab = Lab::up(options).await.unwrap();
    let (talosconfig, _) =
        ichor_talos::talosconfig::Talosconfig::load(Some(&lab.talosconfig)).unwrap();
    let ctx = talosconfig.context(None, "lab").unwrap().1;
    let creds = ctx.credentials("lab", "lab").unwrap();
    let identity = ichor_talos_client::ClientIdentity::from_pem(
        creds.ca_pem.clone().unwrap(),
        creds.crt_pem.clone().unwrap(),
        creds.key_pem_pkcs8().unwrap(),
    );
    let talos =
        ichor_talos_client::TalosClient::new(&ctx.endpoints[0], &identity, Default::default())
            .unwrap();
    let renderer =
        ichor_helm::Renderer::new(ichor_testenv::Tool::Helm4.path()).kubeconfig(&lab.kubeconfig);
    let opts = AdoptOptions {
        cluster: "lab".into(),
        nodes: lab.addresses.iter().map(ToString::to_string).collect(),
        secrets: Some(SecretsSource::Bundle(Box::new(
            ichor_talos::secrets::SecretsBundle::from_file(&lab.bundle).unwrap(),
        ))),
        cni_unmanaged: false,
        tunnel: None,
        cilium_values: None,
        require_ichor: false,
        webhook_timeout: ichor_adopt::waits::WEBHOOK_WAIT_ADOPT,
        cilium_timeout: Duration::from_secs(120),
        handover_timeout: Duration::from_secs(120),
        poll_interval: Duration::from_secs(1),
        cilium: ichor_cilium::CiliumOptions::new(renderer)
            .chart(ichor_helm::ChartRef::path(lab.options.cilium_chart.path())),
        version: "v0.1.0".into(),
        controller_image: None,
    };
    let operator = Arc::new(RemovesCilium {
        kubeconfig: lab.kubeconfig.clone(),
        said: Default::default(),
    });
    let kube = lab.client().await;
    let err = ichor_adopt_run::adopt(&talos, &kube, &opts, operator.clone())
        .await
        .unwrap_err();
    let said = operator.said.lock().unwrap().join("\n");
    match err {
        AdoptError::Wait(msg) => {
            assert_eq!(msg, ichor_adopt::waits::NO_POD_NETWORK, "said:\n{said}")
        }
        other => panic!("expected the no-pod-network failure, got {other}\nsaid:\n{said}"),
    }
    assert_eq!(
        ichor_adopt::waits::NO_POD_NETWORK,
        "Ichor's pods cannot start because this cluster has no pod network (its nodes are NotReady: cni plugin not initialized). Install a CNI, or let ichor adopt install Cilium (a cluster with no CNI)"
    );
    // While waiting it named the Pending pod with the scheduler's message.
    assert!(
        said.contains("untolerated taint {node.kubernetes.io/not-ready: }"),
        "{said}"
    );
}
