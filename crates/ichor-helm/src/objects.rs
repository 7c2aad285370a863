//! Writing objects the way every Ichor writer does, so each step is safe to
//! run again: create-or-keep (a rerun finds the object and keeps it), and
//! server-side apply of an object known only at run time.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::Value;

/// What [`create_or_keep`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOrKeep<K> {
    /// The object was created; the server's copy.
    Created(K),
    /// An object of that name exists (409); it was left as it is.
    Kept,
}

/// Creates `obj`, keeping the one of that name that exists.
pub async fn create_or_keep<K>(
    api: &Api<K>,
    params: &PostParams,
    obj: &K,
) -> Result<CreateOrKeep<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(params, obj).await {
        Ok(created) => Ok(CreateOrKeep::Created(created)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(CreateOrKeep::Kept),
        Err(e) => Err(e),
    }
}

/// Server-side apply (forced, as `field_manager`) of `body`, an object of a
/// kind resolved at run time, named `name`. The body's `metadata.namespace`
/// is set to `namespace` (a namespaced object) or removed (a cluster-scoped one).
pub async fn apply_dynamic(
    api: &Api<DynamicObject>,
    field_manager: &str,
    name: &str,
    namespace: Option<&str>,
    mut body: Value,
) -> Result<DynamicObject, kube::Error> {
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        match namespace {
            Some(n) => meta.insert("namespace".into(), n.into()),
            None => meta.remove("namespace"),
        };
    }
    let pp = PatchParams::apply(field_manager).force();
    api.patch(name, &pp, &Patch::Apply(&body)).await
}
