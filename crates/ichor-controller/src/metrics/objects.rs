//! The gauges about Ichor's objects, computed at scrape time: a
//! [`Snapshot`] of the watch caches and of what the reconciles saw, then
//! [`families`], a pure function of it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};

use ichor_api::{
    DriftClass, OperationPhase, TalosCluster, TalosMachine, TalosOperation, machine::MachineRole,
};
use kube::ResourceExt as _;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::bundle::{Ca, CaDates};
use super::etcd::Readings;
use super::{LastBackup, Seen, lock};

/// Where the object gauges are read from; empty until the leader's
/// controllers start.
#[derive(Default)]
pub(crate) struct Sources {
    pub(crate) context: Option<Weak<crate::Context>>,
    pub(crate) operations: Option<Store<DeserializeGuard<TalosOperation>>>,
}

/// A machine's last applies, as this replica made them (Unix seconds).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applies {
    pub(crate) last_success: Option<i64>,
    pub(crate) last_failure: Option<i64>,
}

/// The `prometheus-client` collector over [`Seen`].
pub(crate) struct Collector(pub(crate) Arc<Seen>);

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in families(&Snapshot::take(&self.0)) {
            // The registry's own families end their help with a period.
            let help = format!("{}.", family.help);
            let mut metric = encoder.encode_descriptor(
                family.name,
                &help,
                None,
                if family.counter {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                },
            )?;
            for sample in &family.samples {
                let one = metric.encode_family(&sample.labels)?;
                match sample.value {
                    Value::Int(v) if family.counter => {
                        ConstCounter::new(u64::try_from(v).unwrap_or(0)).encode(one)?;
                    }
                    Value::Int(v) => ConstGauge::new(v).encode(one)?,
                    Value::Float(v) => ConstGauge::new(v).encode(one)?,
                }
            }
        }
        Ok(())
    }
}

/// The objects and observations one scrape reports.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Whether the watch caches are known: without them (a replica that
    /// does not lead, or before it starts) nothing is filtered by them.
    pub(crate) watching: bool,
    pub(crate) machines: Vec<TalosMachine>,
    pub(crate) clusters: Vec<TalosCluster>,
    pub(crate) operations: Vec<TalosOperation>,
    /// CA dates by (namespace, bundle Secret name).
    pub(crate) bundles: HashMap<(String, String), CaDates>,
    pub(crate) applies: HashMap<String, Applies>,
    pub(crate) etcd: Readings,
    pub(crate) last_backups: BTreeMap<String, LastBackup>,
}

impl Snapshot {
    fn take(seen: &Seen) -> Snapshot {
        let (context, operations) = {
            let sources = lock(&seen.sources);
            (
                sources.context.as_ref().and_then(Weak::upgrade),
                sources.operations.clone(),
            )
        };
        let mut snapshot = Snapshot {
            applies: lock(&seen.applies).clone(),
            etcd: lock(&seen.etcd).clone(),
            last_backups: lock(&seen.last_backups).clone(),
            ..Snapshot::default()
        };
        if let Some(ctx) = context {
            snapshot.watching = true;
            snapshot.machines = valid(&ctx.machines.store);
            snapshot.clusters = valid(&ctx.clusters.store);
            snapshot.bundles = ctx.credentials.bundle_dates();
        }
        if let Some(store) = operations {
            snapshot.operations = valid(&store);
        }
        snapshot
    }
}

/// The objects of a watch cache that deserialized.
fn valid<K>(store: &Store<DeserializeGuard<K>>) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + 'static,
{
    store
        .state()
        .iter()
        .filter_map(|o| o.0.as_ref().ok().cloned())
        .collect()
}

/// One family's samples.
#[derive(Debug, PartialEq)]
pub(crate) struct GaugeFamily {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    /// A counter (`_total` is added to the name) rather than a gauge.
    pub(crate) counter: bool,
    pub(crate) samples: Vec<Sample>,
}

#[derive(Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) labels: Vec<(&'static str, String)>,
    pub(crate) value: Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Float(f64),
}

pub(crate) fn gauge(name: &'static str, help: &'static str) -> GaugeFamily {
    GaugeFamily {
        name,
        help,
        counter: false,
        samples: Vec::new(),
    }
}

impl GaugeFamily {
    pub(crate) fn push(&mut self, labels: Vec<(&'static str, String)>, value: Value) {
        self.samples.push(Sample { labels, value });
    }
}

fn flag(b: bool) -> Value {
    Value::Int(i64::from(b))
}

/// Every object gauge of `s`, in the order docs/metrics.md lists them.
pub(crate) fn families(s: &Snapshot) -> Vec<GaugeFamily> {
    let mut out = machine_families(s);
    out.extend(cluster_families(s));
    out.extend(super::etcd::families(&s.etcd, &machine_ids(s), s.watching));
    out.extend(operation_families(&s.operations));
    out.extend(backup_families(s));
    out
}

/// `namespace/name` of every machine in the cache.
fn machine_ids(s: &Snapshot) -> HashSet<String> {
    s.machines.iter().map(id).collect()
}

fn id(o: &impl kube::Resource) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or_default(),
        o.meta().name.as_deref().unwrap_or_default()
    )
}

