//! The TalosOperation reconciler.
//!
//! read (the operation, its cluster and machines) → plan or next step
//! (`ichor_reconcile::operation`, pure) → one step at a time, each recorded
//! in `status` before it runs, so a restarted controller resumes where the
//! status says and never repeats a finished machine. The plan is written
//! before anything is touched (`plan`). Per machine (`step`): etcd
//! healthy (control planes), pull the installer, write it to the other
//! slot, cordon and drain through the Eviction API (`drain`:
//! PodDisruptionBudgets honoured, no forced deletion), forfeit etcd
//! leadership, reboot, wait for a new boot id + the target version + a
//! Ready Node, uncordon. Each step is a pure transition from what the
//! controller read to what it carries out. A cancel (deletion or the
//! `ichor.maesh.dev/cancel` annotation) stops before the next step
//! (`drive`).
//!
//! `kubernetes-upgrade` runs one component step at a time (`kubernetes`);
//! `ichor` is refused on a Helm install with the `helm upgrade` command
//! ([`ichor`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::operation::{OperationPhase, TalosOperation, TalosOperationStatus};
use ichor_talos_client::TalosClient;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::{Controller, watcher};

use crate::{Context, Error, Result, pipeline};

mod backup;
pub(crate) mod drain;
mod drive;
mod gate;
pub mod ichor;
mod kubernetes;
pub mod manifests;
mod plan;
mod prepull;
mod silence;
mod step;
mod window;

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosoperation";

pub use ichor_api::CANCEL_ANNOTATION;

/// The bounds of the waiting steps (decided on in `ichor-reconcile`; the
/// CLI's flags set them).
pub use ichor_reconcile::operation::OperationBounds;

/// Keeps a running operation until the controller has stopped it.
pub const FINALIZER: &str = "ichor.maesh.dev/operation";

/// Runs the TalosOperation controller until `shutdown`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ops: Api<DeserializeGuard<TalosOperation>> = match ctx.config.namespace.as_deref() {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let controller = Controller::new(ops, watcher::Config::default());
    ctx.metrics.read_operations_of(controller.store());
    let drive = controller
        .graceful_shutdown_on(shutdown)
        .run(guarded_reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "TalosOperation reconcile");
            }
        });
    crate::drive_until_stopped("TalosOperation", drive, stop).await;
}

/// [`reconcile`] behind the unwind boundary: a panic fails this object only.
async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

async fn publish(ctx: &Context, op: &TalosOperation, type_: EventType, reason: &str, note: String) {
    pipeline::publish_on(ctx, "TalosOperation", &op.metadata, type_, reason, note).await;
}

fn finished(status: &TalosOperationStatus) -> bool {
    matches!(
        status.phase,
        Some(OperationPhase::Succeeded | OperationPhase::Failed)
    )
}

/// `status` with Ready, Reconciling and Stalled as its phase says
/// (`ichor_api::conditions::gitops::operation`), as every write sends it.
fn settled(
    status: &TalosOperationStatus,
    op: &TalosOperation,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> TalosOperationStatus {
    let mut status = status.clone();
    let summary = ichor_api::conditions::gitops::operation(&status);
    ichor_api::conditions::gitops::settle(
        &mut status.conditions,
        &summary,
        op.metadata.generation,
        &now,
    );
    status
}

fn cancel_requested(op: &TalosOperation) -> bool {
    op.metadata.deletion_timestamp.is_some() || op.annotations().contains_key(CANCEL_ANNOTATION)
}

async fn reconcile(
    obj: Arc<DeserializeGuard<TalosOperation>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let cached = pipeline::readable(&ctx, &obj).await?;
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    // The status is where the operation is: read it from the API server,
    // not from the watch cache, which may not hold the last step written yet
    // (a stale step could repeat a reboot).
    let Some(fresh) = Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosOperation {namespace}/{name}"
        )))?
    else {
        return Ok(Action::await_change());
    };
    let op = &fresh;
    let mut status = op.status.clone().unwrap_or_default();
    if finished(&status) {
        set_finalizer(&ctx, op, false).await?;
        return Ok(Action::await_change());
    }
    if op.metadata.deletion_timestamp.is_none() {
        set_finalizer(&ctx, op, true).await?;
    }
    let mut run = Run {
        ctx: &ctx,
        op,
        namespace: namespace.clone(),
        clients: BTreeMap::new(),
    };
    let action = run.drive(&mut status).await;
    let status = settled(&status, op, (ctx.clock)());
    pipeline::write_status::<TalosOperation>(&ctx.client, &namespace, &name, &status).await?;
    if finished(&status) {
        set_finalizer(&ctx, op, false).await?;
    }
    action
}

/// Adds (`true`) or removes the finalizer when needed.
async fn set_finalizer(ctx: &Context, op: &TalosOperation, present: bool) -> Result<()> {
    let has = op.finalizers().iter().any(|f| f == FINALIZER);
    if has == present {
        return Ok(());
    }
    let mut list: Vec<String> = op
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_string());
    }
    let namespace = op.namespace().unwrap_or_default();
    let name = op.name_any();
    let patch = serde_json::json!({
        "metadata": { "finalizers": list, "resourceVersion": op.resource_version() }
    });
    match Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone already (its finalizer was the last one).
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "updating the finalizers of TalosOperation {namespace}/{name}"
        ))(e)),
    }
}

struct Run<'a> {
    ctx: &'a Context,
    op: &'a TalosOperation,
    namespace: String,
    clients: BTreeMap<String, TalosClient>,
}
