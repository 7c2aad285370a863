//! Taking one backup: what the controller reads (the cluster, its backup
//! spec and credentials, the bundle, Ichor's objects, a healthy etcd
//! member) and the stream it hands to [`ichor_backup::take`].

use chrono::{DateTime, Utc};
use ichor_api::backup::{BackupPartStatus, EtcdSnapshotStatus, S3Destination, TalosBackup};
use ichor_api::{MachineRole, TalosCluster, TalosMachine, TalosOperation};
use ichor_backup::crypt::{Recipients, RecipientsError};
use ichor_backup::manifest::{self, Layout};
use ichor_backup::store::{self, Destination, Store, StoreError};
use ichor_backup::take::{Inputs, TakeError, Taken};
use ichor_talos_client::ClientOptions;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::to_utc;
use crate::Context;

/// A backup written whole, as its status records it.
pub(super) struct Written {
    pub size: i64,
    pub etcd: EtcdSnapshotStatus,
    pub parts: Vec<BackupPartStatus>,
    pub location: String,
}

/// Why a backup failed; its whole chain becomes the status message.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failure {
    #[error(
        "the controller stopped while this backup ran; what it had written is deleted; take a new backup"
    )]
    Interrupted,
    #[error("TalosCluster {0} does not exist")]
    NoCluster(String),
    #[error(
        "TalosCluster {0} has no spec.backup: it says where backups go and to whom they are encrypted"
    )]
    NoBackupSpec(String),
    #[error("spec.backup.destination of TalosCluster {0} names neither s3 nor volume")]
    NoDestination(String),
    #[error(transparent)]
    Volume(#[from] super::volume::VolumeProblem),
    #[error("spec.backup of TalosCluster {cluster}")]
    Recipients {
        cluster: String,
        #[source]
        source: RecipientsError,
    },
    #[error("the S3 credentials Secret {namespace}/{name} is missing or lacks the key {key}")]
    Credentials {
        namespace: String,
        name: String,
        key: &'static str,
    },
    #[error("the secrets bundle Secret {namespace}/{name} is missing or lacks the key {key}")]
    Bundle {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("reading {what} failed")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("opening the backup destination failed")]
    Store(#[source] Box<StoreError>),
    #[error("the Talos client of control plane {machine} could not be made")]
    Client {
        machine: String,
        #[source]
        source: Box<crate::Error>,
    },
    #[error(
        "no control plane of TalosCluster {cluster} has a healthy etcd member to read a snapshot from (asked: {asked})"
    )]
    NoHealthyMember { cluster: String, asked: String },
    #[error("control plane {machine} did not start streaming its etcd snapshot")]
    Snapshot {
        machine: String,
        #[source]
        source: ichor_talos_client::Error,
    },
    #[error(transparent)]
    Take(Box<TakeError>),
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Failure {
    let what = what.into();
    move |source| Failure::Kube { what, source }
}

/// The folder of `backup` in its destination: its own name when that is a
/// backup name of its cluster (the schedule's are), otherwise the cluster
/// and start time, then its name.
pub(super) fn folder(backup: &TalosBackup, started: DateTime<Utc>) -> String {
    let cluster = &backup.spec.cluster_ref.name;
    let name = backup.name_any();
    if manifest::backup_time(cluster, &name).is_some() {
        name
    } else {
        manifest::backup_name(cluster, started, Some(&name))
    }
}

/// The destination of `cluster`'s backups, opened.
pub(super) async fn open_store(ctx: &Context, cluster: &TalosCluster) -> Result<Store, Failure> {
    let name = cluster.name_any();
    let spec = cluster
        .spec
        .backup
        .as_ref()
        .ok_or_else(|| Failure::NoBackupSpec(name.clone()))?;
    let destination = match (&spec.destination.s3, &spec.destination.volume) {
        (Some(s3), _) => s3_destination(ctx, s3).await?,
        (None, Some(volume)) => Destination::Filesystem {
            root: super::volume::folder(ctx.config.backup_volume.as_ref(), volume)?,
        },
        (None, None) => return Err(Failure::NoDestination(name)),
    };
    Store::open(&destination).map_err(|e| Failure::Store(Box::new(e)))
}

