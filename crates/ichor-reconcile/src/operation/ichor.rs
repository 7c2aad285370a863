//! Kind `ichor`: Ichor upgrades itself. Its decisions: whether it may run
//! (only from the system namespace, no downgrade without the flag), the
//! installer Job — Ichor's image at the target version, running `ichor
//! install --to`, under the `ichor-installer` identity — and where that Job
//! is. The controller's `operation::ichor` starts and follows it.

use k8s_openapi::api::batch::v1::Job;
use serde_json::json;

use crate::version;

/// The installer Job's ServiceAccount (the install manifest's cluster-admin identity).
pub const INSTALLER_IDENTITY: &str = "ichor-installer";

/// The installer Job of operation `operation`: `ichor-upgrade-<operation>`,
/// cut to a Job name's 63 characters.
pub fn installer_job_name(operation: &str) -> String {
    let mut name = format!("ichor-upgrade-{operation}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

/// The installer Job: Ichor's image at `version`, `ichor install --to`.
pub fn installer_job(
    namespace: &str,
    name: &str,
    operation: &str,
    image: &str,
    version: &str,
) -> Job {
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ichor", "app.kubernetes.io/component": "installer",
                "ichor.maesh.dev/operation": operation}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/part-of": "ichor", "app.kubernetes.io/component": "installer"}},
                "spec": {
                    "serviceAccountName": INSTALLER_IDENTITY,
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "installer",
                        "image": image,
                        "args": ["install", "--to", version],
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                            "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}
                    }]
                }
            }
        }
    }))
    .expect("the installer Job is a Job")
}

/// Why an `ichor` operation may not run, or `None` when it may. Kind
/// `ichor` runs the cluster-admin installer, so it is obeyed only from the
/// system namespace (whoever may create operations elsewhere does not get
/// cluster-wide power), and it installs no version older than the running
/// controller's (`running`) unless `spec.allowDowngrade` says so.
pub fn ichor_upgrade_refusal(
    op_namespace: &str,
    system_namespace: &str,
    target: &str,
    running: &str,
    allow_downgrade: bool,
) -> Option<String> {
    if op_namespace != system_namespace {
        return Some(format!(
            "a TalosOperation of kind ichor upgrades Ichor for the whole cluster, so it is obeyed only in {system_namespace}; this one is in {op_namespace} (nothing was started): create it in {system_namespace}"
        ));
    }
    let Some(to) = version::parse(target) else {
        return Some(format!(
            "spec.version {target:?} is not a version like v1.14.0 (nothing was started)"
        ));
    };
    match version::parse(running) {
        Some(from) if to < from && !allow_downgrade => Some(format!(
            "spec.version {target} is older than the running Ichor {from} (nothing was started): a downgrade needs spec.allowDowngrade: true in a new operation"
        )),
        _ => None,
    }
}

/// The words a plan adds when the operation downgrades Ichor on purpose.
pub fn downgrade_note(target: &str, running: &str) -> Option<String> {
    match (version::parse(target), version::parse(running)) {
        (Some(to), Some(from)) if to < from => Some(format!(
            " (a downgrade from {from}, allowed by spec.allowDowngrade)"
        )),
        _ => None,
    }
}

/// Where a Job is: done, failed (with its message) or running.
pub enum JobState {
    Complete,
    Failed(String),
    Running,
}

pub fn job_state(job: &Job) -> JobState {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let is = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
    };
    if is("Complete").is_some() {
        JobState::Complete
    } else if let Some(c) = is("Failed") {
        JobState::Failed(
            c.message
                .clone()
                .unwrap_or_else(|| c.reason.clone().unwrap_or_default()),
        )
    } else {
        JobState::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R18.2
    #[test]
    fn kind_ichor_is_obeyed_only_in_the_system_namespace() {
        let refusal = ichor_upgrade_refusal("team-a", "ichor-system", "v9.0.0", "0.1.0", false)
            .expect("refused");
        assert!(refusal.contains("obeyed only in ichor-system"), "{refusal}");
        assert!(refusal.contains("team-a"), "{refusal}");
        // Even with every other flag set.
        assert!(ichor_upgrade_refusal("team-a", "ichor-system", "v9.0.0", "0.1.0", true).is_some());
        assert_eq!(
            ichor_upgrade_refusal("ichor-system", "ichor-system", "v0.2.0", "0.1.0", false),
            None
        );
        assert_eq!(
            ichor_upgrade_refusal("ichor-system", "ichor-system", "v0.1.0", "0.1.0", false),
            None
        );
    }

    /// Covers: R18.2
    #[test]
    fn a_downgrade_needs_the_flag_and_the_plan_says_so() {
        for (target, running) in [
            ("v0.1.0", "0.2.0"),
            ("v1.9.9", "2.0.0"),
            ("v0.2.0-rc.1", "0.2.0"),
        ] {
            let refusal =
                ichor_upgrade_refusal("ichor-system", "ichor-system", target, running, false)
                    .unwrap_or_else(|| panic!("{target} from {running} refused"));
            assert!(refusal.contains("spec.allowDowngrade"), "{refusal}");
            assert_eq!(
                ichor_upgrade_refusal("ichor-system", "ichor-system", target, running, true),
                None
            );
            assert!(downgrade_note(target, running).is_some_and(|n| n.contains("allowDowngrade")));
        }
        assert_eq!(downgrade_note("v0.3.0", "0.2.0"), None);
        let bad = ichor_upgrade_refusal("ichor-system", "ichor-system", "latest", "0.2.0", true)
            .expect("refused");
        assert!(bad.contains("not a version"), "{bad}");
    }
}
