//! Prometheus metrics, in the text exposition format, without a metrics
//! library: a few counters and gauges are all the controller needs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The controller's counters and gauges.
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    applies: Mutex<BTreeMap<&'static str, u64>>,
    operations: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    steps: Mutex<BTreeMap<(&'static str, &'static str), Histogram>>,
    running: Mutex<BTreeMap<(&'static str, &'static str), i64>>,
    last_backups: Mutex<BTreeMap<String, LastBackup>>,
    backups: Mutex<BTreeMap<(String, &'static str), u64>>,
    leader: AtomicU64,
    ready: AtomicU64,
}

impl Metrics {
    /// One reconcile of `controller` (`talosmachine`, `taloscluster`).
    pub fn reconciled(&self, controller: &'static str) {
        *lock(&self.reconciles).entry(controller).or_default() += 1;
    }

    /// One failed reconcile, by error label.
    pub fn failed(&self, controller: &'static str, label: &'static str) {
        *lock(&self.errors).entry((controller, label)).or_default() += 1;
    }

    /// One apply to a node, by outcome (`applied`, `failed`, `read_back_mismatch`).
    pub fn applied(&self, outcome: &'static str) {
        *lock(&self.applies).entry(outcome).or_default() += 1;
    }

    /// One TalosOperation finished, by kind (`talos-upgrade`, …) and phase (`Succeeded`, `Failed`).
    pub fn operation_finished(&self, kind: &'static str, phase: &'static str) {
        *lock(&self.operations).entry((kind, phase)).or_default() += 1;
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
        lock(&self.steps)
            .entry((kind, step))
            .or_default()
            .observe(took.as_secs_f64());
    }

    /// An operation of `kind` entered `phase` (`Pending`, `Running`,
    /// `Succeeded`, `Failed`), leaving `from` if it was in one: the gauge of
    /// operations by kind and phase as this replica saw them.
    pub fn operation_phase(
        &self,
        kind: &'static str,
        from: Option<&'static str>,
        phase: &'static str,
    ) {
        let mut running = lock(&self.running);
        if let Some(from) = from {
            *running.entry((kind, from)).or_default() -= 1;
        }
        *running.entry((kind, phase)).or_default() += 1;
    }

    /// A succeeded backup of `cluster` (`namespace/name`) seen, finished or
    /// read back from its status: the gauges keep the newest by finish
    /// time, so they are whole again after a restart.
    pub fn backup_succeeded(&self, cluster: &str, last: LastBackup) {
        let mut map = lock(&self.last_backups);
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
        *lock(&self.backups)
            .entry((cluster.to_owned(), result))
            .or_default() += 1;
    }

    /// Whether this replica holds the leader Lease.
    pub fn set_leader(&self, leader: bool) {
        self.leader.store(u64::from(leader), Ordering::Relaxed);
    }

