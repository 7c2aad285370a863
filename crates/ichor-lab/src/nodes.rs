//! The lab's nodes: their names and addresses, their machine configs (the
//! real Talos fixtures patched to the lab's shape), their Node objects and
//! the wait for them to be Ready.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use ichor_helm::objects::create_or_keep;
use ichor_talos::config::MachineConfig;
use ichor_talos::patch::ConfigPatch;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{LabCni, LabError, LabOptions, LabShape, daemonsets, simulator};

/// The fixtures the nodes' configs are made from (real Talos files).
fn fixture(shape: LabShape, name: &str) -> PathBuf {
    ichor_testenv::fixtures::talos_dir()
        .join(shape.fixtures())
        .join(name)
}

/// The nodes' loopback addresses (a /24 of the lab's own, so labs and
/// tests can run side by side) and hostnames: `lab-cp-1`… for the first
/// `control_planes`, then `lab-worker-1`….
pub(crate) fn node_names(nodes: usize, control_planes: usize) -> (Vec<IpAddr>, Vec<String>) {
    let net: u8 = rand::random_range(16..=250);
    let sub: u8 = rand::random_range(1..=250);
    let addresses: Vec<IpAddr> = (0..nodes)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, net, sub, 10 + i as u8)))
        .collect();
    let hostnames: Vec<String> = (0..nodes)
        .map(|i| {
            if i < control_planes {
                format!("lab-cp-{}", i + 1)
            } else {
                format!("lab-worker-{}", i + 1 - control_planes)
            }
        })
        .collect();
    (addresses, hostnames)
}

/// The lab's settings as a patch of a v1.12/v1.13-shaped config.
fn legacy_patch(options: &LabOptions, addresses: &[IpAddr]) -> String {
    let cni = match options.cni {
        LabCni::Flannel => "flannel",
        _ => "none",
    };
    let k = &options.kubernetes_version;
    format!(
        "machine:\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:{k}\n  features:\n    kubePrism:\n      enabled: {}\n      port: 7445\ncluster:\n  controlPlane:\n    endpoint: https://{}:6443\n  clusterName: lab\n  network:\n    cni:\n      name: {cni}\n  apiServer:\n    image: registry.k8s.io/kube-apiserver:{k}\n  controllerManager:\n    image: registry.k8s.io/kube-controller-manager:{k}\n  scheduler:\n    image: registry.k8s.io/kube-scheduler:{k}\n  proxy:\n    disabled: {}\n    image: registry.k8s.io/kube-proxy:{k}\n",
        options.kube_prism, addresses[0], !options.kube_proxy
    )
}

/// The lab's settings as a patch of Talos v1.14's documents. A worker's
/// v1.14 config carries no cluster-wide documents (CNI, kube-proxy).
fn multidoc_patch(options: &LabOptions, addresses: &[IpAddr], control_plane: bool) -> String {
    let k = &options.kubernetes_version;
    let prism_port = if options.kube_prism { 7445 } else { 0 };
    let mut docs = vec![
        format!(
            "apiVersion: v1alpha1\nkind: KubeClusterConfig\nclusterName: lab\nendpoint: https://{}:6443\n",
            addresses[0]
        ),
        format!("apiVersion: v1alpha1\nkind: KubePrismConfig\nport: {prism_port}\n"),
        format!(
            "apiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:{k}\n"
        ),
    ];
    if control_plane {
        docs.push(format!(
            "apiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: {}\nimage: registry.k8s.io/kube-proxy:{k}\n",
            options.kube_proxy
        ));
        docs.push(format!("apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:{k}\n"));
        docs.push(format!("apiVersion: v1alpha1\nkind: KubeControllerManagerConfig\nimage: registry.k8s.io/kube-controller-manager:{k}\n"));
        docs.push(format!("apiVersion: v1alpha1\nkind: KubeSchedulerConfig\nimage: registry.k8s.io/kube-scheduler:{k}\n"));
        if options.cni != LabCni::Flannel {
            docs.push("apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n".into());
        }
    }
    docs.join("---\n")
}

