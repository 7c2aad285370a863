//! The TalosBackup reconciler, and the schedule that creates them.
//!
//! A TalosBackup runs once: Pending → Running (written before anything is
//! read from a node) → Succeeded or Failed. The whole backup is taken
//! inside one reconcile ([`take`]): the etcd snapshot is streamed from a
//! healthy control plane through its check and age into the destination,
//! then the bundle and Ichor's objects, then the manifest. A TalosBackup
//! found Running when a reconcile starts was cut short by a controller
//! restart: it fails, and what it wrote is deleted ([`ichor_backup::take`]
//! leaves no manifest behind, so it never looked complete).
//!
//! [`schedule`] creates a TalosBackup when a cluster's schedule comes due
//! and applies its retention.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::TalosCluster;
use ichor_api::backup::{BackupPhase, TalosBackup, TalosBackupStatus};
use ichor_api::conditions::gitops;
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::{Controller, watcher};

use crate::metrics::LastBackup;
use crate::{Context, Error, Result, pipeline};

pub(crate) mod health;
pub mod schedule;
mod take;
pub mod volume;

/// A Kubernetes time as the backup crate's (`chrono`) time.
pub(crate) fn to_utc(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosbackup";

/// Runs the TalosBackup controller and the backup schedule until `shutdown`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let backups: Api<DeserializeGuard<TalosBackup>> = match ctx.config.namespace.as_deref() {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let drive = Controller::new(backups, watcher::Config::default())
        .graceful_shutdown_on(shutdown.clone())
        .run(guarded_reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "TalosBackup reconcile");
            }
        });
    let scheduled = schedule::run(ctx, shutdown);
    futures::join!(
        crate::drive_until_stopped("TalosBackup", drive, stop),
        scheduled
    );
}

async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosBackup>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosBackup>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

async fn reconcile(obj: Arc<DeserializeGuard<TalosBackup>>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let cached = pipeline::readable(&ctx, &obj).await?;
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    // The phase decides whether this backup runs: read it from the API
    // server, not the watch cache, so a backup never runs twice.
    let Some(backup) = Api::<TalosBackup>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosBackup {namespace}/{name}"
        )))?
    else {
        return Ok(Action::await_change());
    };
    let mut status = backup.status.clone().unwrap_or_default();
    match status.phase {
        BackupPhase::Succeeded => {
            // Every succeeded backup is seen once a controller starts, so
            // the gauges of the newest ones are whole after a restart.
            if let Some(last) = last_backup(&status) {
                ctx.metrics.backup_succeeded(&cluster_id(&backup), last);
            }
            Ok(Action::await_change())
        }
        BackupPhase::Failed => Ok(Action::await_change()),
        BackupPhase::Running => {
            // Only a reconcile that ended mid-backup leaves it Running.
            take::forget_partial(&ctx, &backup).await;
            let cluster = cluster_meta(&ctx, &backup).await;
            finish(
                &ctx,
                &backup,
                &cluster,
                &mut status,
                Err(take::Failure::Interrupted),
            )
            .await?;
            Ok(Action::await_change())
        }
        BackupPhase::Pending => {
            status.phase = BackupPhase::Running;
            status.start_time = Some((ctx.clock)());
            status.message = None;
            settle(&backup, &mut status, (ctx.clock)());
            pipeline::write_status::<TalosBackup>(&ctx.client, &namespace, &name, &status).await?;
            let cluster = cluster_meta(&ctx, &backup).await;
            let note = format!(
                "taking backup {name} of TalosCluster {} ({})",
                backup.spec.cluster_ref.name,
                backup.spec.reason.as_str()
            );
            publish(
                &ctx,
                &backup,
                &cluster,
                EventType::Normal,
                "BackupStarted",
                note,
            )
            .await;
            let outcome = take::take(&ctx, &backup).await;
            finish(&ctx, &backup, &cluster, &mut status, outcome).await?;
            Ok(Action::await_change())
        }
    }
}

/// `namespace/name` of the backup's cluster, as the metrics label it.
fn cluster_id(backup: &TalosBackup) -> String {
    format!(
        "{}/{}",
        backup.namespace().unwrap_or_default(),
        backup.spec.cluster_ref.name
    )
}

