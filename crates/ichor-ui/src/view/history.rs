//! The history page of one machine: the revisions its status keeps (one per
//! apply Ichor made to the node), who made the spec change each carries out,
//! when and why, and the paths it changed. Status holds paths only; the
//! inputs of each revision live in a Secret the UI never reads, so a
//! rollback is asked of the controller ([`ROLLBACK_ANNOTATION`]), which reads
//! them.

use ichor_api::TalosMachine;
use ichor_api::history::{
    MachineRevision, ROLLBACK_ANNOTATION, RevisionApplyMode, RevisionOutcome, RevisionReason,
    rollback_target,
};
use kube::ResourceExt as _;

use super::*;

/// One revision as the page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionRow {
    pub number: u64,
    /// When the apply was sent (RFC 3339).
    pub time: String,
    /// Who made the spec change it carries out, and when; None when no spec
    /// change asked for it (the node drifted on its own).
    pub who: Option<(String, String)>,
    /// Why: drift, the operation's name, a join, or the revision rolled back.
    pub why: String,
    pub apply_mode: &'static str,
    pub outcome: &'static str,
    pub hash_before: Option<String>,
    pub hash_after: String,
    pub changed_paths: Vec<String>,
    /// The viewer may ask for a rollback to this revision (not the newest:
    /// the node runs it already).
    pub can_roll_back: bool,
}

/// The history page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    pub namespace: String,
    pub name: String,
    pub cluster: String,
    /// Newest first.
    pub revisions: Vec<RevisionRow>,
    /// A rollback asked for and not yet carried out by the controller.
    pub rollback_requested: Option<u64>,
}

fn why(r: &MachineRevision) -> String {
    match r.reason {
        RevisionReason::Drift => "drift".into(),
        RevisionReason::Operation => match &r.operation {
            Some(op) => format!("operation {op}"),
            None => "operation".into(),
        },
        RevisionReason::Join => "join".into(),
        RevisionReason::Rollback => match r.rollback_of {
            Some(n) => format!("rollback to revision {n}"),
            None => "rollback".into(),
        },
    }
}

fn mode_name(mode: RevisionApplyMode) -> &'static str {
    match mode {
        RevisionApplyMode::NoReboot => "no-reboot",
        RevisionApplyMode::Reboot => "reboot",
        RevisionApplyMode::Staged => "staged",
        RevisionApplyMode::Try => "try",
        RevisionApplyMode::Maintenance => "maintenance",
    }
}

fn outcome_name(outcome: RevisionOutcome) -> &'static str {
    match outcome {
        RevisionOutcome::Applied => "applied",
        RevisionOutcome::Trying => "trying",
        RevisionOutcome::RevertedByTry => "reverted by try",
    }
}

/// The rows of a machine's revisions, newest first; `may_update` offers a
/// rollback on each but the newest.
pub fn revision_rows(revisions: &[MachineRevision], may_update: bool) -> Vec<RevisionRow> {
    let newest = revisions.iter().map(|r| r.number).max();
    let mut rows: Vec<RevisionRow> = revisions
        .iter()
        .map(|r| RevisionRow {
            number: r.number,
            time: r.time.0.to_string(),
            who: r
                .changed_by
                .as_ref()
                .map(|b| (b.user.clone(), b.at.clone())),
            why: why(r),
            apply_mode: mode_name(r.apply_mode),
            outcome: outcome_name(r.outcome),
            hash_before: r.config_hash_before.clone(),
            hash_after: r.config_hash_after.clone(),
            changed_paths: r.changed_paths.clone(),
            can_roll_back: may_update && Some(r.number) != newest,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.number));
    rows
}

/// The revision a machine's pending rollback request asks for.
pub fn rollback_requested(m: &TalosMachine) -> Option<u64> {
    m.annotations()
        .get(ROLLBACK_ANNOTATION)
        .and_then(|v| rollback_target(v))
}

