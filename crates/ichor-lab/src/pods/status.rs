//! What the lab's pods and Ichor's Deployments report in their status.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::kubelet::PodProcess;
use super::now;

/// Writes the pod's status when it changed since the last write (a failure
/// is logged; the next tick writes it again).
pub(super) async fn write_pod_status(
    pods_api: &Api<Pod>,
    ns: &str,
    container: &Container,
    p: &mut PodProcess,
) {
    let status = pod_status(container, p);
    if status != p.last_status {
        match pods_api
            .patch_status(
                &p.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
        {
            Ok(_) => p.last_status = status,
            Err(e) => {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "lab kubelet: pod {ns}/{} status", p.name)
            }
        }
    }
}

/// Writes the Deployment's status when its replica counts or observed
/// generation differ from `ready` of `replicas`.
pub(super) async fn write_deployment_status(
    client: &kube::Client,
    d: &Deployment,
    key: &(String, String),
    replicas: i32,
    ready: i32,
) -> Result<(), kube::Error> {
    let (ns, name) = key;
    let generation = d.metadata.generation.unwrap_or(1);
    let current = d.status.clone().unwrap_or_default();
    if current.ready_replicas.unwrap_or(0) != ready
        || current.replicas != Some(replicas)
        || current.observed_generation != Some(generation)
    {
        let available = if ready >= replicas { "True" } else { "False" };
        let now = now();
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "replicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
                    "updatedReplicas": replicas, "observedGeneration": generation,
                    "unavailableReplicas": replicas - ready,
                    "conditions": [{"type": "Available", "status": available, "reason": "MinimumReplicasAvailable",
                        "lastUpdateTime": now, "lastTransitionTime": now}]}})),
            )
            .await?;
    }
    Ok(())
}

fn pod_status(container: &Container, p: &PodProcess) -> Value {
    let ready = if p.ready { "True" } else { "False" };
    let state = match (&p.child, &p.last_exit) {
        (Some(_), _) => json!({"running": {"startedAt": now()}}),
        (None, Some(why)) => {
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off restarting failed container {}: {why}", container.name)}})
        }
        (None, None) => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    // `startedAt` would change every tick: compare without it.
    let state = match state.get("running") {
        Some(_) => json!({"running": {}}),
        None => state,
    };
    json!({
        "phase": if p.child.is_some() || p.restarts > 0 { "Running" } else { "Pending" },
        "podIP": p.pod_ip.to_string(), "podIPs": [{"ip": p.pod_ip.to_string()}],
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready},
            {"type": "ContainersReady", "status": ready}],
        "containerStatuses": [{"name": container.name, "image": container.image.clone().unwrap_or_default(),
            "imageID": "", "ready": p.ready, "restartCount": p.restarts, "state": state}]
    })
}
