//! The kubelet's side of the Kubernetes components Talos runs, played by the
//! lab (with [`crate::LabOptions::components`]).
//!
//! On a Talos node the kubelet runs kube-apiserver, kube-controller-manager
//! and kube-scheduler as static pods from the manifests Talos writes, and
//! shows each as a mirror pod (`kube-system`, label `k8s-app`, annotation
//! `kubernetes.io/config.mirror`, owned by the Node); the Node reports the
//! kubelet's version. Here no container runs: the lab asks each node's Talos
//! API which image a component runs (the config resources the emulator
//! derives from the machine config) and writes the mirror pod (Running,
//! Ready, that image) and the Node's `nodeInfo.kubeletVersion` from it. So
//! when a node takes a new component image, Kubernetes shows it as a kubelet
//! would — what a kubernetes-upgrade waits for.

use std::time::Duration;

use ichor_talos_client::TalosClient;
use ichor_talos_client::resources::KubernetesComponent;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// How often the lab's kubelets look at their node's Talos API.
const PERIOD: Duration = Duration::from_millis(500);

/// The control-plane components a control plane runs as static pods, by
/// the `k8s-app` label Talos gives them.
const STATIC_PODS: [(KubernetesComponent, &str); 3] = [
    (KubernetesComponent::ApiServer, "kube-apiserver"),
    (
        KubernetesComponent::ControllerManager,
        "kube-controller-manager",
    ),
    (KubernetesComponent::Scheduler, "kube-scheduler"),
];

/// One node's kubelet: the Node's name, its role and its Talos API.
pub struct LabKubelet {
    pub node: String,
    pub control_plane: bool,
    pub talos: TalosClient,
}

/// Plays every node's kubelet until aborted.
pub fn spawn(client: kube::Client, kubelets: Vec<LabKubelet>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for k in &kubelets {
                // A node that does not answer (rebooting) keeps what it showed.
                if let Err(e) = sync(&client, k).await {
                    tracing::debug!(node = %k.node, error = %ichor_api::error_text::chain(e.as_ref()), "lab kubelet: components");
                }
            }
            tokio::time::sleep(PERIOD).await;
        }
    })
}

/// The version a kubelet image's tag names (`…/kubelet:v1.37.2` → `v1.37.2`).
pub fn image_version(image: &str) -> Option<&str> {
    let (name, tag) = image.rsplit_once(':')?;
    (!tag.is_empty() && !tag.contains('/') && !name.is_empty()).then_some(tag)
}

/// The mirror pod of `component` on `node` running `image`.
pub fn mirror_pod(app: &str, node: &str, node_uid: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{app}-{node}"), "namespace": "kube-system",
            "labels": {"k8s-app": app, "tier": "control-plane"},
            "annotations": {"kubernetes.io/config.mirror": "lab", "kubernetes.io/config.source": "file"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": true}]},
        "spec": {"nodeName": node, "hostNetwork": true, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": app, "image": image}]}
    })
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn sync(client: &kube::Client, k: &LabKubelet) -> Result<(), Failure> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(&k.node).await? else {
        return Ok(());
    };
    if let Some(image) = k
        .talos
        .component_image("", KubernetesComponent::Kubelet)
        .await?
        && let Some(version) = image_version(&image)
    {
        let reported = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.as_str());
        if reported != Some(version) {
            nodes
                .patch_status(
                    &k.node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"nodeInfo": {"kubeletVersion": version}}})),
                )
                .await?;
        }
    }
    if !k.control_plane {
        return Ok(());
    }
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for (component, app) in STATIC_PODS {
        let Some(image) = k.talos.component_image("", component).await? else {
            continue;
        };
        let name = format!("{app}-{}", k.node);
        match pods.get_opt(&name).await? {
            None => {
                let pod: Pod = serde_json::from_value(mirror_pod(app, &k.node, &uid, &image))?;
                pods.create(&PostParams::default(), &pod).await?;
            }
            Some(p) => {
                let runs = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.as_deref());
                if runs != Some(image.as_str()) {
                    // The kubelet restarts the static pod with the new manifest.
                    pods.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Strategic(
                            json!({"spec": {"containers": [{"name": app, "image": image}]}}),
                        ),
                    )
                    .await?;
                }
            }
        }
        let ready = pods.get(&name).await?.status.is_some_and(|s| {
            s.conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if !ready {
            let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
            pods.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now}]}})),
            )
            .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubelet_version_is_its_images_tag() {
        assert_eq!(
            image_version("ghcr.io/siderolabs/kubelet:v1.37.2"),
            Some("v1.37.2")
        );
        assert_eq!(
            image_version("localhost:5000/kubelet:v1.38.0"),
            Some("v1.38.0")
        );
        assert_eq!(image_version("localhost:5000/kubelet"), None);
        assert_eq!(image_version("kubelet:"), None);
    }

    #[test]
    fn a_mirror_pod_is_labelled_as_talos_labels_it() {
        let p = mirror_pod(
            "kube-apiserver",
            "cp-1",
            "u",
            "registry.k8s.io/kube-apiserver:v1.37.2",
        );
        assert_eq!(p["metadata"]["name"], "kube-apiserver-cp-1");
        assert_eq!(p["metadata"]["labels"]["k8s-app"], "kube-apiserver");
        assert_eq!(p["spec"]["nodeName"], "cp-1");
        // A drain leaves mirror pods alone: the annotation says what it is.
        assert!(p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
    }
}
