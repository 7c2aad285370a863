//! The TalosCluster reconciler: Ready aggregated from the machines,
//! `status.cni.detected` (R2.2) and the CNI hand-over (R1.5e).
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
//!
//! The hand-over has three steps, in this order, and `CNIHandover=True` only
//! when all three hold (R6.1, R10.4): (1) the release is deployed at the hash
//! with its DaemonSet Ready; (2) no control plane's live config carries the
//! inline Cilium manifest — from step 1 on the condition says
//! `RemovingInlineManifest`, the render drops the entry and each machine's
//! reconcile applies that class B change (the controller is the only
//! writer); (3) Talos's bootstrap-manifests inventory names none of the
//! release's objects ([`crate::bootstrap_inventory`]). Each step reads what
//! holds now, so a kill between any two and a rerun end in the same state.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::cni::CniWorkload;
use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{
    CniPreset, CniStatus, DetectedCni, MachineRole, TalosCluster, TalosClusterStatus, TalosMachine,
};
use ichor_cilium::{ClusterSettings, HandoverCheck};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kube::core::DeserializeGuard;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt as _, watcher};

use crate::bootstrap_inventory::{InventoryStep, ReleaseObject};
use crate::cni_job::JobState;
use crate::pipeline;
use crate::{Context, Error, Result};

/// The Event reason of the hand-over's inventory step.
pub const INVENTORY_RELEASED: &str = "InventoryReleased";

/// The controller's name in metrics.
pub const CONTROLLER: &str = "taloscluster";

/// How often a cluster whose ichor-cni Job runs is looked at again (Jobs
/// are not watched; the DaemonSet and record watches usually come first).
const HANDOVER_POLL: std::time::Duration = std::time::Duration::from_secs(10);

/// The least time between two reconciles of one TalosCluster: while its
/// machines converge, each one becoming Ready would otherwise reconcile it.
const CLUSTER_SPACING: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs the TalosCluster controller until `shutdown`. Its watch of the
/// TalosMachines fills `machines` (the store [`Context::machines`] reads).
pub(crate) async fn run(
    ctx: Arc<Context>,
    machines: pipeline::Filler<DeserializeGuard<TalosMachine>>,
    nodes: pipeline::Filler<PartialObjectMeta<Node>>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ns = ctx.config.namespace.clone();
    let clusters: Api<DeserializeGuard<TalosCluster>> = match &ns {
        Some(n) => Api::namespaced(ctx.client.clone(), n),
        None => Api::all(ctx.client.clone()),
    };
    let machine_api: Api<DeserializeGuard<TalosMachine>> = match &ns {
        Some(n) => Api::namespaced(ctx.client.clone(), n),
        None => Api::all(ctx.client.clone()),
    };
    let machine_trigger =
        machines.fill(watcher(machine_api, watcher::Config::default()).default_backoff());
    let daemonsets =
        Api::<DaemonSet>::namespaced(ctx.client.clone(), &ctx.config.cilium_release_namespace);
    let records =
        Api::<Secret>::namespaced(ctx.client.clone(), &ctx.config.cilium_storage_namespace);
    let controller = Controller::new(clusters, watcher::Config::default());
    let every_cluster = every_cluster(controller.store());
    let every_cluster_again = every_cluster.clone();
    // The node count is part of the effective values: a Node that comes or
    // goes reconciles every cluster; a Node's status updates do not.
    let node_trigger = nodes.fill(
        watcher(
            Api::<PartialObjectMeta<Node>>::all(ctx.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    );
    let drive = controller
        .watches_stream(
            machine_trigger,
            clusters_of_machine(ctx.machines.store.clone()),
        )
        .watches_stream(
            node_trigger,
            clusters_of_node(ctx.nodes.store.clone(), every_cluster.clone()),
        )
        .watches(
            daemonsets,
            watcher::Config::default()
                .fields(&format!("metadata.name={}", ichor_cilium::AGENT_DAEMONSET)),
            move |_| every_cluster(),
        )
        .watches(
            records,
            watcher::Config::default().labels(&ichor_helm::storage::release_selector(
                ichor_cilium::RELEASE_NAME,
            )),
            move |_| every_cluster_again(),
        )
        .graceful_shutdown_on(shutdown)
        .run(guarded_reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "TalosCluster reconcile");
            }
        });
    crate::drive_until_stopped("TalosCluster", drive, stop).await;
}

/// A reference to a TalosCluster, as the controller queues it.
type ClusterRef = ObjectRef<DeserializeGuard<TalosCluster>>;

/// Every TalosCluster the controller's `store` holds.
fn every_cluster(
    store: Store<DeserializeGuard<TalosCluster>>,
) -> impl Fn() -> Vec<ClusterRef> + Clone + Send + Sync + 'static {
    move || {
        store
            .state()
            .into_iter()
            .map(|c| ObjectRef::from_obj(&*c))
            .collect::<Vec<_>>()
    }
}

/// The clusters an event of a TalosMachine reconciles: the one it names now
/// and the one it named before, and none when neither its membership nor its
/// Ready changed. `machine_store` is the store of the machines' watch.
fn clusters_of_machine(
    machine_store: Store<DeserializeGuard<TalosMachine>>,
) -> impl Fn(DeserializeGuard<TalosMachine>) -> Vec<ClusterRef> + Send + Sync + 'static {
    // A machine's status is written on every change of its drift; the
    // cluster reads only its membership and its Ready.
    let seen = pipeline::ChangeFilter::<MachineInputs>::default();
    move |m: DeserializeGuard<TalosMachine>| {
        let Ok(m) = m.0 else {
            return Vec::new();
        };
        let ns = m.namespace().unwrap_or_default();
        let r = ObjectRef::<DeserializeGuard<TalosMachine>>::new(&m.name_any()).within(&ns);
        let now = machine_store
            .get(&r)
            .is_some()
            .then(|| MachineInputs::of(&m));
        let Some(before) = seen.changed(r.to_string(), now) else {
            return Vec::new();
        };
        // The cluster it names now, and the one it named before.
        let mut names = vec![m.spec.cluster_ref.name.clone()];
        if let Some(b) = before
            && b.cluster != m.spec.cluster_ref.name
        {
            names.push(b.cluster);
        }
        names
            .iter()
            .map(|n| ObjectRef::new(n).within(&ns))
            .collect()
    }
}

