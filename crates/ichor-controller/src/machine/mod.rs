//! The TalosMachine reconciler.
//!
//! read (cluster, bundle, node's live config) → render → drift → status, and,
//! when the machine is not held and class B is the highest class of drift
//! left, apply in no-reboot mode, read back and record. Class C is never
//! applied: a condition says which paths, why, and what the operator can do.
//! Only `status` is ever written (server-side apply of the status
//! subresource); `spec` and `metadata.generation` are never touched. The
//! decisions are `ichor_reconcile::machine`'s; here the watches and the
//! reconcile that reads (`read`), decides, and applies (`write`).
//!
//! Objects are watched through [`DeserializeGuard`]: a TalosMachine that
//! cannot be read as the type becomes an error on that object (logged,
//! counted, an Event) and the others keep reconciling.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::conditions::{self, gitops, reasons};
use ichor_api::{MachineRole, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::machine::{decide_apply, held_condition, ready_condition};
use ichor_talos_client::ClientOptions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt as _, watcher};

use crate::pipeline;
use crate::{Context, Error, Result};

pub(crate) mod history;
mod inputs;
mod read;
mod rollback;
mod try_mode;
mod write;

pub use ichor_reconcile::machine::endpoint;
pub(crate) use inputs::RecentSuccesses;
use inputs::{ClusterInputs, ReconcileInputs};
pub(crate) use read::talos_error;

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosmachine";

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the TalosMachine controller until `shutdown`. Its watch of the
/// TalosClusters fills `clusters` (the store [`Context::clusters`] reads).
pub(crate) async fn run(
    ctx: Arc<Context>,
    clusters: pipeline::Filler<DeserializeGuard<TalosCluster>>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ns = ctx.config.namespace.as_deref();
    let machines: Api<DeserializeGuard<TalosMachine>> = api(&ctx.client, ns);
    let cluster_api: Api<DeserializeGuard<TalosCluster>> = api(&ctx.client, ns);
    // Our own status writes come back as events too; the reconcile that
    // follows finds its inputs unchanged and returns before any read.
    let (store, writer) = kube::runtime::reflector::store();
    let machine_events = watcher(machines, watcher::Config::default())
        .default_backoff()
        .modify(pipeline::forget_managed_fields::<DeserializeGuard<TalosMachine>>)
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream(machine_events, store.clone()).with_config(
        kube::runtime::controller::Config::default().concurrency(ctx.config.machine_concurrency),
    );
    let cluster_store = ctx.clusters.store.clone();
    let cluster_trigger =
        clusters.fill(watcher(cluster_api, watcher::Config::default()).default_backoff());
    // A cluster's status changes with every machine that becomes Ready;
    // its machines are reconciled again only when what their render
    // depends on changed, or the cluster is gone.
    let seen = pipeline::ChangeFilter::<ClusterInputs>::default();
    let drive = controller
        .watches_stream(cluster_trigger, move |c: DeserializeGuard<TalosCluster>| {
            let Ok(c) = c.0 else {
                return Vec::new();
            };
            let ns = c.namespace();
            let name = c.name_any();
            let r = ObjectRef::<DeserializeGuard<TalosCluster>>::new(&name)
                .within(ns.as_deref().unwrap_or_default());
            let now = cluster_store
                .get(&r)
                .is_some()
                .then(|| ClusterInputs::of(&c));
            if seen.changed(r.to_string(), now).is_none() {
                return Vec::new();
            }
            store
                .state()
                .into_iter()
                .filter(|m| {
                    m.0.as_ref()
                        .is_ok_and(|m| m.namespace() == ns && m.spec.cluster_ref.name == name)
                })
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(guarded_reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "TalosMachine reconcile");
            }
        });
    crate::drive_until_stopped("TalosMachine", drive, stop).await;
}

/// [`reconcile`] behind the unwind boundary: a panic fails this object only.
async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosMachine>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosMachine>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

async fn publish(
    ctx: &Context,
    meta: &kube::api::ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    pipeline::publish_on(ctx, "TalosMachine", meta, type_, reason, note).await;
}

