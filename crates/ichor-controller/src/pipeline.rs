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
    let kind = K::kind(&());
    let payload = match std::panic::AssertUnwindSafe(reconcile).catch_unwind().await {
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
        err.to_string(),
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
        error = %error,
        failures,
        retry_in = ?retry,
        "{kind} reconcile failed"
    );
    Action::requeue(retry)
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

/// Remembers, per watched object, the part of it another controller's
/// reconcile depends on. Every status write comes back as a watch event;
/// without this, one machine's status write would reconcile its cluster,
/// whose status write would reconcile all its machines, and so on.
#[derive(Debug)]
pub(crate) struct ChangeFilter<V> {
    seen: std::sync::Mutex<std::collections::HashMap<String, V>>,
}

impl<V> Default for ChangeFilter<V> {
    fn default() -> Self {
        ChangeFilter {
            seen: std::sync::Mutex::default(),
        }
    }
}

impl<V: PartialEq> ChangeFilter<V> {
    /// Records `now` (`None`: the object is gone) for `id`. Returns what was
    /// recorded before when the two differ (the first sighting of an object
    /// is a change), `None` when nothing that matters changed.
    pub(crate) fn changed(&self, id: String, now: Option<V>) -> Option<Option<V>> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match now {
            Some(v) => match seen.get(&id) {
                Some(before) if *before == v => None,
                _ => Some(seen.insert(id, v)),
            },
            None => seen.remove(&id).map(Some),
        }
    }
}

/// The smallest interval between two reconciles of one object: events that
/// come in between are coalesced into the next reconcile (the controller
/// runtime keeps one pending request per object while one runs).
#[derive(Debug, Default)]
pub(crate) struct Spacing {
    last: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl Spacing {
    /// How long the reconcile of `id` waits before it reads, so that it comes
    /// at least `interval` after the previous one; records its start.
    pub(crate) fn wait(&self, id: &str, interval: std::time::Duration) -> std::time::Duration {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let wait = last
            .get(id)
            .map(|at| (*at + interval).saturating_duration_since(now))
            .unwrap_or_default();
        last.insert(id.to_owned(), now + wait);
        wait
    }
}

/// A store one controller's watch fills and another controller's reconcile
/// reads, and whether the watch has listed everything once. (kube's own
/// `Store::wait_until_ready` wakes only the last of several concurrent
/// waiters, so reconciles that run at once would wait for ever.)
pub(crate) struct Shared<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub(crate) store: kube::runtime::reflector::Store<K>,
    ready: tokio::sync::watch::Receiver<bool>,
}

impl<K> Shared<K>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// An empty store, and what fills it.
    pub(crate) fn new() -> (Self, Filler<K>) {
        let (store, writer) = kube::runtime::reflector::store();
        let (tx, ready) = tokio::sync::watch::channel(false);
        (Shared { store, ready }, Filler { writer, ready: tx })
    }

    /// Waits until the store holds a complete list; false when it never
    /// will (the controller stops).
    pub(crate) async fn ready(&self) -> bool {
        let mut ready = self.ready.clone();
        ready.wait_for(|r| *r).await.is_ok()
    }
}

/// Drops an object's `metadata.managedFields` before it is stored: no
/// reconcile reads them, and with status written by server-side apply they
/// are a large part of each object a watch store holds.
pub(crate) fn forget_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The writing side of a [`Shared`] store.
pub(crate) struct Filler<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: kube::runtime::reflector::store::Writer<K>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl<K> Filler<K>
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// Passes a watch's events through the store (each is in the store
    /// before it goes on) and marks the store ready at the end of the
    /// first list.
    pub(crate) fn fill<S>(
        self,
        events: S,
    ) -> impl futures::Stream<Item = std::result::Result<K, kube::runtime::watcher::Error>>
    + Send
    + 'static
    where
        S: futures::Stream<
                Item = std::result::Result<
                    kube::runtime::watcher::Event<K>,
                    kube::runtime::watcher::Error,
                >,
            > + Send
            + 'static,
    {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        let ready = self.ready;
        events
            .modify(forget_managed_fields::<K>)
            .reflect(self.writer)
            .inspect(move |e| {
                if matches!(e, Ok(kube::runtime::watcher::Event::InitDone)) {
                    ready.send_replace(true);
                }
            })
            .touched_objects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = || Error::Client("the API server went away".into());
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

    /// The reconciles of one controller run at once and all wait for the
    /// other controller's store: every one of them must wake.
    /// Covers: the controller-at-scale goal (docs/benchmarks.md): shared stores
    #[tokio::test]
    async fn every_concurrent_waiter_sees_the_store_ready() {
        use futures::StreamExt as _;
        use kube::runtime::watcher::Event;
        let (shared, filler) = Shared::<k8s_openapi::api::core::v1::ConfigMap>::new();
        let shared = Arc::new(shared);
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&shared);
                tokio::spawn(async move { s.ready().await })
            })
            .collect();
        tokio::task::yield_now().await;
        let cm = k8s_openapi::api::core::v1::ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("n".into()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        };
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(cm)),
            Ok(Event::InitDone),
        ]);
        let touched: Vec<_> = filler.fill(events).collect().await;
        assert_eq!(touched.len(), 1);
        for w in waiters {
            assert!(w.await.unwrap());
        }
        assert_eq!(shared.store.state().len(), 1);
    }

    #[test]
    fn a_change_filter_passes_first_sightings_changes_and_removals_only() {
        let f = ChangeFilter::default();
        assert_eq!(f.changed("a".into(), Some(1)), Some(None));
        assert_eq!(f.changed("a".into(), Some(1)), None);
        assert_eq!(f.changed("a".into(), Some(2)), Some(Some(1)));
        assert_eq!(f.changed("b".into(), Some(2)), Some(None));
        assert_eq!(f.changed("a".into(), None), Some(Some(2)));
        assert_eq!(f.changed("a".into(), None), None);
    }

    #[test]
    fn spacing_delays_a_second_reconcile_within_the_interval_only() {
        let s = Spacing::default();
        let interval = std::time::Duration::from_secs(60);
        assert_eq!(s.wait("a", interval), std::time::Duration::ZERO);
        let second = s.wait("a", interval);
        assert!(second > std::time::Duration::from_secs(59), "{second:?}");
        assert_eq!(s.wait("b", interval), std::time::Duration::ZERO);
        assert_eq!(
            s.wait("c", std::time::Duration::ZERO),
            std::time::Duration::ZERO
        );
    }
}
