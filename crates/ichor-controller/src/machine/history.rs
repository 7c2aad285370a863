//! A revision per apply (docs/adr/0022-config-history.md): the revision goes
//! into the machine's status, its inputs and rendered config into the
//! machine's history Secret in Ichor's namespace.

use std::collections::BTreeMap;

use ichor_api::history::{HISTORY_FINALIZER, MachineRevision, RevisionApplyMode, RevisionReason};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::history::{actor, record, rollback, store};
use ichor_reconcile::machine::ApplyPlan;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{Context, Error, Result};

/// Records the apply of `plan` as the machine's next revision: in `status`
/// (bounded), and its inputs in the history Secret. Returns the revision.
/// The status keeps the revision even when the Secret cannot be written
/// (the apply happened); the error says so.
pub(super) async fn record_apply(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    plan: &ApplyPlan,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> (MachineRevision, Result<()>) {
    record_apply_in(
        ctx,
        machine,
        cluster,
        plan,
        status,
        now,
        RevisionApplyMode::NoReboot,
    )
    .await
}

/// [`record_apply`] of an apply made in `apply_mode`.
pub(super) async fn record_apply_in(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    plan: &ApplyPlan,
    status: &mut TalosMachineStatus,
    now: &Time,
    apply_mode: RevisionApplyMode,
) -> (MachineRevision, Result<()>) {
    // A spec `ichor machine rollback` wrote back carries its mark.
    let rollback_of = rollback::rollback_of(
        machine.metadata.annotations.as_ref().map(json_of).as_ref(),
        machine.metadata.generation,
        cluster.metadata.generation,
        &status.revisions,
    );
    let revision = record::next(
        &status.revisions,
        record::Apply {
            time: now.clone(),
            config_hash_before: status.revisions.last().map(|r| r.config_hash_after.clone()),
            config_hash_after: status.config_hash.clone().unwrap_or_default(),
            apply_mode,
            reason: if rollback_of.is_some() {
                RevisionReason::Rollback
            } else {
                RevisionReason::Drift
            },
            operation: None,
            rollback_of,
            machine_generation: machine.metadata.generation,
            cluster_generation: cluster.metadata.generation,
            machine_changed_by: actor::changed_by(&annotations_of(machine)),
            cluster_changed_by: actor::changed_by(&annotations_of(cluster)),
        },
        plan.paths.clone(),
    );
    record(ctx, machine, cluster, revision, &plan.desired_yaml, status).await
}

/// Records `revision` as the machine's newest: in `status` (bounded), and
/// its inputs with the config `rendered` in the history Secret. Every
/// apply site records through here. The status keeps the revision even
/// when the Secret cannot be written (the apply happened); the error says
/// so.
async fn record(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    revision: MachineRevision,
    rendered: &str,
    status: &mut TalosMachineStatus,
) -> (MachineRevision, Result<()>) {
    record::push(
        &mut status.revisions,
        revision.clone(),
        record::kept_for(cluster),
    );
    let kept = keep_inputs(ctx, machine, cluster, rendered, &revision).await;
    (revision, kept)
}

/// An apply of a whole config that no drift decided: a join's, over the
/// maintenance API, or an operation step's.
pub(crate) struct WholeApply<'a> {
    /// [`RevisionReason::Join`] or [`RevisionReason::Operation`].
    pub reason: RevisionReason,
    /// The TalosOperation whose step applied.
    pub operation: Option<&'a str>,
    pub mode: RevisionApplyMode,
    /// From the config the node ran to `rendered`.
    pub change: record::Change,
    /// The config applied.
    pub rendered: &'a str,
}

/// Records a whole-config apply as the machine's next revision in
/// `status` and the history Secret, and tells it in an Event on the
/// machine.
pub(crate) async fn record_whole(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    apply: WholeApply<'_>,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> MachineRevision {
    let revision = whole_revision(machine, cluster, &apply, &status.revisions, now);
    let (revision, kept) = record(ctx, machine, cluster, revision, apply.rendered, status).await;
    tell(ctx, machine, &revision, kept).await;
    revision
}

