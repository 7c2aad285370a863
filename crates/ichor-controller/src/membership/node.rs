//! The Kubernetes side of a removal: cordon, drain through the Eviction
//! API (a PodDisruptionBudget that allows no disruption is named, never
//! overridden, nothing deleted by force), and the Node's deletion.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};

use crate::{Context, Error, Result};

/// Bound on one eviction call.
const EVICTION_CALL: Duration = Duration::from_secs(5);

fn absent(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

pub(super) async fn cordon(ctx: &Context, node: &str) -> Result<()> {
    let patch = serde_json::json!({ "spec": { "unschedulable": true } });
    match Api::<Node>::all(ctx.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if absent(&e) => Ok(()),
        Err(e) => Err(Error::kube(format!("cordoning Node {node}"))(e)),
    }
}

pub(super) async fn delete(ctx: &Context, node: &str) -> Result<()> {
    match Api::<Node>::all(ctx.client.clone())
        .delete(node, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if absent(&e) => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting Node {node}"))(e)),
    }
}

/// The pods a drain of `node` still has to evict (`ns/pod`), each with
/// the PodDisruptionBudget that allows no disruption of it now.
pub(super) async fn pods_left(ctx: &Context, node: &str) -> Result<Vec<(String, Option<String>)>> {
    let pods = Api::<Pod>::all(ctx.client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(Error::kube(format!("listing the pods on Node {node}")))?;
    let mut left = Vec::new();
    for pod in pods.items.iter().filter(|p| evictable(p)) {
        let ns = pod.namespace().unwrap_or_default();
        let pdb = crate::operation::drain::blocking_pdb(ctx, pod)
            .await?
            .map(|b| format!("{ns}/{b}"));
        left.push((format!("{ns}/{}", pod.name_any()), pdb));
    }
    Ok(left)
}

/// Asks the Eviction API to evict every pod of `left` that no budget
/// holds and that is not going already.
pub(super) async fn evict(
    ctx: &Context,
    node: &str,
    left: &[(String, Option<String>)],
) -> Result<()> {
    for (pod, pdb) in left {
        if pdb.is_some() {
            continue;
        }
        let (ns, name) = pod.split_once('/').unwrap_or(("", pod));
        let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
        match tokio::time::timeout(EVICTION_CALL, api.evict(name, &EvictParams::default())).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) if absent(&e) => {}
            // A budget refused it after all: the next look names it.
            Ok(Err(kube::Error::Api(e))) if e.code == 429 => {}
            Ok(Err(e)) => {
                return Err(Error::kube(format!("evicting pod {pod} from Node {node}"))(
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// Not DaemonSet pods (they come back at once), mirror pods (the
/// kubelet's static pods), finished pods, nor pods already going.
fn evictable(pod: &Pod) -> bool {
    let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    let done = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !daemon && !mirror && !done && pod.metadata.deletion_timestamp.is_none()
}