async fn s3_destination(ctx: &Context, s3: &S3Destination) -> Result<Destination, Failure> {
    let namespace = ctx.config.system_namespace.clone();
    let secret_name = s3.credentials_secret_ref.name.clone();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&secret_name)
        .await
        .map_err(kube_error(format!("Secret {namespace}/{secret_name}")))?;
    let value = |key: &'static str| {
        secret
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Failure::Credentials {
                namespace: namespace.clone(),
                name: secret_name.clone(),
                key,
            })
    };
    Ok(Destination::S3(store::S3Destination {
        endpoint: Some(s3.endpoint.clone()),
        bucket: s3.bucket.clone(),
        prefix: s3.prefix.clone(),
        region: s3.region.clone(),
        access_key_id: value("accessKeyId")?,
        secret_access_key: value("secretAccessKey")?,
        allow_http: s3.allow_http,
    }))
}

/// Deletes a backup's objects: its manifest first, so that it stops
/// looking complete before any other part goes.
pub(super) async fn delete_objects(store: &Store, backup: &TalosBackup) -> Result<(), StoreError> {
    let Some(started) = backup.status.as_ref().and_then(|s| s.start_time.as_ref()) else {
        return Ok(());
    };
    let cluster = &backup.spec.cluster_ref.name;
    let folder = folder(backup, to_utc(started));
    let key = |p| Layout::new("").key(cluster, &folder, p);
    store.delete(&[key(manifest::Part::Manifest)]).await?;
    let rest: Vec<String> = manifest::Part::ALL
        .into_iter()
        .filter(|p| *p != manifest::Part::Manifest)
        .map(key)
        .collect();
    store.delete(&rest).await
}

/// Deletes what a backup cut short may have written (best effort: the
/// backup has no manifest, so it never looks complete either way).
pub(super) async fn forget_partial(ctx: &Context, backup: &TalosBackup) {
    let namespace = backup.namespace().unwrap_or_default();
    let cluster_name = &backup.spec.cluster_ref.name;
    let Ok(Some(cluster)) = Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
    else {
        return;
    };
    let Ok(store) = open_store(ctx, &cluster).await else {
        return;
    };
    if let Err(e) = delete_objects(&store, backup).await {
        tracing::warn!(error = %ichor_api::error_text::chain(&e), backup = %backup.name_any(), "deleting a cut backup's objects");
    }
}

/// Takes `backup`: everything read, the snapshot streamed, the parts written.
pub(super) async fn take(ctx: &Context, backup: &TalosBackup) -> Result<Written, Failure> {
    let namespace = backup.namespace().unwrap_or_default();
    let cluster_name = backup.spec.cluster_ref.name.clone();
    let started = backup
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(to_utc)
        .unwrap_or_else(Utc::now);
    let cluster = Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&cluster_name)
        .await
        .map_err(kube_error(format!(
            "TalosCluster {namespace}/{cluster_name}"
        )))?
        .ok_or_else(|| Failure::NoCluster(format!("{namespace}/{cluster_name}")))?;
    let spec = cluster
        .spec
        .backup
        .clone()
        .ok_or_else(|| Failure::NoBackupSpec(format!("{namespace}/{cluster_name}")))?;
    let recipients = Recipients::parse(&spec.recipients).map_err(|source| Failure::Recipients {
        cluster: format!("{namespace}/{cluster_name}"),
        source,
    })?;
    let store = open_store(ctx, &cluster).await?;
    let bundle = read_bundle(ctx, &cluster).await?;
    let (objects, machines) = read_objects(ctx, &cluster).await?;
    let (member, talos) = healthy_member(ctx, &cluster, &machines).await?;
    let revision = api_revision(ctx, &namespace).await?;
    let stream = talos
        .etcd_snapshot("")
        .await
        .map_err(|source| Failure::Snapshot {
            machine: member.clone(),
            source,
        })?;
    let folder = folder(backup, started);
    let inputs = Inputs {
        cluster: manifest::ClusterRef {
            name: cluster_name.clone(),
            uid: cluster.uid().unwrap_or_default(),
        },
        backup: folder.clone(),
        reason: match backup.spec.reason {
            ichor_api::BackupReason::Schedule => manifest::Reason::Schedule,
            ichor_api::BackupReason::Operation => manifest::Reason::Operation,
            ichor_api::BackupReason::Manual => manifest::Reason::Manual,
        },
        started,
        talos_version: cluster.spec.talos_version.clone(),
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        member: member.clone(),
        revision,
        bundle,
        objects,
    };
    let taken = ichor_backup::take::take(
        &store,
        &Layout::new(""),
        &recipients,
        inputs,
        Box::pin(stream),
        Utc::now,
    )
    .await
    .map_err(|e| Failure::Take(Box::new(e)))?;
    Ok(written(&taken, &store, &cluster_name, &folder))
}