/// [`record_whole`] on a machine whose status its own reconcile writes (an
/// operation step's apply): its status read again, only `status.revisions`
/// written, guarded by the resourceVersion read (a conflict reads again).
pub(crate) async fn record_whole_on(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    apply: WholeApply<'_>,
    now: &Time,
) -> Result<()> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let machines = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace);
    let failed = |source| Error::Kube {
        what: format!("recording a revision in the status of TalosMachine {namespace}/{name}"),
        source,
    };
    for _ in 0..3 {
        let Some(fresh) = machines.get_opt(&name).await.map_err(failed)? else {
            return Ok(());
        };
        let mut status = fresh.status.clone().unwrap_or_default();
        let revision = whole_revision(&fresh, cluster, &apply, &status.revisions, now);
        record::push(
            &mut status.revisions,
            revision.clone(),
            record::kept_for(cluster),
        );
        let patch = json!({
            "metadata": {"resourceVersion": fresh.resource_version()},
            "status": {"revisions": status.revisions},
        });
        let params = PatchParams {
            field_manager: Some(crate::FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match machines
            .patch_status(&name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let kept = keep_inputs(ctx, &fresh, cluster, apply.rendered, &revision).await;
                tell(ctx, &fresh, &revision, kept).await;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(failed(e)),
        }
    }
    tracing::warn!(machine = %name, "the revision of an operation step was not recorded: its status kept changing");
    Ok(())
}

/// Takes the revisions the API server has for the machine when they are
/// newer than `status`'s: a reconcile that a write of its own before the
/// apply brought may read the machine from a store that has not yet seen
/// the revision written after it, and its status write must not drop it.
pub(crate) async fn catch_up(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
) -> Result<()> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let fresh = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(|source| Error::Kube {
            what: format!("reading TalosMachine {namespace}/{name}"),
            source,
        })?;
    let newest = |r: &[MachineRevision]| r.iter().map(|r| r.number).max();
    if let Some(revisions) = fresh.and_then(|m| m.status).map(|s| s.revisions)
        && newest(&revisions) > newest(&status.revisions)
    {
        status.revisions = revisions;
    }
    Ok(())
}

/// The revision of a whole-config apply. Who: for a join, the newer of the
/// machine's and the cluster's writers (the join carries out their specs);
/// for an operation step, no spec writer (the operation asked; its name is
/// in the revision).
fn whole_revision(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    apply: &WholeApply<'_>,
    history: &[MachineRevision],
    now: &Time,
) -> MachineRevision {
    let writers = apply.reason != RevisionReason::Operation;
    let writer = |o: serde_json::Value| writers.then(|| actor::changed_by(&o)).flatten();
    record::next(
        history,
        record::Apply {
            time: now.clone(),
            config_hash_before: apply.change.config_hash_before.clone(),
            config_hash_after: apply.change.config_hash_after.clone(),
            apply_mode: apply.mode,
            reason: apply.reason,
            operation: apply.operation.map(str::to_owned),
            rollback_of: None,
            machine_generation: machine.metadata.generation,
            cluster_generation: cluster.metadata.generation,
            machine_changed_by: writer(annotations_of(machine)),
            cluster_changed_by: writer(annotations_of(cluster)),
        },
        apply.change.paths.clone(),
    )
}

/// The Event of a join's or an operation step's revision: who, why, the
/// paths and the config's digest, never a value.
async fn tell(ctx: &Context, machine: &TalosMachine, revision: &MachineRevision, kept: Result<()>) {
    let mut note = super::write::revision_words(revision, kept.err());
    if let Some(op) = &revision.operation {
        note.push_str(&format!("; asked by TalosOperation {op}"));
    }
    let digest = &revision.config_hash_after;
    note.push_str(&format!("; config {}…", &digest[..digest.len().min(12)]));
    crate::pipeline::publish_on(
        ctx,
        "TalosMachine",
        &machine.metadata,
        kube::runtime::events::EventType::Normal,
        REVISION_EVENT,
        note,
    )
    .await;
}

/// The Event reason of a join's or an operation step's revision (a class
/// B apply's revision is told in its `Applied` Event).
pub const REVISION_EVENT: &str = "Revision";

fn json_of(annotations: &BTreeMap<String, String>) -> serde_json::Value {
    json!(annotations)
}

/// The part of an object the changed-by stamp is read from.
fn annotations_of<K: kube::Resource>(object: &K) -> serde_json::Value {
    json!({"metadata": {"annotations": object.meta().annotations}})
}