    /// Whether the servers run (for `/readyz`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(u64::from(ready), Ordering::Relaxed);
    }

    /// Whether the servers run.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) == 1
    }

    /// Failed reconciles of `controller` with error `label` so far.
    pub fn failures(&self, controller: &'static str, label: &'static str) -> u64 {
        lock(&self.errors)
            .get(&(controller, label))
            .copied()
            .unwrap_or(0)
    }

    /// The text exposition format (`text/plain; version=0.0.4`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP ichor_reconciles_total Reconciles run, by controller.\n# TYPE ichor_reconciles_total counter\n");
        for (c, n) in lock(&self.reconciles).iter() {
            let _ = writeln!(out, "ichor_reconciles_total{{controller=\"{c}\"}} {n}");
        }
        out.push_str("# HELP ichor_reconcile_errors_total Failed reconciles, by controller and error.\n# TYPE ichor_reconcile_errors_total counter\n");
        for ((c, e), n) in lock(&self.errors).iter() {
            let _ = writeln!(
                out,
                "ichor_reconcile_errors_total{{controller=\"{c}\",error=\"{e}\"}} {n}"
            );
        }
        out.push_str("# HELP ichor_node_applies_total Config applies to nodes, by outcome.\n# TYPE ichor_node_applies_total counter\n");
        for (o, n) in lock(&self.applies).iter() {
            let _ = writeln!(out, "ichor_node_applies_total{{outcome=\"{o}\"}} {n}");
        }
        out.push_str("# HELP ichor_operations_total TalosOperations finished, by kind and phase.\n# TYPE ichor_operations_total counter\n");
        for ((k, p), n) in lock(&self.operations).iter() {
            let _ = writeln!(
                out,
                "ichor_operations_total{{kind=\"{k}\",phase=\"{p}\"}} {n}"
            );
        }
        out.push_str("# HELP ichor_operations TalosOperations by kind and the phase this replica last moved them to.\n# TYPE ichor_operations gauge\n");
        for ((k, p), n) in lock(&self.running).iter() {
            let _ = writeln!(out, "ichor_operations{{kind=\"{k}\",phase=\"{p}\"}} {n}");
        }
        out.push_str("# HELP ichor_operation_step_duration_seconds How long the steps of TalosOperations took, by kind and step.\n# TYPE ichor_operation_step_duration_seconds histogram\n");
        for ((k, st), h) in lock(&self.steps).iter() {
            h.render(
                &mut out,
                "ichor_operation_step_duration_seconds",
                &format!("kind=\"{k}\",step=\"{st}\""),
            );
        }
        self.render_backups(&mut out);
        let _ = writeln!(
            out,
            "# HELP ichor_leader Whether this replica holds the leader Lease.\n# TYPE ichor_leader gauge\nichor_leader {}",
            self.leader.load(Ordering::Relaxed)
        );
        out
    }
}

