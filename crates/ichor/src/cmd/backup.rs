//! `ichor backup now|list|show`: TalosBackups, through the API server (the
//! controller takes the backup; this command never reads a node or the
//! bucket).

use std::time::Duration;

use anyhow::Context as _;
use ichor_api::ClusterRef;
use ichor_api::backup::{BackupPhase, BackupReason, TalosBackup, TalosBackupSpec};
use kube::api::{Api, ListParams, PostParams};

use crate::args::{BackupListArgs, BackupNameArgs, BackupNowArgs, OutputFormat};
use crate::{connect, printer};

/// How long `now --wait` waits for the controller to start the backup.
const START_WAIT: Duration = Duration::from_secs(60);

/// The name of a backup taken on request: the cluster, the UTC time, `manual`.
pub fn manual_name(cluster: &str, now: chrono::DateTime<chrono::Utc>) -> String {
    ichor_backup::manifest::backup_name(cluster, now, Some("manual"))
}

pub async fn now(args: BackupNowArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let api = Api::<TalosBackup>::namespaced(client, &args.namespace);
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| manual_name(&args.cluster, chrono::Utc::now()));
    let backup = TalosBackup::new(
        &name,
        TalosBackupSpec {
            cluster_ref: ClusterRef {
                name: args.cluster.clone(),
            },
            reason: BackupReason::Manual,
            operation: None,
        },
    );
    api.create(&PostParams::default(), &backup)
        .await
        .with_context(|| {
            format!(
                "cannot create TalosBackup {}/{name}; is Ichor installed there, and may this kubeconfig create TalosBackups?",
                args.namespace
            )
        })?;
    printer::step(&format!("TalosBackup {}/{name} created", args.namespace));
    if !args.wait {
        return print_one(&api.get(&name).await?, args.output);
    }
    let progress = printer::Progress::start(&format!("backing up TalosCluster {}", args.cluster));
    let started = tokio::time::Instant::now();
    let mut said = None;
    let done = loop {
        let b = api
            .get(&name)
            .await
            .with_context(|| format!("cannot read TalosBackup {}/{name}", args.namespace))?;
        let phase = b.status.as_ref().map(|s| s.phase).unwrap_or_default();
        match phase {
            BackupPhase::Succeeded | BackupPhase::Failed => break b,
            BackupPhase::Pending if started.elapsed() > START_WAIT => anyhow::bail!(
                "the controller has not started TalosBackup {}/{name} within {START_WAIT:?}; is the Ichor controller running? Check later with: ichor backup show {name} -n {}",
                args.namespace,
                args.namespace
            ),
            BackupPhase::Pending | BackupPhase::Running if said != Some(phase) => {
                said = Some(phase);
                progress.line(if phase == BackupPhase::Pending {
                    "waiting for the controller to start it"
                } else {
                    "streaming the etcd snapshot, encrypted, to the destination"
                });
            }
            BackupPhase::Pending | BackupPhase::Running => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let failed = done
        .status
        .as_ref()
        .is_some_and(|s| s.phase == BackupPhase::Failed);
    progress.finish(if failed {
        "backup failed"
    } else {
        "backup written"
    });
    print_one(&done, args.output)?;
    if failed {
        anyhow::bail!(
            "TalosBackup {}/{name} failed: see its message above",
            args.namespace
        );
    }
    Ok(())
}

pub async fn list(args: BackupListArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let api = match &args.namespace {
        Some(ns) => Api::<TalosBackup>::namespaced(client, ns),
        None => Api::<TalosBackup>::all(client),
    };
    let mut items: Vec<TalosBackup> = api
        .list(&ListParams::default())
        .await
        .context("cannot list TalosBackups; is Ichor installed (its CRDs), and may this kubeconfig read them?")?
        .items
        .into_iter()
        .filter(|b| args.cluster.as_ref().is_none_or(|c| &b.spec.cluster_ref.name == c))
        .collect();
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    match args.output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(&items)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(&items)?),
        None => {
            if items.is_empty() {
                printer::data("no TalosBackup");
            }
            for b in &items {
                printer::data(&list_line(b));
            }
        }
    }
    Ok(())
}

pub async fn show(args: BackupNameArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let b = Api::<TalosBackup>::namespaced(client, &args.namespace)
        .get(&args.name)
        .await
        .with_context(|| format!("cannot read TalosBackup {}/{}", args.namespace, args.name))?;
    print_one(&b, args.output)
}

/// `NAME  CLUSTER  REASON  PHASE  SIZE`, one line.
fn list_line(b: &TalosBackup) -> String {
    let st = b.status.clone().unwrap_or_default();
    format!(
        "{}  cluster={}  reason={}  phase={:?}  size={}{}",
        b.metadata.name.as_deref().unwrap_or_default(),
        b.spec.cluster_ref.name,
        b.spec.reason.as_str(),
        st.phase,
        st.size.map_or("-".to_string(), |s| s.to_string()),
        st.message.map(|m| format!("  {m}")).unwrap_or_default()
    )
}

fn print_one(b: &TalosBackup, output: Option<OutputFormat>) -> anyhow::Result<()> {
    match output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(b)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(b)?),
        None => {
            printer::data(&list_line(b));
            let st = b.status.clone().unwrap_or_default();
            if let Some(loc) = &st.location {
                printer::data(&format!("  location: {loc}"));
            }
            if let Some(e) = &st.etcd {
                printer::data(&format!(
                    "  etcd: from {}, revision >= {}, db {} bytes, sha256 {}",
                    e.member,
                    e.revision.unwrap_or(0),
                    e.db_size,
                    e.sha256
                ));
            }
            for p in &st.parts {
                printer::data(&format!(
                    "  part {}: {} ({} bytes, sha256 {})",
                    p.name, p.key, p.size, p.sha256
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    /// A manual backup's name sorts with the schedule's by time.
    #[test]
    fn a_manual_name_carries_the_cluster_and_time() {
        let t = chrono::Utc.with_ymd_and_hms(2026, 12, 2, 1, 2, 3).unwrap();
        let name = manual_name("lab", t);
        assert_eq!(name, "lab-20261202010203-manual");
        assert_eq!(ichor_backup::manifest::backup_time("lab", &name), Some(t));
    }
}
