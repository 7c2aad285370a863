use std::collections::BTreeSet;
use std::sync::Arc;

use ichor_api::conditions::{self as conds, Status, reasons};
use ichor_api::{
    ClusterRef, DeploymentSpec, DriftClass, DriftEntry, IchorInstallation, IchorInstallationSpec,
    MachineProgress, MachineRole, MachineStep, Manager, OperationPhase, OperationTarget, PlanEntry,
    PlannedAction, TalosCluster, TalosClusterSpec, TalosClusterStatus, TalosMachine,
    TalosMachineSpec, TalosMachineStatus, TalosOperation, TalosOperationSpec, TalosOperationStatus,
};
use ichor_render::redact::digest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;

use super::*;

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn cluster(name: &str, ready: Option<bool>) -> Arc<TalosCluster> {
    let mut c = TalosCluster::new(
        name,
        serde_json::from_value::<TalosClusterSpec>(serde_json::json!({
            "endpoint": "https://10.5.0.2:6443",
            "talosVersion": "v1.13.0",
            "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"}
        }))
        .unwrap(),
    );
    c.metadata.namespace = Some("lab".into());
    let mut status = TalosClusterStatus::default();
    if let Some(r) = ready {
        conds::set(
            &mut status.conditions,
            conds::new(
                types::READY,
                if r { Status::True } else { Status::False },
                if r {
                    reasons::RECONCILED
                } else {
                    reasons::MACHINES_NOT_READY
                },
                if r { "all good" } else { "node-2 is not Ready" },
                None,
                now(),
            ),
        );
    }
    conds::set(
        &mut status.conditions,
        conds::new(
            types::CNI_HANDOVER,
            Status::True,
            reasons::HANDED_OVER,
            "done",
            None,
            now(),
        ),
    );
    c.status = Some(status);
    Arc::new(c)
}

fn entry(path: &str, class: DriftClass, live: &str, desired: &str) -> DriftEntry {
    DriftEntry {
        path: path.into(),
        class,
        live: Some(live.into()),
        desired: Some(desired.into()),
        reason: Some(format!("reason of {path}")),
    }
}

fn machine(
    name: &str,
    cluster: &str,
    role: MachineRole,
    hold: bool,
    drift: Vec<DriftEntry>,
    ready: bool,
) -> Arc<TalosMachine> {
    let mut m = TalosMachine::new(
        name,
        TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: cluster.into(),
            },
            role,
            address: format!("10.5.0.{}", name.len()),
            hold,
            patches: vec![],
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        },
    );
    m.metadata.namespace = Some("lab".into());
    let mut status = TalosMachineStatus {
        config_hash: Some("abc".into()),
        drift,
        talos_version: Some("v1.13.0".into()),
        ..TalosMachineStatus::default()
    };
    conds::set(
        &mut status.conditions,
        conds::new(
            types::READY,
            if ready { Status::True } else { Status::False },
            reasons::RECONCILED,
            "",
            None,
            now(),
        ),
    );
    m.status = Some(status);
    Arc::new(m)
}

fn operation(name: &str, cluster: &str, phase: Option<OperationPhase>) -> Arc<TalosOperation> {
    let mut o = TalosOperation::new(
        name,
        TalosOperationSpec {
            kind: ichor_api::OperationKind::Reboot,
            target: OperationTarget {
                cluster_ref: ClusterRef {
                    name: cluster.into(),
                },
                machines: vec![],
            },
            version: None,
            concurrency: None,
            installer_image: None,
            dry_run: false,
            skip_backup: None,
            maintenance_windows: None,
            health_checks: Vec::new(),
            alertmanager: None,
            allow_downgrade: false,
        },
    );
    o.metadata.namespace = Some("lab".into());
    o.status = Some(TalosOperationStatus {
        phase,
        plan: vec![
            PlanEntry {
                machine: "cp-1".into(),
                role: MachineRole::Controlplane,
                batch: 0,
                action: PlannedAction::Reboot,
                reason: None,
            },
            PlanEntry {
                machine: "w-1".into(),
                role: MachineRole::Worker,
                batch: 1,
                action: PlannedAction::Skip,
                reason: Some("held".into()),
            },
        ],
        machines: vec![MachineProgress {
            machine: "cp-1".into(),
            step: MachineStep::Rebooting,
            node_name: Some("talos-cp-1".into()),
            ..MachineProgress::default()
        }],
        ..TalosOperationStatus::default()
    });
    Arc::new(o)
}

