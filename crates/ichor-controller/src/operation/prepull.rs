//! Pre-pull: before the first machine of a talos-upgrade (of each hop) is
//! started, the hop's installer image is pulled on every machine that
//! passes it, one after the other, each recorded in `status.prePull`. A
//! pull that fails ends the operation (`PrePullFailed`) with nothing
//! cordoned or drained. What to pull next is
//! `ichor_reconcile::operation::pre_pull`'s decision.

use std::time::Instant;

use ichor_api::operation::{
    OperationKind, OperationPhase, PRE_PULL_FAILED, PrePullPhase, PrePullProgress,
    TalosOperationStatus,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_reconcile::operation::{self as decide, duration, path, pre_pull, step};
use kube::runtime::controller::Action;

use super::Run;
use super::step::talos_error;
use crate::Result;

/// What one machine's pre-pull came to.
enum Pulled {
    Done(PrePullProgress),
    Failed(PrePullProgress, String),
}

impl Run<'_> {
    /// Before the first machine of a talos-upgrade's hop starts: pulls the
    /// image on every machine of the hop. `Some(action)` when the operation
    /// stops here (a pull failed).
    pub(super) async fn pre_pull_first(
        &mut self,
        status: &mut TalosOperationStatus,
    ) -> Result<Option<Action>> {
        if self.op.spec.kind != OperationKind::TalosUpgrade || self.op.spec.dry_run {
            return Ok(None);
        }
        let spec = path::hop_spec(&self.op.spec, status);
        let version = spec.version.clone().unwrap_or_default();
        let cluster = self.cluster().await?;
        while let Some(machine) = pre_pull::next(status) {
            let Some(m) = self.machine(&machine).await? else {
                // Its step fails it as gone; nothing to pull on.
                pre_pull::record(status, skipped(&machine, "TalosMachine is gone"));
                continue;
            };
            match self.pull_on(&m, &cluster, &spec, &version).await? {
                Pulled::Done(entry) => pre_pull::record(status, entry),
                Pulled::Failed(entry, message) => {
                    pre_pull::record(status, entry);
                    self.finish(status, OperationPhase::Failed, PRE_PULL_FAILED, message)
                        .await;
                    return Ok(Some(Action::await_change()));
                }
            }
            self.write(status).await?;
        }
        Ok(None)
    }

    /// Pulls the installer `machine` will write onto it (a held machine and
    /// one before Talos 1.13, whose legacy upgrade pulls by itself, are
    /// skipped).
    async fn pull_on(
        &mut self,
        m: &TalosMachine,
        cluster: &TalosCluster,
        spec: &ichor_api::operation::TalosOperationSpec,
        version: &str,
    ) -> Result<Pulled> {
        let name = kube::ResourceExt::name_any(m);
        if m.spec.hold {
            return Ok(Pulled::Done(skipped(&name, "held")));
        }
        let talos = self.client(m, cluster).await?;
        let why = |e| ichor_api::error_text::chain(&talos_error(m, e));
        let running = match talos.version("").await {
            Ok(v) => v.tag,
            Err(e) => {
                let why = why(e);
                let entry = failed(&name, "", &why);
                return Ok(Pulled::Failed(
                    entry,
                    pre_pull::failed_words(&name, "", &why),
                ));
            }
        };
        if legacy(&running) {
            return Ok(Pulled::Done(skipped(
                &name,
                &format!("Talos {running}: its legacy upgrade pulls the installer itself"),
            )));
        }
        let live = talos.machine_config("").await.ok();
        let image = decide::installer_image(
            spec.installer_image.as_deref(),
            live.as_deref().and_then(step::install_image).as_deref(),
            version,
        );
        let started = Instant::now();
        let pulled = talos
            .clone()
            .with_call_timeout(self.bounds().image)
            .pull_installer("", &image)
            .await;
        let took = Some(duration::words(started.elapsed()));
        Ok(match pulled {
            Ok(_) => Pulled::Done(PrePullProgress {
                machine: name,
                image,
                phase: PrePullPhase::Pulled,
                duration: took,
                message: None,
            }),
            Err(e) => {
                let why = why(e);
                let message = pre_pull::failed_words(&name, &image, &why);
                let mut entry = failed(&name, &image, &why);
                entry.duration = took;
                Pulled::Failed(entry, message)
            }
        })
    }
}

/// Whether Talos `version` upgrades through the legacy call (before 1.13).
fn legacy(version: &str) -> bool {
    ichor_reconcile::version::release_line(version).is_some_and(|l| l < (1, 13))
}

fn skipped(machine: &str, why: &str) -> PrePullProgress {
    PrePullProgress {
        machine: machine.to_string(),
        phase: PrePullPhase::Skipped,
        message: Some(why.to_string()),
        ..Default::default()
    }
}

fn failed(machine: &str, image: &str, why: &str) -> PrePullProgress {
    PrePullProgress {
        machine: machine.to_string(),
        image: image.to_string(),
        phase: PrePullPhase::Failed,
        message: Some(why.to_string()),
        ..Default::default()
    }
}
