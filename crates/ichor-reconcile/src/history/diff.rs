//! What two revisions' rendered configs differ in, per path, with values
//! redacted as drift values are (or shown, for a reader of the history
//! Secret who asked for them).

use ichor_api::DriftEntry;
use ichor_render::drift::compare_redacted;
use ichor_render::redact::Redactor;
use ichor_talos::config::MachineConfig;

use super::store::RevisionRecord;

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("revision {number}'s rendered config does not parse")]
    Parse {
        number: u64,
        #[source]
        source: ichor_talos::config::ConfigError,
    },
    #[error("revisions {from} and {to} cannot be compared")]
    Compare {
        from: u64,
        to: u64,
        #[source]
        source: ichor_render::Error,
    },
}

/// Every value shown as it is: only for `--show-secrets`.
const SHOW_ALL: Redactor<'static> = Redactor {
    public_paths: &[""],
    secret_keys: &[],
};

fn parse(record: &RevisionRecord) -> Result<MachineConfig, DiffError> {
    MachineConfig::parse(&record.rendered_config).map_err(|source| DiffError::Parse {
        number: record.revision.number,
        source,
    })
}

/// The paths `to`'s config differs from `from`'s in: each entry's `live` is
/// the value in `from`, `desired` the value in `to`, redacted unless
/// `show_secrets`.
pub fn diff(
    from: &RevisionRecord,
    to: &RevisionRecord,
    show_secrets: bool,
) -> Result<Vec<DriftEntry>, DiffError> {
    let redactor = if show_secrets {
        SHOW_ALL
    } else {
        Redactor::default()
    };
    let drift = compare_redacted(&parse(from)?, &parse(to)?, &redactor).map_err(|source| {
        DiffError::Compare {
            from: from.revision.number,
            to: to.revision.number,
            source,
        }
    })?;
    Ok(drift.entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::history::{MachineRevision, RevisionApplyMode, RevisionOutcome, RevisionReason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn record(number: u64, config: &str) -> RevisionRecord {
        RevisionRecord {
            revision: MachineRevision {
                number,
                time: Time(k8s_openapi::jiff::Timestamp::from_second(1_796_198_400).unwrap()),
                config_hash_before: None,
                config_hash_after: "sha256:00".into(),
                apply_mode: RevisionApplyMode::NoReboot,
                reason: RevisionReason::Drift,
                operation: None,
                rollback_of: None,
                machine_generation: None,
                cluster_generation: None,
                changed_by: None,
                changed_paths: Vec::new(),
                outcome: RevisionOutcome::Applied,
            },
            machine_spec: json!({}),
            cluster_spec: json!({}),
            rendered_config: config.to_owned(),
        }
    }

    /// Covers: R16.6
    #[test]
    fn a_diff_redacts_secret_values_unless_asked_to_show_them() {
        let base = "version: v1alpha1\nmachine:\n  type: worker\n  token: MARK-old\n  sysctls:\n    a: \"1\"\n";
        let next = "version: v1alpha1\nmachine:\n  type: worker\n  token: MARK-new\n  sysctls:\n    a: \"2\"\n";
        let (a, b) = (record(1, base), record(2, next));
        let entries = diff(&a, &b, false).unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["machine.sysctls.a", "machine.token"]);
        let text = serde_json::to_string(&entries).unwrap();
        assert!(!text.contains("MARK"), "{text}");
        assert_eq!(entries[0].desired.as_deref(), Some("2"));
        let shown = serde_json::to_string(&diff(&a, &b, true).unwrap()).unwrap();
        assert!(
            shown.contains("MARK-new") && shown.contains("MARK-old"),
            "{shown}"
        );
        let broken = record(3, "version: [");
        assert!(matches!(
            diff(&a, &broken, false),
            Err(DiffError::Parse { number: 3, .. })
        ));
    }
}
