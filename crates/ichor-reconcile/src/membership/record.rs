//! A removal's progress as the TalosMachine's `status.membership` keeps
//! it: the plan by step name, the current step's intent (`step`, `since`,
//! `bootId`), and the reset's proof of having been sent
//! (`resetSentBootId`). The reset is the one step whose "sent" survives a
//! restart; every other step is safe to send again.

use ichor_api::{MembershipPhase, MembershipStatus};

use super::removal::{Intent, Progress, Step};

impl Step {
    /// The step's name in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Cordon => "Cordon",
            Step::Drain => "Drain",
            Step::ForfeitLeadership => "ForfeitLeadership",
            Step::LeaveEtcd => "LeaveEtcd",
            Step::RemoveMember => "RemoveMember",
            Step::Reset => "Reset",
            Step::DeleteNode => "DeleteNode",
        }
    }

    pub fn parse(name: &str) -> Option<Step> {
        [
            Step::Cordon,
            Step::Drain,
            Step::ForfeitLeadership,
            Step::LeaveEtcd,
            Step::RemoveMember,
            Step::Reset,
            Step::DeleteNode,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The removal recorded in `status`, if one was planned (phase Leaving
/// with a plan). A step name this version does not know ends the reading:
/// `None`, and the caller plans again.
pub fn progress_of(status: &MembershipStatus) -> Option<Progress> {
    if status.phase != MembershipPhase::Leaving || status.plan.is_empty() {
        return None;
    }
    let plan = status
        .plan
        .iter()
        .map(|s| Step::parse(s))
        .collect::<Option<Vec<_>>>()?;
    let (done, intent) = match status.step.as_deref() {
        None => (0, None),
        Some(name) => {
            let step = Step::parse(name)?;
            let done = plan.iter().position(|s| *s == step)?;
            let intent = status.since.clone().map(|since| Intent {
                step,
                since,
                boot_id: status.boot_id.clone(),
                sent: step == Step::Reset && status.reset_sent_boot_id.is_some(),
            });
            (done, intent)
        }
    };
    Some(Progress { plan, done, intent })
}

/// Writes `progress` into `status` (phase Leaving). The caller records
/// only a progress with an intent, or a finished one.
pub fn record(progress: &Progress, status: &mut MembershipStatus) {
    status.phase = MembershipPhase::Leaving;
    status.plan = progress
        .plan
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    match &progress.intent {
        Some(intent) => {
            status.step = Some(intent.step.as_str().to_string());
            status.since = Some(intent.since.clone());
            status.boot_id = intent.boot_id.clone();
            if intent.step == Step::Reset && intent.sent && status.reset_sent_boot_id.is_none() {
                // A node whose boot id could not be read still has had its reset.
                status.reset_sent_boot_id =
                    Some(intent.boot_id.clone().unwrap_or_else(|| "unknown".into()));
            }
        }
        None => {
            status.step = progress.plan.get(progress.done).map(|s| s.as_str().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::quorum::Leave;
    use super::super::removal::{Options, plan, sent};
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    #[test]
    fn step_names_round_trip() {
        for name in [
            "Cordon",
            "Drain",
            "ForfeitLeadership",
            "LeaveEtcd",
            "RemoveMember",
            "Reset",
            "DeleteNode",
        ] {
            assert_eq!(Step::parse(name).map(Step::as_str), Some(name));
        }
        assert_eq!(Step::parse("Explode"), None);
    }

    /// Covers: R14.4 (the reset's "sent" survives a restart; the plan and intent too)
    #[test]
    fn a_progress_survives_the_status() {
        let steps = plan(
            "cp-2",
            Options {
                control_plane: true,
                ..Options::default()
            },
            true,
            &Leave::Itself,
        )
        .unwrap();
        let reset_at = steps.iter().position(|s| *s == Step::Reset).unwrap();
        let progress = Progress {
            plan: steps,
            done: reset_at,
            intent: Some(Intent {
                step: Step::Reset,
                since: at(5),
                boot_id: Some("boot-1".into()),
                sent: false,
            }),
        };
        let mut status = MembershipStatus::default();
        record(&progress, &mut status);
        assert_eq!(status.step.as_deref(), Some("Reset"));
        assert_eq!(status.reset_sent_boot_id, None);
        assert_eq!(progress_of(&status), Some(progress.clone()));
        let after = sent(&progress, Step::Reset);
        record(&after, &mut status);
        assert_eq!(status.reset_sent_boot_id.as_deref(), Some("boot-1"));
        assert_eq!(progress_of(&status), Some(after));
    }

    #[test]
    fn no_plan_no_progress() {
        assert_eq!(progress_of(&MembershipStatus::default()), None);
        let status = MembershipStatus {
            phase: MembershipPhase::Leaving,
            plan: vec!["Cordon".into(), "Teleport".into()],
            ..MembershipStatus::default()
        };
        assert_eq!(progress_of(&status), None);
    }
}
