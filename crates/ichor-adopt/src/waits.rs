//! R3.1–R3.3: every wait is bounded and says why it is still waiting.
//!
//! [`WaitWatch`] is the pure half of the one wait helper: fed the pods of
//! `ichor-system` and the nodes at each poll, with the time since the wait
//! began (the clock is the caller's, so tests use a fake one), it says what to
//! print every 30 s, and when to give up — at the hard timeout, or early when
//! the cluster has no pod network.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use crate::inspection::KubeNode;

/// Hard timeouts of R3.1.
pub const WEBHOOK_WAIT_ADOPT: Duration = Duration::from_secs(15 * 60);
pub const WEBHOOK_WAIT_INIT: Duration = Duration::from_secs(30 * 60);
pub const CILIUM_READY_WAIT: Duration = Duration::from_secs(10 * 60);
pub const HANDOVER_WAIT: Duration = Duration::from_secs(10 * 60);
/// The API server establishes a CRD within seconds; a minute means it will not.
pub const CRDS_ESTABLISHED_WAIT: Duration = Duration::from_secs(60);
/// How often a wait reports what it still waits for.
pub const REPORT_EVERY: Duration = Duration::from_secs(30);
/// How long every Ichor pod must have been unschedulable, on nodes all NotReady
/// for the network plugin, before the wait fails early.
pub const NO_POD_NETWORK_AFTER: Duration = Duration::from_secs(2 * 60);

/// R3.3, word for word.
pub const NO_POD_NETWORK: &str = "Ichor's pods cannot start because this cluster has no pod network (its nodes are NotReady: cni plugin not initialized). Install a CNI, or let ichor adopt install Cilium (a cluster with no CNI)";

/// What a wait needs to know of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub phase: String,
    /// The PodScheduled=False message when the scheduler could not place it.
    pub unschedulable: Option<String>,
    /// (container, reason) for containers waiting in ImagePullBackOff,
    /// ErrImagePull or CrashLoopBackOff.
    pub waiting: Vec<(String, String)>,
}

impl PodView {
    pub fn from_pod(pod: &Pod) -> PodView {
        let status = pod.status.clone().unwrap_or_default();
        let unschedulable = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| c.message.unwrap_or_else(|| c.reason.unwrap_or_default()));
        let waiting = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .filter_map(|cs| {
                let reason = cs.state?.waiting?.reason?;
                matches!(
                    reason.as_str(),
                    "ImagePullBackOff" | "ErrImagePull" | "CrashLoopBackOff"
                )
                .then_some((cs.name, reason))
            })
            .collect();
        PodView {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            phase: status.phase.unwrap_or_else(|| "Pending".into()),
            unschedulable,
            waiting,
        }
    }

    fn describe(&self) -> String {
        let mut s = format!("pod {}/{} {}", self.namespace, self.name, self.phase);
        if let Some(m) = &self.unschedulable {
            s.push_str(&format!("; {m}"));
        }
        for (container, reason) in &self.waiting {
            s.push_str(&format!("; container {container} waiting: {reason}"));
        }
        s
    }
}

/// What the caller does after a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep waiting; print these lines (empty between reports).
    Waiting(Vec<String>),
    /// Give up: the message says why and what is left.
    Failed(String),
}

/// The state of one bounded wait.
#[derive(Debug, Clone)]
pub struct WaitWatch {
    what: String,
    timeout: Duration,
    last_report: Option<Duration>,
    unschedulable_since: Option<Duration>,
}

impl WaitWatch {
    /// `what` names the wait in messages ("Ichor's webhooks", "Cilium").
    pub fn new(what: impl Into<String>, timeout: Duration) -> WaitWatch {
        WaitWatch {
            what: what.into(),
            timeout,
            last_report: None,
            unschedulable_since: None,
        }
    }

    /// Judges one poll taken `elapsed` after the wait began.
    pub fn observe(&mut self, elapsed: Duration, pods: &[PodView], nodes: &[KubeNode]) -> Verdict {
        let all_unschedulable = !pods.is_empty() && pods.iter().all(|p| p.unschedulable.is_some());
        let no_network =
            !nodes.is_empty() && nodes.iter().all(KubeNode::not_ready_for_network_plugin);
        if all_unschedulable && no_network {
            let since = *self.unschedulable_since.get_or_insert(elapsed);
            if elapsed.saturating_sub(since) >= NO_POD_NETWORK_AFTER {
                return Verdict::Failed(NO_POD_NETWORK.to_string());
            }
        } else {
            self.unschedulable_since = None;
        }
        if elapsed >= self.timeout {
            return Verdict::Failed(format!(
                "{} did not finish within {} ({})",
                self.what,
                human(self.timeout),
                left(pods)
            ));
        }
        let due = self
            .last_report
            .is_none_or(|t| elapsed.saturating_sub(t) >= REPORT_EVERY);
        if !due {
            return Verdict::Waiting(Vec::new());
        }
        self.last_report = Some(elapsed);
        let mut lines = vec![format!(
            "waiting for {} ({} of {})",
            self.what,
            human(elapsed),
            human(self.timeout)
        )];
        lines.extend(
            pods.iter()
                .filter(|p| p.phase != "Running" || !p.waiting.is_empty())
                .map(PodView::describe),
        );
        Verdict::Waiting(lines)
    }
}

fn left(pods: &[PodView]) -> String {
    let pending: Vec<String> = pods
        .iter()
        .filter(|p| p.phase != "Running" || !p.waiting.is_empty())
        .map(PodView::describe)
        .collect();
    if pending.is_empty() {
        "no pod is Pending".into()
    } else {
        pending.join("; ")
    }
}

