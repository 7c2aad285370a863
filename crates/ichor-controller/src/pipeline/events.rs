//! Events on Ichor's objects: a courtesy, never a reason to fail a
//! reconcile.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::ObjectMeta;
use kube::runtime::events::{Event, EventType};

use crate::Context;

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
        tracing::debug!(error = %ichor_api::error_text::chain(&e), "publishing an Event");
    }
}