fn class_name(c: DriftClass) -> &'static str {
    match c {
        DriftClass::A => "A",
        DriftClass::B => "B",
        DriftClass::C => "C",
    }
}

const CLASSES: [DriftClass; 3] = [DriftClass::A, DriftClass::B, DriftClass::C];

/// Machines by (worst drift class, held).
type CountsByState = BTreeMap<(&'static str, bool), i64>;

fn machine_families(s: &Snapshot) -> Vec<GaugeFamily> {
    let mut info = gauge(
        "ichor_machine_info",
        "One per TalosMachine: its cluster, role and the Talos version the node reported",
    );
    let mut held = gauge(
        "ichor_machine_held",
        "Whether the TalosMachine is held (spec.hold)",
    );
    let mut paths = gauge(
        "ichor_machine_drift_paths",
        "Config paths where the node differs from the desired config, by class",
    );
    let mut applied = gauge(
        "ichor_machine_last_apply_timestamp_seconds",
        "When an apply to the machine last succeeded (Unix time)",
    );
    let mut failed = gauge(
        "ichor_machine_last_apply_failure_timestamp_seconds",
        "When an apply to the machine last failed (Unix time)",
    );
    for m in &s.machines {
        let namespace = m.namespace().unwrap_or_default();
        let cluster = m.spec.cluster_ref.name.clone();
        let key = || {
            vec![
                ("namespace", namespace.clone()),
                ("machine", m.name_any()),
                ("cluster", cluster.clone()),
            ]
        };
        let drift = m.status.as_ref().map(|s| s.drift.as_slice()).unwrap_or(&[]);
        let mut labels = key();
        labels.push(("role", role_name(m.spec.role).to_owned()));
        let version = m.status.as_ref().and_then(|s| s.talos_version.clone());
        labels.push(("talos_version", version.unwrap_or_default()));
        info.push(labels, Value::Int(1));
        held.push(key(), flag(m.spec.hold));
        for class in CLASSES {
            let n = drift.iter().filter(|d| d.class == class).count();
            let mut labels = key();
            labels.push(("class", class_name(class).to_owned()));
            paths.push(labels, Value::Int(i64::try_from(n).unwrap_or(i64::MAX)));
        }
        let seen = s.applies.get(&id(m)).copied().unwrap_or_default();
        if let Some(at) = seen.last_success {
            applied.push(key(), Value::Int(at));
        }
        if let Some(at) = seen.last_failure {
            failed.push(key(), Value::Int(at));
        }
    }
    vec![
        machine_counts(&s.machines),
        info,
        held,
        paths,
        applied,
        failed,
    ]
}

/// `ichor_machines`: every combination of worst drift class and hold for
/// each cluster that has machines, 0 when none.
fn machine_counts(machines: &[TalosMachine]) -> GaugeFamily {
    let mut counts = gauge(
        "ichor_machines",
        "TalosMachines by cluster, worst drift class (none, A, B, C) and hold",
    );
    let mut by_cluster: BTreeMap<(String, String), CountsByState> = BTreeMap::new();
    for m in machines {
        let drift = m.status.as_ref().map(|s| s.drift.as_slice()).unwrap_or(&[]);
        let worst = drift
            .iter()
            .map(|d| d.class)
            .max()
            .map_or("none", class_name);
        *by_cluster
            .entry((
                m.namespace().unwrap_or_default(),
                m.spec.cluster_ref.name.clone(),
            ))
            .or_default()
            .entry((worst, m.spec.hold))
            .or_default() += 1;
    }
    for ((namespace, cluster), seen) in by_cluster {
        for drift in ["none", "A", "B", "C"] {
            for hold in [false, true] {
                counts.push(
                    vec![
                        ("namespace", namespace.clone()),
                        ("cluster", cluster.clone()),
                        ("drift", drift.to_owned()),
                        ("held", hold.to_string()),
                    ],
                    Value::Int(seen.get(&(drift, hold)).copied().unwrap_or(0)),
                );
            }
        }
    }
    counts
}

fn role_name(r: MachineRole) -> &'static str {
    match r {
        MachineRole::Controlplane => "controlplane",
        MachineRole::Worker => "worker",
    }
}

