//! etcd per control plane, as the TalosMachine reconcile last read it
//! through the Talos API, and the leader changes seen between reads.

use std::collections::{BTreeMap, HashSet};

use super::objects::{GaugeFamily, Value, counter, gauge};

/// What one member answered to `EtcdStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdReading {
    pub member_id: u64,
    /// The leader's member id; 0 when the member knows none.
    pub leader: u64,
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub raft_term: u64,
    pub is_learner: bool,
    /// How many errors and alarms the member reported.
    pub alarms: usize,
    /// When it was read (Unix seconds).
    pub at_seconds: i64,
}

impl EtcdReading {
    /// The reading of a Talos `EtcdStatus` answer, made at `at_seconds`.
    pub fn of(s: &ichor_talos_client::etcd::EtcdStatus, at_seconds: i64) -> Self {
        EtcdReading {
            member_id: s.member_id,
            leader: s.leader,
            db_size: s.db_size,
            db_size_in_use: s.db_size_in_use,
            raft_term: s.raft_term,
            is_learner: s.is_learner,
            alarms: s.errors.len(),
            at_seconds,
        }
    }
}

/// The newest reading per machine, and each cluster's leader as last seen.
#[derive(Debug, Clone, Default)]
pub(crate) struct Readings {
    /// By machine (`namespace/name`): its cluster (`namespace/name`) and the reading.
    members: BTreeMap<String, (String, EtcdReading)>,
    /// By cluster (`namespace/name`): the leader last seen and the changes counted.
    leaders: BTreeMap<String, (u64, u64)>,
}

impl Readings {
    /// Keeps `reading` as the newest of `machine`; a leader other than the
    /// one its cluster had counts as a change (no leader is not one).
    pub(crate) fn record(&mut self, cluster: &str, machine: &str, reading: EtcdReading) {
        if reading.leader != 0 {
            let (leader, changes) = self.leaders.entry(cluster.to_owned()).or_default();
            if *leader != 0 && *leader != reading.leader {
                *changes += 1;
            }
            *leader = reading.leader;
        }
        self.members
            .insert(machine.to_owned(), (cluster.to_owned(), reading));
    }
}

/// A per-member gauge: its name, help, and value of a reading.
type MemberGauge = (&'static str, &'static str, fn(&EtcdReading) -> i64);

/// The per-member gauges after `ichor_etcd_member_info`, in order.
const MEMBER_GAUGES: [MemberGauge; 8] = [
    (
        "ichor_etcd_member_has_leader",
        "Whether the etcd member knows a leader",
        |m| i64::from(m.leader != 0),
    ),
    (
        "ichor_etcd_member_is_leader",
        "Whether the etcd member is the leader",
        |m| i64::from(m.leader != 0 && m.leader == m.member_id),
    ),
    (
        "ichor_etcd_member_learner",
        "Whether the etcd member is a learner",
        |m| i64::from(m.is_learner),
    ),
    (
        "ichor_etcd_member_db_size_bytes",
        "The size of the etcd member's database",
        |m| m.db_size,
    ),
    (
        "ichor_etcd_member_db_size_in_use_bytes",
        "The part of the etcd member's database in use",
        |m| m.db_size_in_use,
    ),
    (
        "ichor_etcd_member_alarms",
        "Errors and alarms the etcd member reports",
        |m| i64::try_from(m.alarms).unwrap_or(i64::MAX),
    ),
    (
        "ichor_etcd_member_raft_term",
        "The etcd member's Raft term (one more at each election)",
        |m| i64::try_from(m.raft_term).unwrap_or(i64::MAX),
    ),
    (
        "ichor_etcd_status_timestamp_seconds",
        "When the etcd member's status was read (Unix time)",
        |m| m.at_seconds,
    ),
];