/// The gauges' view of a succeeded backup's status.
fn last_backup(status: &TalosBackupStatus) -> Option<LastBackup> {
    let finished = status.completion_time.as_ref()?;
    Some(LastBackup {
        finished_seconds: finished.0.as_second(),
        size_bytes: status.size.unwrap_or(0),
        duration_seconds: took(status).as_secs_f64(),
    })
}

/// How long a finished backup took, from its status.
fn took(status: &TalosBackupStatus) -> std::time::Duration {
    match (&status.start_time, &status.completion_time) {
        (Some(start), Some(end)) => end.0.duration_since(start.0).try_into().unwrap_or_default(),
        _ => std::time::Duration::ZERO,
    }
}

/// The metadata of the backup's TalosCluster, for Events on it; `None`
/// when it cannot be read (the backup's own Events still say everything).
async fn cluster_meta(ctx: &Context, backup: &TalosBackup) -> Option<ObjectMeta> {
    let namespace = backup.namespace().unwrap_or_default();
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_metadata_opt(&backup.spec.cluster_ref.name)
        .await
        .ok()
        .flatten()
        .map(|m| m.metadata)
}

/// Writes the backup's end: its parts and sizes, or why it failed; counts
/// it and says it in Events on the backup and its cluster.
async fn finish(
    ctx: &Context,
    backup: &TalosBackup,
    cluster: &Option<ObjectMeta>,
    status: &mut TalosBackupStatus,
    outcome: std::result::Result<take::Written, take::Failure>,
) -> Result<()> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let id = cluster_id(backup);
    status.completion_time = Some((ctx.clock)());
    match outcome {
        Ok(written) => {
            status.phase = BackupPhase::Succeeded;
            status.message = None;
            status.verified = true;
            status.size = Some(written.size);
            status.etcd = Some(written.etcd);
            status.parts = written.parts;
            status.location = Some(written.location.clone());
            ctx.metrics.backup_finished(&id, "succeeded");
            if let Some(last) = last_backup(status) {
                ctx.metrics.backup_succeeded(&id, last);
            }
            let note = succeeded_note(&name, status);
            publish(
                ctx,
                backup,
                cluster,
                EventType::Normal,
                "BackupSucceeded",
                note,
            )
            .await;
        }
        Err(failure) => {
            let why = ichor_api::error_text::chain(&failure);
            status.phase = BackupPhase::Failed;
            status.message = Some(why.clone());
            ctx.metrics.backup_finished(&id, "failed");
            let note = format!("backup {name} failed: {why}");
            publish(
                ctx,
                backup,
                cluster,
                EventType::Warning,
                "BackupFailed",
                note,
            )
            .await;
        }
    }
    settle(backup, status, (ctx.clock)());
    pipeline::write_status::<TalosBackup>(&ctx.client, &namespace, &name, status).await
}

/// Ready, Reconciling and Stalled as the phase says
/// (`ichor_api::conditions::gitops::backup`), at the backup's generation.
fn settle(
    backup: &TalosBackup,
    status: &mut TalosBackupStatus,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    let generation = backup.metadata.generation;
    status.observed_generation = generation;
    let summary = gitops::backup(status);
    gitops::settle(&mut status.conditions, &summary, generation, &now);
}

/// The Event of a succeeded backup: where, how big, which etcd revision,
/// how long (no secret: a location, sizes and a revision).
fn succeeded_note(name: &str, status: &TalosBackupStatus) -> String {
    let revision = status
        .etcd
        .as_ref()
        .and_then(|e| e.revision)
        .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
    let member = status.etcd.as_ref().map_or("", |e| e.member.as_str());
    format!(
        "backup {name} written to {} ({} bytes, etcd revision {revision} from {member}, {:.1}s; the etcd snapshot matched its sha256)",
        status.location.as_deref().unwrap_or_default(),
        status.size.unwrap_or(0),
        took(status).as_secs_f64(),
    )
}

/// An Event on the backup, and the same on its cluster when it was read.
async fn publish(
    ctx: &Context,
    backup: &TalosBackup,
    cluster: &Option<ObjectMeta>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    if let Some(meta) = cluster {
        pipeline::publish_on(ctx, "TalosCluster", meta, type_, reason, note.clone()).await;
    }
    pipeline::publish_on(ctx, "TalosBackup", &backup.metadata, type_, reason, note).await;
}
