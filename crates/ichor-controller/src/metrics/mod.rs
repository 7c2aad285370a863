//! Prometheus metrics through `prometheus-client` (docs/metrics.md lists
//! them): counters and histograms this replica counts as it works, and
//! gauges about Ichor's objects read at scrape time from the watch caches
//! ([`objects`]), so a deleted object's series go with it.

mod bundle;
mod etcd;
mod objects;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use bundle::{Ca, CaDates, bundle_dates};
pub use etcd::EtcdReading;

/// The `Content-Type` of `/metrics`: the Prometheus text format 0.0.4
/// (Prometheus scrapes it, `promtool check metrics` reads it; in
/// OpenMetrics the counter `ichor_operations_total` and the gauge
/// `ichor_operations` would be one family name twice).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The upper bounds of the step-duration buckets, in seconds: a drain or a
/// reboot takes minutes, an apply well under a second.
const STEP_BUCKETS: [f64; 11] = [
    0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// The upper bounds of the reconcile-duration buckets, in seconds: most
/// reconciles read and write a few objects; one that talks to a node or
/// runs a step waits for it.
const RECONCILE_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindPhase {
    kind: &'static str,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindStep {
    kind: &'static str,
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackupResult {
    cluster: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Version {
    version: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The controller's metrics: what it counts, and where the gauges about
/// objects are read from at scrape time.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    reconcile_durations: Histograms<ControllerLabels>,
    applies: Family<OutcomeLabels, Counter>,
    tries: Family<OutcomeLabels, Counter>,
    operations: Family<KindPhase, Counter>,
    phase_changes: Family<KindPhase, Counter>,
    steps: Histograms<KindStep>,
    backups: Family<BackupResult, Counter>,
    leader: Gauge,
    ready: AtomicBool,
    seen: Arc<Seen>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// What the reconciles saw that the scrape-time gauges report, keyed by
/// object (`namespace/name`), and the watch caches to join it with.
#[derive(Default)]
pub(crate) struct Seen {
    last_backups: Mutex<BTreeMap<String, LastBackup>>,
    applies: Mutex<HashMap<String, objects::Applies>>,
    etcd: Mutex<etcd::Readings>,
    sources: Mutex<objects::Sources>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(concat!("v", env!("CARGO_PKG_VERSION")))
    }
}

impl Metrics {
    /// Every family registered, the controller's `version` in `ichor_build_info`.
    pub fn new(version: &str) -> Self {
        let mut r = Registry::default();
        let build = Family::<Version, Gauge>::default();
        build
            .get_or_create(&Version {
                version: version.to_owned(),
            })
            .set(1);
        let seen = Arc::new(Seen::default());
        let metrics = Metrics {
            reconciles: registered(&mut r, "ichor_reconciles", "Reconciles run, by controller"),
            errors: registered(
                &mut r,
                "ichor_reconcile_errors",
                "Failed reconciles, by controller and error",
            ),
            reconcile_durations: registered_with(
                &mut r,
                "ichor_reconcile_duration_seconds",
                "How long reconciles took, by controller",
                Family::new_with_constructor(|| Histogram::new(RECONCILE_BUCKETS)),
            ),
            applies: registered(
                &mut r,
                "ichor_node_applies",
                "Config applies to nodes, by outcome",
            ),
            tries: registered(
                &mut r,
                "ichor_try_applies",
                "Applies in Talos's try mode, by outcome: tried, confirmed, reverted",
            ),
            operations: registered(
                &mut r,
                "ichor_operations",
                "TalosOperations finished, by kind and phase",
            ),
            phase_changes: registered(
                &mut r,
                "ichor_operation_phase_changes",
                "TalosOperations this replica moved into a phase, by kind and phase",
            ),
            steps: registered_with(
                &mut r,
                "ichor_operation_step_duration_seconds",
                "How long the steps of TalosOperations took, by kind and step",
                Family::new_with_constructor(|| Histogram::new(STEP_BUCKETS)),
            ),
            backups: registered(
                &mut r,
                "ichor_backups",
                "Backups this replica took, by TalosCluster and result",
            ),
            leader: registered(
                &mut r,
                "ichor_leader",
                "Whether this replica holds the leader Lease",
            ),
            ready: AtomicBool::new(false),
            seen: Arc::clone(&seen),
            registry: Registry::default(),
        };
        r.register("ichor_build_info", "The controller's version", build);
        r.register_collector(Box::new(objects::Collector(seen)));
        Metrics {
            registry: r,
            ..metrics
        }
    }

    /// One reconcile of `controller` (`talosmachine`, `taloscluster`).
    pub fn reconciled(&self, controller: &'static str) {
        self.reconciles
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// One reconcile of an object of `kind` (`TalosMachine`, …) ended after `took`.
    pub fn reconcile_took(&self, kind: &str, took: std::time::Duration) {
        let controller = match kind {
            "TalosMachine" => "talosmachine",
            "TalosCluster" => "taloscluster",
            "TalosOperation" => "talosoperation",
            "TalosBackup" => "talosbackup",
            _ => "other",
        };
        self.reconcile_durations
            .get_or_create(&ControllerLabels { controller })
            .observe(took.as_secs_f64());
    }

    /// One failed reconcile, by error label.
    pub fn failed(&self, controller: &'static str, label: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller,
                error: label,
            })
            .inc();
    }

    /// One apply to a node, by outcome (`applied`, `failed`, `read_back_mismatch`).
    pub fn applied(&self, outcome: &'static str) {
        self.applies.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// One step of an apply in try mode: `tried` (applied, Talos reverts it
    /// unless confirmed), `confirmed` or `reverted`.
    pub fn try_apply(&self, outcome: &'static str) {
        self.tries.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// One apply to the machine `namespace/name`, at `at_seconds` (Unix
    /// time), by outcome: counted, and its time kept for the machine's
    /// last-apply gauges.
    pub fn applied_to(&self, machine: &str, outcome: &'static str, at_seconds: i64) {
        self.applied(outcome);
        let mut applies = lock(&self.seen.applies);
        let entry = applies.entry(machine.to_owned()).or_default();
        if outcome == "applied" {
            entry.last_success = Some(at_seconds);
        } else {
            entry.last_failure = Some(at_seconds);
        }
    }

    /// One TalosOperation finished, by kind (`talos-upgrade`, …) and phase (`Succeeded`, `Failed`).
    pub fn operation_finished(&self, kind: &'static str, phase: &'static str) {
        self.operations
            .get_or_create(&KindPhase { kind, phase })
            .inc();
    }

    /// One step of a TalosOperation done, by kind and step (`Draining`,
    /// `kubelet/wait`, …), with how long it took from its start (recorded in
    /// status, so waits across reconciles count whole).
    pub fn operation_step(
        &self,
        kind: &'static str,
        step: &'static str,
        took: std::time::Duration,
    ) {
        self.steps
            .get_or_create(&KindStep { kind, step })
            .observe(took.as_secs_f64());
    }

    /// An operation of `kind` entered `phase` (`Pending`, `Running`,
    /// `Waiting`, `Succeeded`, `Failed`). The gauge of operations by phase
    /// is read from the watch cache at scrape time; this counts the moves.
    pub fn operation_phase(
        &self,
        kind: &'static str,
        _from: Option<&'static str>,
        phase: &'static str,
    ) {
        self.phase_changes
            .get_or_create(&KindPhase { kind, phase })
            .inc();
    }

    /// A succeeded backup of `cluster` (`namespace/name`) seen, finished or
    /// read back from its status: the gauges keep the newest by finish
    /// time, so they are whole again after a restart.
    pub fn backup_succeeded(&self, cluster: &str, last: LastBackup) {
        let mut map = lock(&self.seen.last_backups);
        let newer = map
            .get(cluster)
            .is_none_or(|seen| seen.finished_seconds <= last.finished_seconds);
        if newer {
            map.insert(cluster.to_owned(), last);
        }
    }

    /// A backup of `cluster` this replica took ended, by `result`
    /// (`succeeded`, `failed`).
    pub fn backup_finished(&self, cluster: &str, result: &'static str) {
        self.backups
            .get_or_create(&BackupResult {
                cluster: cluster.to_owned(),
                result,
            })
            .inc();
    }

    /// What the etcd member on the control plane `machine` of `cluster`
    /// (both `namespace/name`) answered.
    pub fn etcd_read(&self, cluster: &str, machine: &str, reading: EtcdReading) {
        lock(&self.seen.etcd).record(cluster, machine, reading);
    }

    /// Whether this replica holds the leader Lease.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Whether the servers run (for `/readyz`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the servers run.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Failed reconciles of `controller` with error `label` so far.
    pub fn failures(&self, controller: &'static str, label: &'static str) -> u64 {
        self.errors
            .get(&ErrorLabels {
                controller,
                error: label,
            })
            .map_or(0, |c| c.get())
    }

    /// Where the gauges about objects are read from at scrape time: the
    /// leader's watch caches and credentials (before this, and on a replica
    /// that does not lead, there are none).
    pub(crate) fn read_objects_of(&self, ctx: &Arc<crate::Context>) {
        lock(&self.seen.sources).context = Some(Arc::downgrade(ctx));
    }

    /// The TalosOperation controller's watch cache, for the operation gauges.
    pub(crate) fn read_operations_of(
        &self,
        store: kube::runtime::reflector::Store<
            kube::core::DeserializeGuard<ichor_api::TalosOperation>,
        >,
    ) {
        lock(&self.seen.sources).operations = Some(store);
    }

    /// The Prometheus text format 0.0.4 (`text/plain; version=0.0.4`), which
    /// `promtool check metrics` reads.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The newest succeeded backup of a cluster, for its gauges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LastBackup {
    /// When it finished, in Unix seconds.
    pub finished_seconds: i64,
    pub size_bytes: i64,
    pub duration_seconds: f64,
}

/// A new metric registered under `name`, and the handle to count with.
fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    registered_with(registry, name, help, M::default())
}

/// `metric` registered under `name`, and the handle to count with.
fn registered_with<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
