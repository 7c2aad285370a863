//! `--wait`: following new machines until their nodes are Ready, and a
//! removal until its TalosMachine is gone, bounded; a bar per machine on
//! a terminal, a line per change otherwise.

use std::time::Duration;

use anyhow::bail;
use ichor_api::{MembershipPhase, TalosMachine};
use kube::api::Api;

use super::checks;
use crate::printer;

/// How often the machines are read again.
const POLL: Duration = Duration::from_millis(500);

/// Where one joining machine stands: steps done of 3 (created, joined,
/// Ready), its words, and whether it failed.
fn join_progress(m: Option<&TalosMachine>) -> (u64, String, bool) {
    let Some(m) = m else {
        return (0, "deleted while joining".into(), true);
    };
    let membership = m.status.as_ref().and_then(|s| s.membership.as_ref());
    if membership.is_none() && !checks::is_ready(m) {
        return (0, "waiting for the controller".into(), false);
    }
    let say = |fallback: &str| {
        membership
            .and_then(|ms| ms.message.clone().or_else(|| ms.step.clone()))
            .unwrap_or_else(|| fallback.to_string())
    };
    match (checks::phase(m), checks::is_ready(m)) {
        (MembershipPhase::Refused, _) => (1, format!("refused: {}", say("see its status")), true),
        (MembershipPhase::Leaving | MembershipPhase::Removed, _) => {
            (1, "being removed".into(), true)
        }
        (MembershipPhase::Member, true) => (3, "Ready".into(), false),
        (MembershipPhase::Member, false) => {
            (2, say("joined; waiting for its Node to be Ready"), false)
        }
        (MembershipPhase::Joining, _) => (1, format!("joining: {}", say("config applied")), false),
    }
}

/// Follows `names` until each is Ready, one fails, or `timeout` passes.
pub async fn joined(
    api: &Api<TalosMachine>,
    names: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bars = printer::Bars::new();
    loop {
        let mut waiting = Vec::new();
        for name in names {
            let m = api.get_opt(name).await?;
            let (done, words, failed) = join_progress(m.as_ref());
            bars.show(name, 3, done, &format!("{name}: {words}"));
            if failed {
                bars.finish();
                bail!("TalosMachine {name} did not join: {words}");
            }
            if done < 3 {
                waiting.push(format!("{name} ({words})"));
            }
        }
        if waiting.is_empty() {
            bars.finish();
            printer::step(&format!("{} machine(s) joined and Ready", names.len()));
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bars.finish();
            bail!(
                "not Ready within {}s: {}; the machines stay and the controller goes on (ichor machine list shows them)",
                timeout.as_secs(),
                waiting.join(", ")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Follows a removal until the TalosMachine is gone or `timeout` passes.
pub async fn removed(api: &Api<TalosMachine>, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bars = printer::Bars::new();
    loop {
        let Some(m) = api.get_opt(name).await? else {
            bars.finish();
            printer::step(&format!("TalosMachine {name} removed"));
            return Ok(());
        };
        let ms = m
            .status
            .as_ref()
            .and_then(|s| s.membership.clone())
            .unwrap_or_default();
        let total = ms.plan.len().max(1) as u64;
        let done = ms
            .step
            .as_ref()
            .and_then(|s| ms.plan.iter().position(|p| p == s))
            .unwrap_or(0) as u64;
        let words = match (ms.phase, &ms.step, &ms.message) {
            // The join's record until the controller writes the removal's plan.
            (MembershipPhase::Joining | MembershipPhase::Member, _, _) => {
                "waiting for the controller to plan the removal".to_string()
            }
            (_, Some(step), Some(msg)) if msg.starts_with(step.as_str()) => msg.clone(),
            (_, Some(step), Some(msg)) => format!("{step}: {msg}"),
            (_, Some(step), None) => step.clone(),
            (_, None, Some(msg)) => msg.clone(),
            (_, None, None) => "waiting for the controller".into(),
        };
        if ms.phase == MembershipPhase::Refused {
            bars.finish();
            bail!("the removal of TalosMachine {name} is refused: {words}");
        }
        bars.show(name, total, done, &format!("{name}: {words}"));
        if tokio::time::Instant::now() >= deadline {
            bars.finish();
            bail!(
                "TalosMachine {name} was not removed within {}s (now: {words}); the removal goes on",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::{ClusterRef, MachineRole, MembershipStatus, TalosMachineSpec};

    use super::*;

    fn new_machine(membership: Option<MembershipPhase>) -> TalosMachine {
        let mut m = TalosMachine::new(
            "w-3",
            TalosMachineSpec {
                cluster_ref: ClusterRef { name: "lab".into() },
                role: MachineRole::Worker,
                address: "10.5.0.7".into(),
                hold: false,
                patches: Vec::new(),
                removal: None,
                replaces: None,
                apply_mode: None,
                try_timeout: None,
            },
        );
        m.status = membership.map(|phase| ichor_api::TalosMachineStatus {
            membership: Some(MembershipStatus {
                phase,
                message: Some("waiting for etcd to promote w-3".into()),
                ..MembershipStatus::default()
            }),
            ..Default::default()
        });
        m
    }

    /// A machine the controller has not looked at is not "joined" yet;
    /// a refusal ends the wait.
    #[test]
    fn a_join_is_followed_from_the_controller_s_record() {
        assert_eq!(join_progress(Some(&new_machine(None))).0, 0);
        let joining = join_progress(Some(&new_machine(Some(MembershipPhase::Joining))));
        assert_eq!(
            joining,
            (1, "joining: waiting for etcd to promote w-3".into(), false)
        );
        assert!(join_progress(Some(&new_machine(Some(MembershipPhase::Refused)))).2);
        assert!(join_progress(None).2);
    }
}
