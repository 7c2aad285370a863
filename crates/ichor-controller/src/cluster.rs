//! The TalosCluster reconciler: Ready aggregated from the machines,
//! `status.cni.detected` (spec 2.2) and the CNI hand-over (spec 1.5 step 5).
//!
//! Hand-over: with preset `cilium`, when Ichor's release `cilium` (record in
//! the storage namespace) is deployed at the hash of this TalosCluster's
//! effective values and the `cilium` DaemonSet is Ready, `CNIHandover=True`.
//! Once True it stays True: the hand-over is a moment, and the render drops
//! the inline CNI entry from then on. When the hash does not match (a
//! takeover, or changed values), the controller starts the ichor-cni Job
//! (`ichor cni helm apply`, see [`crate::cni_job`]) when it knows the image to
//! run (`Config::cni_job_image`); a failed Job is deleted and the next
//! reconcile starts another. A matching hash never creates a Job (R1.5e).

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{
    CniPreset, CniStatus, DetectedCni, TalosCluster, TalosClusterStatus, TalosMachine,
};
use ichor_cilium::{ClusterSettings, HandoverCheck};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};

use crate::{Context, Error, FIELD_MANAGER, Result};

/// The controller's name in metrics.
pub const CONTROLLER: &str = "taloscluster";

/// Reasons this crate adds to `ichor_api::conditions::reasons`.
pub mod local_reasons {
    /// No TalosMachine refers to the cluster yet.
    pub const NO_MACHINES: &str = "NoMachines";
    /// Some machines are not Ready.
    pub const MACHINES_NOT_READY: &str = "MachinesNotReady";
    /// `spec.cni.cilium.values` cannot give effective values.
    pub const INVALID_VALUES: &str = "InvalidValues";
    /// The ichor-cni Job is bringing the release to the effective values.
    pub const JOB_RUNNING: &str = "JobRunning";
}

/// How often a cluster whose hand-over is pending is looked at again (the
/// DaemonSet and record watches usually come first).
const HANDOVER_POLL: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the TalosCluster controller until `shutdown`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ns = ctx.config.namespace.clone();
    let clusters: Api<DeserializeGuard<TalosCluster>> = match &ns {
        Some(n) => Api::namespaced(ctx.client.clone(), n),
        None => Api::all(ctx.client.clone()),
    };
    let machines: Api<DeserializeGuard<TalosMachine>> = match &ns {
        Some(n) => Api::namespaced(ctx.client.clone(), n),
        None => Api::all(ctx.client.clone()),
    };
    let daemonsets =
        Api::<DaemonSet>::namespaced(ctx.client.clone(), &ctx.config.cilium_release_namespace);
    let records =
        Api::<Secret>::namespaced(ctx.client.clone(), &ctx.config.cilium_storage_namespace);
    let controller = Controller::new(clusters, watcher::Config::default());
    let store = controller.store();
    let all = move || {
        store
            .state()
            .into_iter()
            .map(|c| ObjectRef::from_obj(&*c))
            .collect::<Vec<_>>()
    };
    let all2 = all.clone();
    let drive = controller
        .watches(
            machines,
            watcher::Config::default(),
            |m: DeserializeGuard<TalosMachine>| {
                m.0.ok().map(|m| {
                    let r = ObjectRef::new(&m.spec.cluster_ref.name);
                    match m.namespace() {
                        Some(ns) => r.within(&ns),
                        None => r,
                    }
                })
            },
        )
        .watches(
            daemonsets,
            watcher::Config::default()
                .fields(&format!("metadata.name={}", ichor_cilium::AGENT_DAEMONSET)),
            move |_| all(),
        )
        .watches(
            records,
            watcher::Config::default()
                .labels(&format!("owner=helm,name={}", ichor_cilium::RELEASE_NAME)),
            move |_| all2(),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "TalosCluster reconcile");
            }
        });
    crate::drive_until_stopped("TalosCluster", drive, stop).await;
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosCluster>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.failed(CONTROLLER, error.metric_label());
    tracing::warn!(
        cluster = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
        error = %error,
        "TalosCluster reconcile failed"
    );
    Action::requeue(ctx.config.error_requeue)
}