fn cluster_families(s: &Snapshot) -> Vec<GaugeFamily> {
    let mut info = gauge(
        "ichor_cluster_info",
        "One per TalosCluster: the Talos and Kubernetes versions its spec asks for",
    );
    let mut not_after = gauge(
        "ichor_certificate_expiration_timestamp_seconds",
        "When each CA certificate of the cluster's secrets bundle expires (NotAfter, Unix time)",
    );
    let mut not_before = gauge(
        "ichor_certificate_not_before_timestamp_seconds",
        "When each CA certificate of the cluster's secrets bundle became valid (NotBefore, Unix time)",
    );
    let mut key_created = gauge(
        "ichor_service_account_key_created_timestamp_seconds",
        "When the cluster's bundle Secret was created: its service-account key is at least this old (Unix time)",
    );
    for c in &s.clusters {
        let namespace = c.namespace().unwrap_or_default();
        let key = || vec![("namespace", namespace.clone()), ("cluster", c.name_any())];
        let mut labels = key();
        labels.push(("talos_version", c.spec.talos_version.clone()));
        labels.push(("kubernetes_version", c.spec.kubernetes_version.clone()));
        info.push(labels, Value::Int(1));
        let Some(dates) = s
            .bundles
            .get(&(namespace.clone(), c.spec.secrets_ref.name.clone()))
        else {
            continue;
        };
        for (ca, validity) in &dates.cas {
            let mut labels = key();
            labels.push(("ca", Ca::label(*ca).to_owned()));
            not_after.push(labels.clone(), Value::Int(validity.not_after));
            not_before.push(labels, Value::Int(validity.not_before));
        }
        if let Some(at) = dates.secret_created {
            key_created.push(key(), Value::Int(at));
        }
    }
    vec![info, not_after, not_before, key_created]
}

const PHASES: [OperationPhase; 6] = [
    OperationPhase::Pending,
    OperationPhase::Running,
    OperationPhase::Waiting,
    OperationPhase::Paused,
    OperationPhase::Succeeded,
    OperationPhase::Failed,
];

fn phase_name(p: OperationPhase) -> &'static str {
    match p {
        OperationPhase::Pending => "Pending",
        OperationPhase::Running => "Running",
        OperationPhase::Waiting => "Waiting",
        OperationPhase::Paused => "Paused",
        OperationPhase::Succeeded => "Succeeded",
        OperationPhase::Failed => "Failed",
    }
}

fn operation_families(ops: &[TalosOperation]) -> Vec<GaugeFamily> {
    let mut counts = gauge(
        "ichor_operations",
        "TalosOperations in each phase now, by kind",
    );
    let mut phase = gauge(
        "ichor_operation_phase",
        "One series per phase for each TalosOperation: 1 for its phase, 0 for the others",
    );
    let mut started = gauge(
        "ichor_operation_start_timestamp_seconds",
        "When the TalosOperation started running (status.startTime, Unix time)",
    );
    let mut by_kind: BTreeMap<&'static str, [i64; 6]> = BTreeMap::new();
    for op in ops {
        let kind = op.spec.kind.as_str();
        let now = op.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
        let key = || {
            vec![
                ("namespace", op.namespace().unwrap_or_default()),
                ("operation", op.name_any()),
                ("cluster", op.spec.target.cluster_ref.name.clone()),
                ("kind", kind.to_owned()),
            ]
        };
        let counts = by_kind.entry(kind).or_default();
        for (i, p) in PHASES.into_iter().enumerate() {
            if p == now {
                counts[i] += 1;
            }
            let mut labels = key();
            labels.push(("phase", phase_name(p).to_owned()));
            phase.push(labels, flag(p == now));
        }
        if let Some(t) = op.status.as_ref().and_then(|s| s.start_time.as_ref()) {
            started.push(key(), Value::Int(t.0.as_second()));
        }
    }
    for kind in ichor_api::OperationKind::ALL {
        let n = by_kind.get(kind.as_str()).copied().unwrap_or_default();
        for (i, p) in PHASES.into_iter().enumerate() {
            counts.push(
                vec![
                    ("kind", kind.as_str().to_owned()),
                    ("phase", phase_name(p).to_owned()),
                ],
                Value::Int(n[i]),
            );
        }
    }
    vec![counts, phase, started]
}

fn backup_families(s: &Snapshot) -> Vec<GaugeFamily> {
    let clusters: HashSet<String> = s.clusters.iter().map(id).collect();
    let mut at = gauge(
        "ichor_backup_last_success_timestamp_seconds",
        "When the newest succeeded backup of each TalosCluster finished (Unix time)",
    );
    let mut size = gauge(
        "ichor_backup_last_size_bytes",
        "The bytes the newest succeeded backup of each TalosCluster wrote, all parts together",
    );
    let mut took = gauge(
        "ichor_backup_last_duration_seconds",
        "How long the newest succeeded backup of each TalosCluster took",
    );
    for (cluster, b) in &s.last_backups {
        if s.watching && !clusters.contains(cluster) {
            continue;
        }
        let labels = || vec![("cluster", cluster.clone())];
        at.push(labels(), Value::Int(b.finished_seconds));
        size.push(labels(), Value::Int(b.size_bytes));
        took.push(labels(), Value::Float(b.duration_seconds));
    }
    vec![at, size, took]
}

/// A family that is a counter.
pub(crate) fn counter(name: &'static str, help: &'static str) -> GaugeFamily {
    GaugeFamily {
        counter: true,
        ..gauge(name, help)
    }
}
