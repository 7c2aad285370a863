//! What both reconcilers share. Each reconcile is read → decide → write:
//! the read and the write touch the API, the decision between them is a pure
//! function of what was read and the clock (in `cluster` and `machine`).
//! Here: the read of a watched object (a malformed one becomes an error on
//! that object and a Warning Event, and the watch goes on), the status write
//! (server-side apply of the status subresource, nothing else), Events, the
//! error policy, and the clock.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use serde::Serialize;

use crate::{Context, Error, FIELD_MANAGER, Result};

/// The clock the reconcilers read `now` from (conditions' transition times).
pub type Clock = fn() -> Time;

/// The system clock.
pub fn system_clock() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The object behind a [`DeserializeGuard`], or, for one that cannot be read
/// as its type, [`Error::Malformed`] after a Warning Event on it.
pub(crate) async fn readable<'a, K>(
    ctx: &Context,
    guarded: &'a DeserializeGuard<K>,
) -> Result<&'a K>
where
    K: kube::Resource<DynamicType = ()>,
{
    match &guarded.0 {
        Ok(obj) => Ok(obj),
        Err(invalid) => {
            let kind = K::kind(&());
            let err = Error::Malformed {
                kind: static_kind(&kind),
                namespace: invalid.metadata.namespace.clone().unwrap_or_default(),
                name: invalid.metadata.name.clone().unwrap_or_default(),
                reason: invalid.error.clone(),
            };
            publish_on(
                ctx,
                &kind,
                &invalid.metadata,
                EventType::Warning,
                "Malformed",
                err.to_string(),
            )
            .await;
            Err(err)
        }
    }
}

/// The kinds Ichor reconciles, as the `'static` names errors carry.
fn static_kind(kind: &str) -> &'static str {
    match kind {
        "TalosCluster" => "TalosCluster",
        "TalosMachine" => "TalosMachine",
        "TalosOperation" => "TalosOperation",
        _ => "object",
    }
}

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

/// The error policy of both controllers: count, log, requeue after
/// `Config::error_requeue`.
pub(crate) fn error_policy<K>(
    controller: &'static str,
    obj: Arc<DeserializeGuard<K>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action
where
    K: kube::Resource<DynamicType = ()>,
{
    ctx.metrics.failed(controller, error.metric_label());
    let kind = K::kind(&());
    tracing::warn!(
        object = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
        error = %error,
        "{kind} reconcile failed"
    );
    Action::requeue(ctx.config.error_requeue)
}

fn reference(kind: &str, meta: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{}/{}", ichor_api::GROUP, ichor_api::VERSION)),
        kind: Some(kind.into()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    }
}

/// Publishes an Event on an Ichor object (failures are logged at debug only:
/// an Event is a courtesy, never a reason to fail a reconcile).
pub(crate) async fn publish_on(
    ctx: &Context,
    kind: &str,
    meta: &ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &reference(kind, meta)).await {
        tracing::debug!(error = %e, "publishing an Event");
    }
}