async fn reconcile(obj: Arc<DeserializeGuard<TalosCluster>>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let cluster = match &obj.0 {
        Ok(c) => c,
        Err(invalid) => {
            let err = Error::Malformed {
                kind: "TalosCluster",
                namespace: invalid.metadata.namespace.clone().unwrap_or_default(),
                name: invalid.metadata.name.clone().unwrap_or_default(),
                reason: invalid.error.clone(),
            };
            crate::machine::publish_on(
                &ctx,
                "TalosCluster",
                &invalid.metadata,
                kube::runtime::events::EventType::Warning,
                "Malformed",
                err.to_string(),
            )
            .await;
            return Err(err);
        }
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let generation = cluster.metadata.generation;
    let now = crate::now();
    let mut status = cluster.status.clone().unwrap_or_default();

    // Ready, from the machines.
    let machines =
        Api::<DeserializeGuard<TalosMachine>>::namespaced(ctx.client.clone(), &namespace)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(format!(
                "listing the TalosMachines of {namespace}"
            )))?;
    let mine: Vec<&TalosMachine> = machines
        .items
        .iter()
        .filter_map(|m| m.0.as_ref().ok())
        .filter(|m| m.spec.cluster_ref.name == name)
        .collect();
    conditions::set(&mut status.conditions, ready(&mine, generation, &now));

    // The CNI.
    let mut requeue = ctx.config.resync;
    match cluster.spec.cni.preset {
        CniPreset::Unmanaged => {
            conditions::set(
                &mut status.conditions,
                conditions::new(
                    types::CNI_HANDOVER,
                    Status::False,
                    reasons::UNMANAGED,
                    "preset unmanaged: the CNI is the user's, there is nothing to hand over",
                    generation,
                    now.clone(),
                ),
            );
            let detected = detect_cni(&ctx, false).await?;
            status.cni = Some(CniStatus {
                detected: Some(detected),
            });
        }
        CniPreset::Cilium => {
            let node_count = node_count(&ctx, mine.len()).await?;
            let check = match ClusterSettings::from_cluster(cluster, node_count) {
                Ok(settings) => Some(
                    ichor_cilium::check_handover(
                        ctx.client.clone(),
                        &ctx.config.cilium_storage_namespace,
                        &ctx.config.cilium_release_namespace,
                        &settings,
                    )
                    .await
                    .map_err(|e| Error::Cilium {
                        namespace: namespace.clone(),
                        cluster: name.clone(),
                        source: Box::new(e),
                    })?,
                ),
                Err(e) => {
                    if !conditions::is_true(&status.conditions, types::CNI_HANDOVER) {
                        conditions::set(
                            &mut status.conditions,
                            conditions::new(
                                types::CNI_HANDOVER,
                                Status::False,
                                local_reasons::INVALID_VALUES,
                                e.to_string(),
                                generation,
                                now.clone(),
                            ),
                        );
                    }
                    None
                }
            };
            let job = match (&check, &ctx.config.cni_job_image) {
                (Some(c), Some(image)) if !c.at_desired_hash() => Some(
                    crate::cni_job::ensure(&ctx.client, cluster, &c.desired_hash, image).await?,
                ),
                _ => None,
            };
            let released = check.as_ref().is_some_and(|c| c.deployed.is_some());
            let detected = detect_cni(&ctx, released).await?;
            status.cni = Some(CniStatus {
                detected: Some(detected),
            });
            if let Some(check) = check
                && !conditions::is_true(&status.conditions, types::CNI_HANDOVER)
            {
                let c = match &job {
                    Some(crate::cni_job::JobState::Running { name: job }) => conditions::new(
                        types::CNI_HANDOVER,
                        Status::False,
                        local_reasons::JOB_RUNNING,
                        format!(
                            "the ichor-cni Job {namespace}/{job} is bringing Helm release {} to this TalosCluster's effective values (hash {})",
                            ichor_cilium::RELEASE_NAME,
                            check.desired_hash
                        ),
                        generation,
                        now.clone(),
                    ),
                    Some(crate::cni_job::JobState::Failed { name: job, message }) => {
                        requeue = ctx.config.error_requeue;
                        conditions::new(
                            types::CNI_HANDOVER,
                            Status::False,
                            reasons::JOB_FAILED,
                            format!(
                                "the ichor-cni Job {namespace}/{job} failed ({message}); it was deleted and a new attempt starts. Its pod's log says why"
                            ),
                            generation,
                            now.clone(),
                        )
                    }
                    _ => handover_condition(
                        &check,
                        &ctx.config.cilium_storage_namespace,
                        &ctx.config.cilium_release_namespace,
                        generation,
                        &now,
                    ),
                };
                if c.status != "True" && requeue != ctx.config.error_requeue {
                    requeue = HANDOVER_POLL;
                }
                conditions::set(&mut status.conditions, c);
            }
        }
    }
    status.observed_generation = generation;
    write_status(&ctx.client, &namespace, &name, &status).await?;
    Ok(Action::requeue(requeue))
}

