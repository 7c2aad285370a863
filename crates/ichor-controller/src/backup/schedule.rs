//! The backup schedule: every [`TICK`], each TalosCluster with
//! `spec.backup.schedule` gets a TalosBackup when its schedule has come due
//! since its last scheduled one, and its retention is applied.
//!
//! A due run creates one TalosBackup named after the run's time
//! (`<cluster>-<UTC YYYYMMDDhhmmss>`), so two ticks, or two controllers,
//! that see the same run create one object. Runs missed while the
//! controller was down are not caught up one by one: the latest is taken.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ichor_api::backup::{BackupPhase, BackupReason, TalosBackup, TalosBackupSpec};
use ichor_api::{ClusterRef, TalosCluster};
use ichor_backup::retention::{self, Policy};
use ichor_backup::schedule::Schedule;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource as _, ResourceExt as _};

use crate::Context;

/// How often schedules are looked at.
pub const TICK: Duration = Duration::from_secs(15);

/// Runs the schedule until `shutdown`.
pub(super) async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tick(&ctx).await;
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            () = &mut shutdown => return,
        }
    }
}

fn now(ctx: &Context) -> DateTime<Utc> {
    super::to_utc(&(ctx.clock)())
}

async fn tick(ctx: &Context) {
    let clusters: Api<TalosCluster> = match ctx.config.namespace.as_deref() {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let Ok(list) = clusters.list(&ListParams::default()).await else {
        return;
    };
    for cluster in list.items.iter().filter(|c| c.spec.backup.is_some()) {
        if let Err(e) = one_cluster(ctx, cluster).await {
            tracing::warn!(error = %ichor_api::error_text::chain(&e), cluster = %cluster.name_any(), "backup schedule");
        }
    }
}

async fn one_cluster(ctx: &Context, cluster: &TalosCluster) -> crate::Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let Some(spec) = &cluster.spec.backup else {
        return Ok(());
    };
    let api = Api::<TalosBackup>::namespaced(ctx.client.clone(), &namespace);
    let backups: Vec<TalosBackup> = api
        .list(&ListParams::default())
        .await
        .map_err(crate::Error::kube(format!(
            "listing the TalosBackups in {namespace}"
        )))?
        .items
        .into_iter()
        .filter(|b| b.spec.cluster_ref.name == name)
        .collect();
    let now = now(ctx);
    if let Some(schedule) = &spec.schedule
        && let Ok(schedule) = Schedule::parse(&schedule.cron, schedule.time_zone.as_deref())
    {
        let since = last_scheduled(cluster, &backups);
        if let Some(run) = due(&schedule, since, now) {
            create(ctx, &api, cluster, run).await?;
        }
    }
    if let Some(r) = &spec.retention {
        let max_age = r
            .max_age
            .as_deref()
            .and_then(|a| retention::parse_max_age(a).ok());
        if let Ok(policy) = Policy::new(r.keep_last, max_age) {
            apply_retention(ctx, &api, cluster, &backups, &policy, now).await?;
        }
    }
    Ok(())
}

/// When the last scheduled run was: the newest scheduled backup's run time
/// (its name), or the cluster's creation when it has none.
fn last_scheduled(cluster: &TalosCluster, backups: &[TalosBackup]) -> DateTime<Utc> {
    let name = cluster.name_any();
    backups
        .iter()
        .filter(|b| b.spec.reason == BackupReason::Schedule)
        .filter_map(|b| ichor_backup::manifest::backup_time(&name, &b.name_any()))
        .max()
        .or_else(|| {
            cluster
                .metadata
                .creation_timestamp
                .as_ref()
                .map(super::to_utc)
        })
        .unwrap_or_default()
}

/// The latest run of `schedule` after `since` and not after `now`, if any.
pub fn due(schedule: &Schedule, since: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let mut run = schedule.next_after(since).filter(|r| *r <= now)?;
    // Skip to the latest due run (a controller that was down takes one).
    while let Some(next) = schedule.next_after(run).filter(|r| *r <= now) {
        run = next;
    }
    Some(run)
}

