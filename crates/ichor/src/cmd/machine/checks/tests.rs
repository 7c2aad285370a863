use std::collections::BTreeSet;

use ichor_api::{MembershipStatus, TalosMachineSpec, TalosMachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;

fn machine(name: &str, role: MachineRole, address: &str, ready: bool) -> TalosMachine {
    let mut m = TalosMachine::new(
        name,
        TalosMachineSpec {
            cluster_ref: ichor_api::ClusterRef { name: "lab".into() },
            role,
            address: address.into(),
            hold: false,
            patches: Vec::new(),
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        },
    );
    m.status = Some(TalosMachineStatus {
        talos_version: Some("v1.13.9".into()),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: "Test".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }],
        ..TalosMachineStatus::default()
    });
    m
}

fn lab() -> Vec<TalosMachine> {
    vec![
        machine("cp-1", MachineRole::Controlplane, "10.5.0.2", true),
        machine("cp-2", MachineRole::Controlplane, "10.5.0.3", true),
        machine("cp-3", MachineRole::Controlplane, "10.5.0.4", true),
        machine("w-1", MachineRole::Worker, "10.5.0.5", true),
    ]
}

fn fresh(address: &str, hostname: &str) -> Probe {
    Probe {
        address: address.into(),
        reading: NodeReading::Maintenance {
            hostname: hostname.into(),
            talos_version: "v1.13.9".into(),
        },
    }
}

fn versions() -> BTreeSet<String> {
    BTreeSet::from(["v1.13.9".to_string()])
}

fn request<'a>(
    names: &'a [String],
    versions: &'a BTreeSet<String>,
    machines: &'a [TalosMachine],
) -> AddRequest<'a> {
    AddRequest {
        cluster: "lab",
        role: MachineRole::Worker,
        names,
        hold: false,
        replaces: None,
        cluster_versions: versions,
        machines,
    }
}

/// Covers: R14.20 (fresh nodes are planned, named after their hostname or --name)
#[test]
fn fresh_nodes_are_planned() {
    let (v, m) = (versions(), lab());
    let planned = plan_add(
        &request(&[], &v, &m),
        &[fresh("10.5.0.7", "w-2"), fresh("10.5.0.8:50001", "w-3")],
    )
    .unwrap();
    assert_eq!(
        planned.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["w-2", "w-3"]
    );
    let names = ["a".to_string(), "b".to_string()];
    let planned = plan_add(
        &request(&names, &v, &m),
        &[fresh("10.5.0.7", "w-2"), fresh("10.5.0.8", "w-3")],
    )
    .unwrap();
    assert_eq!(planned[1].name, "b");
}

/// Covers: R14.20 (every refusal at once)
#[test]
fn every_refusal_is_reported_at_once() {
    let (v, m) = (versions(), lab());
    let probes = [
        Probe {
            address: "10.5.0.7".into(),
            reading: NodeReading::Configured {
                detail: "its machine stage is 5, not maintenance".into(),
            },
        },
        Probe {
            address: "10.5.0.8".into(),
            reading: NodeReading::Unreachable {
                error: "connection refused".into(),
            },
        },
        fresh("10.5.0.9", "w-9"),
        fresh("10.5.0.9:50000", "w-10"),
        Probe {
            address: "10.5.0.10".into(),
            reading: NodeReading::Maintenance {
                hostname: "w-old".into(),
                talos_version: "v1.12.0".into(),
            },
        },
        fresh("10.5.0.11", "cp-2"),
        fresh("10.5.0.5", "w-new"),
        fresh("10.5.0.12", "w-9"),
    ];
    let refusals = plan_add(&request(&[], &v, &m), &probes).unwrap_err();
    let text: Vec<String> = refusals.iter().map(ToString::to_string).collect();
    let expect = [
        "node 10.5.0.7 is not in maintenance mode",
        "node 10.5.0.8 is unreachable: connection refused",
        "node 10.5.0.9:50000 is given twice",
        "node 10.5.0.10 runs Talos v1.12.0, which cluster lab does not run (v1.13.9)",
        "the name cp-2 (for node 10.5.0.11) is taken",
        "node 10.5.0.5 is already a member: TalosMachine w-1 has that address",
        "the name w-9 would be given to two nodes",
    ];
    assert_eq!(text.len(), expect.len(), "{text:#?}");
    for (t, e) in text.iter().zip(expect) {
        assert!(t.starts_with(e), "{t:?} should start with {e:?}");
    }
}

#[test]
fn names_must_match_the_addresses_and_be_object_names() {
    let (v, m) = (versions(), lab());
    let one = ["Bad_Name".to_string()];
    let refusals = plan_add(
        &request(&one, &v, &m),
        &[fresh("10.5.0.7", "w-2"), fresh("10.5.0.8", "w-3")],
    )
    .unwrap_err();
    assert!(matches!(
        refusals[0],
        AddRefusal::NameCount {
            names: 1,
            addresses: 2
        }
    ));
    assert!(matches!(&refusals[1], AddRefusal::BadName { name } if name == "Bad_Name"));
}

/// Covers: R14.21 (the last control plane, a broken quorum, an unreachable node without --force)
#[test]
fn removals_the_cli_refuses() {
    let mut machines = lab();
    // Two of three control planes Ready: removing a Ready one leaves 1 of 2.
    machines[0] = machine("cp-1", MachineRole::Controlplane, "10.5.0.2", false);
    let r = check_remove(&machines[1], &machines, Ok(()), false).unwrap_err();
    assert!(
        r.to_string()
            .starts_with("removing cp-2 would leave 1 healthy of 2 etcd voters"),
        "{r}"
    );
    // The unhealthy one itself may go.
    assert_eq!(check_remove(&machines[0], &machines, Ok(()), false), Ok(()));

    let only = vec![machine("cp-1", MachineRole::Controlplane, "10.5.0.2", true)];
    let r = check_remove(&only[0], &only, Ok(()), false).unwrap_err();
    assert!(
        r.to_string().contains("would leave no control plane"),
        "{r}"
    );

    let machines = lab();
    let r = check_remove(
        &machines[3],
        &machines,
        Err("connection refused".into()),
        false,
    )
    .unwrap_err();
    assert!(r.to_string().contains("pass --force"), "{r}");
    assert_eq!(
        check_remove(
            &machines[3],
            &machines,
            Err("connection refused".into()),
            true
        ),
        Ok(())
    );
    assert_eq!(check_remove(&machines[2], &machines, Ok(()), false), Ok(()));
}

/// A control plane joining counts as a learner and one leaving as gone:
/// removing another then waits.
#[test]
fn a_leaving_control_plane_blocks_a_second_removal() {
    let mut machines = lab();
    machines[2].status.as_mut().unwrap().membership = Some(MembershipStatus {
        phase: MembershipPhase::Leaving,
        ..MembershipStatus::default()
    });
    let r = check_remove(&machines[0], &machines, Ok(()), false).unwrap_err();
    assert!(r.to_string().contains("cp-3 is leaving etcd"), "{r}");
    let members = members("lab", &machines);
    assert_eq!(members.len(), 3);
    assert!(members[2].leaving && !members[0].leaving);
}
