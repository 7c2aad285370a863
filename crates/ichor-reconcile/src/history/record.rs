//! The next revision of a machine, and the bounded list its status keeps.

use ichor_api::DriftClass;
use ichor_api::history::{
    ChangedBy, MachineRevision, RevisionApplyMode, RevisionOutcome, RevisionReason,
};
use ichor_render::drift::Drift;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_yaml_ng::Mapping;

/// How many revisions a machine's status keeps unless the cluster says
/// otherwise; the history Secret keeps the inputs of as many.
pub const DEFAULT_KEPT: usize = 10;

/// The most revisions a cluster may ask its machines to keep.
pub const MAX_KEPT: u32 = 50;

/// How many revisions `cluster`'s machines keep: its `revisionsKept`
/// (within 1 to [`MAX_KEPT`], as its schema admits), else [`DEFAULT_KEPT`].
pub fn kept_for(cluster: &ichor_api::TalosCluster) -> usize {
    cluster
        .spec
        .revisions_kept
        .map_or(DEFAULT_KEPT, |n| n.clamp(1, MAX_KEPT) as usize)
}

/// What the controller knows about one apply when it sends it.
#[derive(Debug, Clone)]
pub struct Apply {
    pub time: Time,
    pub config_hash_before: Option<String>,
    pub config_hash_after: String,
    pub apply_mode: RevisionApplyMode,
    pub reason: RevisionReason,
    pub operation: Option<String>,
    pub rollback_of: Option<u64>,
    pub machine_generation: Option<i64>,
    pub cluster_generation: Option<i64>,
    /// The machine's and the cluster's changed-by annotations.
    pub machine_changed_by: Option<ChangedBy>,
    pub cluster_changed_by: Option<ChangedBy>,
}

/// The revision an apply makes: numbered after the highest one kept, naming
/// the newer of the two spec writers, with the paths the apply changes
/// ([`changed_paths`] of the drift it resolves).
pub fn next(
    history: &[MachineRevision],
    apply: Apply,
    changed_paths: Vec<String>,
) -> MachineRevision {
    let number = history.iter().map(|r| r.number).max().unwrap_or(0) + 1;
    let outcome = if apply.apply_mode == RevisionApplyMode::Try {
        RevisionOutcome::Trying
    } else {
        RevisionOutcome::Applied
    };
    MachineRevision {
        number,
        time: apply.time,
        config_hash_before: apply.config_hash_before,
        config_hash_after: apply.config_hash_after,
        apply_mode: apply.apply_mode,
        reason: apply.reason,
        operation: apply.operation,
        rollback_of: apply.rollback_of,
        machine_generation: apply.machine_generation,
        cluster_generation: apply.cluster_generation,
        changed_by: newer(apply.machine_changed_by, apply.cluster_changed_by),
        changed_paths,
        outcome,
    }
}

/// The paths an apply of the desired config changes on the node (class A
/// excluded: Ichor does not apply for those).
pub fn changed_paths(drift: &Drift) -> Vec<String> {
    drift
        .entries
        .iter()
        .filter(|e| e.class != DriftClass::A)
        .map(|e| e.path.clone())
        .collect()
}

/// What an apply of a whole config (a join's, an operation step's) changes
/// on the node: paths and digests, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The digest of the config the node ran (`None`: it ran none, a node
    /// in maintenance mode).
    pub config_hash_before: Option<String>,
    /// The digest of the config applied, as `status.configHash` has it.
    pub config_hash_after: String,
    /// Every path that differs, whatever its class: the whole config is
    /// applied.
    pub paths: Vec<String>,
}

/// The [`Change`] from the node's config `live` (`None` in maintenance
/// mode) to `desired`, both as documents.
pub fn change(live: Option<&[Mapping]>, desired: &[Mapping]) -> Change {
    let before: &[Mapping] = live.unwrap_or_default();
    let drift = ichor_render::drift::compare_documents(
        before,
        desired,
        &ichor_render::redact::Redactor::default(),
    );
    Change {
        config_hash_before: live.map(ichor_render::config_digest),
        config_hash_after: ichor_render::config_digest(desired),
        paths: drift.entries.into_iter().map(|e| e.path).collect(),
    }
}