async fn create(
    ctx: &Context,
    api: &Api<TalosBackup>,
    cluster: &TalosCluster,
    run: DateTime<Utc>,
) -> crate::Result<()> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = ichor_backup::manifest::backup_name(&cluster.name_any(), run, None);
    let backup = TalosBackup {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            owner_references: cluster.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: TalosBackupSpec {
            cluster_ref: ClusterRef {
                name: cluster.name_any(),
            },
            reason: BackupReason::Schedule,
            operation: None,
        },
        status: None,
    };
    match api.create(&PostParams::default(), &backup).await {
        Ok(_) => {
            crate::pipeline::publish_on(
                ctx,
                "TalosCluster",
                &cluster.metadata,
                EventType::Normal,
                "BackupScheduled",
                format!("the backup schedule came due at {run}: TalosBackup {name}"),
            )
            .await;
            Ok(())
        }
        // Another tick or replica created it first.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(crate::Error::kube(format!(
            "creating TalosBackup {namespace}/{name}"
        ))(e)),
    }
}

async fn apply_retention(
    ctx: &Context,
    api: &Api<TalosBackup>,
    cluster: &TalosCluster,
    backups: &[TalosBackup],
    policy: &Policy,
    now: DateTime<Utc>,
) -> crate::Result<()> {
    let name = cluster.name_any();
    let seen: Vec<retention::Backup> = backups
        .iter()
        .map(|b| {
            let status = b.status.clone().unwrap_or_default();
            retention::Backup {
                cluster: b.spec.cluster_ref.name.clone(),
                name: b.name_any(),
                phase: match status.phase {
                    BackupPhase::Succeeded => retention::Phase::Succeeded,
                    BackupPhase::Failed => retention::Phase::Failed,
                    BackupPhase::Pending | BackupPhase::Running => retention::Phase::Running,
                },
                finished: status.completion_time.as_ref().map(super::to_utc),
            }
        })
        .collect();
    let deletions = retention::to_delete(&name, &seen, policy, now);
    if deletions.is_empty() {
        return Ok(());
    }
    let store = match super::take::open_store(ctx, cluster).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %ichor_api::error_text::chain(&e), cluster = %name, "retention: the destination cannot be opened; nothing deleted");
            return Ok(());
        }
    };
    for d in deletions {
        let Some(b) = backups.iter().find(|b| b.name_any() == d.name) else {
            continue;
        };
        // The objects first: a TalosBackup is never gone while its objects stay.
        if let Err(e) = super::take::delete_objects(&store, b).await {
            tracing::warn!(error = %ichor_api::error_text::chain(&e), backup = %d.name, "retention: deleting the backup's objects");
            continue;
        }
        match api.delete(&d.name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(crate::Error::kube(format!(
                    "deleting TalosBackup {}",
                    d.name
                ))(e));
            }
        }
        crate::pipeline::publish_on(
            ctx,
            "TalosCluster",
            &cluster.metadata,
            EventType::Normal,
            "BackupDeleted",
            format!("retention deleted backup {}: {}", d.name, d.why),
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, h, m, 0).unwrap()
    }

    /// Covers: R13.7
    #[test]
    fn a_due_run_is_the_latest_one_not_after_now() {
        let every_10 = Schedule::parse("*/10 * * * *", None).unwrap();
        assert_eq!(due(&every_10, at(1, 0), at(1, 9)), None);
        assert_eq!(due(&every_10, at(1, 0), at(1, 10)), Some(at(1, 10)));
        // Down for an hour: one backup, at the latest run.
        assert_eq!(due(&every_10, at(1, 0), at(2, 5)), Some(at(2, 0)));
        // The run just taken is not due again.
        assert_eq!(due(&every_10, at(2, 0), at(2, 5)), None);
    }
}
