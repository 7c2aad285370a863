//! The UI's view of the cluster: kube-rs reflectors over Ichor's four kinds,
//! kept current by watches, so a page reads memory and never lists objects
//! per request.

use std::time::Duration;

use futures::StreamExt as _;
use ichor_api::{IchorInstallation, TalosCluster, TalosMachine, TalosOperation};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::task::JoinSet;

use crate::view::Inventory;

/// The four reflector stores.
#[derive(Clone)]
pub struct Cache {
    clusters: Store<TalosCluster>,
    machines: Store<TalosMachine>,
    operations: Store<TalosOperation>,
    installations: Store<IchorInstallation>,
}

/// Starts one reflector (watch + store) and returns its store.
fn reflect<K>(client: &kube::Client, tasks: &mut JoinSet<()>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    tasks.spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            // A missing CRD or a refused watch retries with backoff; the
            // pages show what the store has meanwhile (R4.3f: an absent
            // IchorInstallation is an empty store, not an error).
            if let Err(e) = event {
                tracing::warn!(kind = %K::kind(&()), error = %ichor_api::error_text::chain(&e), "watch failed, retrying");
            }
        }
    });
    reader
}

impl Cache {
    /// Starts the reflectors; they run until the returned tasks are dropped.
    pub fn start(client: &kube::Client) -> (Cache, JoinSet<()>) {
        let mut tasks = JoinSet::new();
        let cache = Cache {
            clusters: reflect(client, &mut tasks),
            machines: reflect(client, &mut tasks),
            operations: reflect(client, &mut tasks),
            installations: reflect(client, &mut tasks),
        };
        (cache, tasks)
    }

    /// Waits until every store has had its first list (or `limit` passed:
    /// the pages then show what is there, and fill in as the watches catch up).
    pub async fn wait_ready(&self, limit: Duration) -> bool {
        let all = async {
            let _ = futures::join!(
                self.clusters.wait_until_ready(),
                self.machines.wait_until_ready(),
                self.operations.wait_until_ready(),
                self.installations.wait_until_ready(),
            );
        };
        tokio::time::timeout(limit, all).await.is_ok()
    }

    /// The stores' contents now.
    pub fn inventory(&self) -> Inventory {
        let installation = self.installations.state().into_iter().find(|i| {
            i.metadata.name.as_deref() == Some(ichor_api::INSTALLATION_NAME)
                && i.metadata.namespace.as_deref() == Some(ichor_api::SYSTEM_NAMESPACE)
        });
        Inventory {
            clusters: self.clusters.state(),
            machines: self.machines.state(),
            operations: self.operations.state(),
            installation,
        }
    }
}