/// Read → decide → write. The read of the node and the apply are
/// interleaved with pure decisions in [`observe_and_act`]; the conditions
/// around it ([`held_condition`], [`ready_condition`]) are pure too.
async fn reconcile(obj: Arc<DeserializeGuard<TalosMachine>>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let machine = pipeline::readable(&ctx, &obj).await?;
    let generation = machine.metadata.generation;
    let mut status = machine.status.clone().unwrap_or_default();
    let now = (ctx.clock)();
    conditions::set(
        &mut status.conditions,
        held_condition(machine.spec.hold, generation, &now),
    );
    // Joins, removals and replacements first (a deleted machine is
    // removed, never reconciled for drift).
    let cluster = read::read_cluster(machine, &ctx).await.ok();
    if let crate::membership::Flow::Done(action) =
        crate::membership::reconcile(machine, cluster.as_ref(), &ctx, &mut status).await?
    {
        return Ok(action);
    }
    // A rollback asked for on the machine: its spec is written back first.
    if let Some(action) = rollback::if_requested(machine, cluster.as_ref(), &ctx).await? {
        return Ok(action);
    }

    // Our own status writes come back as watch events, and so do the
    // cluster's status changes; a machine whose inputs did not change since
    // its last successful reconcile waits for its resync instead of reading
    // the node again.
    let (outcome, key) = match read::read_cluster(machine, &ctx).await {
        Ok(cluster) => {
            let key = ReconcileInputs::of(machine, &cluster);
            if let Some(left) = ctx.recent_successes.fresh(&key, ctx.config.resync) {
                return Ok(Action::requeue(left));
            }
            (
                observe_and_act(machine, &cluster, &ctx, &mut status, &now).await,
                Some(key),
            )
        }
        Err(e) => (Err(e), None),
    };
    let ready = ready_condition(
        machine,
        &status,
        outcome
            .as_ref()
            .map(|_| ())
            .map_err(|e| (ready_reason(e), ichor_api::error_text::chain(e))),
        &now,
    );
    let event = outcome_event(&outcome, &ready);
    gitops::settle(
        &mut status.conditions,
        &gitops::machine(&ready),
        generation,
        &now,
    );
    if let Some((type_, reason, note)) = event {
        publish(&ctx, &machine.metadata, type_, &reason, note).await;
    }
    status.observed_generation = generation;
    // An operation's step records its revision beside this reconcile; the
    // status written here must not drop one recorded since the read.
    history::catch_up(&ctx, machine, &mut status).await?;
    let namespace = machine.namespace().unwrap_or_default();
    pipeline::write_status::<TalosMachine>(&ctx.client, &namespace, &machine.name_any(), &status)
        .await?;
    if let (Ok(_), Some(after)) = (&outcome, try_mode::look_again(&status)) {
        return Ok(Action::requeue(after));
    }
    match (outcome, key) {
        (Ok(_), Some(key)) => {
            ctx.recent_successes.mark(key);
            Ok(Action::requeue(ctx.config.resync))
        }
        (Ok(_), None) => Ok(Action::requeue(ctx.config.resync)),
        (Err(e), _) => Err(e),
    }
}

/// The Event a reconcile's outcome tells: its note, or the error under the
/// Ready condition's reason; none when nothing happened.
fn outcome_event(
    outcome: &Result<Option<Note>>,
    ready: &Condition,
) -> Option<(EventType, String, String)> {
    match outcome {
        Ok(Some((reason, note))) => Some((
            try_mode::event_type(reason),
            (*reason).to_owned(),
            note.clone(),
        )),
        Ok(None) => None,
        Err(e) => Some((
            EventType::Warning,
            ready.reason.clone(),
            ichor_api::error_text::chain(e),
        )),
    }
}

/// The `Ready=False` reason of a reconcile error.
pub fn ready_reason(e: &Error) -> &'static str {
    match e {
        Error::ClusterNotFound { .. } => reasons::CLUSTER_NOT_FOUND,
        Error::Bundle { .. } => reasons::BUNDLE_UNAVAILABLE,
        Error::Talos { .. } => reasons::NODE_UNREACHABLE,
        Error::LiveConfig { .. } | Error::Render(_) => reasons::RENDER_FAILED,
        _ => reasons::API_ERROR,
    }
}

