//! A machine's removal as steps, each written to status as an intent
//! before it runs, so a controller restarted partway resumes where it
//! stood and never resets a node twice.
//!
//! A reachable node: cordon, drain (through the Eviction API, bounded),
//! for a control plane forfeit etcd leadership and leave etcd, reset the
//! node back to maintenance mode (unless the node is kept), delete the
//! Node. An unreachable node, only when forced: a peer removes its member
//! by id, then the Node is deleted — nothing else can reach it.
//!
//! Every step but the reset is safe to repeat, and is repeated until what
//! it does is seen done. The reset is sent once: the intent records the
//! node's boot id first, and a node seen resetting, rebooted or in
//! maintenance mode has had it.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::quorum::Leave;
use crate::operation::bound_passed;

/// One step of a removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    Cordon,
    Drain,
    ForfeitLeadership,
    LeaveEtcd,
    /// A peer removes the member by id.
    RemoveMember,
    Reset,
    DeleteNode,
}

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    pub control_plane: bool,
    /// Leave the node configured and running (`--keep-node`): no reset.
    pub keep_node: bool,
    /// Remove an unreachable node (`--force`).
    pub force: bool,
}

/// Why a removal cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanRefusal {
    #[error("node {node} does not answer, so it cannot be drained, leave etcd or be reset")]
    Unreachable { node: String },
}

impl PlanRefusal {
    pub fn help(&self) -> &'static str {
        match self {
            PlanRefusal::Unreachable { .. } => {
                "bring the node back, or remove it with --force: its etcd member is removed by id from another control plane and its Node deleted; wipe the machine before it comes back"
            }
        }
    }
}

/// The steps of removing `node`, given whether it answers and how its
/// member leaves ([`super::quorum::may_leave`]).
pub fn plan(
    node: &str,
    options: Options,
    node_answers: bool,
    leave: &Leave,
) -> Result<Vec<Step>, PlanRefusal> {
    let mut steps = Vec::new();
    if !node_answers {
        if !options.force {
            return Err(PlanRefusal::Unreachable { node: node.into() });
        }
        if options.control_plane && *leave != Leave::NotAMember {
            steps.push(Step::RemoveMember);
        }
        steps.push(Step::DeleteNode);
        return Ok(steps);
    }
    steps.extend([Step::Cordon, Step::Drain]);
    if options.control_plane {
        match leave {
            Leave::Itself => steps.extend([Step::ForfeitLeadership, Step::LeaveEtcd]),
            Leave::ById { .. } => steps.push(Step::RemoveMember),
            Leave::NotAMember => {}
        }
    }
    if !options.keep_node {
        steps.push(Step::Reset);
    }
    steps.push(Step::DeleteNode);
    Ok(steps)
}

/// The step running now: written before it acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub step: Step,
    pub since: Time,
    /// The node's boot id when the step began (the reset's proof of
    /// having happened is a different one).
    pub boot_id: Option<String>,
    /// The step's call was made (recorded after it returned).
    pub sent: bool,
}

/// A removal's progress, as its status keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub plan: Vec<Step>,
    /// How many steps of `plan` are done.
    pub done: usize,
    pub intent: Option<Intent>,
}

/// What a reconcile saw of the machine being removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    /// The Node object exists.
    pub node_exists: bool,
    pub unschedulable: bool,
    /// Pods a drain still has to evict, and the budget refusing each
    /// (`ns/pod` → `ns/pdb`), as the Eviction API answered last.
    pub pods_left: Vec<(String, Option<String>)>,
    /// The machine's member is in etcd's list.
    pub member_present: bool,
    pub member_is_leader: bool,
    /// The node's Talos API answers.
    pub node_answers: bool,
    pub boot_id: Option<String>,
    /// The node's machine stage says it is resetting.
    pub resetting: bool,
    /// The node answers in maintenance mode.
    pub maintenance: bool,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Write this progress to status (an intent before a step, or a step done).
    Record(Progress),
    /// Carry out the step now, then record the intent as sent.
    Act(Step),
    /// Look again later; why, for the status.
    Wait(String),
    Done,
    /// The removal stops; why, for the status. The node stays as it is.
    Fail(String),
}

