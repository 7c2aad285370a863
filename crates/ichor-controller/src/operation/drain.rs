//! Cordon and drain: every pod on the node except DaemonSet and mirror
//! pods is evicted through the Eviction API, a PodDisruptionBudget that
//! allows no disruption now is not asked, and nothing is deleted by force.

use std::time::Duration;

use ichor_api::selector::selects;
use ichor_reconcile::operation::step::DrainState;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};

use super::Run;
use crate::{Error, Result};

impl Run<'_> {
    pub(super) async fn cordon(&self, node: &str, unschedulable: bool) -> Result<()> {
        let patch = serde_json::json!({ "spec": { "unschedulable": unschedulable } });
        Api::<Node>::all(self.ctx.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "{} Node {node}",
                if unschedulable {
                    "cordoning"
                } else {
                    "uncordoning"
                }
            )))?;
        Ok(())
    }

    /// Cordons, then asks the Eviction API to evict every pod on the node
    /// except DaemonSet and mirror pods. Done when none is left; blocked
    /// (naming the PodDisruptionBudget) while an eviction is refused.
    pub(super) async fn drain(&self, node: &str) -> Result<DrainState> {
        self.cordon(node, true).await?;
        let pods = Api::<Pod>::all(self.ctx.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(Error::kube(format!("listing the pods on Node {node}")))?;
        let mut blocked = Vec::new();
        let mut left = 0usize;
        for pod in pods.items.iter().filter(|p| evictable(p)) {
            left += 1;
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let name = pod.name_any();
            // A budget that allows no disruption now is not asked: the API
            // server would answer 429 with a Retry-After the client waits out.
            if let Some(pdb) = self.blocking_pdb(pod).await? {
                blocked.push(format!(
                    "PodDisruptionBudget {ns}/{pdb} does not allow evicting pod {ns}/{name}"
                ));
                continue;
            }
            let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &ns);
            let params = EvictParams::default();
            match tokio::time::timeout(EVICTION_CALL, api.evict(&name, &params)).await {
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => left -= 1,
                Ok(Err(kube::Error::Api(e))) if e.code == 429 => {
                    let cause = e
                        .details
                        .as_ref()
                        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                        .map(|c| c.message.clone())
                        .unwrap_or_else(|| e.message.clone());
                    blocked.push(format!("the eviction of pod {ns}/{name} is refused: {cause}"));
                }
                Ok(Err(e)) => {
                    return Err(Error::kube(format!("evicting pod {ns}/{name} from Node {node}"))(e));
                }
                Err(_) => blocked.push(format!(
                    "the eviction of pod {ns}/{name} got no answer within {EVICTION_CALL:?} (the API server asks to retry later)"
                )),
            }
        }
        Ok(if !blocked.is_empty() {
            DrainState::Blocked(blocked.join("; "))
        } else if left == 0 {
            DrainState::Done
        } else {
            DrainState::Blocked(format!(
                "{left} pod(s) on Node {node} are still terminating"
            ))
        })
    }

    /// The PodDisruptionBudget that selects the pod and allows no
    /// disruption now (or has not been processed since its last change).
    async fn blocking_pdb(&self, pod: &Pod) -> Result<Option<String>> {
        blocking_pdb(self.ctx, pod).await
    }
}

/// Bound on one eviction call (the client retries a 429 after its Retry-After).
const EVICTION_CALL: Duration = Duration::from_secs(5);

/// Not DaemonSet pods (they come back at once) nor mirror pods (static pods
/// the kubelet owns), as kubectl drain skips them.
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
    !daemon && !mirror && !done
}

/// The PodDisruptionBudget that refuses evicting `pod` now (or has not been
/// processed since its last change), if any: named in the status of a drain
/// that waits (an operation's or a removal's).
pub(crate) async fn blocking_pdb(ctx: &crate::Context, pod: &Pod) -> Result<Option<String>> {
    let ns = pod.namespace().unwrap_or_default();
    let pdbs = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!(
            "listing the PodDisruptionBudgets of {ns}"
        )))?;
    let labels = pod.labels();
    Ok(pdbs
        .items
        .iter()
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| selects(sel, labels))
        })
        .find(|pdb| {
            let processed = pdb.status.as_ref().is_some_and(|s| {
                s.observed_generation.unwrap_or(0) >= pdb.metadata.generation.unwrap_or(0)
            });
            let allowed = pdb
                .status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0);
            !processed || allowed < 1
        })
        .map(|pdb| pdb.name_any()))
}
