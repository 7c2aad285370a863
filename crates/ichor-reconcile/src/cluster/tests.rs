//! The TalosCluster decision and its conditions, with an injected clock:
//! no API server. The helpers both test modules use come first.

use super::{HandoverCheck, Time, Waiting};

/// The Cilium values' hash the release is rendered at in these tests.
const DESIRED: &str = "0123456789abcdef";

/// `secs` after the epoch.
fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("timestamp"))
}

/// The hand-over check of release `cilium` wanting [`DESIRED`]: the
/// release `deployed` (revision, hash) and the agent DaemonSet's state.
fn check(deployed: Option<(u32, &str)>, daemonset: Result<(), Waiting>) -> HandoverCheck {
    HandoverCheck {
        release: "cilium".into(),
        agent_daemonset: "cilium".into(),
        desired_hash: DESIRED.into(),
        deployed: deployed.map(|(r, h)| (r, h.to_string())),
        daemonset,
    }
}

mod decide_tests {
    //! The TalosCluster decision from YAML fixtures (`src/fixtures/`), with
    //! an injected clock: no API server.

    use super::super::*;
    use super::{at, check};
    use std::time::Duration;

    fn cluster(yaml: &str) -> TalosCluster {
        serde_yaml_ng::from_str(yaml).expect("fixture")
    }

    fn machines() -> Vec<TalosMachine> {
        serde_yaml_ng::from_str(include_str!("../fixtures/machines-prod.yaml")).expect("fixture")
    }

    fn settings(can_start_job: bool) -> Settings {
        Settings {
            storage_namespace: "ichor-system".into(),
            release_namespace: "kube-system".into(),
            can_start_job,
            resync: Duration::from_secs(300),
            error_requeue: Duration::from_secs(15),
            system_namespace: "ichor-system".into(),
        }
    }

    fn workload(namespace: &str, name: &str, image: &str) -> CniWorkload {
        CniWorkload::recognise(namespace, name, &[image.to_string()]).expect("a CNI's DaemonSet")
    }

    fn observed(handover: Option<std::result::Result<HandoverCheck, InvalidValues>>) -> Observed {
        Observed {
            machines: machines(),
            handover,
            job: None,
            cni_workloads: vec![workload(
                "kube-system",
                "cilium",
                "quay.io/cilium/cilium:v1.18.5",
            )],
            inventory: None,
            cilium_release: None,
            backup_health: None,
        }
    }

    /// `observed` with each control plane's live config read, carrying `inline`.
    fn with_inline(mut o: Observed, inline: &[&str]) -> Observed {
        for m in o.machines.iter_mut() {
            m.status
                .get_or_insert_with(Default::default)
                .inline_manifests = Some(inline.iter().map(|s| s.to_string()).collect());
        }
        o
    }

    /// The objects of Ichor's Cilium release (a few, as the chart names them).
    fn release_objects() -> Vec<crate::inventory::ReleaseObject> {
        [
            ("v1", "ServiceAccount", "cilium"),
            ("rbac.authorization.k8s.io/v1", "ClusterRole", "cilium"),
            ("v1", "ConfigMap", "cilium-config"),
            ("apps/v1", "DaemonSet", "cilium"),
        ]
        .into_iter()
        .map(|(api, kind, name)| {
            let namespace = (kind != "ClusterRole").then_some("kube-system");
            crate::inventory::release_object(api, kind, namespace, name, "kube-system")
        })
        .collect()
    }

    fn inventory(config_map: Option<ConfigMap>) -> Option<InventoryObserved> {
        Some(InventoryObserved {
            release: release_objects(),
            config_map,
        })
    }

    fn inventory_after_init() -> ConfigMap {
        serde_yaml_ng::from_str(include_str!("../fixtures/inventory-after-init.yaml"))
            .expect("fixture")
    }

    fn complete() -> Option<std::result::Result<HandoverCheck, InvalidValues>> {
        Some(Ok(check(Some((2, "0123456789abcdef")), Ok(()))))
    }

    fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
        conditions::find(&d.status.conditions, type_).expect("condition")
    }

    /// Covers: R1.5e
    #[test]
    fn off_the_hash_starts_the_job_and_says_so() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Ok(check(Some((1, "old")), Ok(())))));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            d.actions,
            vec![ClusterAction::StartJob {
                hash: "0123456789abcdef".into()
            }]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("False", reasons::JOB_RUNNING)
        );
        let job = crate::cni_job::job_name("ichor-system", "prod", "0123456789abcdef");
        assert!(
            h.message.contains(&format!("ichor-system/{job}")),
            "{}",
            h.message
        );
        assert_eq!(d.requeue, HANDOVER_POLL);
        assert_eq!(h.last_transition_time, at(100));
        assert_eq!(d.status.observed_generation, Some(3));
        // Without an image no Job is started: the condition says what is off.
        let d = decide(&c, &o, &settings(false), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_RELEASE
        );
    }

    /// Covers: R1.5e
    #[test]
    fn a_matching_hash_never_starts_a_job() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let o = with_inline(observed(complete()), &[]);
        let d = decide(&c, &o, &settings(true), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::HANDED_OVER
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    /// Waiting for the release or the DaemonSet, with no Job running, is
    /// not polled: both are watched, and a steady state makes no requests.
    /// Covers: the controller-at-scale goal (docs/benchmarks.md): no polling in steady state
    #[test]
    fn a_pending_hand_over_without_a_job_waits_for_the_watches() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Ok(check(None, Ok(())))));
        let d = decide(&c, &o, &settings(false), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_RELEASE
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
        let o = observed(Some(Ok(check(
            Some((2, "0123456789abcdef")),
            Err("0 of 3 ready".into()),
        ))));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::WAITING_FOR_DAEMON_SET
        );
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    fn failed(uid: &str) -> JobState {
        JobState::Failed {
            name: "ichor-cni-prod-0123456789".into(),
            uid: uid.into(),
            message: "BackoffLimitExceeded".into(),
        }
    }

    /// Covers: R5.6
    #[test]
    fn a_failed_job_is_deleted_and_retried_after_a_back_off() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let mut o = observed(Some(Ok(check(None, Ok(())))));
        o.job = Some(failed("uid-1"));
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            d.actions,
            vec![ClusterAction::DeleteFailedJob {
                name: "ichor-cni-prod-0123456789".into()
            }]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::JOB_FAILED);
        assert!(h.message.contains("BackoffLimitExceeded"), "{}", h.message);
        let first = crate::cni_job::job_backoff(1, "ichor-system/prod");
        assert_eq!(d.requeue, first);
        let failures = d.status.cni.as_ref().unwrap().job_failures.clone().unwrap();
        assert_eq!(
            (failures.count, failures.last_failure.clone()),
            (1, at(100))
        );

        // The same failed Job seen again (its deletion not yet done) is not
        // counted twice.
        let mut again = c.clone();
        again.status = Some(d.status.clone());
        let d2 = decide(&again, &o, &settings(true), &at(101));
        assert_eq!(
            d2.status
                .cni
                .as_ref()
                .unwrap()
                .job_failures
                .as_ref()
                .unwrap()
                .count,
            1
        );

        // Gone, and the back-off not over: no new Job, and the wait is said.
        o.job = None;
        let d3 = decide(&again, &o, &settings(true), &at(102));
        assert!(d3.actions.is_empty(), "{:?}", d3.actions);
        let h = condition(&d3, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::JOB_FAILED);
        assert!(
            h.message.contains("the next attempt starts at"),
            "{}",
            h.message
        );
        assert!(d3.requeue <= first, "{:?}", d3.requeue);

        // Once it is over, a new Job starts.
        let later = at(100 + first.as_secs() as i64 + 1);
        let d4 = decide(&again, &o, &settings(true), &later);
        assert_eq!(
            d4.actions,
            vec![ClusterAction::StartJob {
                hash: "0123456789abcdef".into()
            }]
        );
    }

    /// Covers: R5.6
    #[test]
    fn each_failure_in_a_row_doubles_the_wait_and_the_release_forgets_them() {
        let mut c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let mut o = observed(Some(Ok(check(None, Ok(())))));
        let mut now = 100;
        let mut waits = Vec::new();
        for i in 1..=5 {
            o.job = Some(failed(&format!("uid-{i}")));
            let d = decide(&c, &o, &settings(true), &at(now));
            assert_eq!(
                d.status
                    .cni
                    .as_ref()
                    .unwrap()
                    .job_failures
                    .as_ref()
                    .unwrap()
                    .count,
                i
            );
            waits.push(d.requeue);
            c.status = Some(d.status);
            now += 10_000;
        }
        for pair in waits.windows(2) {
            assert!(pair[1] > pair[0], "{waits:?}");
        }
        // A different hash starts the count again; at the hash it is gone.
        let o = observed(complete());
        let d = decide(&c, &o, &settings(true), &at(now));
        assert_eq!(d.status.cni.as_ref().unwrap().job_failures, None);
    }

    #[test]
    fn a_hand_over_stays_true_and_its_time_is_kept() {
        let c = cluster(include_str!("../fixtures/cluster-handed-over.yaml"));
        let o = observed(Some(Ok(check(
            Some((3, "other")),
            Err("0 of 3 ready".into()),
        ))));
        let d = decide(&c, &o, &settings(true), &at(999_999));
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        assert_eq!(h.last_transition_time.0.as_second(), 1_767_225_600);
        // The Job still brings the release to the values.
        assert_eq!(d.actions.len(), 1);
        assert_eq!(d.requeue, Duration::from_secs(300));
    }

    /// Step 2 of the hand-over: the release holds, a control plane still
    /// carries the inline entry; the condition says so, names the machine,
    /// and from now on the render drops the entry.
    /// Covers: R10.4
    #[test]
    fn the_released_cilium_waits_for_the_inline_entry_to_leave_the_control_planes() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        for o in [
            observed(complete()),
            with_inline(observed(complete()), &["cilium"]),
        ] {
            let d = decide(&c, &o, &settings(true), &at(100));
            let h = condition(&d, types::CNI_HANDOVER);
            assert_eq!(
                (h.status.as_str(), h.reason.as_str()),
                ("False", reasons::REMOVING_INLINE_MANIFEST)
            );
            assert!(h.message.contains("prod-cp-1"), "{}", h.message);
            // The worker carries no inline manifest and is not waited for.
            assert!(!h.message.contains("prod-w-1"), "{}", h.message);
            assert!(d.actions.is_empty());
            assert!(conditions::inline_cni_dropped(&d.status.conditions));
        }
        // Before the release holds, the render keeps the entry.
        let o = observed(Some(Ok(check(None, Ok(())))));
        let d = decide(&c, &o, &settings(false), &at(100));
        assert!(!conditions::inline_cni_dropped(&d.status.conditions));
    }

    /// Step 3: the inline entry is gone; the release's objects that Talos's
    /// inventory names leave it (an action), and the hand-over is True only
    /// with it. Talos's own objects stay.
    /// Covers: R6.1, R10.4
    #[test]
    fn the_inventory_step_comes_last_and_only_then_is_the_hand_over_true() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let mut o = with_inline(observed(complete()), &["extra"]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d = decide(&c, &o, &settings(true), &at(100));
        let [ClusterAction::ReleaseInventory { config_map, step }] = d.actions.as_slice() else {
            panic!("one inventory action: {:?}", d.actions);
        };
        assert_eq!(config_map.metadata.resource_version.as_deref(), Some("812"));
        assert_eq!(step.strip.len(), 4);
        let left: Vec<&str> = step.data.keys().map(String::as_str).collect();
        assert_eq!(
            left,
            [
                "_system__coredns_rbac.authorization.k8s.io_ClusterRole",
                "kube-system_coredns_apps_Deployment"
            ]
        );
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        assert!(h.message.contains("4 objects"), "{}", h.message);
        // No inventory at all (Talos before 1.13): nothing to do, True.
        o.inventory = inventory(None);
        let d = decide(&c, &o, &settings(true), &at(100));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
    }

    /// A kill between any two steps, then a rerun, ends in the same state:
    /// each step is decided from what holds now, and the inventory is its
    /// own to-do list.
    /// Covers: R10.4, R6.1
    #[test]
    fn a_kill_between_any_two_steps_then_a_rerun_ends_the_same() {
        let c0 = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let write = |c: &TalosCluster, d: &Decision| {
            let mut c = c.clone();
            c.status = Some(d.status.clone());
            c
        };
        // The run without a kill.
        let mut o = observed(complete());
        let d1 = decide(&c0, &o, &settings(true), &at(100));
        let c1 = write(&c0, &d1);
        o = with_inline(o, &[]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d2 = decide(&c1, &o, &settings(true), &at(110));
        let ClusterAction::ReleaseInventory { step, .. } = &d2.actions[0] else {
            panic!("{:?}", d2.actions);
        };
        let mut cleaned = inventory_after_init();
        cleaned.data = Some(step.data.clone());
        let end = write(&c1, &d2);

        // Killed after the inventory write, before the status write: the
        // rerun finds the inventory clean and ends True with nothing to do.
        let mut rerun = o.clone();
        rerun.inventory = inventory(Some(cleaned.clone()));
        let d = decide(&c1, &rerun, &settings(true), &at(120));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");

        // Killed before step 1's status write: the rerun decides step 1 again.
        let d = decide(&c0, &observed(complete()), &settings(true), &at(120));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            condition(&d1, types::CNI_HANDOVER).reason
        );
        assert!(d.actions.is_empty());

        // Killed with the annotations stripped and the inventory not yet
        // written: the inventory still names them, the same step again.
        let d = decide(&c1, &o, &settings(true), &at(120));
        assert_eq!(d.actions, d2.actions);

        // And once True, it stays True with nothing more to do.
        let d = decide(&end, &rerun, &settings(true), &at(130));
        assert!(d.actions.is_empty());
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
    }

    /// After the hand-over, while a control plane still carries the inline
    /// entry (Talos's boot apply records its objects again), the inventory
    /// step is taken again; the condition stays True.
    /// Covers: R6.1
    #[test]
    fn a_handed_over_cluster_clears_the_inventory_again_while_the_entry_remains() {
        let c = cluster(include_str!("../fixtures/cluster-handed-over.yaml"));
        let mut o = with_inline(observed(complete()), &["cilium"]);
        o.inventory = inventory(Some(inventory_after_init()));
        let d = decide(&c, &o, &settings(true), &at(200));
        assert!(matches!(
            d.actions.as_slice(),
            [ClusterAction::ReleaseInventory { .. }]
        ));
        assert_eq!(condition(&d, types::CNI_HANDOVER).status, "True");
        assert_eq!(
            inline_pending(&c, &o.machines),
            ["prod-cp-1 (held: release it so Ichor may apply)".to_string()]
        );
    }

    #[test]
    fn values_that_give_no_effective_values_are_said() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let o = observed(Some(Err("the values are not a mapping".into())));
        let d = decide(&c, &o, &settings(true), &at(100));
        let h = condition(&d, types::CNI_HANDOVER);
        assert_eq!(h.reason, reasons::INVALID_VALUES);
        assert!(d.actions.is_empty());
    }

    #[test]
    fn unmanaged_has_nothing_to_hand_over_and_detects_what_runs() {
        let c = cluster(include_str!("../fixtures/cluster-unmanaged.yaml"));
        let mut o = observed(None);
        o.machines.clear();
        o.cni_workloads = vec![workload(
            "kube-system",
            "kube-flannel",
            "ghcr.io/siderolabs/flannel:v0.26",
        )];
        let d = decide(&c, &o, &settings(true), &at(100));
        assert_eq!(
            condition(&d, types::CNI_HANDOVER).reason,
            reasons::UNMANAGED
        );
        assert_eq!(condition(&d, types::READY).reason, reasons::NO_MACHINES);
        assert_eq!(
            d.status.cni.as_ref().and_then(|c| c.detected),
            Some(DetectedCni::Flannel)
        );
        assert!(d.actions.is_empty());
    }

    #[test]
    fn ready_names_the_machine_not_reconciled_yet() {
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let d = decide(&c, &observed(None), &settings(true), &at(100));
        let r = condition(&d, types::READY);
        assert_eq!(r.reason, reasons::MACHINES_NOT_READY);
        assert_eq!(
            r.message,
            "1 of 2 machines are not Ready: prod-w-1 (not reconciled yet)"
        );
    }

    #[test]
    fn detected_cni_asks_the_one_detector_with_ichors_release() {
        let mut o = observed(None);
        o.cni_workloads.clear();
        assert_eq!(detected_cni(&o), DetectedCni::None);
        // R2.2: Ichor's release deployed counts before its DaemonSet.
        let deployed = observed(Some(Ok(check(Some((1, "0123456789abcdef")), Ok(())))));
        let o = Observed {
            cni_workloads: vec![],
            ..deployed
        };
        assert_eq!(detected_cni(&o), DetectedCni::Cilium);
        // Weave is seen as another CNI, as adopt sees it.
        let o = Observed {
            cni_workloads: vec![workload(
                "kube-system",
                "weave-net",
                "weaveworks/weave-kube:2.8",
            )],
            ..observed(None)
        };
        assert_eq!(detected_cni(&o), DetectedCni::Other);
    }

    /// `observed` with every machine Ready.
    fn machines_ready(mut o: Observed) -> Observed {
        for m in o.machines.iter_mut() {
            let s = m.status.get_or_insert_with(Default::default);
            let ready = conditions::new(
                types::READY,
                Status::True,
                reasons::RECONCILED,
                "read",
                m.metadata.generation,
                at(1),
            );
            conditions::set(&mut s.conditions, ready);
        }
        o
    }

    /// The decision through a hand-over, as GitOps tools read it:
    /// Reconciling with Ready Unknown while it runs, Ready once handed
    /// over, Stalled on values that give none, Ready False while a machine
    /// is not Ready; Flux's checker rules hold in each.
    /// Covers: R17.1a, R17.1b
    #[test]
    fn the_hand_over_is_reconciling_until_done_and_keeps_fluxs_rules() {
        use ichor_api::conditions::flux::ichor_violations;
        let c = cluster(include_str!("../fixtures/cluster-cilium.yaml"));
        let daemonset_not_ready = check(Some((2, super::DESIRED)), Err("0 of 3 ready".into()));
        let cases = [
            (
                machines_ready(observed(Some(Ok(check(Some((1, "old")), Ok(())))))),
                "Unknown",
                Some(reasons::JOB_RUNNING),
                None,
            ),
            (
                machines_ready(observed(Some(Ok(daemonset_not_ready)))),
                "Unknown",
                Some(reasons::WAITING_FOR_DAEMON_SET),
                None,
            ),
            (
                machines_ready(with_inline(observed(complete()), &[])),
                "True",
                None,
                None,
            ),
            (
                machines_ready(observed(Some(Err("the values are not a mapping".into())))),
                "False",
                None,
                Some(reasons::INVALID_VALUES),
            ),
            (
                observed(Some(Ok(check(Some((1, "old")), Ok(()))))),
                "False",
                None,
                None,
            ),
        ];
        for (o, ready, reconciling, stalled) in cases {
            let d = decide(&c, &o, &settings(true), &at(100));
            let cs = &d.status.conditions;
            let reason = |type_| conditions::find(cs, type_).map(|c| c.reason.as_str());
            assert_eq!(condition(&d, types::READY).status, ready, "{cs:?}");
            assert_eq!(reason(types::RECONCILING), reconciling, "{cs:?}");
            assert_eq!(reason(types::STALLED), stalled, "{cs:?}");
            let broken = ichor_violations(c.metadata.generation, d.status.observed_generation, cs);
            assert!(broken.is_empty(), "{broken:?} in {cs:?}");
        }
    }
}