/// The history page of one machine; None when there is no such machine.
/// `may_update` is the viewer's `update` on this TalosMachine (false when
/// read-only or anonymous).
pub fn history_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    may_update: bool,
) -> Option<HistoryPage> {
    let m = inv
        .machines
        .iter()
        .find(|m| m.namespace().as_deref() == Some(namespace) && m.name_any() == name)?;
    let revisions = m
        .status
        .as_ref()
        .map(|s| s.revisions.as_slice())
        .unwrap_or_default();
    // A machine being removed is not rolled back.
    let may_update = may_update && m.metadata.deletion_timestamp.is_none();
    Some(HistoryPage {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        cluster: m.spec.cluster_ref.name.clone(),
        revisions: revision_rows(revisions, may_update),
        rollback_requested: rollback_requested(m),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ichor_api::history::ChangedBy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn revision(number: u64, reason: RevisionReason, who: Option<&str>) -> MachineRevision {
        MachineRevision {
            number,
            time: Time(k8s_openapi::jiff::Timestamp::from_second(1_796_198_400).expect("time")),
            config_hash_before: (number > 1).then(|| format!("sha256:{:064}", number - 1)),
            config_hash_after: format!("sha256:{number:064}"),
            apply_mode: RevisionApplyMode::NoReboot,
            reason,
            operation: None,
            rollback_of: (reason == RevisionReason::Rollback).then_some(1),
            machine_generation: Some(number as i64),
            cluster_generation: Some(1),
            changed_by: who.map(|u| ChangedBy {
                user: u.into(),
                at: "2026-12-02T08:00:00Z".into(),
            }),
            changed_paths: vec!["machine.nodeLabels.zone".into()],
            outcome: RevisionOutcome::Applied,
        }
    }

    fn inventory(revisions: Vec<MachineRevision>, rollback_to: Option<&str>) -> Inventory {
        let mut m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "w-1", "namespace": "team"},
            "spec": {"clusterRef": {"name": "lab"}, "role": "worker", "address": "10.5.0.9"},
            "status": {}
        }))
        .expect("a TalosMachine");
        m.status.as_mut().expect("status").revisions = revisions;
        if let Some(r) = rollback_to {
            m.annotations_mut()
                .insert(ROLLBACK_ANNOTATION.into(), r.into());
        }
        Inventory {
            machines: vec![Arc::new(m)],
            ..Inventory::default()
        }
    }

    /// Covers: R16.8 (newest first, who, when, why, mode, hashes, paths; rollback offered only with update, never to the newest)
    #[test]
    fn history_lists_revisions_newest_first_and_offers_rollback_only_with_update() {
        let inv = inventory(
            vec![
                revision(
                    1,
                    RevisionReason::Drift,
                    Some("system:serviceaccount:a:one"),
                ),
                revision(2, RevisionReason::Drift, None),
                revision(3, RevisionReason::Rollback, Some("bob")),
            ],
            Some("1"),
        );
        let page = history_page(&inv, "team", "w-1", true).expect("the page");
        assert_eq!(page.cluster, "lab");
        assert_eq!(page.rollback_requested, Some(1));
        let numbers: Vec<u64> = page.revisions.iter().map(|r| r.number).collect();
        assert_eq!(numbers, [3, 2, 1]);
        let [newest, middle, first] = &page.revisions[..] else {
            panic!("three rows")
        };
        assert_eq!(newest.why, "rollback to revision 1");
        assert_eq!(newest.who.as_ref().map(|w| w.0.as_str()), Some("bob"));
        assert_eq!(middle.who, None);
        assert_eq!(first.why, "drift");
        assert_eq!(first.apply_mode, "no-reboot");
        assert_eq!(first.hash_before, None);
        assert_eq!(
            middle.hash_before.as_deref(),
            Some(first.hash_after.as_str())
        );
        assert_eq!(first.changed_paths, ["machine.nodeLabels.zone"]);
        assert!(!newest.can_roll_back && middle.can_roll_back && first.can_roll_back);

        let viewer = history_page(&inv, "team", "w-1", false).expect("the page");
        assert!(viewer.revisions.iter().all(|r| !r.can_roll_back));
        assert!(history_page(&inv, "team", "nope", true).is_none());
        assert!(history_page(&inv, "other", "w-1", true).is_none());
    }

    #[test]
    fn a_machine_without_revisions_or_with_a_bad_request_shows_none() {
        let inv = inventory(Vec::new(), Some("latest"));
        let page = history_page(&inv, "team", "w-1", true).expect("the page");
        assert!(page.revisions.is_empty());
        assert_eq!(page.rollback_requested, None);
    }
}
