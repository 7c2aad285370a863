//! The ichor-cni Job: how the controller brings Ichor's Cilium release to a
//! TalosCluster's effective values without being cluster-admin itself.
//!
//! The Job runs `ichor cni helm apply` (the same apply-for-cluster function as
//! the CLI, R5.1) as the `ichor-cni` identity, on the host network, tolerating
//! every taint, and reaches the API server through KubePrism on
//! localhost:7445 — so it runs on a cluster whose pod network is the thing
//! being changed. One Job per (cluster, values hash): a finished Job for the
//! same hash is not run again; a failed one is deleted and the next attempt
//! starts after a back-off that doubles with each failure (R5.6, learnt from
//! hardware case E5: a failed Job must not end the story, nor run every few
//! seconds forever).
//!
//! The Job lives in the controller's own namespace, whatever the
//! TalosCluster's: the `ichor-cni` ServiceAccount exists only there, and the
//! controller may create Jobs only there (a Role, not a ClusterRole), so no
//! namespace's users can borrow a Job's identity.

use std::time::Duration;

use ichor_api::TalosCluster;
use k8s_openapi::api::batch::v1::Job;
use kube_core::ResourceExt as _;
use serde_json::json;

/// The ServiceAccount the Job runs as (the chart's and the installer's `ichor-cni`).
pub const SERVICE_ACCOUNT: &str = "ichor-cni";
/// Label naming the TalosCluster a Job is for.
pub const CLUSTER_LABEL: &str = "ichor.maesh.dev/cni-for";
/// Label naming the namespace of the TalosCluster a Job is for.
pub const CLUSTER_NAMESPACE_LABEL: &str = "ichor.maesh.dev/cni-for-namespace";
/// The wait after a Job's first failure; it doubles with each failure after.
pub const JOB_BACKOFF_FIRST: Duration = Duration::from_secs(15);
/// The longest wait between two attempts.
pub const JOB_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// How long to wait after the `failures`-th failure in a row before the
/// next attempt: 15 s, 30 s, 1 min … up to 10 min, each ±20% by a jitter
/// drawn from `seed` (the cluster), so many clusters failing together do
/// not retry in step. Pure: the same inputs give the same wait.
pub fn job_backoff(failures: u32, seed: &str) -> Duration {
    crate::backoff::wait(failures, JOB_BACKOFF_FIRST, JOB_BACKOFF_MAX, seed)
}

/// Where a cluster's Job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Just created, or still running.
    Running { name: String },
    /// Completed: the release should now be at the hash.
    Succeeded { name: String },
    /// Failed (the reconcile deletes it; a later one starts a new one).
    Failed {
        name: String,
        uid: String,
        message: String,
    },
    /// Decided, not observed: no Job, and the back-off after `failures`
    /// failures in a row runs until `next`.
    Waiting {
        failures: u32,
        next: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
        message: String,
    },
}

/// The Job's name: the cluster and 10 hex digits of a digest of the
/// cluster's namespace, name and values hash (≤ 63; two clusters of one
/// name in two namespaces get two Jobs).
pub fn job_name(namespace: &str, cluster: &str, hash: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{namespace}/{cluster}/{hash}"));
    let short: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let prefix: String = cluster
        .chars()
        .take(63 - "ichor-cni--".len() - short.len())
        .collect();
    format!("ichor-cni-{}-{short}", prefix.trim_end_matches('-'))
}

/// The Job for `cluster` at values `hash`, running `image`, in
/// `system_namespace` (pure).
pub fn build(cluster: &TalosCluster, hash: &str, image: &str, system_namespace: &str) -> Job {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(&namespace, &name, hash),
            "namespace": system_namespace,
            "labels": {
                CLUSTER_LABEL: name,
                CLUSTER_NAMESPACE_LABEL: namespace,
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
            uid: job.uid().unwrap_or_default(),
            message: c
                .message
                .or(c.reason)
                .unwrap_or_else(|| "the Job failed".into()),
        };
    }
    JobState::Running { name }
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
            "ichor-system",
        );
        let v = serde_json::to_value(&job).unwrap();
        let pod = &v["spec"]["template"]["spec"];
        assert_eq!(
            v["metadata"]["name"],
            job_name("ichor-system", "prod", "0123456789abcdef")
        );
        assert_eq!(v["metadata"]["namespace"], "ichor-system");
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
        assert!(job_name("ns", &long, "0123456789abcdef").len() <= 63);
        assert!(job_name("ns", "prod", "0123456789abcdef").starts_with("ichor-cni-prod-"));
    }

    /// A cluster in a team's namespace gets its Job in the system namespace,
    /// where the ichor-cni identity lives; same-named clusters of two
    /// namespaces get two Jobs.
    /// Covers: R18.2
    #[test]
    fn the_job_runs_in_the_system_namespace_for_a_cluster_anywhere() {
        let mut team = cluster();
        team.metadata.namespace = Some("team-a".into());
        let job = serde_json::to_value(build(&team, "h", "i", "ichor-system")).unwrap();
        assert_eq!(job["metadata"]["namespace"], "ichor-system");
        assert_eq!(job["metadata"]["labels"][CLUSTER_NAMESPACE_LABEL], "team-a");
        let args = &job["spec"]["template"]["spec"]["containers"][0]["args"];
        assert_eq!(args[4], "prod");
        assert_eq!(args[6], "team-a");
        assert_ne!(
            job_name("team-a", "prod", "h"),
            job_name("team-b", "prod", "h")
        );
    }

    /// Covers: R5.6, R18.5
    #[test]
    fn the_wait_after_a_failure_doubles_up_to_ten_minutes_with_jitter() {
        assert_eq!(job_backoff(0, "c"), Duration::ZERO);
        let first = job_backoff(1, "ns/prod");
        assert!(first >= JOB_BACKOFF_FIRST.mul_f64(0.8) && first < JOB_BACKOFF_FIRST.mul_f64(1.2));
        let third = job_backoff(3, "ns/prod");
        assert!(
            third >= Duration::from_secs(48) && third < Duration::from_secs(72),
            "{third:?}"
        );
        let late = job_backoff(40, "ns/prod");
        assert!(late >= JOB_BACKOFF_MAX.mul_f64(0.8) && late < JOB_BACKOFF_MAX.mul_f64(1.2));
    }

    #[test]
    fn state_reads_complete_and_failed() {
        let mut job = build(&cluster(), "h", "i", "ichor-system");
        assert!(matches!(state(&job), JobState::Running { .. }));
        job.status = serde_json::from_value(json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]})).unwrap();
        assert_eq!(
            state(&job),
            JobState::Failed {
                name: job_name("ichor-system", "prod", "h"),
                uid: String::new(),
                message: "Job has reached the specified backoff limit".into()
            }
        );
        job.status = serde_json::from_value(json!({"succeeded": 1})).unwrap();
        assert!(matches!(state(&job), JobState::Succeeded { .. }));
    }
}
