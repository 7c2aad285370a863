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
use ichor_api::backup::{BackupPhase, TalosBackup, TalosBackupStatus};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::{Controller, watcher};

use crate::{Context, Error, Result, pipeline};

pub mod schedule;
mod take;

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
        BackupPhase::Succeeded | BackupPhase::Failed => Ok(Action::await_change()),
        BackupPhase::Running => {
            // Only a reconcile that ended mid-backup leaves it Running.
            take::forget_partial(&ctx, &backup).await;
            finish(&ctx, &backup, &mut status, Err(take::Failure::Interrupted)).await?;
            Ok(Action::await_change())
        }
        BackupPhase::Pending => {
            status.phase = BackupPhase::Running;
            status.start_time = Some((ctx.clock)());
            status.message = None;
            pipeline::write_status::<TalosBackup>(&ctx.client, &namespace, &name, &status).await?;
            publish(
                &ctx,
                &backup,
                EventType::Normal,
                "BackupStarted",
                format!(
                    "taking a backup of TalosCluster {} ({})",
                    backup.spec.cluster_ref.name,
                    backup.spec.reason.as_str()
                ),
            )
            .await;
            let outcome = take::take(&ctx, &backup).await;
            finish(&ctx, &backup, &mut status, outcome).await?;
            Ok(Action::await_change())
        }
    }
}

/// Writes the backup's end: its parts and sizes, or why it failed.
async fn finish(
    ctx: &Context,
    backup: &TalosBackup,
    status: &mut TalosBackupStatus,
    outcome: std::result::Result<take::Written, take::Failure>,
) -> Result<()> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
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
            publish(
                ctx,
                backup,
                EventType::Normal,
                "BackupSucceeded",
                format!(
                    "backup written to {} ({} bytes, etcd snapshot checked against its sha256)",
                    written.location, written.size
                ),
            )
            .await;
        }
        Err(failure) => {
            let why = ichor_api::error_text::chain(&failure);
            status.phase = BackupPhase::Failed;
            status.message = Some(why.clone());
            publish(ctx, backup, EventType::Warning, "BackupFailed", why).await;
        }
    }
    pipeline::write_status::<TalosBackup>(&ctx.client, &namespace, &name, status).await
}

async fn publish(
    ctx: &Context,
    backup: &TalosBackup,
    type_: EventType,
    reason: &str,
    note: String,
) {
    pipeline::publish_on(ctx, "TalosBackup", &backup.metadata, type_, reason, note).await;
}