impl Metrics {
    fn render_backups(&self, out: &mut String) {
        let last = lock(&self.last_backups);
        let gauge =
            |out: &mut String, name: &str, help: &str, value: &dyn Fn(&LastBackup) -> String| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                for (cluster, b) in last.iter() {
                    let _ = writeln!(out, "{name}{{cluster=\"{cluster}\"}} {}", value(b));
                }
            };
        gauge(
            out,
            "ichor_backup_last_success_timestamp_seconds",
            "When the newest succeeded backup of each TalosCluster finished (Unix time).",
            &|b| b.finished_seconds.to_string(),
        );
        gauge(
            out,
            "ichor_backup_last_size_bytes",
            "The bytes the newest succeeded backup of each TalosCluster wrote, all parts together.",
            &|b| b.size_bytes.to_string(),
        );
        gauge(
            out,
            "ichor_backup_last_duration_seconds",
            "How long the newest succeeded backup of each TalosCluster took.",
            &|b| b.duration_seconds.to_string(),
        );
        out.push_str("# HELP ichor_backups_total Backups this replica took, by TalosCluster and result.\n# TYPE ichor_backups_total counter\n");
        for ((cluster, result), n) in lock(&self.backups).iter() {
            let _ = writeln!(
                out,
                "ichor_backups_total{{cluster=\"{cluster}\",result=\"{result}\"}} {n}"
            );
        }
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

/// The upper bounds of the step-duration buckets, in seconds: a drain or a
/// reboot takes minutes, an apply well under a second.
const STEP_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// A Prometheus histogram over [`STEP_BUCKETS`].
#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; 11],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (i, le) in STEP_BUCKETS.iter().enumerate() {
            if v <= *le {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (i, le) in STEP_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{le}\"}} {}",
                self.counts[i]
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_labels() {
        let m = Metrics::default();
        m.reconciled("talosmachine");
        m.reconciled("talosmachine");
        m.failed("talosmachine", "talos");
        m.applied("applied");
        m.set_leader(true);
        m.operation_finished("talos-upgrade", "Succeeded");
        m.operation_step(
            "talos-upgrade",
            "Draining",
            std::time::Duration::from_secs(20),
        );
        m.operation_phase("talos-upgrade", None, "Running");
        m.operation_phase("talos-upgrade", Some("Running"), "Succeeded");
        let text = m.render();
        assert!(
            text.contains("ichor_operations_total{kind=\"talos-upgrade\",phase=\"Succeeded\"} 1")
        );
        assert!(text.contains("ichor_operation_step_duration_seconds_bucket{kind=\"talos-upgrade\",step=\"Draining\",le=\"15\"} 0"));
        assert!(text.contains("ichor_operation_step_duration_seconds_bucket{kind=\"talos-upgrade\",step=\"Draining\",le=\"30\"} 1"));
        assert!(text.contains("ichor_operation_step_duration_seconds_count{kind=\"talos-upgrade\",step=\"Draining\"} 1"));
        assert!(text.contains("ichor_operations{kind=\"talos-upgrade\",phase=\"Running\"} 0"));
        assert!(text.contains("ichor_operations{kind=\"talos-upgrade\",phase=\"Succeeded\"} 1"));
        assert!(text.contains("ichor_reconciles_total{controller=\"talosmachine\"} 2"));
        assert!(text.contains(
            "ichor_reconcile_errors_total{controller=\"talosmachine\",error=\"talos\"} 1"
        ));
        assert!(text.contains("ichor_node_applies_total{outcome=\"applied\"} 1"));
        assert!(text.contains("ichor_leader 1"));
        assert_eq!(m.failures("talosmachine", "talos"), 1);
    }

    /// Covers: R20.9
    #[test]
    fn backup_metrics_keep_the_newest_success_per_cluster() {
        let m = Metrics::default();
        let at = |finished_seconds, size_bytes, duration_seconds| LastBackup {
            finished_seconds,
            size_bytes,
            duration_seconds,
        };
        m.backup_succeeded("ns/a", at(1_796_000_100, 2048, 12.5));
        // An older one read back later (a restart's first look) changes nothing.
        m.backup_succeeded("ns/a", at(1_796_000_000, 1024, 3.0));
        m.backup_succeeded("ns/b", at(1_796_000_050, 512, 1.0));
        m.backup_finished("ns/a", "succeeded");
        m.backup_finished("ns/a", "failed");
        m.backup_finished("ns/a", "failed");
        let text = m.render();
        let expected = "\
# HELP ichor_backup_last_success_timestamp_seconds When the newest succeeded backup of each TalosCluster finished (Unix time).
# TYPE ichor_backup_last_success_timestamp_seconds gauge
ichor_backup_last_success_timestamp_seconds{cluster=\"ns/a\"} 1796000100
ichor_backup_last_success_timestamp_seconds{cluster=\"ns/b\"} 1796000050
# HELP ichor_backup_last_size_bytes The bytes the newest succeeded backup of each TalosCluster wrote, all parts together.
# TYPE ichor_backup_last_size_bytes gauge
ichor_backup_last_size_bytes{cluster=\"ns/a\"} 2048
ichor_backup_last_size_bytes{cluster=\"ns/b\"} 512
# HELP ichor_backup_last_duration_seconds How long the newest succeeded backup of each TalosCluster took.
# TYPE ichor_backup_last_duration_seconds gauge
ichor_backup_last_duration_seconds{cluster=\"ns/a\"} 12.5
ichor_backup_last_duration_seconds{cluster=\"ns/b\"} 1
# HELP ichor_backups_total Backups this replica took, by TalosCluster and result.
# TYPE ichor_backups_total counter
ichor_backups_total{cluster=\"ns/a\",result=\"failed\"} 2
ichor_backups_total{cluster=\"ns/a\",result=\"succeeded\"} 1
";
        assert!(text.contains(expected), "{text}");
        // Before any backup the families are declared, with no sample.
        let empty = Metrics::default().render();
        assert!(
            empty.contains("# TYPE ichor_backups_total counter\n# HELP ichor_leader"),
            "{empty}"
        );
    }
}