/// Whether what `step` does is seen done.
fn seen_done(step: Step, intent: &Intent, seen: &Seen) -> bool {
    match step {
        Step::Cordon => seen.unschedulable || !seen.node_exists,
        Step::Drain => intent.sent && seen.pods_left.is_empty(),
        Step::ForfeitLeadership => intent.sent && !seen.member_is_leader,
        Step::LeaveEtcd | Step::RemoveMember => !seen.member_present,
        Step::Reset => {
            seen.maintenance
                || (seen.boot_id.is_some() && seen.boot_id != intent.boot_id)
                || (intent.sent && !seen.node_answers)
        }
        Step::DeleteNode => !seen.node_exists,
    }
}

/// The next move of a removal in `progress`, given what was `seen` at
/// `now`, each waiting step bounded by `bound` from its intent.
pub fn next(progress: &Progress, seen: &Seen, now: &Time, bound: Duration) -> Next {
    let Some(&step) = progress.plan.get(progress.done) else {
        return Next::Done;
    };
    let intent = match &progress.intent {
        Some(intent) if intent.step == step => intent,
        _ => {
            return Next::Record(Progress {
                intent: Some(Intent {
                    step,
                    since: now.clone(),
                    boot_id: seen.boot_id.clone(),
                    sent: false,
                }),
                ..progress.clone()
            });
        }
    };
    if seen_done(step, intent, seen) {
        return Next::Record(Progress {
            done: progress.done + 1,
            intent: None,
            ..progress.clone()
        });
    }
    if bound_passed(Some(&intent.since), now, bound) {
        return Next::Fail(timed_out(step, seen, bound));
    }
    if step == Step::Reset {
        if intent.sent || seen.resetting {
            return Next::Wait("the node is resetting".into());
        }
        if !seen.node_answers {
            // It may have taken a reset whose record was lost: never a second.
            return Next::Wait("the node does not answer".into());
        }
    }
    Next::Act(step)
}