/// The etcd families: members that are still in `machines` (all of them
/// when not `watching`), and the leader changes of their clusters.
pub(crate) fn families(
    r: &Readings,
    machines: &HashSet<String>,
    watching: bool,
) -> Vec<GaugeFamily> {
    let mut info = gauge(
        "ichor_etcd_member_info",
        "One per control plane whose etcd member answered, with its member id",
    );
    let mut gauges: Vec<GaugeFamily> = MEMBER_GAUGES
        .iter()
        .map(|(name, help, _)| gauge(name, help))
        .collect();
    let mut clusters = HashSet::new();
    for (machine, (cluster, m)) in &r.members {
        if watching && !machines.contains(machine) {
            continue;
        }
        let (namespace, name) = machine.split_once('/').unwrap_or(("", machine));
        clusters.insert(cluster.clone());
        let cluster_name = cluster.split_once('/').map_or(cluster.as_str(), |(_, c)| c);
        let key = || {
            vec![
                ("namespace", namespace.to_owned()),
                ("cluster", cluster_name.to_owned()),
                ("machine", name.to_owned()),
            ]
        };
        let mut labels = key();
        labels.push(("member_id", format!("{:x}", m.member_id)));
        info.push(labels, Value::Int(1));
        for (family, (_, _, value)) in gauges.iter_mut().zip(MEMBER_GAUGES.iter()) {
            family.push(key(), Value::Int(value(m)));
        }
    }
    let mut out = vec![info];
    out.append(&mut gauges);
    out.push(leader_changes(r, &clusters));
    out
}

/// `ichor_etcd_leader_changes_total` of the `clusters` whose members are reported.
fn leader_changes(r: &Readings, clusters: &HashSet<String>) -> GaugeFamily {
    let mut changes = counter(
        "ichor_etcd_leader_changes",
        "etcd leader changes this replica saw between reads of a cluster's members",
    );
    for (cluster, (_, n)) in &r.leaders {
        if !clusters.contains(cluster) {
            continue;
        }
        let (namespace, name) = cluster.split_once('/').unwrap_or(("", cluster));
        changes.push(
            vec![
                ("namespace", namespace.to_owned()),
                ("cluster", name.to_owned()),
            ],
            Value::Int(i64::try_from(*n).unwrap_or(i64::MAX)),
        );
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(member_id: u64, leader: u64) -> EtcdReading {
        EtcdReading {
            member_id,
            leader,
            db_size: 4096,
            db_size_in_use: 2048,
            raft_term: 2,
            is_learner: false,
            alarms: 0,
            at_seconds: 100,
        }
    }

    #[test]
    fn leader_changes_count_a_new_leader_not_a_lost_one() {
        let mut r = Readings::default();
        r.record("ns/c", "ns/cp-1", reading(1, 1));
        r.record("ns/c", "ns/cp-2", reading(2, 1));
        assert_eq!(r.leaders["ns/c"], (1, 0));
        // No leader for a moment (an election), then another one.
        r.record("ns/c", "ns/cp-2", reading(2, 0));
        assert_eq!(r.leaders["ns/c"], (1, 0));
        r.record("ns/c", "ns/cp-2", reading(2, 2));
        assert_eq!(r.leaders["ns/c"], (2, 1));
    }

    /// Covers: R17.5
    #[test]
    fn a_deleted_machine_loses_its_member_series() {
        let mut r = Readings::default();
        r.record("ns/c", "ns/cp-1", reading(1, 1));
        r.record("ns/c", "ns/cp-2", reading(2, 0));
        let machines: HashSet<String> = ["ns/cp-1".to_owned()].into();
        let fams = families(&r, &machines, true);
        let info = &fams[0];
        assert_eq!(info.samples.len(), 1);
        assert_eq!(
            info.samples[0].labels,
            vec![
                ("namespace", "ns".to_owned()),
                ("cluster", "c".to_owned()),
                ("machine", "cp-1".to_owned()),
                ("member_id", "1".to_owned()),
            ]
        );
        assert_eq!(fams[2].samples[0].value, Value::Int(1), "cp-1 leads");
        assert_eq!(
            fams.last().unwrap().samples.len(),
            1,
            "the cluster's changes"
        );
        // Gone from the cache: nothing of it, nor of its cluster, is left.
        let fams = families(&r, &HashSet::new(), true);
        assert!(fams.iter().all(|f| f.samples.is_empty()));
    }
}
