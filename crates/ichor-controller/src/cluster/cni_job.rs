//! The ichor-cni Job's I/O: read, start and delete it. What the Job is,
//! its name, its state and the back-off between attempts are decided in
//! `ichor_reconcile::cni_job` (re-exported here).

use ichor_api::TalosCluster;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};

pub use ichor_reconcile::cni_job::*;

use crate::{Error, Result};

/// The state of the Job for (`cluster`, `hash`) in `system_namespace`,
/// when it exists.
pub async fn read(
    client: &kube::Client,
    system_namespace: &str,
    cluster: &TalosCluster,
    hash: &str,
) -> Result<Option<JobState>> {
    let name = job_name(
        &cluster.namespace().unwrap_or_default(),
        &cluster.name_any(),
        hash,
    );
    let existing = Api::<Job>::namespaced(client.clone(), system_namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!(
            "reading the ichor-cni Job {system_namespace}/{name}"
        )))?;
    Ok(existing.as_ref().map(state))
}

/// Starts the Job for (`cluster`, `hash`) running `image` in `system_namespace`.
pub async fn start(
    client: &kube::Client,
    system_namespace: &str,
    cluster: &TalosCluster,
    hash: &str,
    image: &str,
) -> Result<()> {
    let job = build(cluster, hash, image, system_namespace);
    let name = job.name_any();
    Api::<Job>::namespaced(client.clone(), system_namespace)
        .create(&PostParams::default(), &job)
        .await
        .map_err(Error::kube(format!(
            "creating the ichor-cni Job {system_namespace}/{name}"
        )))?;
    Ok(())
}

/// Deletes the failed Job `name` in `system_namespace` (its pods with it),
/// so that a later reconcile starts a new attempt.
pub async fn delete(client: &kube::Client, system_namespace: &str, name: &str) -> Result<()> {
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    Api::<Job>::namespaced(client.clone(), system_namespace)
        .delete(name, &dp)
        .await
        .map_err(Error::kube(format!(
            "deleting the failed ichor-cni Job {system_namespace}/{name}"
        )))?;
    Ok(())
}
