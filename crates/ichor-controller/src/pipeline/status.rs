//! The status write: server-side apply of the status subresource, and
//! nothing else of the object.

use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;

use crate::{Error, FIELD_MANAGER, Result};

/// Server-side apply of `status` to the status subresource of
/// `namespace/name`; nothing else is sent.
pub(crate) async fn write_status<K>(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: &impl Serialize,
) -> Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": kind,
        "status": status,
    });
    Api::<K>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "writing the status of {kind} {namespace}/{name}"
        )))?;
    Ok(())
}
