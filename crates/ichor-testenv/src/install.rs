//! Installing what a test needs on the test control plane: CustomResourceDefinitions,
//! served before the call returns.
//!
//! The CRDs are given by the caller (`ichor_api::crds::all()`): ichor-api's
//! own tests use this crate, so it cannot use ichor-api.
use std::fmt;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject};

use crate::wait::{self, Seen, WaitError};

/// How long the apiserver may take to serve a new CRD on a loaded machine.
pub const CRD_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a CRD's state is looked at while waiting.
const CRD_POLL: Duration = Duration::from_millis(200);

#[derive(thiserror::Error)]
pub enum InstallError {
    #[error("the CustomResourceDefinition {name} has no served version")]
    NoServedVersion { name: String },
    #[error("creating the CustomResourceDefinition {name}")]
    Create { name: String, source: kube::Error },
    #[error("waiting for the CustomResourceDefinition {name} to be served")]
    NotServed { name: String, source: WaitError },
}

/// The error and its causes, so that a test's `unwrap()` reads as a sentence.
impl fmt::Debug for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::chain(self))
    }
}

/// Creates `crds` (one already there is kept: the control plane is shared
/// by the test binary's tests) and waits until each is Established and its
/// kind can be listed.
pub async fn crds(
    client: &kube::Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<(), InstallError> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut created = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let served = served_resource(&crd)
            .ok_or_else(|| InstallError::NoServedVersion { name: name.clone() })?;
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(source) => return Err(InstallError::Create { name, source }),
        }
        created.push((name, served));
    }
    for (name, served) in created {
        let kind = Api::<DynamicObject>::all_with(client.clone(), &served);
        let what = format!("the CustomResourceDefinition {name} to be served");
        wait::until(what, CRD_TIMEOUT, CRD_POLL, || async {
            let conditions = match api.get(&name).await {
                Ok(got) => got.status.and_then(|s| s.conditions).unwrap_or_default(),
                Err(e) => return Seen::not_yet(crate::chain(&e)),
            };
            if !conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                let said: Vec<_> = conditions
                    .iter()
                    .map(|c| {
                        format!(
                            "{}={} {}",
                            c.type_,
                            c.status,
                            c.message.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                return Seen::not_yet(format!("conditions {said:?}"));
            }
            match kind.list(&ListParams::default().limit(1)).await {
                Ok(_) => Seen::Done(()),
                Err(e) => Seen::not_yet(format!("Established, listing: {}", crate::chain(&e))),
            }
        })
        .await
        .map_err(|source| InstallError::NotServed { name, source })?;
    }
    Ok(())
}

/// The kind of `crd` at its storage version (the served one, else the first served).
fn served_resource(crd: &CustomResourceDefinition) -> Option<ApiResource> {
    let spec = &crd.spec;
    let served = || spec.versions.iter().filter(|v| v.served);
    let version = served().find(|v| v.storage).or_else(|| served().next())?;
    Some(ApiResource {
        group: spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", spec.group, version.name),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(versions: serde_json::Value) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.test"},
            "spec": {
                "group": "example.test",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": versions,
            }
        }))
        .unwrap()
    }

    fn version(name: &str, served: bool, storage: bool) -> serde_json::Value {
        serde_json::json!({"name": name, "served": served, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object"}}})
    }

    #[test]
    fn a_crd_is_listed_at_its_served_storage_version() {
        let r = served_resource(&crd(serde_json::json!([
            version("v1alpha1", true, false),
            version("v1", true, true),
            version("v2", false, false),
        ])))
        .unwrap();
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str(), r.plural.as_str()),
            ("example.test/v1", "Widget", "widgets")
        );
        let none = served_resource(&crd(serde_json::json!([version("v1", false, true)])));
        assert!(none.is_none());
    }
}