/// The clusters an event of a Node reconciles: every one when the Node came
/// or went (`node_store` is the store of the Nodes' watch), none otherwise.
fn clusters_of_node(
    node_store: Store<PartialObjectMeta<Node>>,
    every_cluster: impl Fn() -> Vec<ClusterRef> + Send + Sync + 'static,
) -> impl Fn(PartialObjectMeta<Node>) -> Vec<ClusterRef> + Send + Sync + 'static {
    let nodes_seen = pipeline::ChangeFilter::<()>::default();
    move |n: PartialObjectMeta<Node>| {
        let name = n.name_any();
        let present = node_store.get(&ObjectRef::new(&name)).is_some();
        match nodes_seen.changed(name, present.then_some(())) {
            Some(_) => every_cluster(),
            None => Vec::new(),
        }
    }
}

/// [`reconcile`] behind the unwind boundary: a panic fails this object only.
async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosCluster>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosCluster>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

/// What of a TalosMachine its cluster's reconcile reads: which cluster it
/// names, and its Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MachineInputs {
    cluster: String,
    ready: Option<(String, String)>,
    inline_manifests: Option<Vec<String>>,
}

impl MachineInputs {
    pub(crate) fn of(m: &TalosMachine) -> Self {
        let ready = m
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::READY))
            .map(|c| (c.status.clone(), c.reason.clone()));
        MachineInputs {
            cluster: m.spec.cluster_ref.name.clone(),
            ready,
            inline_manifests: m.status.as_ref().and_then(|s| s.inline_manifests.clone()),
        }
    }
}

/// Read → decide → write.
async fn reconcile(obj: Arc<DeserializeGuard<TalosCluster>>, ctx: Arc<Context>) -> Result<Action> {
    let id = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let wait = ctx.cluster_spacing.wait(&id, CLUSTER_SPACING);
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    ctx.metrics.reconciled(CONTROLLER);
    let cluster = pipeline::readable(&ctx, &obj).await?;
    let observed = read(&ctx, cluster).await?;
    let settings = Settings::of(&ctx.config);
    let decision = decide(cluster, &observed, &settings, &(ctx.clock)());
    write(&ctx, cluster, &decision).await?;
    Ok(Action::requeue(decision.requeue))
}

/// What the TalosCluster reconcile reads before it decides.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The readable TalosMachines whose `spec.clusterRef` names this cluster.
    pub machines: Vec<TalosMachine>,
    /// The hand-over check (preset cilium), or why the effective values
    /// cannot be derived from `spec.cni.cilium.values`.
    pub handover: Option<std::result::Result<HandoverCheck, String>>,
    /// The ichor-cni Job for the desired values hash, when one exists.
    pub job: Option<JobState>,
    /// The DaemonSets recognised as a CNI's, in every namespace.
    pub cni_workloads: Vec<CniWorkload>,
    /// Talos's bootstrap-manifests inventory and the release's objects, read
    /// once the release step holds and until the hand-over is done; `None`
    /// otherwise (the decision then has no inventory step to take).
    pub inventory: Option<InventoryObserved>,
    /// Ichor's Cilium release from its newest record (preset cilium).
    pub cilium_release: Option<ichor_api::CiliumReleaseStatus>,
}

/// What the inventory step reads.
#[derive(Debug, Clone, Default)]
pub struct InventoryObserved {
    /// The objects of the deployed release, as the inventory names them.
    pub release: Vec<ReleaseObject>,
    /// The inventory ConfigMap, `None` when there is none.
    pub config_map: Option<ConfigMap>,
}

/// The settings the decision needs from the controller's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub storage_namespace: String,
    pub release_namespace: String,
    /// Whether the controller may start the ichor-cni Job (it has an image).
    pub can_start_job: bool,
    pub resync: std::time::Duration,
    pub error_requeue: std::time::Duration,
    /// Where the ichor-cni Jobs run (the controller's own namespace).
    pub system_namespace: String,
}

impl Settings {
    fn of(config: &crate::Config) -> Self {
        Settings {
            system_namespace: config.system_namespace.clone(),
            storage_namespace: config.cilium_storage_namespace.clone(),
            release_namespace: config.cilium_release_namespace.clone(),
            can_start_job: config.cni_job_image.is_some(),
            resync: config.resync,
            error_requeue: config.error_requeue,
        }
    }
}

/// What to write to the API, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterAction {
    /// Strip the owning-inventory annotation of the release's objects that
    /// Talos's inventory names, then remove them from `config_map` (as read).
    ReleaseInventory {
        config_map: Box<ConfigMap>,
        step: InventoryStep,
    },
    /// Create the ichor-cni Job for this values hash.
    StartJob { hash: String },
    /// Delete the failed ichor-cni Job (the next reconcile starts another).
    DeleteFailedJob { name: String },
}

/// What the reconcile decided: the status to write, the actions before it,
/// and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub status: TalosClusterStatus,
    pub actions: Vec<ClusterAction>,
    pub requeue: std::time::Duration,
}

async fn read(ctx: &Context, cluster: &TalosCluster) -> Result<Observed> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let machines = machines_of(ctx, &namespace, &name).await?;
    let mut observed = Observed {
        machines,
        ..Observed::default()
    };
    if cluster.spec.cni.preset == CniPreset::Cilium {
        observed.cilium_release = read_cilium_release(ctx).await;
        observed.handover = Some(read_handover(ctx, cluster, observed.machines.len()).await?);
        if let Some(Ok(check)) = &observed.handover
            && !check.at_desired_hash()
            && ctx.config.cni_job_image.is_some()
        {
            observed.job = crate::cni_job::read(
                &ctx.client,
                &ctx.config.system_namespace,
                cluster,
                &check.desired_hash,
            )
            .await?;
        }
        let handed_over = cluster
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER));
        if let Some(Ok(check)) = &observed.handover
            && check.complete()
            && (!handed_over || !inline_pending(cluster, &observed.machines).is_empty())
        {
            observed.inventory = Some(read_inventory(ctx, cluster).await?);
        }
    }
    observed.cni_workloads = read_cni_workloads(ctx).await?;
    Ok(observed)
}

