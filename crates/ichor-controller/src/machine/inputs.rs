//! What a TalosMachine's reconcile depends on, apart from the node: a
//! machine whose inputs did not change since its last success waits for its
//! resync instead of reading the node again.

use ichor_api::conditions;
use ichor_api::{TalosCluster, TalosMachine};
use kube::ResourceExt as _;

fn handover(c: &TalosCluster) -> bool {
    c.status
        .as_ref()
        .is_some_and(|s| conditions::inline_cni_dropped(&s.conditions))
}

/// What of a TalosCluster its machines' reconciles depend on (its status
/// is Ready aggregated from them, which they do not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterInputs {
    uid: String,
    generation: Option<i64>,
    handover: bool,
}

impl ClusterInputs {
    pub(crate) fn of(cluster: &TalosCluster) -> Self {
        ClusterInputs {
            uid: cluster.uid().unwrap_or_default(),
            generation: cluster.metadata.generation,
            handover: handover(cluster),
        }
    }
}

/// What a machine's reconcile depends on, apart from the node itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReconcileInputs {
    uid: String,
    generation: Option<i64>,
    cluster: ClusterInputs,
}

impl ReconcileInputs {
    pub(super) fn of(machine: &TalosMachine, cluster: &TalosCluster) -> Self {
        ReconcileInputs {
            uid: machine.uid().unwrap_or_default(),
            generation: machine.metadata.generation,
            cluster: ClusterInputs::of(cluster),
        }
    }
}

/// When each machine was last reconciled successfully, and with which inputs.
#[derive(Debug, Default)]
pub(crate) struct RecentSuccesses {
    seen:
        std::sync::Mutex<std::collections::HashMap<String, (ReconcileInputs, std::time::Instant)>>,
}

impl RecentSuccesses {
    /// The time left before the resync when nothing changed since the last success.
    pub(super) fn fresh(
        &self,
        key: &ReconcileInputs,
        resync: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (k, at) = seen.get(&key.uid)?;
        let elapsed = at.elapsed();
        (k == key && elapsed < resync).then(|| resync - elapsed)
    }

    pub(super) fn mark(&self, key: ReconcileInputs) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Deleted machines leave entries behind; drop the old ones now and then.
        if seen.len() >= 4096 {
            seen.retain(|_, (_, at)| at.elapsed() < std::time::Duration::from_secs(3600));
        }
        seen.insert(key.uid.clone(), (key, std::time::Instant::now()));
    }
}
