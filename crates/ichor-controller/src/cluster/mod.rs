//! The TalosCluster reconciler: Ready aggregated from the machines,
//! `status.cni.detected` (R2.2), the CNI hand-over (R1.5e) and
//! `BackupHealthy` from the cluster's TalosBackups.
//!
//! `read` → `ichor_reconcile::cluster::decide` (pure: the hand-over's
//! three steps and the ichor-cni Job are described there) → `write`. This
//! module runs the controller: its watches and what each event reconciles.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::backup::TalosBackup;
use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::cluster::{Settings, decide};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt as _, watcher};

use crate::pipeline;
use crate::{Context, Error, Result};

pub mod bootstrap_inventory;
pub mod cni_job;
mod read;
mod write;

pub use read::cilium_release_status;

/// The Event reason of the hand-over's inventory step.
pub const INVENTORY_RELEASED: &str = "InventoryReleased";

/// The controller's name in metrics.
pub const CONTROLLER: &str = "taloscluster";

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
    let backups: Api<DeserializeGuard<TalosBackup>> = match &ns {
        Some(n) => Api::namespaced(ctx.client.clone(), n),
        None => Api::all(ctx.client.clone()),
    };
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
        // A backup that finishes changes `BackupHealthy` of its cluster.
        .watches(backups, watcher::Config::default(), cluster_of_backup)
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
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "TalosCluster reconcile");
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

/// The cluster a TalosBackup is of.
fn cluster_of_backup(b: DeserializeGuard<TalosBackup>) -> Option<ClusterRef> {
    let b = b.0.ok()?;
    let ns = b.namespace().unwrap_or_default();
    Some(ObjectRef::new(&b.spec.cluster_ref.name).within(&ns))
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
    let observed = read::read(&ctx, cluster).await?;
    let settings = settings(&ctx.config);
    let decision = decide(cluster, &observed, &settings, &(ctx.clock)());
    write::write(&ctx, cluster, &decision).await?;
    Ok(Action::requeue(decision.requeue))
}

/// The settings the decision needs from the controller's configuration.
fn settings(config: &crate::Config) -> Settings {
    Settings {
        system_namespace: config.system_namespace.clone(),
        storage_namespace: config.cilium_storage_namespace.clone(),
        release_namespace: config.cilium_release_namespace.clone(),
        can_start_job: config.cni_job_image.is_some(),
        resync: config.resync,
        error_requeue: config.error_requeue,
    }
}
