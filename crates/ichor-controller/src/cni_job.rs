//! The ichor-cni Job: how the controller brings Ichor's Cilium release to a
//! TalosCluster's effective values without being cluster-admin itself.
//!
//! The Job runs `ichor cni helm apply` (the same apply-for-cluster function as
//! the CLI, R5.1) as the `ichor-cni` identity, on the host network, tolerating
//! every taint, and reaches the API server through KubePrism on
//! localhost:7445 — so it runs on a cluster whose pod network is the thing
//! being changed. One Job per (cluster, values hash): a finished Job for the
//! same hash is not run again; a failed one is deleted so the next reconcile
//! starts a new attempt (the spec's E5 finding: a failed Job must not end the
//! story).

use ichor_api::TalosCluster;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use serde_json::json;

use crate::{Error, Result};

/// The ServiceAccount the Job runs as (the chart's and the installer's `ichor-cni`).
pub const SERVICE_ACCOUNT: &str = "ichor-cni";
/// Label naming the TalosCluster a Job is for.
pub const CLUSTER_LABEL: &str = "ichor.maesh.dev/cni-for";

/// Where a cluster's Job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Just created, or still running.
    Running { name: String },
    /// Completed: the release should now be at the hash.
    Succeeded { name: String },
    /// Failed and deleted; the next reconcile starts a new one.
    Failed { name: String, message: String },
}

/// The Job's name: the cluster and the first characters of the hash (≤ 63).
pub fn job_name(cluster: &str, hash: &str) -> String {
    let short: String = hash.chars().take(10).collect();
    let prefix: String = cluster
        .chars()
        .take(63 - "ichor-cni--".len() - short.len())
        .collect();
    format!("ichor-cni-{}-{short}", prefix.trim_end_matches('-'))
}

/// The Job for `cluster` at values `hash`, running `image` (pure).
pub fn build(cluster: &TalosCluster, hash: &str, image: &str) -> Job {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(&name, hash),
            "namespace": namespace,
            "labels": {
                CLUSTER_LABEL: name,
                "ichor.maesh.dev/values-hash": hash.chars().take(63).collect::<String>(),
                "app.kubernetes.io/part-of": "ichor",
                "app.kubernetes.io/component": "ichor-cni",
            },
        },
        "spec": {
            "backoffLimit": 2,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": {CLUSTER_LABEL: name, "app.kubernetes.io/component": "ichor-cni"}},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "restartPolicy": "Never",
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "tolerations": [{"operator": "Exists"}],
                    "priorityClassName": "system-cluster-critical",
                    "containers": [{
                        "name": "ichor-cni",
                        "image": image,
                        "args": ["cni", "helm", "apply", "--cluster", name, "--namespace", namespace],
                        "env": [
                            {"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}
                        ],
                        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                            "capabilities": {"drop": ["ALL"]}}
                    }]
                }
            }
        }
    }))
    .expect("the ichor-cni Job is a valid Job")
}

/// Where a Job stands, from its status (pure).
pub fn state(job: &Job) -> JobState {
    let name = job.name_any();
    let status = job.status.clone().unwrap_or_default();
    let condition = |t: &str| {
        status
            .conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"))
            .cloned()
    };
    if condition("Complete").is_some() || status.succeeded.unwrap_or(0) > 0 {
        return JobState::Succeeded { name };
    }
    if let Some(c) = condition("Failed") {
        return JobState::Failed {
            name,
            message: c
                .message
                .or(c.reason)
                .unwrap_or_else(|| "the Job failed".into()),
        };
    }
    JobState::Running { name }
}

/// The state of the Job for (`cluster`, `hash`), when it exists.
pub async fn read(
    client: &kube::Client,
    cluster: &TalosCluster,
    hash: &str,
) -> Result<Option<JobState>> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = job_name(&cluster.name_any(), hash);
    let existing = Api::<Job>::namespaced(client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!(
            "reading the ichor-cni Job {namespace}/{name}"
        )))?;
    Ok(existing.as_ref().map(state))
}

/// Starts the Job for (`cluster`, `hash`) running `image`.
pub async fn start(
    client: &kube::Client,
    cluster: &TalosCluster,
    hash: &str,
    image: &str,
) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = job_name(&cluster.name_any(), hash);
    Api::<Job>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &build(cluster, hash, image))
        .await
        .map_err(Error::kube(format!(
            "creating the ichor-cni Job {namespace}/{name}"
        )))?;
    Ok(())
}

/// Deletes the failed Job `name` (its pods with it), so that the next
/// reconcile starts a new attempt.
pub async fn delete(client: &kube::Client, cluster: &TalosCluster, name: &str) -> Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    Api::<Job>::namespaced(client.clone(), &namespace)
        .delete(name, &dp)
        .await
        .map_err(Error::kube(format!(
            "deleting the failed ichor-cni Job {namespace}/{name}"
        )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> TalosCluster {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "ichor-system"},
            "spec": {"endpoint": "https://10.0.0.1:6443", "talosVersion": "v1.13.9", "kubernetesVersion": "v1.34.1",
                "secretsRef": {"name": "s"}}
        }))
        .unwrap()
    }

    /// Covers: R5.1
    #[test]
    fn the_job_runs_the_shared_apply_on_the_host_network_through_kubeprism() {
        let job = build(
            &cluster(),
            "0123456789abcdef",
            "ghcr.io/maeshinshin/ichor-controller:v0.1.0",
        );
        let v = serde_json::to_value(&job).unwrap();
        let pod = &v["spec"]["template"]["spec"];
        assert_eq!(v["metadata"]["name"], "ichor-cni-prod-0123456789");
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["serviceAccountName"], "ichor-cni");
        assert_eq!(pod["tolerations"][0]["operator"], "Exists");
        assert_eq!(
            pod["containers"][0]["args"],
            json!([
                "cni",
                "helm",
                "apply",
                "--cluster",
                "prod",
                "--namespace",
                "ichor-system"
            ])
        );
        assert_eq!(pod["containers"][0]["env"][0]["value"], "localhost");
        assert_eq!(pod["containers"][0]["env"][1]["value"], "7445");
    }

    #[test]
    fn names_fit_in_63_characters() {
        let long = "a".repeat(80);
        assert!(job_name(&long, "0123456789abcdef").len() <= 63);
    }

    #[test]
    fn state_reads_complete_and_failed() {
        let mut job = build(&cluster(), "h", "i");
        assert!(matches!(state(&job), JobState::Running { .. }));
        job.status = serde_json::from_value(json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]})).unwrap();
        assert_eq!(
            state(&job),
            JobState::Failed {
                name: "ichor-cni-prod-h".into(),
                message: "Job has reached the specified backoff limit".into()
            }
        );
        job.status = serde_json::from_value(json!({"succeeded": 1})).unwrap();
        assert!(matches!(state(&job), JobState::Succeeded { .. }));
    }
}
