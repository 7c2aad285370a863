//! The boundary of each reconcile: the read of a watched object, the
//! unwind boundary around the reconcile, and the error policy that
//! requeues a failed object after its back-off.

use std::sync::Arc;

use kube::ResourceExt as _;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use ichor_api::error_text::{chain, with_help};

use super::publish_on;
use crate::{Context, Error, Result};

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
                ichor_api::error_text::chain(&err),
            )
            .await;
            Err(err)
        }
    }
}

/// Runs one reconcile behind an unwind boundary: a panic (a defect reached
/// by one object's input) becomes [`Error::Panicked`] on that object, a
/// Warning Event on it and the `panic` label of the error counter, and the
/// process with its webhooks and every other object goes on. The error
/// policy then requeues the object like any failed reconcile.
pub(crate) async fn unwind_boundary<K, F>(
    ctx: Arc<Context>,
    obj: Arc<DeserializeGuard<K>>,
    reconcile: F,
) -> Result<kube::runtime::controller::Action>
where
    K: kube::Resource<DynamicType = ()>,
    F: std::future::Future<Output = Result<kube::runtime::controller::Action>>,
{
    use futures::FutureExt as _;
    use tracing::Instrument as _;
    let kind = K::kind(&());
    // Every log line of the reconcile, and every Talos call in it, names
    // the object through this span.
    let span = tracing::info_span!(
        "reconcile",
        kind = %kind,
        object = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
    );
    let started = std::time::Instant::now();
    let outcome = std::panic::AssertUnwindSafe(reconcile)
        .catch_unwind()
        .instrument(span)
        .await;
    ctx.metrics.reconcile_took(&kind, started.elapsed());
    let payload = match outcome {
        Ok(result) => {
            if result.is_ok() {
                let namespace = obj.namespace().unwrap_or_default();
                ctx.failures.succeeded(&kind, &namespace, &obj.name_any());
            }
            return result;
        }
        Err(payload) => payload,
    };
    let err = Error::Panicked {
        kind: static_kind(&kind),
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        message: panic_text(payload.as_ref()),
    };
    publish_on(
        &ctx,
        &kind,
        kube::Resource::meta(obj.as_ref()),
        EventType::Warning,
        "ReconcilePanicked",
        ichor_api::error_text::chain(&err),
    )
    .await;
    Err(err)
}

/// A panic payload as text fit for an Event: the first line, quoted values
/// redacted, at most 200 characters.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let raw = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    let first = raw.lines().next().unwrap_or_default();
    let mut text = ichor_talos::redact::quoted_values(first);
    if let Some((cut, _)) = text.char_indices().nth(200) {
        text.truncate(cut);
        text.push('…');
    }
    text
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

/// The error policy of every controller: count, log, requeue after the
/// object's back-off (`Config::error_requeue` doubled with each failure in
/// a row, up to `Config::error_requeue_max`, with jitter).
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
    let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let failures = ctx.failures.failed(&kind, &namespace, &name);
    let retry = crate::backoff::wait(
        failures,
        ctx.config.error_requeue,
        ctx.config.error_requeue_max,
        &format!("{kind}/{namespace}/{name}"),
    );
    tracing::warn!(
        object = %format!("{namespace}/{name}"),
        error = %with_help(chain(error), error.help()),
        failures,
        retry_in = ?retry,
        "{kind} reconcile failed"
    );
    Action::requeue(retry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Shared;

    /// A context whose client is never called (no server behind it).
    fn offline_context() -> Arc<Context> {
        let client =
            kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        Arc::new(Context::new(
            client,
            crate::Config {
                error_requeue: std::time::Duration::from_secs(15),
                error_requeue_max: std::time::Duration::from_secs(600),
                ..crate::Config::default()
            },
            Arc::default(),
            Shared::new().0,
            Shared::new().0,
            Shared::new().0,
        ))
    }

    fn machine(name: &str) -> Arc<DeserializeGuard<ichor_api::TalosMachine>> {
        let m: ichor_api::TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"clusterRef": {"name": "prod"}, "address": "10.0.0.1", "role": "worker"}
        }))
        .unwrap();
        Arc::new(DeserializeGuard(Ok(m)))
    }

    /// Covers: R18.5 (every failed reconcile backs off: the wait doubles with
    /// each failure in a row of that object, with its own jitter, and a
    /// success starts it again from the first wait)
    #[tokio::test]
    async fn a_failing_object_is_retried_later_each_time_until_it_succeeds() {
        let ctx = offline_context();
        let err = || Error::ClusterNotFound {
            namespace: "team-a".into(),
            machine: "w1".into(),
            cluster: "gone".into(),
        };
        let expected = |n: u32| {
            Action::requeue(crate::backoff::wait(
                n,
                ctx.config.error_requeue,
                ctx.config.error_requeue_max,
                "TalosMachine/team-a/w1",
            ))
        };
        for n in 1..=6 {
            let action = error_policy("machine", machine("w1"), &err(), ctx.clone());
            assert_eq!(action, expected(n), "failure {n}");
        }
        assert_ne!(expected(1), expected(6), "the wait grew");
        // Another object starts at its own first wait.
        let other = error_policy("machine", machine("w2"), &err(), ctx.clone());
        assert_ne!(other, expected(6));
        // A success resets w1.
        let ok = unwind_boundary(ctx.clone(), machine("w1"), async {
            Ok(Action::requeue(std::time::Duration::from_secs(300)))
        })
        .await;
        assert!(ok.is_ok());
        let action = error_policy("machine", machine("w1"), &err(), ctx.clone());
        assert_eq!(action, expected(1));
    }
}
