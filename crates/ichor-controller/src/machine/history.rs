//! A revision per apply (docs/adr/0022-config-history.md): the revision goes
//! into the machine's status, its inputs and rendered config into the
//! machine's history Secret in Ichor's namespace.

use std::collections::BTreeMap;

use ichor_api::history::{MachineRevision, RevisionApplyMode, RevisionReason};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::history::{actor, record, rollback, store};
use ichor_reconcile::machine::ApplyPlan;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
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
    record::push(
        &mut status.revisions,
        revision.clone(),
        record::DEFAULT_KEPT,
    );
    let kept = keep_inputs(ctx, machine, cluster, plan, &revision).await;
    (revision, kept)
}

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
    plan: &ApplyPlan,
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
        rendered_config: plan.desired_yaml.clone(),
    };
    if let Err(e) = store::append(&mut data, &record, record::DEFAULT_KEPT, store::MAX_BYTES) {
        tracing::warn!(machine = %machine.name_any(), error = %ichor_api::error_text::chain(&e), "the revision's inputs are not kept");
        return Ok(());
    }
    // Owned by the machine when they share a namespace (an owner in another
    // namespace would make the garbage collector delete the Secret at once);
    // otherwise the machine's finalizer deletes it.
    let owner = (namespace == ctx.config.system_namespace).then(|| {
        json!([{"apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "name": machine.name_any(), "uid": machine.uid().unwrap_or_default()}])
    });
    let mut metadata = json!({
        "name": name,
        "namespace": ctx.config.system_namespace,
        "labels": {"app.kubernetes.io/part-of": "ichor", "app.kubernetes.io/component": "history"},
        // A machine's name may be longer than a label value may.
        "annotations": {"ichor.maesh.dev/history-of": format!("{namespace}/{}", machine.name_any())},
    });
    if let Some(owner) = owner {
        metadata["ownerReferences"] = owner;
    }
    // The data is written whole, so keys dropped by the bound go too; the
    // resourceVersion read makes a concurrent writer's change a conflict
    // (retried by the next reconcile), never a lost record.
    if let Some(version) = &resource_version {
        metadata["resourceVersion"] = json!(version);
    }
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "ichor.maesh.dev/history",
        "metadata": metadata,
        "data": data.into_iter().map(|(k, v)| (k, ByteString(v))).collect::<BTreeMap<_, _>>(),
    }))
    .expect("a history Secret deserialises");
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