async fn write_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: &TalosClusterStatus,
) -> Result<()> {
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", ichor_api::GROUP, ichor_api::VERSION),
        "kind": "TalosCluster",
        "status": status,
    });
    Api::<TalosCluster>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "writing the status of TalosCluster {namespace}/{name}"
        )))?;
    Ok(())
}

/// The node count the effective values depend on: the Kubernetes Nodes, or,
/// while none has registered, the cluster's TalosMachines.
async fn node_count(ctx: &Context, machines: usize) -> Result<u32> {
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(Error::kube("listing the Nodes"))?;
    let n = if nodes.items.is_empty() {
        machines
    } else {
        nodes.items.len()
    };
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The CNI running in the cluster (spec 2.2: `cilium` from the moment Ichor's
/// Cilium release is deployed).
async fn detect_cni(ctx: &Context, ichor_release_deployed: bool) -> Result<DetectedCni> {
    let ds = |ns: &str| Api::<DaemonSet>::namespaced(ctx.client.clone(), ns);
    let exists = |ns: String, name: &'static str| {
        let api = ds(&ns);
        async move {
            api.get_metadata_opt(name)
                .await
                .map(|o| o.is_some())
                .map_err(Error::kube(format!("reading DaemonSet {ns}/{name}")))
        }
    };
    let release_ns = ctx.config.cilium_release_namespace.clone();
    let cilium =
        ichor_release_deployed || exists(release_ns, ichor_cilium::AGENT_DAEMONSET).await?;
    let flannel = exists("kube-system".into(), "kube-flannel").await?;
    let calico = exists("kube-system".into(), "calico-node").await?
        || exists("calico-system".into(), "calico-node").await?;
    Ok(match (cilium, flannel, calico) {
        (false, false, false) => DetectedCni::None,
        (true, false, false) => DetectedCni::Cilium,
        (false, true, false) => DetectedCni::Flannel,
        (false, false, true) => DetectedCni::Calico,
        _ => DetectedCni::Mixed,
    })
}

/// `Ready` of a cluster from its machines' `Ready`.
pub fn ready(machines: &[&TalosMachine], generation: Option<i64>, now: &Time) -> Condition {
    if machines.is_empty() {
        return conditions::new(
            types::READY,
            Status::False,
            local_reasons::NO_MACHINES,
            "no TalosMachine refers to this cluster yet",
            generation,
            now.clone(),
        );
    }
    let not_ready: Vec<String> = machines
        .iter()
        .filter_map(|m| {
            let cs = m
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            match conditions::find(cs, types::READY) {
                Some(c) if c.status == "True" => None,
                Some(c) => Some(format!("{} ({})", m.name_any(), c.reason)),
                None => Some(format!("{} (not reconciled yet)", m.name_any())),
            }
        })
        .collect();
    if not_ready.is_empty() {
        conditions::new(
            types::READY,
            Status::True,
            reasons::RECONCILED,
            format!("all {} machines are Ready", machines.len()),
            generation,
            now.clone(),
        )
    } else {
        conditions::new(
            types::READY,
            Status::False,
            local_reasons::MACHINES_NOT_READY,
            format!(
                "{} of {} machines are not Ready: {}",
                not_ready.len(),
                machines.len(),
                not_ready.join(", ")
            ),
            generation,
            now.clone(),
        )
    }
}

/// `CNIHandover` from a hand-over check.
pub fn handover_condition(
    check: &HandoverCheck,
    storage_ns: &str,
    release_ns: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let release = ichor_cilium::RELEASE_NAME;
    if check.complete() {
        let rev = check.deployed.as_ref().map(|(r, _)| *r).unwrap_or_default();
        return conditions::new(
            types::CNI_HANDOVER,
            Status::True,
            reasons::HANDED_OVER,
            format!(
                "Helm release {release} (record in {storage_ns}, revision {rev}) is deployed at the effective-values hash {} and DaemonSet {release_ns}/{} is Ready",
                check.desired_hash,
                ichor_cilium::AGENT_DAEMONSET
            ),
            generation,
            now.clone(),
        );
    }
    if !check.at_desired_hash() {
        let message = match &check.deployed {
            None => format!(
                "no deployed Helm release {release} in {storage_ns}; install Ichor's Cilium (ichor cni bootstrap, or ichor adopt)"
            ),
            Some((rev, hash)) => format!(
                "Helm release {release} revision {rev} is deployed with values hash {hash}, but this TalosCluster's effective values hash to {}; the ichor-cni Job upgrades it (or run `ichor cni helm apply` for this cluster)",
                check.desired_hash
            ),
        };
        return conditions::new(
            types::CNI_HANDOVER,
            Status::False,
            reasons::WAITING_FOR_RELEASE,
            message,
            generation,
            now.clone(),
        );
    }
    let why = check.daemonset.as_ref().err().cloned().unwrap_or_default();
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::WAITING_FOR_DAEMON_SET,
        format!(
            "Helm release {release} is deployed at the effective-values hash; DaemonSet {release_ns}/{} is not Ready: {why}",
            ichor_cilium::AGENT_DAEMONSET
        ),
        generation,
        now.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(deployed: Option<(u32, &str)>, ds: Result<(), String>) -> HandoverCheck {
        HandoverCheck {
            desired_hash: "h1".into(),
            deployed: deployed.map(|(r, h)| (r, h.to_string())),
            daemonset: ds,
        }
    }

    fn machine(name: &str, ready: Option<(&str, &str)>) -> TalosMachine {
        let mut m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}, "role": "worker", "address": "10.0.0.2"}
        }))
        .unwrap();
        if let Some((status, reason)) = ready {
            let st = if status == "True" {
                Status::True
            } else {
                Status::False
            };
            m.status = Some(ichor_api::TalosMachineStatus {
                conditions: vec![conditions::new(
                    types::READY,
                    st,
                    reason,
                    "",
                    Some(1),
                    crate::now(),
                )],
                ..Default::default()
            });
        }
        m
    }

    #[test]
    fn cluster_ready_names_the_machines_that_are_not() {
        let now = crate::now();
        let c = ready(&[], Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", local_reasons::NO_MACHINES)
        );
        let a = machine("a", Some(("True", reasons::RECONCILED)));
        let b = machine("b", Some(("False", reasons::NODE_UNREACHABLE)));
        let n = machine("n", None);
        let c = ready(&[&a], Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::RECONCILED)
        );
        let c = ready(&[&a, &b, &n], Some(1), &now);
        assert_eq!(c.reason, local_reasons::MACHINES_NOT_READY);
        assert_eq!(
            c.message,
            "2 of 3 machines are not Ready: b (NodeUnreachable), n (not reconciled yet)"
        );
    }

    /// Covers: R1.5e
    #[test]
    fn handover_needs_the_hash_and_a_ready_daemonset() {
        let now = crate::now();
        let c = handover_condition(&check(Some((1, "h1")), Ok(())), "s", "r", Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        let c = handover_condition(
            &check(Some((1, "h1")), Err("0 of 3 ready".into())),
            "s",
            "r",
            Some(1),
            &now,
        );
        assert_eq!(c.reason, reasons::WAITING_FOR_DAEMON_SET);
        assert!(c.message.contains("0 of 3 ready"));
        let c = handover_condition(&check(Some((2, "h0")), Ok(())), "s", "r", Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::WAITING_FOR_RELEASE)
        );
        assert!(
            c.message.contains("h0") && c.message.contains("h1"),
            "{}",
            c.message
        );
        let c = handover_condition(&check(None, Ok(())), "s", "r", Some(1), &now);
        assert_eq!(c.reason, reasons::WAITING_FOR_RELEASE);
    }
}
