//! The backup before the first control plane: carries out what
//! `ichor_reconcile::operation::backup_gate` decides (create the
//! TalosBackup, wait for it, fail the operation when it fails).

use ichor_api::ClusterRef;
use ichor_api::backup::{BackupPhase, BackupReason, TalosBackup, TalosBackupSpec};
use ichor_api::conditions::{Status, reasons, types};
use ichor_api::operation::{OperationPhase, TalosOperationStatus};
use ichor_reconcile::operation::backup_gate::{self, BackupSeen, Gate};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource as _, ResourceExt as _};

use super::{Run, publish};
use crate::{Error, Result};

impl Run<'_> {
    /// `Some(action)` while the operation must not start its steps yet
    /// (waiting for its backup, or failed for it); `None` to go on.
    pub(super) async fn backup_first(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Option<Action>> {
        if self.op.spec.dry_run || backup_gate::passed(self.op.spec.kind, status) {
            return Ok(None);
        }
        let api = Api::<TalosBackup>::namespaced(self.ctx.client.clone(), &self.namespace);
        let seen = match status.backup.as_deref() {
            Some(name) => {
                let found = api.get_opt(name).await.map_err(Error::kube(format!(
                    "reading TalosBackup {}/{name}",
                    self.namespace
                )))?;
                Some(match found {
                    None => BackupSeen::Missing,
                    Some(b) => match b.status.map(|s| s.phase) {
                        Some(BackupPhase::Succeeded) => BackupSeen::Succeeded,
                        Some(BackupPhase::Failed) => BackupSeen::Failed,
                        _ => BackupSeen::Waiting,
                    },
                })
            }
            None => None,
        };
        let has_destination = match self.cluster().await {
            Ok(c) => c.spec.backup.is_some(),
            Err(_) => false,
        };
        let op_name = self.op.name_any();
        let cluster = self.op.spec.target.cluster_ref.name.clone();
        let now = self.now();
        let gate = backup_gate::gate(
            self.op.spec.kind,
            status,
            has_destination,
            self.op.spec.skip_backup.as_ref().map(|s| s.reason.as_str()),
            seen,
            || {
                let t = crate::backup::to_utc(&now);
                ichor_backup::manifest::backup_name(&cluster, t, Some(&format!("before-{op_name}")))
            },
        );
        match gate {
            Gate::Proceed => Ok(None),
            Gate::Record(text) => {
                status.backup = Some(text);
                self.write(status).await?;
                Ok(None)
            }
            Gate::Create { name } => {
                self.create_backup(&api, &name).await?;
                status.backup = Some(name.clone());
                self.wait_for(status, &name);
                self.write(status).await?;
                Ok(Some(Action::requeue(self.bounds().poll)))
            }
            Gate::Wait { name } => {
                self.wait_for(status, &name);
                Ok(Some(Action::requeue(self.bounds().poll)))
            }
            Gate::Fail { message } => {
                self.finish(
                    status,
                    OperationPhase::Failed,
                    reasons::BACKUP_FAILED,
                    message,
                )
                .await;
                Ok(Some(Action::await_change()))
            }
        }
    }

    fn wait_for(&self, status: &mut TalosOperationStatus, name: &str) {
        let message = format!(
            "waiting for TalosBackup {name}, taken before the first control plane is touched"
        );
        self.set(
            status,
            types::WAITING,
            Status::True,
            reasons::WAITING_FOR_BACKUP,
            message.clone(),
        );
        status.message = Some(message);
    }

    async fn create_backup(&self, api: &Api<TalosBackup>, name: &str) -> Result<()> {
        let backup = TalosBackup {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                owner_references: self.op.controller_owner_ref(&()).map(|r| vec![r]),
                ..ObjectMeta::default()
            },
            spec: TalosBackupSpec {
                cluster_ref: ClusterRef {
                    name: self.op.spec.target.cluster_ref.name.clone(),
                },
                reason: BackupReason::Operation,
                operation: Some(self.op.name_any()),
            },
            status: None,
        };
        match api.create(&PostParams::default(), &backup).await {
            Ok(_) => {
                publish(
                    self.ctx,
                    self.op,
                    EventType::Normal,
                    "BackupRequested",
                    format!(
                        "TalosBackup {name} is taken before the first control plane is touched"
                    ),
                )
                .await;
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(Error::kube(format!(
                "creating TalosBackup {}/{name}",
                self.namespace
            ))(e)),
        }
    }
}
