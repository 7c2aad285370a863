//! ApplyConfiguration with the rules of the emulated Talos version: the
//! documents checked, the mode settled (AUTO, v1.14's refusal of REBOOT),
//! a dry run's summary, try mode's rollback, and what the node records.

use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use ichor_talos_client::proto::machine;

use crate::derive;
use crate::host;

use super::state::NodeState;
use super::writes::WriteAction;
use super::{Node, new_uuid};

impl Node {
    /// ApplyConfiguration with the rules of the emulated Talos version.
    pub fn apply(
        self: &Arc<Self>,
        req: machine::ApplyConfigurationRequest,
        is_admin: bool,
    ) -> Result<machine::ApplyConfiguration, Status> {
        use machine::apply_configuration_request::Mode;
        let mut st = self.lock();
        if st.rebooting_after_apply {
            return Err(Status::failed_precondition(
                "configuration was already applied and node is rebooting, cannot apply more configuration changes until next reboot",
            ));
        }
        let in_maintenance = st.active.is_none();
        if !in_maintenance && !is_admin {
            return Err(Status::permission_denied("not authorized"));
        }
        // As machined does, first thing: any apply but a try (a dry run or
        // one refused below too) confirms a pending try, so the timer goes.
        if requested_mode_is_not_try(req.mode)
            && let Some(h) = st.rollback.take()
        {
            h.abort();
        }
        validate_applied_documents(&req.data, in_maintenance)?;
        let v14 = self.multidoc_kubernetes();
        let requested = requested_apply_mode(req.mode, in_maintenance, v14)?;
        let current = st.active.clone().unwrap_or_default();
        let immediate = || {
            if in_maintenance || v14 {
                Ok(())
            } else {
                derive::can_apply_immediate(&current, &req.data)
            }
        };
        let (mode, mut details, mode_err) = settle_apply_mode(requested, immediate)?;

        if req.dry_run {
            return Ok(dry_run_summary(&current, &req.data, mode, &details));
        }

        let try_timeout = req
            .try_mode_timeout
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or(Duration::from_secs(60));
        let before = self.facts_of(&st);
        self.store_applied_config(&mut st, mode, req.data.clone(), try_timeout, &mut details);
        self.record_apply(&mut st, mode, req.data.len(), before.as_ref(), &details);
        self.refresh(&mut st);
        drop(st);
        self.record(WriteAction::ApplyConfiguration {
            mode: apply_mode_name(mode).to_string(),
            config: req.data,
        });
        if mode == Mode::Reboot {
            self.start_reboot(new_uuid());
        }
        Ok(machine::ApplyConfiguration {
            metadata: None,
            warnings: Vec::new(),
            mode: mode as i32,
            mode_details: details + &mode_err,
        })
    }

    /// What an apply leaves in the node's record: machined's line, the
    /// services starting on a node leaving maintenance mode, the kubelet
    /// restarting when its image changed now.
    fn record_apply(
        &self,
        st: &mut NodeState,
        mode: machine::apply_configuration_request::Mode,
        bytes: usize,
        before: Option<&derive::ConfigFacts>,
        details: &str,
    ) {
        let summary = details.lines().next().unwrap_or_default();
        st.journal.talos(format!(
            "apply config request: mode {}, {bytes} bytes: {summary}",
            apply_mode_name(mode)
        ));
        let Some(after) = self.facts_of(st) else {
            return;
        };
        let etcd_runs = self.etcd_runs(st);
        let member_id = self.member_id();
        let Some(active) = st.active.clone() else {
            return;
        };
        match before {
            None => {
                host::record_services_start(&mut st.journal, &active, &after, etcd_runs, member_id)
            }
            Some(b) if b.kubelet_image != after.kubelet_image => {
                host::record_kubelet_restart(&mut st.journal, &after);
            }
            Some(_) => {}
        }
    }

    /// Stores an applied config where `mode` puts it (active, persistent or
    /// both) and moves a node out of maintenance mode.
    fn store_applied_config(
        self: &Arc<Self>,
        st: &mut NodeState,
        mode: machine::apply_configuration_request::Mode,
        data: Vec<u8>,
        timeout: Duration,
        details: &mut String,
    ) {
        use machine::apply_configuration_request::Mode;
        match mode {
            Mode::Try => {
                details.push_str(&format!(
                    "\nThe config is applied in 'try' mode and will be automatically reverted back in {}",
                    go_duration(timeout)
                ));
                let previous = st.active.clone();
                self.schedule_try_rollback(st, previous, timeout);
                st.active = Some(data);
            }
            Mode::NoReboot => {
                st.persistent = Some(data.clone());
                st.active = Some(data);
            }
            Mode::Staged => {
                st.persistent = Some(data);
            }
            Mode::Reboot => {
                st.persistent = Some(data);
                st.rebooting_after_apply = true;
            }
            Mode::Auto => unreachable!("AUTO is resolved above"),
        }
        if st.active.is_none() {
            // A node in maintenance mode becomes configured.
            st.active = st.persistent.clone();
        }
        if st.stage == 3 && st.active.is_some() {
            st.stage = 4;
        }
    }