/// Each node's machine config: the real fixture, patched to the lab's shape.
pub fn node_configs(options: &LabOptions, addresses: &[IpAddr]) -> Result<Vec<String>, LabError> {
    let read = |name: &str| {
        let path = fixture(options.shape, name);
        std::fs::read_to_string(&path).map_err(|source| LabError::Read { path, source })
    };
    let cp = read("base-controlplane.yaml")?;
    let worker = read("base-worker.yaml")?;
    let parse = |text: String| ConfigPatch::parse(&text, "the lab's patch").map_err(LabError::from);
    let (cp_patch, worker_patch) = match options.shape {
        LabShape::V1alpha1 => {
            let p = parse(legacy_patch(options, addresses))?;
            (p.clone(), p)
        }
        LabShape::Multidoc => (
            parse(multidoc_patch(options, addresses, true))?,
            parse(multidoc_patch(options, addresses, false))?,
        ),
    };
    (0..options.nodes)
        .map(|i| {
            let (base, patch) = if i < options.control_planes {
                (&cp, &cp_patch)
            } else {
                (&worker, &worker_patch)
            };
            let config = MachineConfig::parse(base)?;
            let patched = patch.apply(&config, "the lab's patch")?;
            Ok(patched.to_yaml()?)
        })
        .collect()
}

/// The Node objects of the lab's nodes, NotReady with the kubelet's
/// network-plugin message, as a kubelet without a CNI registers them.
pub(crate) async fn register_nodes(
    client: &kube::Client,
    hostnames: &[String],
    addresses: &[IpAddr],
    options: &LabOptions,
) -> Result<(), kube::Error> {
    for (i, (name, address)) in hostnames.iter().zip(addresses).enumerate() {
        let kubelet = Kubelet {
            name,
            address: *address,
            index: i,
            control_plane: i < options.control_planes,
            talos_version: &options.talos_version,
        };
        register_node(client, &kubelet, options).await?;
    }
    Ok(())
}

/// What a node's kubelet registers.
pub(crate) struct Kubelet<'a> {
    pub name: &'a str,
    pub address: IpAddr,
    /// The node's place among the lab's nodes (its pod CIDR).
    pub index: usize,
    pub control_plane: bool,
    pub talos_version: &'a str,
}

/// One node's Node object, NotReady with the kubelet's network-plugin
/// message until a CNI runs on it, as a kubelet registers it (a Node kept
/// from before, as a kubelet finds it, gets its status anew).
pub(crate) async fn register_node(
    client: &kube::Client,
    kubelet: &Kubelet<'_>,
    options: &LabOptions,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let (name, i) = (kubelet.name, kubelet.index);
    let role_label = if kubelet.control_plane {
        "node-role.kubernetes.io/control-plane"
    } else {
        "node-role.kubernetes.io/worker"
    };
    let mut spec =
        json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]});
    if options.pod_cidrs {
        spec["podCIDR"] = json!(format!("10.244.{i}.0/24"));
        spec["podCIDRs"] = json!([format!("10.244.{i}.0/24")]);
    }
    let mut annotations =
        json!({"ichor.maesh.dev/simulated": "a lab node: its kubelet is the lab's node simulator"});
    if options.kube_prism {
        annotations[daemonsets::KUBE_PRISM_ANNOTATION] = json!("7445");
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        // The labels a kubelet sets on its Node (charts select on them).
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, role_label: "",
                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"},
            "annotations": annotations},
        "spec": spec,
    }))
    .expect("node");
    create_or_keep(&api, &PostParams::default(), &node).await?;
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "addresses": [{"type": "InternalIP", "address": kubelet.address.to_string()}, {"type": "Hostname", "address": name}],
            // What a Talos kubelet reports: the node's Talos version and the
            // Kubernetes version of the cluster (the real API server's).
            "nodeInfo": {"kubeletVersion": options.kubernetes_version, "kubeProxyVersion": "",
                "osImage": format!("Talos ({})", kubelet.talos_version), "operatingSystem": "linux",
                "architecture": "amd64", "kernelVersion": "", "containerRuntimeVersion": "containerd://2.1.5",
                "machineID": "", "systemUUID": "", "bootID": ""},
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "message": simulator::NO_CNI_MESSAGE, "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
    )
    .await?;
    Ok(())
}

/// Waits (bounded) until every Node is Ready; says which are not.
pub(crate) async fn wait_nodes_ready(
    client: &kube::Client,
    timeout: std::time::Duration,
) -> Result<(), LabError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let nodes = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await?;
        let not_ready: Vec<String> = nodes
            .items
            .iter()
            .filter(|n| {
                !n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        if not_ready.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(LabError::Config(format!(
                "the lab's CNI did not make nodes {} Ready within {timeout:?}",
                not_ready.join(", ")
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
