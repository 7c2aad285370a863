//! A rollback asked for on the machine itself ([`ROLLBACK_ANNOTATION`], set
//! by the UI, whose identity may not read the history Secret): the
//! controller reads that revision's inputs from the Secret, writes the
//! machine's config fields back with the mark that records the apply which
//! follows as a rollback of that revision, and removes the request, all in
//! one write. The cluster's spec is never written from here (`ichor machine
//! rollback --include-cluster` does that, with its plan and consent). The
//! write then takes the usual hold-and-apply path.

use ichor_api::history::{ROLLBACK_ANNOTATION, rollback_target};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::history::rollback::{self, ROLLBACK_OF_ANNOTATION, RollbackMark};
use ichor_reconcile::history::store;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::{Value, json};

use crate::{Context, Error, Result};

/// The Event reason of a rollback written back.
pub const ROLLBACK_WRITTEN: &str = "RollbackWritten";
/// The Event reason of a rollback request that cannot be carried out.
pub const ROLLBACK_REFUSED: &str = "RollbackRefused";

/// The raw value of a machine's rollback request, if it carries one.
pub(super) fn requested(machine: &TalosMachine) -> Option<&str> {
    machine
        .metadata
        .annotations
        .as_ref()?
        .get(ROLLBACK_ANNOTATION)
        .map(String::as_str)
}

/// The JSON merge patch (RFC 7386) that turns `current` into `target`: keys
/// `target` lacks set to null, objects diffed key by key (so nothing of
/// `current` is merged into a value written back), anything else as `target`.
pub fn merge_diff(current: &Value, target: &Value) -> Value {
    match (current, target) {
        (Value::Object(c), Value::Object(t)) => {
            let mut out = serde_json::Map::new();
            for (k, v) in c {
                match t.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(tv) if tv != v => {
                        out.insert(k.clone(), merge_diff(v, tv));
                    }
                    Some(_) => {}
                }
            }
            for (k, tv) in t {
                if !c.contains_key(k) {
                    out.insert(k.clone(), tv.clone());
                }
            }
            Value::Object(out)
        }
        _ => target.clone(),
    }
}

/// The merge patch of one rollback request: the spec turned from `current`
/// into `spec` (none for a request refused or with nothing to write), the
/// mark added when the spec changes, the request removed; guarded by the
/// resourceVersion read, so a machine changed since is a conflict, not
/// overwritten (and the mark's generation, the one this write gives, holds).
pub fn patch(
    resource_version: &str,
    current: &Value,
    spec: Option<&Value>,
    mark: Option<&RollbackMark>,
) -> Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ROLLBACK_ANNOTATION.to_owned(), Value::Null);
    if let Some(mark) = mark {
        annotations.insert(
            ROLLBACK_OF_ANNOTATION.to_owned(),
            Value::String(serde_json::to_string(mark).expect("a mark serialises")),
        );
    }
    let mut patch =
        json!({"metadata": {"resourceVersion": resource_version, "annotations": annotations}});
    if let Some(spec) = spec {
        patch["spec"] = merge_diff(current, spec);
    }
    patch
}

/// Carries out the machine's rollback request, if it carries one and its
/// cluster is known, and publishes the Event; the action that ends the
/// reconcile then (the write brings the next one, which renders and applies
/// the spec written back).
pub(super) async fn if_requested(
    machine: &TalosMachine,
    cluster: Option<&TalosCluster>,
    ctx: &Context,
) -> Result<Option<Action>> {
    let (Some(_), Some(cluster)) = (requested(machine), cluster) else {
        return Ok(None);
    };
    let (type_, reason, note) = carry_out(machine, cluster, ctx).await?;
    super::publish(ctx, &machine.metadata, type_, reason, note).await;
    Ok(Some(Action::requeue(ctx.config.resync)))
}

/// Where the revision a request names stands in the history Secret.
enum Lookup {
    Kept(Box<store::RevisionRecord>),
    /// Why it cannot be written back.
    Refused(String),
}

/// The record of revision `number` of `machine`, read from its history
/// Secret (which only the controller reads).
async fn lookup(machine: &TalosMachine, number: u64, ctx: &Context) -> Result<Lookup> {
    let (namespace, name) = (machine.namespace().unwrap_or_default(), machine.name_any());
    let secret_name = store::secret_name(&namespace, &name);
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ctx.config.system_namespace);
    let secret = secrets
        .get_opt(&secret_name)
        .await
        .map_err(|source| Error::Kube {
            what: format!(
                "reading the history Secret {}/{secret_name} of TalosMachine {namespace}/{name} for its rollback to revision {number}",
                ctx.config.system_namespace
            ),
            source,
        })?;
    let data = secret
        .and_then(|s| s.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    Ok(match store::find(&data, number) {
        Ok(Some(record)) => Lookup::Kept(Box::new(record)),
        Ok(None) => Lookup::Refused(format!(
            "revision {number}'s inputs are no longer kept in the history Secret (it keeps the newest ones only)"
        )),
        Err(e) => Lookup::Refused(format!(
            "revision {number}'s inputs cannot be read: {}",
            ichor_api::error_text::chain(&e)
        )),
    })
}