fn lab() -> Inventory {
    Inventory {
        clusters: vec![cluster("one", Some(true)), cluster("two", Some(false))],
        machines: vec![
            machine(
                "cp-1",
                "one",
                MachineRole::Controlplane,
                false,
                vec![],
                true,
            ),
            machine(
                "w-1",
                "one",
                MachineRole::Worker,
                true,
                vec![
                    entry("machine.nodeLabels.zone", DriftClass::B, "a", "b"),
                    entry("cluster.proxy.disabled", DriftClass::C, "false", "true"),
                    entry("KubeProxyConfig.enabled", DriftClass::A, "", "true"),
                ],
                true,
            ),
            machine(
                "w-2",
                "one",
                MachineRole::Worker,
                true,
                vec![entry("machine.nodeLabels.zone", DriftClass::B, "a", "b")],
                false,
            ),
            machine(
                "cp-9",
                "two",
                MachineRole::Controlplane,
                false,
                vec![],
                false,
            ),
        ],
        operations: vec![operation("reboot-1", "one", Some(OperationPhase::Running))],
        installation: None,
    }
}

/// Covers: the UI's pages, docs/ui.md (clusters: phase, upgrading while an operation runs, versions, CNI and hand-over, machines in sync)
#[test]
fn clusters_page_shows_upgrading_health_and_sync() {
    let page = clusters_page(&lab());
    assert_eq!(page.rows.len(), 2);
    let one = &page.rows[0];
    assert_eq!(one.name, "one");
    assert_eq!(
        one.phase, "Upgrading",
        "a running TalosOperation makes it Upgrading"
    );
    assert_eq!(one.running_operations, vec!["reboot-1".to_string()]);
    assert_eq!((one.in_sync, one.machines, one.held), (1, 3, 2));
    assert_eq!(one.cni, "cilium");
    assert_eq!(one.handover.as_deref(), Some("True HandedOver"));
    let two = &page.rows[1];
    assert_eq!(two.phase, "Degraded");
    assert_eq!(
        two.health.as_deref(),
        Some("MachinesNotReady: node-2 is not Ready")
    );
}

/// Covers: R4.3f (the UI tolerates the absence of the IchorInstallation), R4.6a (Helm-managed: the helm upgrade command, no action)
#[test]
fn ichor_summary_without_and_with_helm() {
    let none = ichor_summary(None);
    assert_eq!(none.version, None);
    assert!(!none.helm_managed);
    assert_eq!(none.helm_upgrade_command, None);
    let mut inst = IchorInstallation::new(
        "ichor",
        IchorInstallationSpec {
            version: "v0.1.0".into(),
            deployment: DeploymentSpec {
                manager: Manager::Helm,
            },
            installer_repository: None,
        },
    );
    inst.metadata.namespace = Some("ichor-system".into());
    let helm = ichor_summary(Some(&inst));
    assert_eq!(helm.version.as_deref(), Some("v0.1.0"));
    assert_eq!(
        helm.helm_upgrade_command.as_deref(),
        Some(
            "helm upgrade ichor oci://ghcr.io/maeshinshin/charts/ichor --version VERSION --namespace ichor-system --reuse-values"
        )
    );
    inst.spec.deployment.manager = Manager::Installer;
    assert_eq!(ichor_summary(Some(&inst)).helm_upgrade_command, None);
}

/// Covers: the UI's pages, docs/ui.md (cluster: control plane ready, held machines with what they hold back)
#[test]
fn cluster_page_lists_held_machines_and_what_they_hold_back() {
    let p = cluster_page(&lab(), "lab", "one", Permissions::default()).unwrap();
    assert_eq!(p.control_plane_ready, (1, 1));
    assert_eq!(
        p.held,
        vec![
            HeldMachine {
                name: "w-1".into(),
                held_back: vec![
                    "machine.nodeLabels.zone".into(),
                    "cluster.proxy.disabled".into()
                ],
            },
            HeldMachine {
                name: "w-2".into(),
                held_back: vec!["machine.nodeLabels.zone".into()],
            },
        ]
    );
    assert!(!p.can_start_operation);
    let p = cluster_page(
        &lab(),
        "lab",
        "one",
        Permissions {
            create_operations: true,
            ..Permissions::default()
        },
    )
    .unwrap();
    assert!(p.can_start_operation);
    assert!(cluster_page(&lab(), "lab", "nope", Permissions::default()).is_none());
    assert!(cluster_page(&lab(), "other", "one", Permissions::default()).is_none());
}