/// Ichor's Cilium release from its records; `None` without a record. A
/// failed read is logged and leaves the field out: the hand-over check,
/// which reads the same records, reports the failure.
async fn read_cilium_release(ctx: &Context) -> Option<ichor_api::CiliumReleaseStatus> {
    let storage_ns = &ctx.config.cilium_storage_namespace;
    match ichor_helm::SecretStorage::new(ctx.client.clone(), storage_ns)
        .history(ichor_cilium::RELEASE_NAME)
        .await
    {
        Ok(history) => cilium_release_status(&history, storage_ns),
        Err(e) => {
            tracing::debug!("reading Ichor's Cilium release records: {e}");
            None
        }
    }
}

/// What `status.cni.release` says of a release's history (oldest first):
/// the newest revision, its status, chart version and deploy time, and the
/// newest deployed revision when that is an older one.
pub fn cilium_release_status(
    history: &[ichor_helm::StoredRelease],
    storage_ns: &str,
) -> Option<ichor_api::CiliumReleaseStatus> {
    let newest = history.last()?;
    let deployed = ichor_helm::storage::newest_deployed(history).map(|s| s.release.version);
    let release = &newest.release;
    Some(ichor_api::CiliumReleaseStatus {
        name: release.name.clone(),
        storage_namespace: storage_ns.to_string(),
        revision: i64::from(release.version),
        status: release.status().as_str().to_string(),
        chart_version: release.chart_version().map(str::to_string),
        last_deployed: release
            .info
            .as_ref()
            .and_then(|i| i.last_deployed)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        deployed_revision: deployed.filter(|d| *d != release.version).map(i64::from),
    })
}

/// The deployed release's objects and Talos's inventory.
async fn read_inventory(ctx: &Context, cluster: &TalosCluster) -> Result<InventoryObserved> {
    let release =
        ichor_cilium::deployed_release(ctx.client.clone(), &ctx.config.cilium_storage_namespace)
            .await
            .map_err(|e| Error::Cilium {
                namespace: cluster.namespace().unwrap_or_default(),
                cluster: cluster.name_any(),
                source: Box::new(e),
            })?;
    let release = match release {
        Some(r) => crate::bootstrap_inventory::release_objects(
            &r.manifest,
            &ctx.config.cilium_release_namespace,
        )
        .map_err(|e| Error::Cilium {
            namespace: cluster.namespace().unwrap_or_default(),
            cluster: cluster.name_any(),
            source: Box::new(ichor_cilium::Error::Helm(ichor_helm::Error::Manifest {
                release: ichor_cilium::RELEASE_NAME.into(),
                source: e,
            })),
        })?,
        None => Vec::new(),
    };
    Ok(InventoryObserved {
        release,
        config_map: crate::bootstrap_inventory::read(&ctx.client).await?,
    })
}

/// The readable TalosMachines of `namespace/name`, from the store the
/// machine watch fills (a list per reconcile would read every machine of
/// the namespace for every machine that changed).
async fn machines_of(ctx: &Context, namespace: &str, name: &str) -> Result<Vec<TalosMachine>> {
    if !ctx.machines.ready().await {
        // The watch is gone: the controller is stopping.
        return Ok(Vec::new());
    }
    Ok(ctx
        .machines
        .store
        .state()
        .iter()
        .filter_map(|m| m.0.as_ref().ok())
        .filter(|m| m.namespace().as_deref() == Some(namespace) && m.spec.cluster_ref.name == name)
        .cloned()
        .collect())
}

/// The hand-over check for the cluster's effective values, or why they
/// cannot be derived.
async fn read_handover(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: usize,
) -> Result<std::result::Result<HandoverCheck, String>> {
    let node_count = node_count(ctx, machines).await?;
    let settings = match ClusterSettings::from_cluster(cluster, node_count) {
        Ok(s) => s,
        Err(e) => return Ok(Err(e.to_string())),
    };
    ichor_cilium::check_handover(
        ctx.client.clone(),
        &ctx.config.cilium_storage_namespace,
        &ctx.config.cilium_release_namespace,
        &settings,
    )
    .await
    .map(Ok)
    .map_err(|e| Error::Cilium {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
        source: Box::new(e),
    })
}

/// The decision: pure, from what was read and `now`.
pub fn decide(
    cluster: &TalosCluster,
    observed: &Observed,
    settings: &Settings,
    now: &Time,
) -> Decision {
    let generation = cluster.metadata.generation;
    let mut status = cluster.status.clone().unwrap_or_default();
    let mine: Vec<&TalosMachine> = observed.machines.iter().collect();
    conditions::set(&mut status.conditions, ready(&mine, generation, now));
    let mut decision = Decision {
        status,
        actions: Vec::new(),
        requeue: settings.resync,
    };
    match cluster.spec.cni.preset {
        CniPreset::Unmanaged => {
            conditions::set(
                &mut decision.status.conditions,
                conditions::new(
                    types::CNI_HANDOVER,
                    Status::False,
                    reasons::UNMANAGED,
                    "preset unmanaged: the CNI is the user's, there is nothing to hand over",
                    generation,
                    now.clone(),
                ),
            );
        }
        CniPreset::Cilium => decide_handover(cluster, observed, settings, now, &mut decision),
    };
    let job_failures = decision
        .status
        .cni
        .as_ref()
        .and_then(|c| c.job_failures.clone());
    decision.status.cni = Some(CniStatus {
        detected: Some(detected_cni(observed)),
        release: observed.cilium_release.clone(),
        job_failures,
    });
    decision.status.observed_generation = generation;
    decision
}

