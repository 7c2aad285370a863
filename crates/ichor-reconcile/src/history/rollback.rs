//! A rollback, decided without I/O: which spec fields an earlier revision's
//! inputs write back, and the mark that lets the controller record the
//! apply that follows as a rollback of that revision.
//!
//! The mark names the generations the rollback's write produced, so it
//! speaks for that spec only: a later spec change (a new generation) or an
//! apply already recorded for it leaves later applies as drift.

use ichor_api::history::MachineRevision;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::store::RevisionRecord;

/// Set together with the spec a rollback writes back: which revision's
/// inputs it is, and the generations that write gave the TalosMachine and
/// the TalosCluster (JSON, [`RollbackMark`]).
pub const ROLLBACK_OF_ANNOTATION: &str = "ichor.maesh.dev/rollback-of";

/// The value of [`ROLLBACK_OF_ANNOTATION`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RollbackMark {
    /// The revision whose inputs were written back.
    pub revision: u64,
    /// The TalosMachine's generation once they were.
    pub machine_generation: i64,
    /// The TalosCluster's generation once they were.
    pub cluster_generation: i64,
}

/// The revision an apply rolls back, if the machine carries a mark for the
/// generations it was rendered from and no revision kept has recorded that
/// rollback yet. `annotations` is the machine's `metadata.annotations`.
pub fn rollback_of(
    annotations: Option<&Value>,
    machine_generation: Option<i64>,
    cluster_generation: Option<i64>,
    history: &[MachineRevision],
) -> Option<u64> {
    let raw = annotations?.get(ROLLBACK_OF_ANNOTATION)?.as_str()?;
    let mark: RollbackMark = serde_json::from_str(raw).ok()?;
    let current = Some(mark.machine_generation) == machine_generation
        && Some(mark.cluster_generation) == cluster_generation;
    let recorded = history.iter().any(|r| {
        r.rollback_of == Some(mark.revision)
            && r.machine_generation == machine_generation
            && r.cluster_generation == cluster_generation
    });
    (current && !recorded).then_some(mark.revision)
}

/// The TalosMachine's spec fields a rollback leaves as they are: who the
/// machine is and where it is in its life, not what its config is made of.
pub const MACHINE_FIELDS_KEPT: &[&str] = &[
    "clusterRef",
    "role",
    "address",
    "hold",
    "removal",
    "replaces",
];

/// The TalosCluster's spec fields a rollback leaves as they are: its secrets
/// and its backups are not inputs of a node's config.
pub const CLUSTER_FIELDS_KEPT: &[&str] = &["secretsRef", "backup", "maintenanceWindows"];

/// One spec written back: the fields that change, and the spec to write.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecWrite {
    /// The top-level spec fields whose value changes, sorted.
    pub fields: Vec<String>,
    /// The spec to write (the current one with those fields as recorded).
    pub spec: Value,
}

/// What rolling back to a record writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The revision rolled back to.
    pub revision: u64,
    pub machine: SpecWrite,
    /// The cluster's fields written back (`--include-cluster`); `None`
    /// otherwise.
    pub cluster: Option<SpecWrite>,
    /// Without `--include-cluster`: the cluster's fields that differ from
    /// the record and stay as they are (so the config rendered can differ
    /// from the revision's).
    pub cluster_left: Vec<String>,
}

impl Plan {
    /// Nothing to write: the specs are the record's already.
    pub fn is_empty(&self) -> bool {
        self.machine.fields.is_empty() && self.cluster.as_ref().is_none_or(|c| c.fields.is_empty())
    }
}

/// `current` with every field of `recorded` not in `kept` as recorded
/// (fields the record lacks are removed).
fn write_back(current: &Value, recorded: &Value, kept: &[&str]) -> SpecWrite {
    let empty = Map::new();
    let current = current.as_object().unwrap_or(&empty);
    let recorded = recorded.as_object().unwrap_or(&empty);
    let mut spec = Map::new();
    let mut fields = Vec::new();
    let keys: std::collections::BTreeSet<&String> = current.keys().chain(recorded.keys()).collect();
    for key in keys {
        let value = if kept.contains(&key.as_str()) {
            current.get(key)
        } else {
            recorded.get(key)
        };
        if value != current.get(key) {
            fields.push(key.clone());
        }
        if let Some(v) = value {
            spec.insert(key.clone(), v.clone());
        }
    }
    SpecWrite {
        fields,
        spec: Value::Object(spec),
    }
}