/// The reason and note of an Event a reconcile publishes.
type Note = (&'static str, String);

/// Reads the node, decides on the drift ([`decide_apply`]), and applies
/// when that says so. Returns the Event of an apply (or of an apply given
/// up because the machine changed), if there was one.
async fn observe_and_act(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let address = machine.spec.address.clone();
    let talos = ctx
        .credentials
        .talos_client(
            &ctx.client,
            cluster,
            &endpoint(&address, ctx.config.talos_port),
            ClientOptions {
                call_timeout: ctx.config.talos_call_timeout,
                ..ClientOptions::default()
            },
        )
        .await?
        .map_err(|e| read::talos_error(machine, e))?;
    let version = talos
        .version("")
        .await
        .map_err(|e| read::talos_error(machine, e))?;
    status.talos_version = Some(version.tag.clone());
    if machine.spec.role == MachineRole::Controlplane {
        read_etcd_for_metrics(machine, &talos, ctx, now).await;
    }
    let live = read::read_live(&talos, machine).await?;
    let plan = decide_apply(machine, cluster, &live, status, now)?;
    let target = try_mode::Target {
        machine,
        cluster,
        talos: &talos,
        ctx,
    };
    let (mode, timeout) = ichor_api::apply::effective(
        machine.spec.apply_mode,
        machine.spec.try_timeout.as_deref(),
        cluster.spec.apply_mode,
        cluster.spec.try_timeout.as_deref(),
    );
    try_mode::refresh(&target, mode, status).await?;
    if try_mode::look_again(status).is_some() {
        return try_mode::follow(&target, &live, status, now).await;
    }
    if try_mode::held_by_revert(machine, status) {
        try_mode::hold_conditions(machine, status, now);
        return Ok(None);
    }
    let Some(plan) = plan else {
        return Ok(None);
    };
    match mode {
        ichor_api::apply::ApplyMode::Try => {
            try_mode::start(&target, &plan, timeout, status, now).await
        }
        ichor_api::apply::ApplyMode::NoReboot => {
            write::apply_and_read_back(machine, cluster, &talos, ctx, &plan, status, now).await
        }
    }
}

/// The control plane's etcd member as the metrics report it: read once per
/// reconcile (never per scrape); a member that does not answer keeps its
/// last reading, whose timestamp tells its age.
async fn read_etcd_for_metrics(
    machine: &TalosMachine,
    talos: &ichor_talos_client::TalosClient,
    ctx: &Context,
    now: &Time,
) {
    let namespace = machine.namespace().unwrap_or_default();
    match talos.etcd_status("").await {
        Ok(s) => ctx.metrics.etcd_read(
            &format!("{namespace}/{}", machine.spec.cluster_ref.name),
            &format!("{namespace}/{}", machine.name_any()),
            crate::metrics::EtcdReading::of(&s, now.0.as_second()),
        ),
        Err(e) => {
            tracing::debug!(error = %ichor_api::error_text::chain(&e), "etcd status for the metrics");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    fn machine(hold: bool, _: Option<&str>) -> TalosMachine {
        let mut m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "base-cp-1", "namespace": "ichor-system", "generation": 2},
            "spec": {"clusterRef": {"name": "base"}, "role": "controlplane", "address": "10.5.0.2"}
        }))
        .expect("a TalosMachine");
        m.spec.hold = hold;
        m
    }

    #[test]
    fn held_and_ready_follow_the_spec_and_the_outcome() {
        let h = held_condition(false, Some(2), &at(5));
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("False", reasons::RELEASED)
        );
        assert_eq!(
            held_condition(true, Some(2), &at(5)).reason,
            reasons::HOLD_SET
        );
        let m = machine(true, None);
        let err = Error::ClusterNotFound {
            namespace: "ichor-system".into(),
            machine: "base-cp-1".into(),
            cluster: "base".into(),
        };
        let r = ready_condition(
            &m,
            &TalosMachineStatus::default(),
            Err((ready_reason(&err), ichor_api::error_text::chain(&err))),
            &at(5),
        );
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", reasons::CLUSTER_NOT_FOUND)
        );
        let r = ready_condition(&m, &TalosMachineStatus::default(), Ok(()), &at(5));
        assert_eq!(
            r.message,
            "node 10.5.0.2 read (Talos unknown); 0 drift entries"
        );
    }
}