/// The later of two spec writers (RFC 3339 UTC times compare as text).
fn newer(a: Option<ChangedBy>, b: Option<ChangedBy>) -> Option<ChangedBy> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at > a.at { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Appends a revision and drops the oldest beyond `kept` (at least one is
/// always kept: the newest).
pub fn push(history: &mut Vec<MachineRevision>, revision: MachineRevision, kept: usize) {
    history.push(revision);
    history.sort_by_key(|r| r.number);
    let excess = history.len().saturating_sub(kept.max(1));
    history.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::DriftEntry;

    fn by(user: &str, at: &str) -> ChangedBy {
        ChangedBy {
            user: user.into(),
            at: at.into(),
        }
    }

    fn apply(mode: RevisionApplyMode) -> Apply {
        Apply {
            time: Time(
                k8s_openapi::jiff::Timestamp::from_second(1_796_198_400).expect("timestamp"),
            ),
            config_hash_before: Some("sha256:aa".into()),
            config_hash_after: "sha256:bb".into(),
            apply_mode: mode,
            reason: RevisionReason::Drift,
            operation: None,
            rollback_of: None,
            machine_generation: Some(3),
            cluster_generation: Some(7),
            machine_changed_by: Some(by("alice", "2026-12-02T07:00:00Z")),
            cluster_changed_by: Some(by("bob", "2026-12-02T07:30:00Z")),
        }
    }

    fn entry(path: &str, class: DriftClass) -> DriftEntry {
        DriftEntry {
            path: path.into(),
            class,
            live: None,
            desired: None,
            reason: None,
        }
    }

    /// Covers: R16.1
    #[test]
    fn a_revision_names_the_newer_writer_and_the_paths_without_values() {
        let drift = Drift {
            entries: vec![
                entry("machine.network.hostname", DriftClass::A),
                entry("machine.sysctls", DriftClass::B),
            ],
        };
        let r = next(
            &[],
            apply(RevisionApplyMode::NoReboot),
            changed_paths(&drift),
        );
        assert_eq!(r.number, 1);
        assert_eq!(r.changed_by.unwrap().user, "bob");
        assert_eq!(r.changed_paths, vec!["machine.sysctls".to_owned()]);
        assert_eq!(r.outcome, RevisionOutcome::Applied);
        let r = next(&[], apply(RevisionApplyMode::Try), changed_paths(&drift));
        assert_eq!(r.outcome, RevisionOutcome::Trying);
    }

    fn documents(text: &str) -> Vec<Mapping> {
        ichor_talos::config::ParsedConfig::parse_with_origin(text, "a Talos fixture")
            .expect("a Talos config")
            .mappings
    }

    /// A join's config (the node ran none) and an operation step's (one
    /// image changed): the digests of both sides, the paths without values.
    /// Covers: R16.1
    #[test]
    fn a_whole_config_apply_changes_the_paths_it_differs_on() {
        let text = crate::history::CONTROL_PLANE_FIXTURE;
        let live = documents(text);
        let joined = change(None, &live);
        assert_eq!(joined.config_hash_before, None);
        assert_eq!(joined.config_hash_after, ichor_render::config_digest(&live));
        assert!(!joined.paths.is_empty());
        let stepped = documents(&text.replace(
            "image: ghcr.io/siderolabs/kubelet:v1.28.0",
            "image: ghcr.io/siderolabs/kubelet:v1.29.0",
        ));
        let step = change(Some(&live), &stepped);
        assert_eq!(
            step.config_hash_before,
            Some(joined.config_hash_after.clone())
        );
        assert_ne!(step.config_hash_after, joined.config_hash_after);
        assert_eq!(step.paths.len(), 1, "{:?}", step.paths);
        assert!(step.paths[0].contains("image"), "{:?}", step.paths);
        assert!(!step.paths[0].contains("v1.29.0"), "{:?}", step.paths);
    }

    /// Covers: R16.1
    #[test]
    fn status_keeps_the_newest_revisions_numbered_on() {
        let mut history = Vec::new();
        for _ in 0..1000 {
            let r = next(&history, apply(RevisionApplyMode::NoReboot), Vec::new());
            push(&mut history, r, DEFAULT_KEPT);
        }
        assert_eq!(history.len(), DEFAULT_KEPT);
        assert_eq!(history.first().unwrap().number, 991);
        assert_eq!(history.last().unwrap().number, 1000);
        let r = next(&history, apply(RevisionApplyMode::NoReboot), Vec::new());
        push(&mut history, r, 0);
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].number, 1001);
    }

    /// Covers: R16.1
    #[test]
    fn a_cluster_sets_how_many_revisions_its_machines_keep() {
        let mut cluster: ichor_api::TalosCluster =
            serde_yaml_ng::from_str(include_str!("../fixtures/cluster-base.yaml")).unwrap();
        assert_eq!(kept_for(&cluster), DEFAULT_KEPT);
        cluster.spec.revisions_kept = Some(3);
        let kept = kept_for(&cluster);
        assert_eq!(kept, 3);
        let mut history = Vec::new();
        for _ in 0..7 {
            let r = next(&history, apply(RevisionApplyMode::NoReboot), Vec::new());
            push(&mut history, r, kept);
        }
        let numbers: Vec<u64> = history.iter().map(|r| r.number).collect();
        assert_eq!(numbers, [5, 6, 7], "the newest 3, numbered on");
        // Outside what the schema admits (an object written before it):
        // held within the bounds.
        cluster.spec.revisions_kept = Some(0);
        assert_eq!(kept_for(&cluster), 1);
        cluster.spec.revisions_kept = Some(1_000);
        assert_eq!(kept_for(&cluster), MAX_KEPT as usize);
    }
}
