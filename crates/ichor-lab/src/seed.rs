//! The workloads a cluster the lab starts with a CNI already runs (and
//! kube-proxy, when on): their DaemonSets, and a hand-applied Cilium's
//! operator and config.

use ichor_helm::objects::create_or_keep;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::{LabCni, LabOptions, cilium_on_talos};

/// A Cilium applied by hand: its operator, which registers Cilium's CRDs
/// (the simulator plays that part), and its config the way the Talos guide
/// says, so that its agents run (cilium_on_talos).
async fn seed_hand_applied_cilium(
    client: &kube::Client,
    options: &LabOptions,
) -> Result<(), kube::Error> {
    let operator: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cilium-operator", "namespace": "kube-system"},
        // The labels Cilium's chart gives it (a takeover keeps the selector).
        "spec": {"replicas": 1, "selector": {"matchLabels": {"io.cilium/app": "operator", "name": "cilium-operator"}},
            "template": {"metadata": {"labels": {"io.cilium/app": "operator", "name": "cilium-operator"}},
                "spec": {"hostNetwork": true, "containers": [{"name": "operator", "image": "quay.io/cilium/operator-generic:v1.18.5"}]}}}
    }))
    .expect("deployment");
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "kube-system");
    create_or_keep(&api, &PostParams::default(), &operator).await?;
    // A Cilium applied by hand the way the Talos guide says, so that its
    // agents run (cilium_on_talos).
    let config: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cilium-config", "namespace": "kube-system"},
        "data": {"ipam": "kubernetes", "cgroup-root": cilium_on_talos::TALOS_CGROUP_ROOT,
            "tunnel-protocol": "vxlan",
            "kube-proxy-replacement": if options.kube_proxy { "false" } else { "true" }},
    }))
    .expect("configmap");
    create_or_keep(
        &Api::namespaced(client.clone(), "kube-system"),
        &PostParams::default(),
        &config,
    )
    .await?;
    Ok(())
}

/// The workloads a cluster with a CNI already runs (and kube-proxy, when on).
pub(crate) async fn seed_cni(
    client: &kube::Client,
    options: &LabOptions,
) -> Result<(), kube::Error> {
    let mut daemonsets = Vec::new();
    if options.kube_proxy {
        daemonsets.push((
            "kube-system",
            "kube-proxy",
            format!("registry.k8s.io/kube-proxy:{}", options.kubernetes_version),
        ));
    }
    match options.cni {
        LabCni::None => {}
        LabCni::Flannel => daemonsets.push((
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.26.7".to_string(),
        )),
        LabCni::Calico => daemonsets.push((
            "calico-system",
            "calico-node",
            "docker.io/calico/node:v3.29.1".to_string(),
        )),
        LabCni::Cilium => daemonsets.push((
            "kube-system",
            "cilium",
            "quay.io/cilium/cilium:v1.18.5".to_string(),
        )),
    }
    if options.cni == LabCni::Cilium {
        seed_hand_applied_cilium(client, options).await?;
    }
    for (ns, name, image) in daemonsets {
        ensure_namespace(client, ns).await?;
        let mut container = json!({"name": name, "image": image});
        if name == "cilium" {
            container = json!({"name": cilium_on_talos::AGENT_CONTAINER, "image": image,
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}],
                "securityContext": {"capabilities": {"add": ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW",
                    "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"],
                    "drop": ["ALL"]}}});
        }
        // kube-proxy's labels and selector as Talos's bootstrap manifest
        // makes them (Talos created it; a kubernetes-upgrade's sync applies
        // that manifest over it, and a selector is immutable).
        let labels = if name == "kube-proxy" {
            json!({"k8s-app": name, "tier": "node"})
        } else {
            json!({"k8s-app": name})
        };
        let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"hostNetwork": true, "tolerations": [{"operator": "Exists"}],
                        "containers": [container]}}}
        }))
        .expect("daemonset");
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), ns);
        create_or_keep(&api, &PostParams::default(), &ds).await?;
    }
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .expect("ns");
    create_or_keep(&Api::all(client.clone()), &PostParams::default(), &ns)
        .await
        .map(drop)
}