/// Carries out the machine's rollback request against `cluster`: the
/// revision's machine spec written back, or, when it cannot be (not a
/// revision number, its inputs no longer kept or unreadable), the request
/// removed. Returns the Event to publish.
async fn carry_out(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
) -> Result<(EventType, &'static str, String)> {
    let raw = requested(machine).unwrap_or_default();
    let refused = |why: String| async move {
        write(machine, ctx, None, None).await?;
        Ok((
            EventType::Warning,
            ROLLBACK_REFUSED,
            format!("{why}; the request was removed"),
        ))
    };
    let Some(number) = rollback_target(raw) else {
        return refused(format!(
            "{ROLLBACK_ANNOTATION}: {raw:?} is not a revision number"
        ))
        .await;
    };
    let record = match lookup(machine, number, ctx).await? {
        Lookup::Kept(record) => record,
        Lookup::Refused(why) => return refused(why).await,
    };
    let plan = rollback::plan(
        &record,
        &serde_json::to_value(&machine.spec).unwrap_or_default(),
        &serde_json::to_value(&cluster.spec).unwrap_or_default(),
        false,
    );
    if plan.machine.fields.is_empty() {
        write(machine, ctx, None, None).await?;
        return Ok((
            EventType::Normal,
            ROLLBACK_WRITTEN,
            format!(
                "the machine's spec is revision {number}'s already: nothing to write back; the request was removed"
            ),
        ));
    }
    // A spec change raises the generation by one: the mark names the
    // generation this write gives, so the apply rendered from it is recorded
    // as the rollback.
    let mark = RollbackMark {
        revision: number,
        machine_generation: machine.metadata.generation.unwrap_or_default() + 1,
        cluster_generation: cluster.metadata.generation.unwrap_or_default(),
    };
    write(machine, ctx, Some(&plan.machine.spec), Some(&mark)).await?;
    let mut note = format!(
        "revision {number}'s {} written back to the spec; the change takes the usual hold-and-apply path",
        plan.machine.fields.join(", ")
    );
    if !plan.cluster_left.is_empty() {
        note.push_str(&format!(
            "; the cluster's {} differ from the revision's and were left as they are",
            plan.cluster_left.join(", ")
        ));
    }
    Ok((EventType::Normal, ROLLBACK_WRITTEN, note))
}

async fn write(
    machine: &TalosMachine,
    ctx: &Context,
    spec: Option<&Value>,
    mark: Option<&RollbackMark>,
) -> Result<()> {
    let (namespace, name) = (machine.namespace().unwrap_or_default(), machine.name_any());
    let version = machine.resource_version().unwrap_or_default();
    let current = serde_json::to_value(&machine.spec).unwrap_or_default();
    Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(patch(&version, &current, spec, mark)),
        )
        .await
        .map_err(|source| Error::Kube {
            what: format!("writing the rollback of TalosMachine {namespace}/{name}"),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R16.8 (the controller writes the revision's fields back with the mark, and removes the request, in one write guarded by the version read)
    #[test]
    fn the_patch_writes_fields_back_marks_them_and_removes_the_request() {
        let current = json!({"hold": true, "applyMode": "try", "removal": {"mode": "Wipe", "force": true},
            "patches": [{"name": "a", "inline": "x"}, {"name": "b", "inline": "y"}]});
        let spec = json!({"hold": true, "removal": {"mode": "Wipe"}, "patches": [{"name": "a", "inline": "x"}]});
        let mark = RollbackMark {
            revision: 1,
            machine_generation: 4,
            cluster_generation: 2,
        };
        let p = patch("77", &current, Some(&spec), Some(&mark));
        assert_eq!(p["metadata"]["resourceVersion"], "77");
        let annotations = &p["metadata"]["annotations"];
        assert_eq!(annotations[ROLLBACK_ANNOTATION], Value::Null);
        let written: RollbackMark =
            serde_json::from_str(annotations[ROLLBACK_OF_ANNOTATION].as_str().unwrap()).unwrap();
        assert_eq!(written, mark);
        assert_eq!(
            p["spec"],
            json!({"applyMode": null, "removal": {"force": null}, "patches": spec["patches"]})
        );
        // Merged as the API server merges, the spec is the one written back.
        let mut merged = current.clone();
        json_merge(&mut merged, &p["spec"]);
        assert_eq!(merged, spec);
        // A refusal only removes the request.
        let p = patch("77", &current, None, None);
        assert!(p.get("spec").is_none());
        assert_eq!(p["metadata"]["annotations"].as_object().unwrap().len(), 1);
    }

    /// RFC 7386's merge, as the API server applies a merge patch.
    fn json_merge(target: &mut Value, patch: &Value) {
        let Value::Object(p) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        let t = target.as_object_mut().unwrap();
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                json_merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}