/// What the status records of a backup written whole.
fn written(taken: &Taken, store: &Store, cluster: &str, folder: &str) -> Written {
    let m = &taken.manifest;
    let size = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Written {
        size: size(taken.written),
        etcd: EtcdSnapshotStatus {
            revision: i64::try_from(m.etcd.revision).ok(),
            member: m.etcd.member.clone(),
            db_size: size(m.etcd.db_size),
            sha256: m.etcd.sha256.clone(),
        },
        parts: m
            .parts
            .iter()
            .map(|p| BackupPartStatus {
                name: match p.name {
                    manifest::Part::EtcdSnapshot => "etcd-snapshot",
                    manifest::Part::Bundle => "bundle",
                    manifest::Part::Objects => "objects",
                    manifest::Part::Manifest => "manifest",
                }
                .to_string(),
                key: p.key.clone(),
                size: size(p.size),
                sha256: p.sha256.clone(),
            })
            .collect(),
        location: format!(
            "{} {}",
            store.name(),
            Layout::new("").backup_folder(cluster, folder)
        ),
    }
}

/// The API server's list revision, which is etcd's: a snapshot read after
/// it holds at least this revision.
async fn api_revision(ctx: &Context, namespace: &str) -> Result<u64, Failure> {
    Ok(
        Api::<TalosBackup>::namespaced(ctx.client.clone(), namespace)
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map_err(kube_error("the API server's current revision"))?
            .metadata
            .resource_version
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0),
    )
}

async fn read_bundle(ctx: &Context, cluster: &TalosCluster) -> Result<Vec<u8>, Failure> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.spec.secrets_ref.name.clone();
    let key = cluster.spec.secrets_ref.key_or_default().to_owned();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(kube_error(format!("Secret {namespace}/{name}")))?;
    secret
        .and_then(|s| s.data)
        .and_then(|mut d| d.remove(&key))
        .map(|v| v.0)
        .ok_or(Failure::Bundle {
            namespace,
            name,
            key,
        })
}

/// Ichor's objects of `cluster` as multi-document YAML (without their
/// managed fields), and its machines.
async fn read_objects(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<(Vec<u8>, Vec<TalosMachine>), Failure> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let machines: Vec<TalosMachine> =
        Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_error(format!("the TalosMachines in {namespace}")))?
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_ref.name == name)
            .collect();
    let operations: Vec<TalosOperation> =
        Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
            .list(&ListParams::default())
            .await
            .map_err(kube_error(format!("the TalosOperations in {namespace}")))?
            .items
            .into_iter()
            .filter(|o| o.spec.target.cluster_ref.name == name)
            .collect();
    let mut docs: Vec<serde_json::Value> = Vec::new();
    let mut push = |v: serde_json::Value| {
        let mut v = v;
        if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("managedFields");
        }
        docs.push(v);
    };
    push(serde_json::to_value(cluster).unwrap_or_default());
    for m in &machines {
        push(serde_json::to_value(m).unwrap_or_default());
    }
    for o in &operations {
        push(serde_json::to_value(o).unwrap_or_default());
    }
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&d).unwrap_or_default());
    }
    Ok((out.into_bytes(), machines))
}

/// The first control plane whose etcd member is healthy (no errors, not a
/// learner), and a client to it.
async fn healthy_member(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> Result<(String, ichor_talos_client::TalosClient), Failure> {
    let mut asked = Vec::new();
    for m in machines
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
    {
        let name = m.name_any();
        let endpoint = crate::machine::endpoint(&m.spec.address, ctx.config.talos_port);
        let client = match ctx
            .credentials
            .talos_client(
                &ctx.client,
                cluster,
                &endpoint,
                ClientOptions {
                    call_timeout: ctx.config.talos_call_timeout,
                    ..ClientOptions::default()
                },
            )
            .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                asked.push(format!("{name}: {}", ichor_api::error_text::chain(&e)));
                continue;
            }
            Err(e) => {
                return Err(Failure::Client {
                    machine: name,
                    source: Box::new(e),
                });
            }
        };
        match client.etcd_status("").await {
            Ok(s) if s.errors.is_empty() && !s.is_learner => return Ok((name, client)),
            Ok(s) if s.is_learner => asked.push(format!("{name}: a learner")),
            Ok(s) => asked.push(format!("{name}: {}", s.errors.join("; "))),
            Err(e) => asked.push(format!("{name}: {}", ichor_api::error_text::chain(&e))),
        }
    }
    Err(Failure::NoHealthyMember {
        cluster: cluster.name_any(),
        asked: if asked.is_empty() {
            "no control plane".into()
        } else {
            asked.join(", ")
        },
    })
}
