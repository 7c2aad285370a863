//! Kind `ichor`: Ichor upgrades itself. On an install-manifest install the
//! controller starts the installer Job — its own image at the target
//! version, running `ichor install --to`, under the `ichor-installer`
//! identity — and follows it; a controller restarted on the new version
//! picks the Job up from status. On a Helm install the operation is refused
//! with the `helm upgrade` command (R4.6a).

use ichor_api::conditions::reasons;
use ichor_api::operation::{OperationPhase, TalosOperationStatus};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::Run;
use crate::{DeployedBy, Error, Result};

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
    let parse = |v: &str| semver::Version::parse(v.trim_start_matches('v')).ok();
    let Some(to) = parse(target) else {
        return Some(format!(
            "spec.version {target:?} is not a version like v1.14.0 (nothing was started)"
        ));
    };
    match parse(running) {
        Some(from) if to < from && !allow_downgrade => Some(format!(
            "spec.version {target} is older than the running Ichor v{from} (nothing was started): a downgrade needs spec.allowDowngrade: true in a new operation"
        )),
        _ => None,
    }
}

/// The words a plan adds when the operation downgrades Ichor on purpose.
pub fn downgrade_note(target: &str, running: &str) -> Option<String> {
    let parse = |v: &str| semver::Version::parse(v.trim_start_matches('v')).ok();
    match (parse(target), parse(running)) {
        (Some(to), Some(from)) if to < from => Some(format!(
            " (a downgrade from v{from}, allowed by spec.allowDowngrade)"
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

impl Run<'_> {
    fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.config.system_namespace)
    }

    /// Starts the installer Job (or refuses, or stops at the plan for a dry run).
    pub(super) async fn start_ichor_upgrade(
        &self,
        status: &mut TalosOperationStatus,
    ) -> Result<Action> {
        status.start_time = Some(self.now());
        let version = self.op.spec.version.clone().unwrap_or_default();
        let running = env!("CARGO_PKG_VERSION");
        if let Some(refusal) = ichor_upgrade_refusal(
            &self.op.namespace().unwrap_or_default(),
            &self.ctx.config.system_namespace,
            &version,
            running,
            self.op.spec.allow_downgrade,
        ) {
            self.finish(status, OperationPhase::Failed, reasons::REFUSED, refusal)
                .await;
            return Ok(Action::await_change());
        }
        if self.ctx.config.deployed_by == DeployedBy::Helm {
            return Ok(self.refuse_kind_ichor(status).await);
        }
        let ns = self.ctx.config.system_namespace.clone();
        let Some(own) = self.ctx.config.cni_job_image.clone() else {
            self.finish(
                status,
                OperationPhase::Failed,
                reasons::REFUSED,
                "this controller does not know its own image (it runs without --cni-job-image), so it cannot start the installer Job; run `ichor adopt` of the new version to upgrade the install".to_string(),
            )
            .await;
            return Ok(Action::await_change());
        };
        let image = ichor_render::retag(&own, &version);
        let name = installer_job_name(&self.op.name_any());
        let plan = format!(
            "installer Job {ns}/{name} runs {image} (`ichor install --to {version}`) as {INSTALLER_IDENTITY}{}",
            downgrade_note(&version, running).unwrap_or_default()
        );
        if self.op.spec.dry_run {
            self.finish(
                status,
                OperationPhase::Succeeded,
                reasons::DRY_RUN,
                format!("dry run: the {plan}; nothing was started"),
            )
            .await;
            return Ok(Action::await_change());
        }
        let job = installer_job(&ns, &name, &self.op.name_any(), &image, &version);
        match self.jobs().create(&PostParams::default(), &job).await {
            Ok(_) => {}
            // Created by a controller that stopped before writing the status.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(Error::kube(format!(
                    "creating the installer Job {ns}/{name}"
                ))(e));
            }
        }
        super::publish(
            self.ctx,
            self.op,
            kube::runtime::events::EventType::Normal,
            "Planned",
            format!("ichor: the {plan}"),
        )
        .await;
        self.ctx
            .metrics
            .operation_phase(self.op.spec.kind.as_str(), None, "Running");
        status.phase = Some(OperationPhase::Running);
        status.message = Some(format!("the {plan}"));
        Ok(Action::requeue(self.bounds().poll))
    }

    /// Follows the installer Job until it completes or fails.
    pub(super) async fn drive_ichor(&self, status: &mut TalosOperationStatus) -> Result<Action> {
        let ns = self.ctx.config.system_namespace.clone();
        let name = installer_job_name(&self.op.name_any());
        let version = self.op.spec.version.clone().unwrap_or_default();
        let job = self
            .jobs()
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!(
                "reading the installer Job {ns}/{name}"
            )))?;
        let Some(job) = job else {
            self.finish(
                status,
                OperationPhase::Failed,
                reasons::JOB_FAILED,
                format!(
                    "the installer Job {ns}/{name} is gone; create a new operation to try again"
                ),
            )
            .await;
            return Ok(Action::await_change());
        };
        match job_state(&job) {
            JobState::Complete => {
                self.finish(
                    status,
                    OperationPhase::Succeeded,
                    reasons::SUCCEEDED,
                    format!("Ichor {version} is installed (installer Job {ns}/{name} completed); the controller restarts on the new version"),
                )
                .await;
                Ok(Action::await_change())
            }
            JobState::Failed(why) => {
                self.finish(
                    status,
                    OperationPhase::Failed,
                    reasons::JOB_FAILED,
                    format!("the installer Job {ns}/{name} failed: {why}; see its logs (kubectl -n {ns} logs job/{name}), then create a new operation"),
                )
                .await;
                Ok(Action::await_change())
            }
            JobState::Running => {
                status.message = Some(format!("the installer Job {ns}/{name} runs"));
                Ok(Action::requeue(self.bounds().poll))
            }
        }
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