mod condition_tests {
    use super::super::*;
    use super::{DESIRED, at, check};

    fn machine(name: &str, ready: Option<(&str, &str)>) -> TalosMachine {
        let mut m: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterRef": {"name": "c"}, "role": "worker", "address": "10.0.0.2"}
        }))
        .unwrap();
        if let Some((status, reason)) = ready {
            let st = if status == "True" {
                Status::True
            } else {
                Status::False
            };
            m.status = Some(ichor_api::TalosMachineStatus {
                conditions: vec![conditions::new(
                    types::READY,
                    st,
                    reason,
                    "",
                    Some(1),
                    at(0),
                )],
                ..Default::default()
            });
        }
        m
    }

    #[test]
    fn cluster_ready_names_the_machines_that_are_not() {
        let now = at(0);
        let c = ready(&[], Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::NO_MACHINES)
        );
        let a = machine("a", Some(("True", reasons::RECONCILED)));
        let b = machine("b", Some(("False", reasons::NODE_UNREACHABLE)));
        let n = machine("n", None);
        let c = ready(&[&a], Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::RECONCILED)
        );
        let c = ready(&[&a, &b, &n], Some(1), &now);
        assert_eq!(c.reason, reasons::MACHINES_NOT_READY);
        assert_eq!(
            c.message,
            "2 of 3 machines are not Ready: b (NodeUnreachable), n (not reconciled yet)"
        );
    }

    /// Covers: R1.5e
    #[test]
    fn handover_needs_the_hash_and_a_ready_daemonset() {
        let now = at(0);
        let c = handover_condition(&check(Some((1, DESIRED)), Ok(())), "s", "r", Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::HANDED_OVER)
        );
        let c = handover_condition(
            &check(Some((1, DESIRED)), Err("0 of 3 ready".into())),
            "s",
            "r",
            Some(1),
            &now,
        );
        assert_eq!(c.reason, reasons::WAITING_FOR_DAEMON_SET);
        assert!(c.message.contains("0 of 3 ready"));
        let c = handover_condition(&check(Some((2, "h0")), Ok(())), "s", "r", Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::WAITING_FOR_RELEASE)
        );
        assert!(
            c.message.contains("h0") && c.message.contains(DESIRED),
            "{}",
            c.message
        );
        let c = handover_condition(&check(None, Ok(())), "s", "r", Some(1), &now);
        assert_eq!(c.reason, reasons::WAITING_FOR_RELEASE);
    }
}