/// Covers: the UI's pages, docs/ui.md (machines: search and filters held, drifted, class, role with counts)
#[test]
fn machines_filters_and_counts() {
    let inv = lab();
    let all = machines_page(&inv, MachineQuery::default());
    assert_eq!(all.rows.len(), 4);
    assert_eq!(
        all.counts,
        FilterCounts {
            all: 4,
            held: 2,
            drifted: 2,
            class_a: 0,
            class_b: 1,
            class_c: 1,
            controlplane: 2,
            worker: 2,
        }
    );
    let names = |q: MachineQuery| -> Vec<String> {
        machines_page(&inv, q)
            .rows
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    assert_eq!(
        names(MachineQuery {
            held: "yes".into(),
            ..MachineQuery::default()
        }),
        ["w-1", "w-2"]
    );
    assert_eq!(
        names(MachineQuery {
            held: "no".into(),
            ..MachineQuery::default()
        }),
        ["cp-1", "cp-9"]
    );
    assert_eq!(
        names(MachineQuery {
            class: "C".into(),
            ..MachineQuery::default()
        }),
        ["w-1"]
    );
    assert_eq!(
        names(MachineQuery {
            role: "controlplane".into(),
            drifted: "no".into(),
            ..MachineQuery::default()
        }),
        ["cp-1", "cp-9"]
    );
    // The search narrows the counts too: they say what each filter would show.
    let searched = machines_page(
        &inv,
        MachineQuery {
            q: "W-".into(),
            ..MachineQuery::default()
        },
    );
    assert_eq!(searched.counts.all, 2);
    assert_eq!(searched.counts.controlplane, 0);
    assert_eq!(searched.total, 4);
    // Words must all match: name and cluster.
    assert_eq!(
        names(MachineQuery {
            q: "two cp".into(),
            ..MachineQuery::default()
        }),
        ["cp-9"]
    );
    // An unknown filter value filters nothing.
    assert_eq!(
        names(MachineQuery {
            class: "Z".into(),
            ..MachineQuery::default()
        })
        .len(),
        4
    );
}

/// Covers: R12.4 (what releasing the hold would do: paths, apply mode, reboot or not)
#[test]
fn release_preview_follows_the_classes() {
    let b = entry("machine.nodeLabels.zone", DriftClass::B, "a", "b");
    let c = entry("cluster.network.podSubnets", DriftClass::C, "x", "y");
    let a = entry("KubeProxyConfig.enabled", DriftClass::A, "", "true");
    let only_b = release_preview(&[a.clone(), b.clone()]);
    assert_eq!(only_b.mode, ApplyMode::NoReboot);
    assert_eq!(only_b.applies, vec!["machine.nodeLabels.zone".to_string()]);
    assert!(!only_b.reboots);
    let with_c = release_preview(&[b.clone(), c.clone()]);
    assert_eq!(with_c.mode, ApplyMode::BlockedByClassC);
    assert!(
        with_c.applies.is_empty(),
        "one C entry blocks the whole machine"
    );
    assert_eq!(
        with_c.blocked_by,
        vec![(
            "cluster.network.podSubnets".to_string(),
            "reason of cluster.network.podSubnets".to_string()
        )]
    );
    assert_eq!(release_preview(&[a]).mode, ApplyMode::NothingToApply);
    assert_eq!(release_preview(&[]).mode, ApplyMode::NothingToApply);
}

/// Covers: the UI's pages, docs/ui.md (per-path drift with class badges and meanings), R8.1 (secrets as digests)
#[test]
fn machine_page_shows_drift_with_secrets_as_digests() {
    let mut inv = lab();
    inv.machines.push(machine(
        "w-3",
        "one",
        MachineRole::Worker,
        true,
        vec![
            entry("machine.nodeLabels.zone", DriftClass::B, "a", "b"),
            // A secret that reached status unredacted is still not shown.
            entry(
                "cluster.secret",
                DriftClass::C,
                "SECRETMARKER-old",
                "SECRETMARKER-new",
            ),
            // A digest the controller wrote is shown as it is.
            entry("machine.token", DriftClass::C, &digest("t1"), &digest("t2")),
            // A secret key under a public path is hidden.
            entry(
                "machine.network.interfaces[wg0].wireguard.privateKey",
                DriftClass::B,
                "SECRETMARKER-k",
                "SECRETMARKER-l",
            ),
        ],
        true,
    ));
    let p = machine_page(
        &inv,
        "lab",
        "w-3",
        Permissions {
            patch_machines: true,
            ..Permissions::default()
        },
    )
    .unwrap();
    let shown = format!("{:?}", p.drift);
    assert!(!shown.contains("SECRETMARKER"), "{shown}");
    assert_eq!(p.drift[0].live.as_deref(), Some("a"));
    assert_eq!(p.drift[1].live, Some(digest("SECRETMARKER-old")));
    assert_eq!(p.drift[2].live, Some(digest("t1")));
    assert_eq!(p.drift[3].desired, Some(digest("SECRETMARKER-l")));
    assert_eq!(p.legend.len(), 3);
    assert!(p.legend[2].1.contains("never applies it on its own"));
    assert!(p.can_release && !p.can_take_hold);
    assert!(p.release.is_some());
    let no_rights = machine_page(&inv, "lab", "w-3", Permissions::default()).unwrap();
    assert!(!no_rights.can_release && !no_rights.can_take_hold);
    let released = machine_page(
        &inv,
        "lab",
        "cp-1",
        Permissions {
            patch_machines: true,
            ..Permissions::default()
        },
    )
    .unwrap();
    assert!(released.can_take_hold && !released.can_release);
    assert!(released.release.is_none());
}

#[test]
fn paths_parse_as_the_drift_writes_them() {
    use ichor_render::path::Segment::{Item, Key};
    assert_eq!(
        parse_path("cluster.inlineManifests[cilium].contents").0,
        vec![
            Key("cluster".into()),
            Key("inlineManifests".into()),
            Item("cilium".into()),
            Key("contents".into())
        ]
    );
    assert_eq!(
        parse_path("machine.nodeLabels[\"node.kubernetes.io/exclude\"]").0,
        vec![
            Key("machine".into()),
            Key("nodeLabels".into()),
            Key("node.kubernetes.io/exclude".into())
        ]
    );
    assert_eq!(
        parse_path("KubeInlineManifestConfig[cilium]").to_string(),
        "KubeInlineManifestConfig[cilium]"
    );
}

/// Covers: the UI's pages, docs/ui.md (operations: the plan and per-machine progress with node names)
#[test]
fn operation_page_joins_plan_and_progress() {
    let inv = lab();
    let p = operation_page(
        &inv,
        "lab",
        "reboot-1",
        Permissions {
            patch_operations: true,
            ..Permissions::default()
        },
    )
    .unwrap();
    assert_eq!(p.row.phase, "Running");
    assert_eq!(p.row.done, (0, 2));
    assert_eq!(p.progress.len(), 2);
    assert_eq!(p.progress[0].machine, "cp-1");
    assert_eq!(p.progress[0].node.as_deref(), Some("talos-cp-1"));
    assert_eq!(p.progress[0].step, "Rebooting");
    assert_eq!(p.progress[1].action, "skip");
    assert_eq!(p.progress[1].reason.as_deref(), Some("held"));
    assert_eq!(p.progress[1].step, "Pending");
    assert!(p.can_cancel);
    assert!(
        !operation_page(&inv, "lab", "reboot-1", Permissions::default())
            .unwrap()
            .can_cancel
    );
    let mut done = inv.clone();
    done.operations = vec![operation(
        "reboot-2",
        "one",
        Some(OperationPhase::Succeeded),
    )];
    let all = Permissions {
        patch_machines: true,
        create_operations: true,
        patch_operations: true,
        delete_machines: true,
    };
    assert!(
        !operation_page(&done, "lab", "reboot-2", all)
            .unwrap()
            .can_cancel
    );
    assert_eq!(operations_page(&done).len(), 1);
}

/// Covers: the UI's pages, docs/ui.md (cluster: the Cilium release's status read from its record)
#[test]
fn cluster_page_shows_the_cilium_release_from_its_record() {
    let mut inv = lab();
    let i = inv
        .clusters
        .iter()
        .position(|c| c.name_any() == "one")
        .unwrap();
    let mut c = (*inv.clusters[i]).clone();
    c.spec.cni.preset = ichor_api::CniPreset::Cilium;
    inv.clusters[i] = Arc::new(c.clone());
    let p = cluster_page(&inv, "lab", "one", Permissions::default()).unwrap();
    assert_eq!(p.cilium_release.as_deref(), Some("no Helm record yet"));

    c.status.get_or_insert_with(Default::default).cni = Some(ichor_api::CniStatus {
        detected: None,
        release: Some(ichor_api::CiliumReleaseStatus {
            name: "cilium".into(),
            storage_namespace: "ichor-system".into(),
            revision: 3,
            status: "failed".into(),
            chart_version: Some("1.18.5".into()),
            last_deployed: Some("2026-01-02T03:04:05Z".into()),
            deployed_revision: Some(2),
        }),
        job_failures: None,
    });
    inv.clusters[i] = Arc::new(c.clone());
    let p = cluster_page(&inv, "lab", "one", Permissions::default()).unwrap();
    assert_eq!(
        p.cilium_release.as_deref(),
        Some(
            "cilium revision 3: failed (revision 2 is the one deployed), chart 1.18.5, deployed 2026-01-02T03:04:05Z; record in ichor-system"
        )
    );

    c.spec.cni.preset = ichor_api::CniPreset::Unmanaged;
    inv.clusters[i] = Arc::new(c);
    let p = cluster_page(&inv, "lab", "one", Permissions::default()).unwrap();
    assert_eq!(
        p.cilium_release, None,
        "an unmanaged CNI has no Ichor release"
    );
}

/// The lab, with one more machine and operation in namespace `other`.
fn two_namespaces() -> Inventory {
    let mut inv = lab();
    let mut m = (*machine("x-1", "far", MachineRole::Worker, false, vec![], true)).clone();
    m.metadata.namespace = Some("other".into());
    inv.machines.push(Arc::new(m));
    let mut o = (*operation("far-op", "far", None)).clone();
    o.metadata.namespace = Some("other".into());
    inv.operations.push(Arc::new(o));
    inv
}

/// Covers: R18.3 (every page shows only what the user may list: per kind, cluster-wide or per namespace; no grant, nothing)
#[test]
fn pages_show_only_what_the_user_may_read() {
    let inv = two_namespaces();
    assert_eq!(
        namespaces(&inv),
        [
            BTreeSet::from(["lab".to_string()]),
            BTreeSet::from(["lab".to_string(), "other".to_string()]),
            BTreeSet::from(["lab".to_string(), "other".to_string()]),
        ]
    );

    // No grant: no machine, no cluster, no operation, on any page.
    let none = ReadGrants::default();
    assert!(none.reads_nothing());
    let seen = visible(&inv, &none);
    assert!(seen.clusters.is_empty() && seen.machines.is_empty() && seen.operations.is_empty());
    assert!(
        machines_page(&seen, MachineQuery::default())
            .rows
            .is_empty()
    );
    assert!(clusters_page(&seen).rows.is_empty());
    assert!(operations_page(&seen).is_empty());
    assert!(machine_page(&seen, "lab", "w-1", Permissions::default()).is_none());

    // Machines of namespace other only.
    let other = ReadGrants {
        machines: Readable::default().with("other"),
        ..ReadGrants::default()
    };
    assert!(!other.reads_nothing());
    let seen = visible(&inv, &other);
    let names: Vec<String> = machines_page(&seen, MachineQuery::default())
        .rows
        .iter()
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect();
    assert_eq!(names, vec!["other/x-1".to_string()]);
    assert!(seen.operations.is_empty() && seen.clusters.is_empty());

    // Cluster-wide list: everything of that kind.
    let all_ops = ReadGrants {
        operations: Readable::Everywhere,
        ..ReadGrants::default()
    };
    assert_eq!(operations_page(&visible(&inv, &all_ops)).len(), 2);
    let everything = visible(&inv, &ReadGrants::everything());
    assert_eq!(everything.machines.len(), inv.machines.len());
    assert_eq!(everything.clusters.len(), inv.clusters.len());
    // Everywhere stays everywhere when a namespace is added.
    assert_eq!(Readable::Everywhere.with("x"), Readable::Everywhere);
}

/// A value that only looks like a digest is not shown as it is, and a URL
/// with a token is a digest even on a public path.
/// Covers: R8.1
#[test]
fn only_real_digests_and_public_values_are_shown() {
    use ichor_render::path::{ConfigPath, Segment::Key};
    let secret = ConfigPath(vec![Key("cluster".into()), Key("secret".into())]);
    let forged = "sha256:this-is-the-secret-itself";
    assert_ne!(shown_value(&secret, forged), forged);
    let real = ichor_render::redact::digest("s3cr3t");
    assert_eq!(shown_value(&secret, &real), real);
    let manifests = ConfigPath(vec![Key("cluster".into()), Key("extraManifests".into())]);
    let url = "https://example.com/m.yaml?token=T0K3N";
    assert!(!shown_value(&manifests, url).contains("T0K3N"));
    let plain = "https://example.com/m.yaml";
    assert_eq!(shown_value(&manifests, plain), plain);
}

/// A machine whose removal runs at `step` of the usual plan.
fn leaving(step: &str) -> Arc<TalosMachine> {
    let mut m = (*machine("w-4", "one", MachineRole::Worker, false, vec![], true)).clone();
    m.metadata.deletion_timestamp = Some(now());
    m.status.as_mut().unwrap().membership = Some(ichor_api::MembershipStatus {
        phase: ichor_api::MembershipPhase::Leaving,
        plan: ["Cordon", "Drain", "Reset", "DeleteNode"]
            .map(String::from)
            .to_vec(),
        step: Some(step.into()),
        message: Some("evicting 2 pods; budget web-pdb allows none now".into()),
        since: Some(now()),
        ..ichor_api::MembershipStatus::default()
    });
    Arc::new(m)
}

/// Covers: R14.24 (the machine page shows a removal's steps; remove is offered only with delete on talosmachines)
#[test]
fn machine_page_shows_membership_and_offers_remove_only_when_allowed() {
    let mut inv = lab();
    inv.machines.push(leaving("Drain"));
    let p = machine_page(&inv, "lab", "w-4", Permissions::default()).unwrap();
    let m = p.membership.as_ref().expect("a removal is shown");
    assert_eq!(m.phase, ichor_api::MembershipPhase::Leaving);
    assert_eq!(
        m.steps,
        [
            ("Cordon".to_string(), StepState::Done),
            ("Drain".to_string(), StepState::Running),
            ("Reset".to_string(), StepState::Pending),
            ("DeleteNode".to_string(), StepState::Pending),
        ]
    );
    assert!(m.message.as_deref().unwrap().contains("web-pdb"));
    // Already leaving: nothing more to remove, whoever looks.
    let all = Permissions {
        delete_machines: true,
        ..Permissions::default()
    };
    assert!(!machine_page(&inv, "lab", "w-4", all).unwrap().can_remove);

    // A plain member shows no membership; remove needs delete.
    let member = machine_page(&inv, "lab", "cp-1", all).unwrap();
    assert!(member.membership.is_none() && member.can_remove);
    let patch_only = Permissions {
        patch_machines: true,
        ..Permissions::default()
    };
    assert!(
        !machine_page(&inv, "lab", "cp-1", patch_only)
            .unwrap()
            .can_remove
    );

    let viewer = crate::html::Viewer {
        user: Some("ops".into()),
        read_only: false,
        reads_nothing: false,
    };
    let page = crate::html::machine(&machine_page(&inv, "lab", "w-4", all).unwrap(), &viewer)
        .into_string();
    assert!(page.contains("id=\"membership-steps\""), "{page}");
    assert!(page.contains("<strong>Drain</strong> running"), "{page}");
    assert!(!page.contains("/remove\""), "{page}");
    let page = crate::html::machine(&member, &viewer).into_string();
    assert!(
        page.contains("action=\"/machines/lab/cp-1/remove\""),
        "{page}"
    );
    let page = crate::html::machine(
        &machine_page(&inv, "lab", "cp-1", patch_only).unwrap(),
        &viewer,
    )
    .into_string();
    assert!(!page.contains("/remove\""), "{page}");
}

/// A removal the controller has not planned yet shows as leaving; a
/// refused join says why.
#[test]
fn membership_before_the_plan_and_when_refused() {
    let mut m = (*machine("w-5", "one", MachineRole::Worker, false, vec![], false)).clone();
    m.metadata.deletion_timestamp = Some(now());
    let v = membership_view(&m).unwrap();
    assert_eq!(v.phase, ichor_api::MembershipPhase::Leaving);
    assert!(v.steps.is_empty());
    m.metadata.deletion_timestamp = None;
    m.status.as_mut().unwrap().membership = Some(ichor_api::MembershipStatus {
        phase: ichor_api::MembershipPhase::Refused,
        message: Some("etcd already has a member named w-5".into()),
        ..ichor_api::MembershipStatus::default()
    });
    let v = membership_view(&m).unwrap();
    assert_eq!(v.phase, ichor_api::MembershipPhase::Refused);
    assert!(v.message.unwrap().contains("already has a member"));
}