/// 250 s → "4m10s".
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m0s"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNSCHEDULABLE: &str =
        "0/3 nodes are available: 3 node(s) had untolerated taint {node.kubernetes.io/not-ready: }";
    const NO_CNI: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

    fn pending(name: &str) -> PodView {
        PodView {
            namespace: "ichor-system".into(),
            name: name.into(),
            phase: "Pending".into(),
            unschedulable: Some(UNSCHEDULABLE.into()),
            waiting: vec![],
        }
    }

    fn nodes(ready: bool) -> Vec<KubeNode> {
        (1..=3)
            .map(|i| KubeNode {
                name: format!("n{i}"),
                ready,
                ready_message: Some(if ready { "ok".into() } else { NO_CNI.into() }),
                pod_cidr: None,
            })
            .collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Covers: R3.2
    #[test]
    fn every_30_seconds_it_names_pending_pods_with_their_scheduler_message() {
        let mut w = WaitWatch::new("Ichor's webhooks", WEBHOOK_WAIT_ADOPT);
        let pods = vec![pending("ichor-controller-0")];
        let ready = nodes(true);
        let Verdict::Waiting(lines) = w.observe(secs(0), &pods, &ready) else {
            panic!()
        };
        assert_eq!(lines[0], "waiting for Ichor's webhooks (0s of 15m0s)");
        assert_eq!(
            lines[1],
            format!("pod ichor-system/ichor-controller-0 Pending; {UNSCHEDULABLE}")
        );
        assert_eq!(w.observe(secs(10), &pods, &ready), Verdict::Waiting(vec![]));
        let Verdict::Waiting(lines) = w.observe(secs(31), &pods, &ready) else {
            panic!()
        };
        assert_eq!(lines.len(), 2);
    }

    /// Covers: R3.2
    #[test]
    fn image_pull_and_crash_loop_reasons_are_printed() {
        let mut w = WaitWatch::new("Ichor's webhooks", WEBHOOK_WAIT_ADOPT);
        let pod = PodView {
            phase: "Pending".into(),
            unschedulable: None,
            waiting: vec![("manager".into(), "ImagePullBackOff".into())],
            ..pending("ichor-controller-0")
        };
        let Verdict::Waiting(lines) = w.observe(secs(0), &[pod], &nodes(true)) else {
            panic!()
        };
        assert_eq!(
            lines[1],
            "pod ichor-system/ichor-controller-0 Pending; container manager waiting: ImagePullBackOff"
        );
    }

    /// Covers: R3.1
    #[test]
    fn at_the_hard_timeout_it_fails_and_says_what_is_left() {
        let mut w = WaitWatch::new("Ichor's webhooks", secs(240));
        let pod = PodView {
            unschedulable: None,
            waiting: vec![("manager".into(), "ImagePullBackOff".into())],
            ..pending("c")
        };
        assert!(matches!(
            w.observe(secs(239), std::slice::from_ref(&pod), &nodes(true)),
            Verdict::Waiting(_)
        ));
        let Verdict::Failed(msg) = w.observe(secs(240), &[pod], &nodes(true)) else {
            panic!()
        };
        assert_eq!(
            msg,
            "Ichor's webhooks did not finish within 4m0s (pod ichor-system/c Pending; container manager waiting: ImagePullBackOff)"
        );
    }

    /// Covers: R3.3
    #[test]
    fn no_pod_network_fails_early_after_two_minutes_with_the_specs_text() {
        let mut w = WaitWatch::new("Ichor's webhooks", WEBHOOK_WAIT_ADOPT);
        let pods = vec![pending("a"), pending("b")];
        let down = nodes(false);
        assert!(matches!(
            w.observe(secs(5), &pods, &down),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.observe(secs(124), &pods, &down),
            Verdict::Waiting(_)
        ));
        assert_eq!(
            w.observe(secs(125), &pods, &down),
            Verdict::Failed(NO_POD_NETWORK.into())
        );
    }

    /// Covers: R3.3
    #[test]
    fn the_early_failure_needs_both_conditions_without_a_break() {
        let mut w = WaitWatch::new("Ichor's webhooks", WEBHOOK_WAIT_ADOPT);
        let pods = vec![pending("a")];
        assert!(matches!(
            w.observe(secs(0), &pods, &nodes(false)),
            Verdict::Waiting(_)
        ));
        // One node turns Ready: the clock restarts.
        let mut mixed = nodes(false);
        mixed[0].ready = true;
        assert!(matches!(
            w.observe(secs(60), &pods, &mixed),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.observe(secs(150), &pods, &nodes(false)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.observe(secs(269), &pods, &nodes(false)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.observe(secs(270), &pods, &nodes(false)),
            Verdict::Failed(_)
        ));
        // A scheduled pod means the network is not the problem.
        let mut w = WaitWatch::new("x", WEBHOOK_WAIT_ADOPT);
        let some_scheduled = vec![
            pending("a"),
            PodView {
                unschedulable: None,
                ..pending("b")
            },
        ];
        assert!(matches!(
            w.observe(secs(0), &some_scheduled, &nodes(false)),
            Verdict::Waiting(_)
        ));
        assert!(matches!(
            w.observe(secs(300), &some_scheduled, &nodes(false)),
            Verdict::Waiting(_)
        ));
    }

    #[test]
    fn a_pod_object_is_read_into_its_view() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ichor-system"},
            "status": {"phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}],
                "containerStatuses": [{"name": "manager", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }))
        .unwrap();
        let v = PodView::from_pod(&pod);
        assert_eq!(v.unschedulable.as_deref(), Some(UNSCHEDULABLE));
        assert_eq!(
            v.waiting,
            vec![("manager".to_string(), "CrashLoopBackOff".to_string())]
        );
    }
}
