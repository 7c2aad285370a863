//! The last step of a kubernetes-upgrade, the bootstrap-manifests sync, as
//! `talosctl upgrade-k8s` ends, with Ichor's rules: its I/O. What the sync
//! writes and never writes, and the decision ([`plan`]), are
//! `ichor_reconcile::operation::manifests`'s (re-exported here); here the
//! manifests as Talos serves them ([`struct_to_json`]), the read of what
//! the cluster holds ([`read`]) and the apply ([`sync`]).

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value};

pub use ichor_reconcile::operation::manifests::*;

use crate::{Error, FIELD_MANAGER, Result};

/// A `google.protobuf.Struct` as JSON. Numbers that are whole become
/// integers, as Talos's own conversion ends (a Struct has only doubles,
/// and the API server reads `2.0` as no int32).
pub fn struct_to_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect::<Map<String, Value>>(),
    )
}

fn value_to_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                Value::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => struct_to_json(s),
    }
}

fn api(client: &kube::Client, o: &ManifestObject) -> Option<Api<DynamicObject>> {
    let (group, version, kind, plural) = writable(&o.group, &o.kind)?;
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    Some(Api::namespaced_with(
        client.clone(),
        &o.namespace,
        &resource,
    ))
}

/// Reads what the cluster holds of each writable object and decides.
pub async fn read(client: &kube::Client, objects: Vec<ManifestObject>) -> Result<Plan> {
    let mut live = BTreeMap::new();
    for o in objects.iter().filter(|o| is_writable(o)) {
        let Some(api) = api(client, o) else { continue };
        let found = api.get_opt(&o.name).await.map_err(Error::kube(format!(
            "reading {o} of Talos's bootstrap manifests"
        )))?;
        if let Some(found) = found {
            live.insert(
                o.to_string(),
                Live {
                    annotations: found.metadata.annotations.unwrap_or_default(),
                    labels: found.metadata.labels.unwrap_or_default(),
                },
            );
        }
    }
    Ok(plan(objects, &|o| live.get(&o.to_string()).cloned()))
}

/// Applies the plan's objects (server-side, forced, the controller's field
/// manager). Only objects [`read`] found are in the plan; one deleted in
/// the moment between the read and its apply would be created again, as
/// Talos's own apply would create it. `Ok(Some(why))`: the API server
/// rejects an object as invalid (an immutable field such as a selector made
/// otherwise than Talos makes it) — retrying cannot help, so the step fails
/// with `why`.
pub async fn sync(client: &kube::Client, plan: &Plan) -> Result<Option<String>> {
    for o in &plan.apply {
        let Some(api) = api(client, o) else { continue };
        let mut body = o.body.clone();
        if let Some(md) = body.get_mut("metadata").and_then(Value::as_object_mut) {
            md.insert("namespace".into(), Value::String(o.namespace.clone()));
        }
        match api
            .patch(
                &o.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 422 => {
                return Ok(Some(format!(
                    "the API server rejects {o} as Talos's bootstrap manifest {} has it: {}; Talos creates this object only when it is missing, so the live one was made another way — make it match Talos's manifest (or delete it for Talos to create it at the next boot), then create the operation again",
                    o.manifest, e.message
                )));
            }
            Err(e) => {
                return Err(Error::kube(format!(
                    "applying {o} from Talos's bootstrap manifest {}",
                    o.manifest
                ))(e));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Covers: kubernetes-upgrade, ADR 0014 (a Struct's doubles come back as the integers they were)
    #[test]
    fn struct_numbers_become_integers_when_whole() {
        use prost_types::value::Kind;
        let num = |n| prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let s = prost_types::Struct {
            fields: [
                ("replicas".to_string(), num(2.0)),
                ("ratio".to_string(), num(0.5)),
            ]
            .into(),
        };
        assert_eq!(struct_to_json(&s), json!({"replicas": 2, "ratio": 0.5}));
    }
}