fn timed_out(step: Step, seen: &Seen, bound: Duration) -> String {
    let bound = bound.as_secs();
    match step {
        Step::Drain => {
            let pods = seen
                .pods_left
                .iter()
                .map(|(pod, pdb)| match pdb {
                    Some(pdb) => format!("{pod} (PodDisruptionBudget {pdb})"),
                    None => pod.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!("the drain did not finish in {bound}s; pods left: {pods}")
        }
        Step::Reset => format!("the node did not reset in {bound}s"),
        other => format!("{other:?} did not finish in {bound}s"),
    }
}

/// The progress after `step` was carried out: its intent marked sent.
pub fn sent(progress: &Progress, step: Step) -> Progress {
    let mut after = progress.clone();
    if let Some(intent) = after.intent.as_mut().filter(|i| i.step == step) {
        intent.sent = true;
    }
    after
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    const BOUND: Duration = Duration::from_secs(300);

    fn cp() -> Options {
        Options {
            control_plane: true,
            ..Options::default()
        }
    }

    /// Covers: R14.2 (drain, leave etcd, reset, delete the Node)
    #[test]
    fn plans() {
        use Step::*;
        assert_eq!(
            plan("cp-2", cp(), true, &Leave::Itself),
            Ok(vec![
                Cordon,
                Drain,
                ForfeitLeadership,
                LeaveEtcd,
                Reset,
                DeleteNode
            ])
        );
        assert_eq!(
            plan(
                "w-1",
                Options {
                    keep_node: true,
                    ..Options::default()
                },
                true,
                &Leave::NotAMember
            ),
            Ok(vec![Cordon, Drain, DeleteNode])
        );
        assert_eq!(
            plan("cp-3", cp(), true, &Leave::ById { id: 3 }),
            Ok(vec![Cordon, Drain, RemoveMember, Reset, DeleteNode])
        );
        assert_eq!(
            plan("cp-3", cp(), false, &Leave::ById { id: 3 }),
            Err(PlanRefusal::Unreachable {
                node: "cp-3".into()
            })
        );
        assert_eq!(
            plan(
                "cp-3",
                Options {
                    force: true,
                    ..cp()
                },
                false,
                &Leave::ById { id: 3 }
            ),
            Ok(vec![RemoveMember, DeleteNode])
        );
    }

    /// A node that behaves: each step's effect is seen after it is sent.
    fn world_after(step: Step, seen: &mut Seen) {
        match step {
            Step::Cordon => seen.unschedulable = true,
            Step::Drain => seen.pods_left.clear(),
            Step::ForfeitLeadership => seen.member_is_leader = false,
            Step::LeaveEtcd | Step::RemoveMember => seen.member_present = false,
            Step::Reset => {
                seen.resetting = true;
            }
            Step::DeleteNode => seen.node_exists = false,
        }
    }

    fn start() -> (Progress, Seen) {
        let plan = plan("cp-2", cp(), true, &Leave::Itself).unwrap();
        (
            Progress {
                plan,
                done: 0,
                intent: None,
            },
            Seen {
                node_exists: true,
                pods_left: vec![("default/web-1".into(), None)],
                member_present: true,
                member_is_leader: true,
                node_answers: true,
                boot_id: Some("boot-1".into()),
                ..Seen::default()
            },
        )
    }

    /// Runs a removal to the end; `crash_after_act` drops the "sent"
    /// record of each act with that index (a controller killed between the
    /// call and its record). Returns the acts in order.
    fn run(crash_after_act: Option<usize>) -> Vec<Step> {
        let (mut progress, mut seen) = start();
        let mut acts = Vec::new();
        for tick in 0..100 {
            // The node reboots into maintenance mode some ticks after the reset.
            if seen.resetting && tick % 3 == 0 {
                seen.resetting = false;
                seen.maintenance = true;
                seen.boot_id = Some("boot-2".into());
            }
            match next(&progress, &seen, &at(tick), BOUND) {
                Next::Record(p) => progress = p,
                Next::Act(step) => {
                    acts.push(step);
                    world_after(step, &mut seen);
                    if crash_after_act != Some(acts.len() - 1) {
                        progress = sent(&progress, step);
                    }
                }
                Next::Wait(_) => {}
                Next::Done => return acts,
                Next::Fail(why) => panic!("{why}"),
            }
        }
        panic!("no end: {progress:?}");
    }

    /// Covers: R14.4 (a controller restarted partway never resets a node twice)
    #[test]
    fn one_reset_whatever_the_crash() {
        let clean = run(None);
        assert_eq!(clean.iter().filter(|s| **s == Step::Reset).count(), 1);
        for crash in 0..clean.len() {
            let acts = run(Some(crash));
            assert_eq!(
                acts.iter().filter(|s| **s == Step::Reset).count(),
                1,
                "crash after act {crash}: {acts:?}"
            );
            assert_eq!(acts.last(), Some(&Step::DeleteNode));
        }
    }

    /// Covers: R14.2 (a drain is bounded; the budget is named)
    #[test]
    fn a_blocked_drain_fails_naming_the_budget() {
        let (progress, mut seen) = start();
        seen.unschedulable = true;
        seen.pods_left = vec![("default/db-0".into(), Some("default/db".into()))];
        let progress = Progress {
            done: 1,
            intent: Some(Intent {
                step: Step::Drain,
                since: at(0),
                boot_id: Some("boot-1".into()),
                sent: true,
            }),
            ..progress
        };
        assert_eq!(
            next(&progress, &seen, &at(10), BOUND),
            Next::Act(Step::Drain)
        );
        assert!(matches!(
            next(&progress, &seen, &at(300), BOUND),
            Next::Fail(why) if why.contains("default/db-0 (PodDisruptionBudget default/db)")
        ));
    }

    #[test]
    fn a_reset_seen_through_a_new_boot_id_or_silence() {
        let intent = Intent {
            step: Step::Reset,
            since: at(0),
            boot_id: Some("boot-1".into()),
            sent: true,
        };
        let answering = Seen {
            node_answers: true,
            boot_id: Some("boot-1".into()),
            ..Seen::default()
        };
        assert!(!seen_done(Step::Reset, &intent, &answering));
        assert!(seen_done(
            Step::Reset,
            &intent,
            &Seen {
                boot_id: Some("boot-2".into()),
                ..answering.clone()
            }
        ));
        assert!(seen_done(
            Step::Reset,
            &intent,
            &Seen {
                node_answers: false,
                boot_id: None,
                ..answering.clone()
            }
        ));
        let unsent = Intent {
            sent: false,
            ..intent
        };
        assert!(!seen_done(
            Step::Reset,
            &unsent,
            &Seen {
                node_answers: false,
                boot_id: None,
                ..answering
            }
        ));
    }
}