async fn keep_inputs(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    rendered: &str,
    revision: &MachineRevision,
) -> Result<()> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = store::secret_name(&namespace, &machine.name_any());
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ctx.config.system_namespace);
    let failed = |what: &str| {
        let what = format!(
            "{what} the history Secret {}/{name} of TalosMachine {namespace}/{}",
            ctx.config.system_namespace,
            machine.name_any()
        );
        move |source| Error::Kube { what, source }
    };
    let existing = secrets.get_opt(&name).await.map_err(failed("reading"))?;
    let resource_version = existing
        .as_ref()
        .and_then(|s| s.metadata.resource_version.clone());
    let mut data: BTreeMap<String, Vec<u8>> = existing
        .and_then(|s| s.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, ByteString(v))| (k, v))
        .collect();
    let record = store::RevisionRecord {
        revision: revision.clone(),
        machine_spec: serde_json::to_value(&machine.spec).unwrap_or_default(),
        cluster_spec: serde_json::to_value(&cluster.spec).unwrap_or_default(),
        rendered_config: rendered.to_owned(),
    };
    if let Err(e) = store::append(
        &mut data,
        &record,
        record::kept_for(cluster),
        store::MAX_BYTES,
    ) {
        tracing::warn!(machine = %machine.name_any(), error = %ichor_api::error_text::chain(&e), "the revision's inputs are not kept");
        return Ok(());
    }
    // Outside Ichor's namespace no owner reference can delete the Secret
    // with the machine: the finalizer first, so no Secret outlives it.
    if namespace != ctx.config.system_namespace {
        set_history_finalizer(ctx, machine, true).await?;
    }
    let uid = machine.uid().unwrap_or_default();
    // The data is written whole, so keys dropped by the bound go too; the
    // resourceVersion read makes a concurrent writer's change a conflict
    // (retried by the next reconcile), never a lost record.
    let secret = store::secret(
        &store::SecretOf {
            system_namespace: &ctx.config.system_namespace,
            machine_namespace: &namespace,
            machine_name: &machine.name_any(),
            machine_uid: &uid,
            resource_version: resource_version.clone(),
        },
        data,
    );
    if resource_version.is_some() {
        secrets
            .replace(&name, &PostParams::default(), &secret)
            .await
            .map_err(failed("writing"))?;
    } else {
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(failed("creating"))?;
    }
    Ok(())
}

/// A deleted machine's history, once nothing else keeps the machine (its
/// membership finalizer gone): the history Secret deleted, then the
/// history finalizer dropped. `false` when the machine carries none.
pub(crate) async fn forget(ctx: &Context, machine: &TalosMachine) -> Result<bool> {
    let has = |f: &str| machine.finalizers().iter().any(|x| x == f);
    if machine.metadata.deletion_timestamp.is_none()
        || !has(HISTORY_FINALIZER)
        || has(ichor_api::machine::MEMBERSHIP_FINALIZER)
    {
        return Ok(false);
    }
    let namespace = machine.namespace().unwrap_or_default();
    let name = store::secret_name(&namespace, &machine.name_any());
    match Api::<Secret>::namespaced(ctx.client.clone(), &ctx.config.system_namespace)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(source) => {
            return Err(Error::Kube {
                what: format!(
                    "deleting the history Secret {}/{name} of TalosMachine {namespace}/{}",
                    ctx.config.system_namespace,
                    machine.name_any()
                ),
                source,
            });
        }
    }
    set_history_finalizer(ctx, machine, false).await?;
    Ok(true)
}

/// Adds or drops [`HISTORY_FINALIZER`] (a merge patch of the list read
/// just now, guarded by its resourceVersion: the reconcile's copy is older
/// than its own status writes).
async fn set_history_finalizer(ctx: &Context, machine: &TalosMachine, present: bool) -> Result<()> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let machines = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace);
    let failed = |source| Error::Kube {
        what: format!("updating the finalizers of TalosMachine {namespace}/{name}"),
        source,
    };
    let Some(now) = machines.get_opt(&name).await.map_err(failed)? else {
        return Ok(());
    };
    let mut list: Vec<String> = now
        .finalizers()
        .iter()
        .filter(|f| *f != HISTORY_FINALIZER)
        .cloned()
        .collect();
    if present == now.finalizers().iter().any(|f| f == HISTORY_FINALIZER) {
        return Ok(());
    }
    if present {
        list.push(HISTORY_FINALIZER.to_owned());
    }
    let patch = json!({
        "metadata": { "finalizers": list, "resourceVersion": now.resource_version() }
    });
    match machines
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(failed(e)),
    }
}