    /// Replaces any pending rollback with one that puts `previous` (the
    /// config active when the try came: machined's rollback target, which
    /// after an unconfirmed try is that try's config, not the persisted
    /// one) back once the 'try' `timeout` has passed.
    fn schedule_try_rollback(
        self: &Arc<Self>,
        st: &mut NodeState,
        previous: Option<Vec<u8>>,
        timeout: Duration,
    ) {
        if let Some(h) = st.rollback.take() {
            h.abort();
        }
        let node = Arc::clone(self);
        st.rollback = Some(tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let mut st = node.lock();
            st.active = previous.or_else(|| st.persistent.clone());
            st.rollback = None;
            st.journal.talos(format!(
                "the configuration applied in try mode was rolled back after {}",
                go_duration(timeout)
            ));
            node.refresh(&mut st);
            drop(st);
            node.record(WriteAction::TryRollback);
        }));
    }
}

/// The documents of an applied config, checked as Talos checks them: not
/// empty, a v1alpha1 document outside maintenance mode, and every other
/// document with its kind and apiVersion.
fn validate_applied_documents(data: &[u8], in_maintenance: bool) -> Result<(), Status> {
    let docs = derive::documents(data).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if docs.is_empty() {
        return Err(Status::invalid_argument("the configuration is empty"));
    }
    let has_v1alpha1 = docs.iter().any(derive::is_v1alpha1);
    if !in_maintenance && !has_v1alpha1 {
        return Err(Status::invalid_argument(
            "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?",
        ));
    }
    for doc in &docs {
        if !derive::is_v1alpha1(doc)
            && (doc.get("apiVersion").is_none() || doc.get("kind").is_none())
        {
            return Err(Status::invalid_argument(
                "error decoding document: missing kind or apiVersion",
            ));
        }
    }
    Ok(())
}

/// Whether a request's mode is anything but TRY (an unknown mode too: it is
/// refused later, after machined cancelled the timer).
fn requested_mode_is_not_try(mode: i32) -> bool {
    mode != machine::apply_configuration_request::Mode::Try as i32
}

/// The requested apply mode: REBOOT becomes NO_REBOOT in maintenance mode
/// and is refused from v1.14 on.
fn requested_apply_mode(
    mode: i32,
    in_maintenance: bool,
    v14: bool,
) -> Result<machine::apply_configuration_request::Mode, Status> {
    use machine::apply_configuration_request::Mode;
    let mut requested = Mode::try_from(mode)
        .map_err(|_| Status::invalid_argument(format!("unknown mode {mode}")))?;
    if requested == Mode::Reboot {
        if in_maintenance {
            requested = Mode::NoReboot;
        } else if v14 {
            return Err(Status::unimplemented(
                "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
            ));
        }
    }
    Ok(requested)
}

/// The mode an apply runs in (AUTO resolved by whether the change applies
/// without a reboot), its details, and why a reboot is needed when AUTO
/// chose one.
fn settle_apply_mode(
    requested: machine::apply_configuration_request::Mode,
    immediate: impl Fn() -> Result<(), derive::ImmediateError>,
) -> Result<(machine::apply_configuration_request::Mode, String, String), Status> {
    use machine::apply_configuration_request::Mode;
    let mut mode = requested;
    let mut mode_err = String::new();
    let details = match mode {
        Mode::Try | Mode::NoReboot => {
            immediate().map_err(|e| Status::invalid_argument(e.to_string()))?;
            "Applied configuration without a reboot"
        }
        Mode::Staged => "Staged configuration to be applied after the next reboot",
        Mode::Auto => match immediate() {
            Ok(()) => {
                mode = Mode::NoReboot;
                "Applied configuration without a reboot"
            }
            Err(e) => {
                mode = Mode::Reboot;
                mode_err = format!(": {e}");
                "Applied configuration with a reboot"
            }
        },
        Mode::Reboot => "Applied configuration with a reboot",
    }
    .to_string();
    Ok((mode, details, mode_err))
}

/// The answer to a dry run: what would happen and the config diff.
fn dry_run_summary(
    current: &[u8],
    new: &[u8],
    mode: machine::apply_configuration_request::Mode,
    details: &str,
) -> machine::ApplyConfiguration {
    let old = String::from_utf8_lossy(current).into_owned();
    let new = String::from_utf8_lossy(new).into_owned();
    let mut diff = crate::diff::unified(&old, &new);
    if diff.is_empty() {
        diff = "No changes.".to_string();
    }
    machine::ApplyConfiguration {
        metadata: None,
        warnings: Vec::new(),
        mode: mode as i32,
        mode_details: format!(
            "Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{diff}"
        ),
    }
}

/// The mode's name as the write record spells it.
fn apply_mode_name(mode: machine::apply_configuration_request::Mode) -> &'static str {
    use machine::apply_configuration_request::Mode;
    match mode {
        Mode::Reboot => "reboot",
        Mode::Auto => "auto",
        Mode::NoReboot => "no_reboot",
        Mode::Staged => "staged",
        Mode::Try => "try",
    }
}

/// Go's `time.Duration.String()` for whole milliseconds (`1m0s`, `30s`, `1.5s`).
pub(crate) fn go_duration(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".to_string();
    }
    let h = total_ms / 3_600_000;
    let m = (total_ms / 60_000) % 60;
    let ms = total_ms % 60_000;
    let secs = if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let s = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", s.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    }
}