/// `CNIHandover` and the ichor-cni Job (preset cilium). Once True the
/// condition stays True: the hand-over is a moment.
fn decide_handover(
    cluster: &TalosCluster,
    observed: &Observed,
    settings: &Settings,
    now: &Time,
    decision: &mut Decision,
) {
    let generation = cluster.metadata.generation;
    let handed_over = conditions::is_true(&decision.status.conditions, types::CNI_HANDOVER);
    let check = match &observed.handover {
        Some(Ok(check)) => check,
        Some(Err(why)) => {
            if !handed_over {
                conditions::set(
                    &mut decision.status.conditions,
                    conditions::new(
                        types::CNI_HANDOVER,
                        Status::False,
                        reasons::INVALID_VALUES,
                        why.clone(),
                        generation,
                        now.clone(),
                    ),
                );
            }
            return;
        }
        None => return,
    };
    let job = job_step(
        cluster,
        check,
        observed.job.as_ref(),
        settings,
        now,
        decision,
    );
    if handed_over {
        // Talos's apply at boot records again the objects its inline
        // manifests name: while a control plane still carries the entry
        // (a machine joined after the hand-over, or a held one), the
        // inventory step is taken again.
        inventory_action(observed, decision);
        return;
    }
    let c = match &job {
        Some(JobState::Running { name: job }) => job_running(cluster, check, job, settings, now),
        Some(JobState::Failed {
            name: job, message, ..
        }) => {
            let failures = decision
                .status
                .cni
                .as_ref()
                .and_then(|c| c.job_failures.as_ref())
                .map_or(1, |f| f.count);
            let seed = format!(
                "{}/{}",
                cluster.namespace().unwrap_or_default(),
                cluster.name_any()
            );
            decision.requeue = crate::cni_job::job_backoff(failures, &seed);
            job_failed(
                job,
                message,
                failures,
                decision.requeue,
                settings,
                now,
                generation,
            )
        }
        Some(JobState::Waiting {
            failures,
            next,
            message,
        }) => job_waiting(*failures, next, message, settings, now, generation),
        _ => handover_condition(
            check,
            &settings.storage_namespace,
            &settings.release_namespace,
            generation,
            now,
        ),
    };
    let c = match c.status.as_str() {
        "True" => after_release(cluster, observed, c, now, decision),
        _ => c,
    };
    // What the condition waits for is watched (the record, the DaemonSet,
    // the Nodes, the machines), except a running Job: only that is polled.
    if c.status != "True"
        && decision.requeue != settings.error_requeue
        && matches!(job, Some(JobState::Running { .. }))
    {
        decision.requeue = HANDOVER_POLL;
    }
    conditions::set(&mut decision.status.conditions, c);
}

/// Steps 2 and 3 of the hand-over, once the release holds (`released` is its
/// True condition): the inline entry gone from every control plane's live
/// config, then Talos's inventory cleared of the release's objects (an
/// action). True only past both.
fn after_release(
    cluster: &TalosCluster,
    observed: &Observed,
    released: Condition,
    now: &Time,
    decision: &mut Decision,
) -> Condition {
    let generation = cluster.metadata.generation;
    let pending = inline_pending(cluster, &observed.machines);
    if !pending.is_empty() {
        return conditions::new(
            types::CNI_HANDOVER,
            Status::False,
            reasons::REMOVING_INLINE_MANIFEST,
            format!(
                "{}; Ichor is removing the inline Cilium manifest from the control planes' configs (a no-reboot apply), still on: {}",
                released.message,
                pending.join(", ")
            ),
            generation,
            now.clone(),
        );
    }
    let inventory_note = match inventory_action(observed, decision) {
        Some(n) => {
            format!(
                "{n} objects of the release were removed from Talos's inventory {}/{} now",
                ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
                ichor_talos::bootstrap_inventory::INVENTORY_NAME
            )
        }
        None => format!(
            "Talos's inventory {}/{} names none of the release's objects",
            ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
            ichor_talos::bootstrap_inventory::INVENTORY_NAME
        ),
    };
    conditions::new(
        types::CNI_HANDOVER,
        Status::True,
        reasons::HANDED_OVER,
        format!(
            "{}; no control plane's config carries the inline Cilium manifest; {inventory_note}, so talosctl upgrade-k8s cannot prune Cilium",
            released.message
        ),
        generation,
        now.clone(),
    )
}

/// The inventory step, when Talos's inventory (as read) names objects of the
/// release: the action, and how many objects it removes.
fn inventory_action(observed: &Observed, decision: &mut Decision) -> Option<usize> {
    let inventory = observed.inventory.as_ref()?;
    let config_map = inventory.config_map.clone()?;
    let data = config_map.data.clone().unwrap_or_default();
    let step = crate::bootstrap_inventory::decide(&inventory.release, Some(&data))?;
    let n = step.strip.len();
    decision.actions.push(ClusterAction::ReleaseInventory {
        config_map: Box::new(config_map),
        step,
    });
    Some(n)
}

/// The control-plane machines whose live config still carries the inline
/// Cilium entry (or the inline manifest taken over from a previous install),
/// or whose config was not read yet.
pub fn inline_pending(cluster: &TalosCluster, machines: &[TalosMachine]) -> Vec<String> {
    let taken_over = cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ichor_api::TAKEN_OVER_INLINE_MANIFEST_ANNOTATION));
    let mut pending: Vec<String> = machines
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
        .filter_map(
            |m| match m.status.as_ref().and_then(|s| s.inline_manifests.as_ref()) {
                None => Some(format!("{} (config not read yet)", m.name_any())),
                Some(names)
                    if names.iter().any(|n| {
                        n == ichor_render::cni::INLINE_CNI_NAME || Some(n) == taken_over
                    }) =>
                {
                    Some(match m.spec.hold {
                        true => format!("{} (held: release it so Ichor may apply)", m.name_any()),
                        false => m.name_any(),
                    })
                }
                Some(_) => None,
            },
        )
        .collect();
    pending.sort();
    pending
}

