//! What `BackupHealthy` is decided from: the cluster's TalosBackups and its
//! schedule, read for the TalosCluster reconcile, which writes the
//! condition with the cluster's others (one status writer; the decision is
//! [`ichor_reconcile::cluster::backup_health`]).

use chrono::{DateTime, Utc};
use ichor_api::TalosCluster;
use ichor_api::backup::{BackupPhase, TalosBackup};
use ichor_api::conditions::{Status, reasons};
use ichor_backup::schedule::Schedule;
use ichor_reconcile::cluster::backup_health::{self, Finished, Health, Outcome};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::to_utc;
use super::volume::BackupVolume;
use crate::{Context, Error, Result};

/// `BackupHealthy` of `cluster` now; `None` without `spec.backup`.
pub(crate) async fn read(ctx: &Context, cluster: &TalosCluster) -> Result<Option<Health>> {
    if cluster.spec.backup.is_none() {
        return Ok(None);
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let backups = Api::<TalosBackup>::namespaced(ctx.client.clone(), &namespace)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!(
            "listing the TalosBackups in {namespace}"
        )))?
        .items;
    Ok(health(
        cluster,
        &backups,
        ctx.config.backup_volume.as_ref(),
        (ctx.clock)().0,
    ))
}

/// `BackupHealthy` of `cluster` from the TalosBackups of its namespace.
pub(crate) fn health(
    cluster: &TalosCluster,
    backups: &[TalosBackup],
    mounted: Option<&BackupVolume>,
    now: Timestamp,
) -> Option<Health> {
    let spec = cluster.spec.backup.as_ref()?;
    // A volume that is not mounted fails every backup: say what to set
    // before any backup is tried.
    if let Some(volume) = &spec.destination.volume
        && let Err(problem) = super::volume::folder(mounted, volume)
    {
        return Some(Health {
            status: Status::False,
            reason: reasons::VOLUME_NOT_MOUNTED,
            message: problem.to_string(),
            recheck_at: None,
        });
    }
    let name = cluster.name_any();
    let finished: Vec<Finished> = backups
        .iter()
        .filter(|b| b.spec.cluster_ref.name == name)
        .filter_map(finished)
        .collect();
    // The webhook refuses a schedule that does not parse; one stored before
    // that rule is treated as none (nothing is ever overdue then).
    let schedule = spec
        .schedule
        .as_ref()
        .and_then(|s| Schedule::parse(&s.cron, s.time_zone.as_deref()).ok());
    let next_run = |t: Timestamp| schedule.as_ref().and_then(|s| next_after(s, t));
    let created = cluster
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    Some(backup_health::health(
        &finished,
        schedule
            .is_some()
            .then_some(&next_run as backup_health::NextRun<'_>),
        created,
        now,
    ))
}

/// A TalosBackup that has finished, as the decision sees it.
fn finished(b: &TalosBackup) -> Option<Finished> {
    let status = b.status.as_ref()?;
    let outcome = match status.phase {
        BackupPhase::Succeeded => Outcome::Succeeded,
        BackupPhase::Failed => Outcome::Failed(
            status
                .message
                .clone()
                .unwrap_or_else(|| "no reason recorded".into()),
        ),
        BackupPhase::Pending | BackupPhase::Running => return None,
    };
    let at = status
        .completion_time
        .as_ref()
        .or(status.start_time.as_ref())
        .or(b.metadata.creation_timestamp.as_ref())?;
    Some(Finished {
        name: b.name_any(),
        finished: at.0,
        outcome,
    })
}

/// The schedule's next run after `t`, in the decision's time type.
fn next_after(schedule: &Schedule, t: Timestamp) -> Option<Timestamp> {
    let t: DateTime<Utc> = to_utc(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t));
    let run = schedule.next_after(t)?;
    Timestamp::new(run.timestamp(), run.timestamp_subsec_nanos() as i32).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(rfc3339: &str) -> Timestamp {
        rfc3339.parse().expect("a timestamp")
    }

    fn cluster(schedule: Option<(&str, &str)>) -> TalosCluster {
        let mut backup = serde_json::json!({
            "destination": {"s3": {"endpoint": "http://s3", "bucket": "bkt",
                "credentialsSecretRef": {"name": "s3"}}},
            "recipients": ["age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"],
        });
        if let Some((cron, tz)) = schedule {
            backup["schedule"] = serde_json::json!({"cron": cron, "timeZone": tz});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "c", "namespace": "ns",
                "creationTimestamp": "2026-03-20T00:00:00Z"},
            "spec": {"endpoint": "https://c:6443", "talosVersion": "v1.12.0",
                "kubernetesVersion": "v1.34.0", "secretsRef": {"name": "bundle"},
                "backup": backup},
        }))
        .expect("a TalosCluster")
    }

    fn backup(cluster: &str, name: &str, phase: &str, done: &str) -> TalosBackup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosBackup",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterRef": {"name": cluster}, "reason": "schedule"},
            "status": {"phase": phase, "completionTime": done, "message": "the bucket refused"},
        }))
        .expect("a TalosBackup")
    }

    /// Covers: R20.8
    #[test]
    fn the_schedules_runs_decide_across_a_daylight_saving_change() {
        // Daily 02:30 Berlin: on 2026-03-29 (spring forward) it runs at
        // 03:00 CEST (01:00 UTC). A backup of 2026-03-27 02:30 CET (01:30
        // UTC): runs 03-28 01:30 UTC, 03-29 01:00 UTC, so overdue after
        // 01:30 UTC on 03-29.
        let c = cluster(Some(("30 2 * * *", "Europe/Berlin")));
        let done = [backup(
            "c",
            "c-20260327013000",
            "Succeeded",
            "2026-03-27T01:31:00Z",
        )];
        let h = health(&c, &done, None, ts("2026-03-29T01:30:00Z")).expect("spec.backup is set");
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        assert_eq!(h.recheck_at, Some(ts("2026-03-29T01:30:00Z")));
        let h = health(&c, &done, None, ts("2026-03-29T01:31:00Z")).expect("spec.backup is set");
        assert_eq!(
            (h.status, h.reason),
            (Status::False, reasons::BACKUP_OVERDUE)
        );
    }

    /// Covers: R20.8
    #[test]
    fn only_this_clusters_finished_backups_count() {
        let c = cluster(None);
        let mut b = backup("c", "c-1", "Succeeded", "2026-03-21T00:00:00Z");
        // Another cluster's failure and this cluster's running backup are
        // not looked at.
        let other = backup("c-2", "c-2-1", "Failed", "2026-03-22T00:00:00Z");
        let mut running = backup("c", "c-2", "Running", "2026-03-22T00:00:00Z");
        running.status.as_mut().expect("a status").completion_time = None;
        let h = health(
            &c,
            &[b.clone(), other, running],
            None,
            ts("2026-03-23T00:00:00Z"),
        )
        .expect("spec.backup is set");
        assert_eq!(
            (h.status, h.reason),
            (Status::True, reasons::BACKUP_SUCCEEDED)
        );
        b.status.as_mut().expect("a status").phase = BackupPhase::Failed;
        let h = health(&c, &[b], None, ts("2026-03-23T00:00:00Z")).expect("spec.backup is set");
        assert_eq!(
            h.message,
            "the newest backup, c-1, failed: the bucket refused"
        );
        // Without spec.backup there is no condition.
        let mut bare = cluster(None);
        bare.spec.backup = None;
        assert_eq!(health(&bare, &[], None, ts("2026-03-23T00:00:00Z")), None);
    }
}
