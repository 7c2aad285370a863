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

pub use ichor_reconcile::operation::ichor::*;

use super::Run;
use crate::{DeployedBy, Error, Result};

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