/// The Job step of the hand-over: off the desired hash and allowed to run a
/// Job, start one when there is none and the back-off after the last
/// failures has run out, and delete a failed one (counting it once, by its
/// uid, in `status.cni.jobFailures`). At the desired hash the failures are
/// forgotten. Returns the Job's state as it is after the actions (a started
/// Job is running).
fn job_step(
    cluster: &TalosCluster,
    check: &HandoverCheck,
    observed: Option<&JobState>,
    settings: &Settings,
    now: &Time,
    decision: &mut Decision,
) -> Option<JobState> {
    let cni = decision.status.cni.get_or_insert_with(Default::default);
    if check.at_desired_hash() {
        cni.job_failures = None;
        return None;
    }
    if !settings.can_start_job {
        return None;
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let seed = format!("{namespace}/{}", cluster.name_any());
    let previous = cni
        .job_failures
        .clone()
        .filter(|f| f.hash == check.desired_hash);
    match observed {
        None => {
            if let Some(f) = &previous {
                let wait = crate::cni_job::job_backoff(f.count, &seed);
                let next = Time(
                    f.last_failure
                        .0
                        .checked_add(jiff_duration(wait))
                        .unwrap_or(f.last_failure.0),
                );
                if now.0 < next.0 {
                    let left = next.0.duration_since(now.0);
                    let left = std::time::Duration::try_from(left).unwrap_or_default();
                    decision.requeue = decision
                        .requeue
                        .min(left.max(std::time::Duration::from_secs(1)));
                    return Some(JobState::Waiting {
                        failures: f.count,
                        next,
                        message: f.message.clone(),
                    });
                }
            }
            decision.actions.push(ClusterAction::StartJob {
                hash: check.desired_hash.clone(),
            });
            Some(JobState::Running {
                name: crate::cni_job::job_name(
                    &namespace,
                    &cluster.name_any(),
                    &check.desired_hash,
                ),
            })
        }
        Some(state) => {
            if let JobState::Failed { name, uid, message } = state {
                decision
                    .actions
                    .push(ClusterAction::DeleteFailedJob { name: name.clone() });
                let counted = previous.as_ref().is_some_and(|f| &f.last_job_uid == uid);
                if !counted {
                    cni.job_failures = Some(ichor_api::CniJobFailures {
                        hash: check.desired_hash.clone(),
                        count: previous.map_or(1, |f| f.count + 1),
                        last_failure: now.clone(),
                        last_job_uid: uid.clone(),
                        message: message.clone(),
                    });
                }
            }
            Some(state.clone())
        }
    }
}

/// A wait as jiff's signed duration (saturating: the waits here are minutes).
fn jiff_duration(d: std::time::Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

fn job_running(
    cluster: &TalosCluster,
    check: &HandoverCheck,
    job: &str,
    settings: &Settings,
    now: &Time,
) -> Condition {
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::JOB_RUNNING,
        format!(
            "the ichor-cni Job {}/{job} is bringing Helm release {} to this TalosCluster's effective values (hash {})",
            settings.system_namespace,
            ichor_cilium::RELEASE_NAME,
            check.desired_hash
        ),
        cluster.metadata.generation,
        now.clone(),
    )
}

fn job_failed(
    job: &str,
    message: &str,
    failures: u32,
    wait: std::time::Duration,
    settings: &Settings,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    job_failed_condition(
        format!(
            "the ichor-cni Job {}/{job} failed ({message}); failures in a row: {failures}. It was deleted and a new attempt starts in {}s; the Job's pod log says why",
            settings.system_namespace,
            wait.as_secs()
        ),
        now,
        generation,
    )
}

/// `CNIHandover` while the back-off after failed Jobs runs.
fn job_waiting(
    failures: u32,
    next: &Time,
    message: &str,
    settings: &Settings,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    job_failed_condition(
        format!(
            "the ichor-cni Job failed {failures} time(s) in a row (last: {message}); the next attempt starts at {} in {}. Fix what its log said, or change spec.cni to start one now",
            next.0, settings.system_namespace
        ),
        now,
        generation,
    )
}

fn job_failed_condition(message: String, now: &Time, generation: Option<i64>) -> Condition {
    conditions::new(
        types::CNI_HANDOVER,
        Status::False,
        reasons::JOB_FAILED,
        message,
        generation,
        now.clone(),
    )
}

/// The actions, then the status.
async fn write(ctx: &Context, cluster: &TalosCluster, decision: &Decision) -> Result<()> {
    for action in &decision.actions {
        match action {
            ClusterAction::StartJob { hash } => {
                let image = ctx.config.cni_job_image.as_deref().unwrap_or_default();
                crate::cni_job::start(
                    &ctx.client,
                    &ctx.config.system_namespace,
                    cluster,
                    hash,
                    image,
                )
                .await?;
            }
            ClusterAction::DeleteFailedJob { name } => {
                crate::cni_job::delete(&ctx.client, &ctx.config.system_namespace, name).await?;
            }
            ClusterAction::ReleaseInventory { config_map, step } => {
                crate::bootstrap_inventory::release(&ctx.client, config_map, step).await?;
                pipeline::publish_on(
                    ctx,
                    "TalosCluster",
                    &cluster.metadata,
                    kube::runtime::events::EventType::Normal,
                    INVENTORY_RELEASED,
                    format!(
                        "removed {} objects of Helm release {} from Talos's bootstrap-manifests inventory {}/{} and their {} annotation, so talosctl upgrade-k8s cannot prune them",
                        step.strip.len(),
                        ichor_cilium::RELEASE_NAME,
                        ichor_talos::bootstrap_inventory::INVENTORY_NAMESPACE,
                        ichor_talos::bootstrap_inventory::INVENTORY_NAME,
                        ichor_talos::bootstrap_inventory::OWNING_INVENTORY_ANNOTATION,
                    ),
                )
                .await;
            }
        }
    }
    let namespace = cluster.namespace().unwrap_or_default();
    pipeline::write_status::<TalosCluster>(
        &ctx.client,
        &namespace,
        &cluster.name_any(),
        &decision.status,
    )
    .await
}

/// The node count the effective values depend on ([`ichor_cilium::node_count_rule`]),
/// from the store the Node watch fills.
async fn node_count(ctx: &Context, machines: usize) -> Result<u32> {
    let nodes = match ctx.nodes.ready().await {
        true => ctx.nodes.store.len(),
        false => Api::<Node>::all(ctx.client.clone())
            .list_metadata(&ListParams::default())
            .await
            .map_err(Error::kube("listing the Nodes"))?
            .items
            .len(),
    };
    Ok(ichor_cilium::node_count_rule(nodes, machines))
}

/// The DaemonSets of every namespace that the one detector recognises as
/// a CNI's (`ichor_api::cni`, the reading adopt makes too).
async fn read_cni_workloads(ctx: &Context) -> Result<Vec<CniWorkload>> {
    let daemonsets = Api::<DaemonSet>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing the DaemonSets"))?;
    Ok(daemonsets
        .items
        .iter()
        .filter_map(CniWorkload::of_daemonset)
        .collect())
}

/// `status.cni.detected`, by the one detector: the CNI DaemonSets, and
/// Cilium from the moment Ichor's Cilium release is deployed (R2.2).
pub fn detected_cni(observed: &Observed) -> DetectedCni {
    let ichor_release_deployed = matches!(&observed.handover, Some(Ok(c)) if c.deployed.is_some());
    ichor_api::cni::detect(&observed.cni_workloads, ichor_release_deployed)
}

/// `Ready` of a cluster from its machines' `Ready`.
pub fn ready(machines: &[&TalosMachine], generation: Option<i64>, now: &Time) -> Condition {
    if machines.is_empty() {
        return conditions::new(
            types::READY,
            Status::False,
            reasons::NO_MACHINES,
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
            reasons::MACHINES_NOT_READY,
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
mod decide_tests {
    //! The TalosCluster decision from YAML fixtures (`src/fixtures/`), with
    //! an injected clock: no API server.

    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use std::time::Duration;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    fn cluster(yaml: &str) -> TalosCluster {
        serde_yaml_ng::from_str(yaml).expect("fixture")
    }

    fn machines() -> Vec<TalosMachine> {
        serde_yaml_ng::from_str(include_str!("fixtures/machines-prod.yaml")).expect("fixture")
    }

    fn settings(can_start_job: bool) -> Settings {
        Settings {
            storage_namespace: "ichor-system".into(),
            release_namespace: "kube-system".into(),
            can_start_job,
            resync: Duration::from_secs(300),
            error_requeue: Duration::from_secs(15),
            system_namespace: "ichor-system".into(),
        }
    }

    fn check(deployed: Option<(u32, &str)>, daemonset: Result<(), String>) -> HandoverCheck {
        HandoverCheck {
            desired_hash: "0123456789abcdef".into(),
            deployed: deployed.map(|(r, h)| (r, h.to_string())),
            daemonset,
        }
    }

    fn workload(namespace: &str, name: &str, image: &str) -> CniWorkload {
        CniWorkload::recognise(namespace, name, &[image.to_string()]).expect("a CNI's DaemonSet")
    }

    fn observed(handover: Option<std::result::Result<HandoverCheck, String>>) -> Observed {
        Observed {
            machines: machines(),
            handover,
            job: None,
            cni_workloads: vec![workload(
                "kube-system",
                "cilium",
                "quay.io/cilium/cilium:v1.18.5",
            )],
            inventory: None,
            cilium_release: None,
        }
    }

    /// `observed` with each control plane's live config read, carrying `inline`.
    fn with_inline(mut o: Observed, inline: &[&str]) -> Observed {
        for m in o.machines.iter_mut() {
            m.status
                .get_or_insert_with(Default::default)
                .inline_manifests = Some(inline.iter().map(|s| s.to_string()).collect());
        }
        o
    }

    /// The objects of Ichor's Cilium release (a few, as the chart names them).
    const RELEASE_MANIFEST: &str = "---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: cilium\n  namespace: kube-system\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: cilium\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cilium-config\n  namespace: kube-system\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: cilium\n  namespace: kube-system\n";

    fn inventory(config_map: Option<ConfigMap>) -> Option<InventoryObserved> {
        Some(InventoryObserved {
            release: crate::bootstrap_inventory::release_objects(RELEASE_MANIFEST, "kube-system")
                .unwrap(),
            config_map,
        })
    }

    fn inventory_after_init() -> ConfigMap {
        serde_yaml_ng::from_str(include_str!("fixtures/inventory-after-init.yaml"))
            .expect("fixture")
    }

    fn complete() -> Option<std::result::Result<HandoverCheck, String>> {
        Some(Ok(check(Some((2, "0123456789abcdef")), Ok(()))))
    }

    fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
        conditions::find(&d.status.conditions, type_).expect("condition")
    }

    /// Covers: R1.5e
    #[test]
    fn off_the_hash_starts_the_job_and_says_so() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Ok(check(Some((1, "old")), Ok(())))));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            d.actions,
            vec![ClusterAction::StartJob {
                hash: "0123456789abcdef".into()
            }]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("False", reasons::JOB_RUNNING)
        );
        let job = crate::cni_job::job_name("ichor-system", "prod", "0123456789abcdef");
        assert!(
            h.message.contains(&format!("ichor-system/{job}")),
            "{}",
            h.message
        );
        assert_eq!(d.requeue, HANDOVER_POLL);
        assert_eq!(h.last_transition_time, at(100));
        assert_eq!(d.status.observed_generation, Some(3));
        // Without an image no Job is started: the condition says what is off.
        let d = decide(&c, &o, &settings(false), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_RELEASE
        );
    }

    /// Covers: R1.5e
    #[test]
    fn a_matching_hash_never_starts_a_job() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let o = with_inline(observed(complete()), &[]);
        let d = decide(&c, &o, &settings(true), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::HANDED_OVER
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    /// Waiting for the release or the DaemonSet, with no Job running, is
    /// not polled: both are watched, and a steady state makes no requests.
    /// Covers: the controller-at-scale goal (docs/benchmarks.md): no polling in steady state
    #[test]
    fn a_pending_hand_over_without_a_job_waits_for_the_watches() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Ok(check(None, Ok(())))));
        let d = decide(&c, &o, &settings(false), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_RELEASE
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
        let o = observed(Some(Ok(check(
            Some((2, "0123456789abcdef")),
            Err("0 of 3 ready".into()),
        ))));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_DAEMON_SET
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    fn failed(uid: &str) -> JobState {
        JobState::Failed {
            name: "ichor-cni-prod-0123456789".into(),
            uid: uid.into(),
            message: "BackoffLimitExceeded".into(),
        }
    }

    /// Covers: R5.6
    #[test]
    fn a_failed_job_is_deleted_and_retried_after_a_back_off() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let mut o = observed(Some(Ok(check(None, Ok(())))));
        o.job = Some(failed("uid-1"));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            d.actions,
            vec![ClusterAction::DeleteFailedJob {
                name: "ichor-cni-prod-0123456789".into()
            }]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::JOB_FAILED);
        assert!(h.message.contains("BackoffLimitExceeded"), "{}", h.message);
        let first = crate::cni_job::job_backoff(1, "ichor-system/prod");
        assert_eq!(d.requeue, first);
        let failures = d.status.cni.as_ref().unwrap().job_failures.clone().unwrap();
        assert_eq!(
            (failures.count, failures.last_failure.clone()),
            (1, at(100))
        );

        // The same failed Job seen again (its deletion not yet done) is not
        // counted twice.
        let mut again = c.clone();
        again.status = Some(d.status.clone());
        let d2 = decide(&again, &o, &settings(true), &at(101));
        assert_eq!(
            d2.status
                .cni
                .as_ref()
                .unwrap()
                .job_failures
                .as_ref()
                .unwrap()
                .count,
            1
        );

        // Gone, and the back-off not over: no new Job, and the wait is said.
        o.job = None;
        let d3 = decide(&again, &o, &settings(true), &at(102));
        assert!(d3.actions.is_empty(), "{:?}", d3.actions);
        let h = condition(&d3, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::JOB_FAILED);
        assert!(
            h.message.contains("the next attempt starts at"),
            "{}",
            h.message
        );
        assert!(d3.requeue <= first, "{:?}", d3.requeue);

        // Once it is over, a new Job starts.
        let later = at(100 + first.as_secs() as i64 + 1);
        let d4 = decide(&again, &o, &settings(true), &later);
        assert_eq!(
            d4.actions,
            vec![ClusterAction::StartJob {
                hash: "0123456789abcdef".into()
            }]
        );
    }

    /// Covers: R5.6
    #[test]
    fn each_failure_in_a_row_doubles_the_wait_and_the_release_forgets_them() {
        let mut c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let mut o = observed(Some(Ok(check(None, Ok(())))));
        let mut now = 100;
        let mut waits = Vec::new();
        for i in 1..=5 {
            o.job = Some(failed(&format!("uid-{i}")));
            let d = decide(&c, &o, &settings(true), &at(now));
            assert_eq!(
                d.status
                    .cni
                    .as_ref()
                    .unwrap()
                    .job_failures
                    .as_ref()
                    .unwrap()
                    .count,
                i
            );
            waits.push(d.requeue);
            c.status = Some(d.status);
            now += 10_000;
        }
        for pair in waits.windows(2) {
            assert!(pair[1] > pair[0], "{waits:?}");
        }
        // A different hash starts the count again; at the hash it is gone.
        let o = observed(complete());
        let d = decide(&c, &o, &settings(true), &at(now));
        assert_eq!(d.status.cni.as_ref().unwrap().job_failures, None);
    }

    #[test]
    fn a_hand_over_stays_true_and_its_time_is_kept() {
        let c = cluster(include_str!("fixtures/cluster-handed-over.yaml"));
        let o = observed(Some(Ok(check(
            Some((3, "other")),
            Err("0 of 3 ready".into()),
        ))));
        let d = decide(&c, &o, &settings(true), &at(999_999));
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        assert_eq!(h.last_transition_time.0.as_second(), 1_767_225_600);
        // The Job still brings the release to the values.
        assert_eq!(d.actions.len(), 1);
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    /// Step 2 of the hand-over: the release holds, a control plane still
    /// carries the inline entry; the condition says so, names the machine,
    /// and from now on the render drops the entry.
    /// Covers: R10.4
    #[test]
    fn the_released_cilium_waits_for_the_inline_entry_to_leave_the_control_planes() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        for o in [
            observed(complete()),
            with_inline(observed(complete()), &["cilium"]),
        ] {
            let d = decide(&c, &o, &settings(true), &at(100));
            let h = condition(&d, types::CNI_HANDOVER);
            assert_eq!(
                (h.status.as_str(), h.reason.as_str()),
                ("False", reasons::REMOVING_INLINE_MANIFEST)
            );
            assert!(h.message.contains("prod-cp-1"), "{}", h.message);
            // The worker carries no inline manifest and is not waited for.
            assert!(!h.message.contains("prod-w-1"), "{}", h.message);
            assert!(d.actions.is_empty());
            assert!(conditions::inline_cni_dropped(&d.status.conditions));
        }
        // Before the release holds, the render keeps the entry.
        let o = observed(Some(Ok(check(None, Ok(())))));
        let d = decide(&c, &o, &settings(false), &at(100));
        assert!(!conditions::inline_cni_dropped(&d.status.conditions));
    }

    /// Step 3: the inline entry is gone; the release's objects that Talos's
    /// inventory names leave it (an action), and the hand-over is True only
    /// with it. Talos's own objects stay.
    /// Covers: R6.1, R10.4
    #[test]
    fn the_inventory_step_comes_last_and_only_then_is_the_hand_over_true() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let mut o = with_inline(observed(complete()), &["extra"]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d = decide(&c, &o, &settings(true), &at(100));
        let [ClusterAction::ReleaseInventory { config_map, step }] = d.actions.as_slice() else {
            panic!("one inventory action: {:?}", d.actions);
        };
        assert_eq!(config_map.metadata.resource_version.as_deref(), Some("812"));
        assert_eq!(step.strip.len(), 4);
        let left: Vec<&str> = step.data.keys().map(String::as_str).collect();
        assert_eq!(
            left,
            [
                "_system__coredns_rbac.authorization.k8s.io_ClusterRole",
                "kube-system_coredns_apps_Deployment"
            ]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        assert!(h.message.contains("4 objects"), "{}", h.message);
        // No inventory at all (Talos before 1.13): nothing to do, True.
        o.inventory = inventory(None);
        let d = decide(&c, &o, &settings(true), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
    }

    /// A kill between any two steps, then a rerun, ends in the same state:
    /// each step is decided from what holds now, and the inventory is its
    /// own to-do list.
    /// Covers: R10.4, R6.1
    #[test]
    fn a_kill_between_any_two_steps_then_a_rerun_ends_the_same() {
        let c0 = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let write = |c: &TalosCluster, d: &Decision| {
            let mut c = c.clone();
            c.status = Some(d.status.clone());
            c
        };
        // The run without a kill.
        let mut o = observed(complete());
        let d1 = decide(&c0, &o, &settings(true), &at(100));
        let c1 = write(&c0, &d1);
        o = with_inline(o, &[]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d2 = decide(&c1, &o, &settings(true), &at(110));
        let ClusterAction::ReleaseInventory { step, .. } = &d2.actions[0] else {
            panic!("{:?}", d2.actions);
        };
        let mut cleaned = inventory_after_init();
        cleaned.data = Some(step.data.clone());
        let end = write(&c1, &d2);

        // Killed after the inventory write, before the status write: the
        // rerun finds the inventory clean and ends True with nothing to do.
        let mut rerun = o.clone();
        rerun.inventory = inventory(Some(cleaned.clone()));
        let d = decide(&c1, &rerun, &settings(true), &at(120));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");

        // Killed before step 1's status write: the rerun decides step 1 again.
        let d = decide(&c0, &observed(complete()), &settings(true), &at(120));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            condition(&d1, types::CNI_HANDOVER).reason
        );
        assert!(d.actions.is_empty());

        // Killed with the annotations stripped and the inventory not yet
        // written: the inventory still names them, the same step again.
        let d = decide(&c1, &o, &settings(true), &at(120));
        assert_eq!(d.actions, d2.actions);

        // And once True, it stays True with nothing more to do.
        let d = decide(&end, &rerun, &settings(true), &at(130));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
    }

    /// After the hand-over, while a control plane still carries the inline
    /// entry (Talos's boot apply records its objects again), the inventory
    /// step is taken again; the condition stays True.
    /// Covers: R6.1
    #[test]
    fn a_handed_over_cluster_clears_the_inventory_again_while_the_entry_remains() {
        let c = cluster(include_str!("fixtures/cluster-handed-over.yaml"));
        let mut o = with_inline(observed(complete()), &["cilium"]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d = decide(&c, &o, &settings(true), &at(200));
        assert!(matches!(
            d.actions.as_slice(),
            [ClusterAction::ReleaseInventory { .. }]
        ));
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
        assert_eq!(
            inline_pending(&c, &o.machines),
            ["prod-cp-1 (held: release it so Ichor may apply)".to_string()]
        );
    }

    #[test]
    fn values_that_give_no_effective_values_are_said() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Err("the values are not a mapping".into())));
        let d = decide(&c, &o, &settings(true), &at(100));
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::INVALID_VALUES);
        assert!(d.actions.is_empty());
    }

    #[test]
    fn unmanaged_has_nothing_to_hand_over_and_detects_what_runs() {
        let c = cluster(include_str!("fixtures/cluster-unmanaged.yaml"));
        let mut o = observed(None);
        o.machines.clear();
        o.cni_workloads = vec![workload(
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.26",
        )];
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::UNMANAGED
        );
        assert_eq!(condition(&d, types::READY).reason, reasons::NO_MACHINES);
        assert_eq!(
            d.status.cni.as_ref().and_then(|c| c.detected),
            Some(DetectedCni::Flannel)
        );
        assert!(d.actions.is_empty());
    }

    #[test]
    fn ready_names_the_machine_not_reconciled_yet() {
        let c = cluster(include_str!("fixtures/cluster-cilium.yaml"));
        let d = decide(&c, &observed(None), &settings(true), &at(100));
        let r = condition(&d, types::READY);
        assert_eq!(r.reason, reasons::MACHINES_NOT_READY);
        assert_eq!(
            r.message,
            "1 of 2 machines are not Ready: prod-w-1 (not reconciled yet)"
        );
    }

    fn stored(version: u32, status: &str) -> ichor_helm::StoredRelease {
        let release: ichor_helm::Release = serde_json::from_value(serde_json::json!({
            "name": "cilium", "version": version, "namespace": "kube-system", "manifest": "",
            "info": {"status": status, "last_deployed": "2026-01-02T03:04:05Z"},
            "chart": {"metadata": {"name": "cilium", "version": format!("1.18.{version}")}}
        }))
        .unwrap();
        ichor_helm::StoredRelease {
            release,
            resource_version: None,
            labels: Default::default(),
        }
    }

    /// Covers: the UI's cluster page (docs/ui.md): the Cilium release status read from its record
    #[test]
    fn the_cilium_release_status_is_the_newest_record_and_the_deployed_one_behind_it() {
        assert_eq!(cilium_release_status(&[], "ichor-system"), None);
        let deployed = cilium_release_status(
            &[stored(1, "superseded"), stored(2, "deployed")],
            "ichor-system",
        )
        .unwrap();
        assert_eq!(
            deployed,
            ichor_api::CiliumReleaseStatus {
                name: "cilium".into(),
                storage_namespace: "ichor-system".into(),
                revision: 2,
                status: "deployed".into(),
                chart_version: Some("1.18.2".into()),
                last_deployed: Some("2026-01-02T03:04:05Z".into()),
                deployed_revision: None,
            }
        );
        let failed = cilium_release_status(
            &[stored(1, "deployed"), stored(2, "failed")],
            "ichor-system",
        )
        .unwrap();
        assert_eq!((failed.revision, failed.status.as_str()), (2, "failed"));
        assert_eq!(failed.deployed_revision, Some(1));
    }

    #[test]
    fn detected_cni_asks_the_one_detector_with_ichors_release() {
        let mut o = observed(None);
        o.cni_workloads.clear();
        assert_eq!(detected_cni(&o), DetectedCni::None);
        // R2.2: Ichor's release deployed counts before its DaemonSet.
        let deployed = observed(Some(Ok(check(Some((1, "0123456789abcdef")), Ok(())))));
        let o = Observed {
            cni_workloads: vec![],
            ..deployed
        };
        assert_eq!(detected_cni(&o), DetectedCni::Cilium);
        // Weave is seen as another CNI, as adopt sees it.
        let o = Observed {
            cni_workloads: vec![workload(
                "kube-system",
                "weave-net",
                "weaveworks/weave-kube:2.8",
            )],
            ..observed(None)
        };
        assert_eq!(detected_cni(&o), DetectedCni::Other);
    }
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
                    crate::pipeline::system_clock(),
                )],
                ..Default::default()
            });
        }
        m
    }

    #[test]
    fn cluster_ready_names_the_machines_that_are_not() {
        let now = crate::pipeline::system_clock();
        let c = ready(&[], Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::NO_MACHINES)
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
        assert_eq!(c.reason, reasons::MACHINES_NOT_READY);
        assert_eq!(
            c.message,
            "2 of 3 machines are not Ready: b (NodeUnreachable), n (not reconciled yet)"
        );
    }

    /// Covers: R1.5e
    #[test]
    fn handover_needs_the_hash_and_a_ready_daemonset() {
        let now = crate::pipeline::system_clock();
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
