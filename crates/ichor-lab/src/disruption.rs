//! The disruption controller's and the kubelet's parts in a drain: the lab
//! runs no kube-controller-manager, so nothing would compute a
//! PodDisruptionBudget's status, and the API server's Eviction API refuses
//! every eviction a budget covers until its status is processed; and no
//! kubelet ends a pod once it is evicted. Every tick:
//!
//! - each PodDisruptionBudget's status is computed from the pods it selects,
//!   as the disruption controller does ([`budget_status`]): expected pods,
//!   Ready ones (a pod being deleted is not healthy), the healthy count the
//!   budget needs, and how many disruptions it allows now; the
//!   `disruptedPods` the API server records on an eviction are left to it;
//! - a pod that is being deleted (an eviction deletes with the pod's own
//!   grace period) is removed, as its kubelet would once its containers
//!   stop — except DaemonSet pods and Ichor's own pods, which their own
//!   parts of the lab run ([`crate::daemonsets`], [`crate::pods`]).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use ichor_api::selector::selects;

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `value` of `expected` (an int, or a percentage rounded up, as Kubernetes scales it).
fn scaled(value: &IntOrString, expected: i32) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            ((pct * i64::from(expected) + 99) / 100) as i32
        }
    }
}

/// The status the disruption controller would write for `pdb` over the
/// pods of its namespace: `(expectedPods, currentHealthy, desiredHealthy,
/// disruptionsAllowed)`.
pub fn budget_status(pdb: &PodDisruptionBudget, pods: &[Pod]) -> (i32, i32, i32, i32) {
    let spec = pdb.spec.clone().unwrap_or_default();
    let selected: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.namespace() == pdb.namespace()
                && spec
                    .selector
                    .as_ref()
                    .is_some_and(|s| selects(s, p.labels()))
        })
        .collect();
    let expected = selected.len() as i32;
    let healthy = selected.iter().filter(|p| ready(p)).count() as i32;
    let desired = match (&spec.min_available, &spec.max_unavailable) {
        (Some(min), _) => scaled(min, expected),
        (None, Some(max)) => (expected - scaled(max, expected)).max(0),
        (None, None) => expected,
    };
    (expected, healthy, desired, (healthy - desired).max(0))
}

fn status_patch(
    pdb: &PodDisruptionBudget,
    (expected, healthy, desired, allowed): (i32, i32, i32, i32),
    now: &str,
) -> Value {
    json!({"status": {
        "observedGeneration": pdb.metadata.generation,
        "expectedPods": expected, "currentHealthy": healthy, "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "conditions": [{"type": "DisruptionAllowed", "status": if allowed > 0 { "True" } else { "False" },
            "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" }, "message": "",
            "observedGeneration": pdb.metadata.generation, "lastTransitionTime": now}]
    }})
}

/// One pass: budgets' status, then evicted pods ended.
pub async fn tick(client: &kube::Client, now: &str) -> Result<(), kube::Error> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    for pdb in Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        let computed = budget_status(&pdb, &pods);
        let current = pdb.status.as_ref().map(|s| {
            (
                s.expected_pods.unwrap_or(-1),
                s.current_healthy.unwrap_or(-1),
                s.desired_healthy.unwrap_or(-1),
                s.disruptions_allowed.unwrap_or(-1),
            )
        });
        let processed =
            pdb.status.as_ref().and_then(|s| s.observed_generation) == pdb.metadata.generation;
        if current == Some(computed) && processed {
            continue;
        }
        Api::<PodDisruptionBudget>::namespaced(
            client.clone(),
            &pdb.namespace().unwrap_or_default(),
        )
        .patch_status(
            &pdb.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status_patch(&pdb, computed, now)),
        )
        .await?;
    }
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
    {
        let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
        let ichor = pod.spec.as_ref().is_some_and(|s| {
            s.containers
                .iter()
                .any(|c| c.image.as_deref().is_some_and(crate::pods::is_ichor_image))
        });
        if daemon || ichor {
            continue;
        }
        let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str, ready: bool, deleting: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "apps", "labels": {"app": app},
                "deletionTimestamp": if deleting { json!("2026-01-01T00:00:00Z") } else { Value::Null }},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn pdb(spec: Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "apps", "generation": 1},
            "spec": spec
        }))
        .unwrap()
    }

    /// The budget's numbers as the disruption controller computes them:
    /// minAvailable and maxUnavailable (ints and rounded-up percentages),
    /// a pod being deleted is not healthy, other apps' pods do not count.
    /// Covers: the lab behind R11.3 (its simulator honours PDBs)
    #[test]
    fn budgets_count_ready_pods() {
        let pods = vec![
            pod("a", "web", true, false),
            pod("b", "web", true, false),
            pod("c", "web", false, false),
            pod("d", "web", true, true),
            pod("x", "db", true, false),
        ];
        let sel = json!({"matchLabels": {"app": "web"}});
        assert_eq!(
            budget_status(&pdb(json!({"selector": sel, "minAvailable": 2})), &pods),
            (4, 2, 2, 0)
        );
        assert_eq!(
            budget_status(&pdb(json!({"selector": sel, "minAvailable": 1})), &pods),
            (4, 2, 1, 1)
        );
        assert_eq!(
            budget_status(&pdb(json!({"selector": sel, "maxUnavailable": 1})), &pods),
            (4, 2, 3, 0)
        );
        assert_eq!(
            budget_status(&pdb(json!({"selector": sel, "minAvailable": "30%"})), &pods),
            (4, 2, 2, 0)
        );
        assert_eq!(
            budget_status(
                &pdb(json!({"selector": sel, "maxUnavailable": "50%"})),
                &pods
            ),
            (4, 2, 2, 0)
        );
    }
}
