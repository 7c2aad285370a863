//! The stores the controllers share, and the filters that keep one
//! controller's status writes from reconciling the other's objects again
//! and again.

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
    use kube::api::ObjectMeta;
    use std::sync::Arc;

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