/// The plan to write `record`'s inputs back over the current specs.
pub fn plan(
    record: &RevisionRecord,
    machine_spec: &Value,
    cluster_spec: &Value,
    include_cluster: bool,
) -> Plan {
    let machine = write_back(machine_spec, &record.machine_spec, MACHINE_FIELDS_KEPT);
    let cluster = write_back(cluster_spec, &record.cluster_spec, CLUSTER_FIELDS_KEPT);
    let (cluster, cluster_left) = if include_cluster {
        (Some(cluster), Vec::new())
    } else {
        (None, cluster.fields)
    };
    Plan {
        revision: record.revision.number,
        machine,
        cluster,
        cluster_left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::history::{RevisionApplyMode, RevisionOutcome, RevisionReason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn revision(number: u64, rollback_of: Option<u64>, generations: (i64, i64)) -> MachineRevision {
        MachineRevision {
            number,
            time: Time(k8s_openapi::jiff::Timestamp::from_second(1_796_198_400).unwrap()),
            config_hash_before: None,
            config_hash_after: "sha256:00".into(),
            apply_mode: RevisionApplyMode::NoReboot,
            reason: RevisionReason::Drift,
            operation: None,
            rollback_of,
            machine_generation: Some(generations.0),
            cluster_generation: Some(generations.1),
            changed_by: None,
            changed_paths: Vec::new(),
            outcome: RevisionOutcome::Applied,
        }
    }

    fn marked(revision: u64, machine: i64, cluster: i64) -> Value {
        let mark = RollbackMark {
            revision,
            machine_generation: machine,
            cluster_generation: cluster,
        };
        json!({ ROLLBACK_OF_ANNOTATION: serde_json::to_string(&mark).unwrap() })
    }

    /// Covers: R16.7
    #[test]
    fn the_mark_names_the_rollback_for_its_generations_once() {
        let a = marked(1, 5, 2);
        assert_eq!(rollback_of(Some(&a), Some(5), Some(2), &[]), Some(1));
        // A later spec change, or a cluster change, is not the rollback.
        assert_eq!(rollback_of(Some(&a), Some(6), Some(2), &[]), None);
        assert_eq!(rollback_of(Some(&a), Some(5), Some(3), &[]), None);
        // Recorded already: a later apply of the same specs is drift.
        let kept = [revision(3, Some(1), (5, 2))];
        assert_eq!(rollback_of(Some(&a), Some(5), Some(2), &kept), None);
        // No mark, or one that is not Ichor's.
        assert_eq!(rollback_of(None, Some(5), Some(2), &[]), None);
        let forged = json!({ ROLLBACK_OF_ANNOTATION: "3" });
        assert_eq!(rollback_of(Some(&forged), Some(5), Some(2), &[]), None);
    }

    /// Covers: R16.7
    #[test]
    fn a_plan_writes_back_config_fields_and_keeps_the_machines_place() {
        let record = RevisionRecord {
            revision: revision(1, None, (2, 1)),
            machine_spec: json!({"clusterRef": {"name": "lab"}, "role": "worker",
                "address": "10.5.0.2", "hold": false, "patches": [{"name": "a", "inline": "x"}]}),
            cluster_spec: json!({"talosVersion": "v1.13.0", "secretsRef": {"name": "old"}}),
            rendered_config: String::new(),
        };
        let machine = json!({"clusterRef": {"name": "lab"}, "role": "worker",
            "address": "10.5.0.2", "hold": true,
            "patches": [{"name": "a", "inline": "x"}, {"name": "b", "inline": "y"}],
            "applyMode": "try"});
        let cluster = json!({"talosVersion": "v1.13.1", "secretsRef": {"name": "new"}});
        let p = plan(&record, &machine, &cluster, false);
        assert_eq!(p.machine.fields, vec!["applyMode", "patches"]);
        assert_eq!(p.machine.spec["hold"], json!(true));
        assert_eq!(p.machine.spec["patches"], record.machine_spec["patches"]);
        assert!(p.machine.spec.get("applyMode").is_none());
        assert_eq!(p.cluster, None);
        assert_eq!(p.cluster_left, vec!["talosVersion"]);
        let p = plan(&record, &machine, &cluster, true);
        let c = p.cluster.unwrap();
        assert_eq!(c.fields, vec!["talosVersion"]);
        assert_eq!(c.spec["secretsRef"]["name"], "new");
        assert!(p.cluster_left.is_empty());
        let p = plan(&record, &record.machine_spec, &record.cluster_spec, true);
        assert!(p.is_empty());
    }
}
