//! Pre-pull: a talos-upgrade pulls the installer image of the current hop
//! on every machine that passes it before the first of them is cordoned,
//! so a registry that refuses the image stops the operation with nothing
//! cordoned or drained. The decisions here; the pulls are the controller's.

use ichor_api::operation::{MachineStep, PrePullPhase, PrePullProgress, TalosOperationStatus};

/// The machines the current hop pre-pulls on, in plan order: those that
/// pass it (Pending, with hops). Empty once any of them has started (a
/// resumed operation does not pull again).
pub fn machines(status: &TalosOperationStatus) -> Vec<String> {
    let on_hop: Vec<_> = status
        .machines
        .iter()
        .filter(|p| !p.hops.is_empty() && p.step != MachineStep::Skipped)
        .collect();
    if on_hop.iter().any(|p| p.step != MachineStep::Pending) {
        return Vec::new();
    }
    let order = |m: &str| status.plan.iter().position(|e| e.machine == m);
    let mut names: Vec<String> = on_hop.into_iter().map(|p| p.machine.clone()).collect();
    names.sort_by_key(|m| order(m));
    names
}

/// The next machine to pull on, or `None` when every one is pulled (or
/// skipped). A failed pull stops the operation before this is asked again.
pub fn next(status: &TalosOperationStatus) -> Option<String> {
    machines(status).into_iter().find(|m| {
        !status.pre_pull.iter().any(|e| {
            &e.machine == m && matches!(e.phase, PrePullPhase::Pulled | PrePullPhase::Skipped)
        })
    })
}

/// Whether `machine`'s Pulling step can go on without pulling: the image it
/// writes was pulled ahead.
pub fn pulled_ahead(status: &TalosOperationStatus, machine: &str, image: Option<&str>) -> bool {
    status.pre_pull.iter().any(|e| {
        e.machine == machine && e.phase == PrePullPhase::Pulled && Some(e.image.as_str()) == image
    })
}

/// Records `entry`, replacing the machine's earlier one.
pub fn record(status: &mut TalosOperationStatus, entry: PrePullProgress) {
    match status
        .pre_pull
        .iter_mut()
        .find(|e| e.machine == entry.machine)
    {
        Some(e) => *e = entry,
        None => status.pre_pull.push(entry),
    }
}

/// The operation's message when `machine`'s pull failed (`why`: the error
/// with its causes).
pub fn failed_words(machine: &str, image: &str, why: &str) -> String {
    format!(
        "pre-pull: {machine} could not pull {image}: {why}; no machine was cordoned or drained. Make the image pullable on every machine (registry, credentials, spec.installerImage) and create the operation again"
    )
}

#[cfg(test)]
mod tests {
    use ichor_api::operation::{MachineProgress, PlanEntry, PlannedAction};

    use super::*;

    fn status() -> TalosOperationStatus {
        let entry = |m: &str, action| PlanEntry {
            machine: m.into(),
            role: ichor_api::machine::MachineRole::Worker,
            batch: 0,
            action,
            reason: None,
        };
        let progress = |m: &str, step, hops: &[&str]| MachineProgress {
            machine: m.into(),
            step,
            hops: hops.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        };
        TalosOperationStatus {
            plan: vec![
                entry("cp-1", PlannedAction::Upgrade),
                entry("w-2", PlannedAction::Skip),
                entry("w-1", PlannedAction::Upgrade),
            ],
            machines: vec![
                progress("w-1", MachineStep::Pending, &["v1.14.0"]),
                progress("w-2", MachineStep::Skipped, &[]),
                progress("cp-1", MachineStep::Pending, &["v1.14.0"]),
            ],
            ..Default::default()
        }
    }

    /// Every planned machine is pulled, in plan order, before any starts;
    /// skipped ones are not; a started hop pulls nothing more.
    /// Covers: R15.4
    #[test]
    fn every_machine_before_the_first_starts() {
        let mut st = status();
        assert_eq!(machines(&st), vec!["cp-1", "w-1"]);
        assert_eq!(next(&st).as_deref(), Some("cp-1"));
        let pulled = |m: &str| PrePullProgress {
            machine: m.into(),
            image: "i:v1.14.0".into(),
            phase: PrePullPhase::Pulled,
            ..Default::default()
        };
        record(&mut st, pulled("cp-1"));
        assert_eq!(next(&st).as_deref(), Some("w-1"));
        record(&mut st, pulled("w-1"));
        assert_eq!(next(&st), None);
        assert!(pulled_ahead(&st, "w-1", Some("i:v1.14.0")));
        assert!(!pulled_ahead(&st, "w-1", Some("i:v1.13.9")));
        st.pre_pull.clear();
        st.machines[2].step = MachineStep::Draining;
        assert_eq!(next(&st), None, "a started hop pulls nothing more");
    }
}
