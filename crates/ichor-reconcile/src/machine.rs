//! The TalosMachine decisions: the drift of a node's live config against
//! the render and whether to apply it, whether the machine still allows an
//! apply decided on an older read, and the conditions (`Held`, `Ready`,
//! `Drifted`, `Applied`). A held machine gets no apply; class C drift gets
//! none either and says why; only class B left on a released machine is
//! applied, in no-reboot mode, by the controller.

use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::endpoint::Endpoint;
use ichor_api::{DriftClass, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_render::{Drift, RenderInput};
use ichor_talos::config::{MachineConfig, ParsedConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_core::ResourceExt as _;

/// `Held` from `spec.hold`.
pub fn held_condition(hold: bool, generation: Option<i64>, now: &Time) -> Condition {
    if hold {
        conditions::new(
            types::HELD,
            Status::True,
            reasons::HOLD_SET,
            "spec.hold is true: Ichor computes the drift and writes nothing to this node; set spec.hold: false to let Ichor apply class B drift",
            generation,
            now.clone(),
        )
    } else {
        conditions::new(
            types::HELD,
            Status::False,
            reasons::RELEASED,
            "spec.hold is false: Ichor applies class B drift to this node in no-reboot mode; class C drift is never applied on its own",
            generation,
            now.clone(),
        )
    }
}

/// `Ready` after a reconcile: True with what was read, or False with the
/// error's reason (a constant of `conditions::reasons`) and words (the
/// error with each of its causes, [`ichor_api::error_text::chain`], so the condition says why).
pub fn ready_condition(
    machine: &TalosMachine,
    status: &TalosMachineStatus,
    outcome: Result<(), (&'static str, String)>,
    now: &Time,
) -> Condition {
    let generation = machine.metadata.generation;
    match outcome {
        Ok(()) => conditions::new(
            types::READY,
            Status::True,
            reasons::RECONCILED,
            format!(
                "node {} read (Talos {}); {} drift entr{}",
                machine.spec.address,
                status.talos_version.as_deref().unwrap_or("unknown"),
                status.drift.len(),
                if status.drift.len() == 1 { "y" } else { "ies" }
            ),
            generation,
            now.clone(),
        ),
        Err((reason, message)) => conditions::new(
            types::READY,
            Status::False,
            reason,
            message,
            generation,
            now.clone(),
        ),
    }
}

/// `host:port` to dial for `address` (the Talos port added when absent),
/// as [`Endpoint`] reads it. An address the webhook refuses is dialled as
/// written: the dial fails and names it.
pub fn endpoint(address: &str, port: u16) -> String {
    let a = address.trim();
    Endpoint::parse(a, port).map_or_else(|_| a.to_owned(), |e| e.to_string())
}

/// The names of the inline manifests of a config (what the TalosCluster's
/// hand-over waits on; the contents stay on the node).
pub fn inline_manifest_names(config: &MachineConfig) -> Vec<String> {
    config
        .facts()
        .inline_manifests
        .into_iter()
        .map(|m| m.name)
        .collect()
}

/// A class B apply [`decide_apply`] chose.
#[derive(Debug, Clone)]
pub struct ApplyPlan {
    /// The rendered config, as applied.
    pub desired_yaml: String,
    /// The rendered config, to compare the read-back with.
    pub desired: MachineConfig,
    /// The class B paths the apply brings to the render.
    pub paths: Vec<String>,
}

/// The decision on a node's live config: renders, compares, writes the
/// drift and `Drifted` into `status`, and says whether to apply. A held
/// machine gets no apply; class C drift gets none either and says why in
/// `Applied`; only class B left on a released machine is applied.
pub fn decide_apply(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    live: &ParsedConfig,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<ApplyPlan>, ichor_render::Error> {
    let generation = machine.metadata.generation;
    let render = ichor_render::render_machine_from(
        &RenderInput::from_objects(cluster, machine, &live.config),
        &live.mappings,
    )?;
    status.config_hash = Some(render.hash.clone());
    status.inline_manifests = Some(inline_manifest_names(&live.config));
    let drift = &render.drift;
    status.drift = drift.entries.clone();
    conditions::set(&mut status.conditions, drifted(drift, generation, now));

    if machine.spec.hold {
        return Ok(None);
    }
    if drift.max_class() == Some(DriftClass::C) {
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::APPLIED,
                Status::False,
                reasons::UNSAFE_DRIFT,
                format!("not applied: {}", class_c_message(drift)),
                generation,
                now.clone(),
            ),
        );
        return Ok(None);
    }
    if !drift.is_applicable() {
        return Ok(None);
    }
    let paths = drift
        .of_class(DriftClass::B)
        .map(|e| e.path.clone())
        .collect();
    // The YAML only now: a reconcile that applies nothing never writes it.
    let desired_yaml = render.yaml()?;
    Ok(Some(ApplyPlan {
        desired_yaml,
        desired: render.config(),
        paths,
    }))
}

/// Whether the machine as it is now (`current`, read from the API server
/// right before the apply) still allows the apply decided on `read` (the
/// object the reconcile started from). The hold can be taken back, or the
/// spec changed, while Ichor talks to the node; `None` when neither
/// happened, else the `Applied=False` condition saying why nothing was
/// written.
pub fn still_released(
    read: &TalosMachine,
    current: &TalosMachine,
    now: &Time,
) -> Option<Condition> {
    let generation = current.metadata.generation;
    if current.spec.hold {
        return Some(conditions::new(
            types::APPLIED,
            Status::False,
            reasons::HOLD_TAKEN_BACK,
            "not applied: spec.hold was set to true while Ichor was reading the node, so nothing was written to it; set spec.hold: false to let Ichor apply class B drift",
            generation,
            now.clone(),
        ));
    }
    if current.uid() != read.uid() || generation != read.metadata.generation {
        return Some(conditions::new(
            types::APPLIED,
            Status::False,
            reasons::SPEC_CHANGED,
            format!(
                "not applied: the TalosMachine changed (generation {} to {}) while Ichor was reading the node, so nothing was written to it; the next reconcile renders the new spec",
                read.metadata.generation.unwrap_or_default(),
                generation.unwrap_or_default()
            ),
            generation,
            now.clone(),
        ));
    }
    None
}

/// `Applied` after the read-back, and the note of a successful apply. Equal
/// bytes, or (a node that re-encodes what it stores) equal on every path:
/// both are a successful read-back; the message says which.
pub fn read_back_condition(
    plan: &ApplyPlan,
    read_back_yaml: &str,
    after: &Drift,
    hash: &str,
    generation: Option<i64>,
    now: &Time,
) -> (Condition, Option<String>) {
    let same_bytes = read_back_yaml == plan.desired_yaml;
    if same_bytes || after.entries.is_empty() {
        let how = if same_bytes {
            "the config read back equals the render"
        } else {
            "the config read back equals the render on every path (the node serialises it differently)"
        };
        let note = format!(
            "applied {} in no-reboot mode; {how} (config hash {hash})",
            plan.paths.join(", ")
        );
        let c = conditions::new(
            types::APPLIED,
            Status::True,
            reasons::APPLIED,
            note.clone(),
            generation,
            now.clone(),
        );
        return (c, Some(note));
    }
    let paths: Vec<&str> = after.entries.iter().map(|e| e.path.as_str()).collect();
    let c = conditions::new(
        types::APPLIED,
        Status::False,
        reasons::READ_BACK_MISMATCH,
        format!(
            "applied in no-reboot mode, but the config read back differs from the render at {}; status.drift shows the values; check the node with talosctl get machineconfig",
            paths.join(", ")
        ),
        generation,
        now.clone(),
    );
    (c, None)
}

/// The `Drifted` condition for a drift.
pub fn drifted(drift: &Drift, generation: Option<i64>, now: &Time) -> Condition {
    match drift.max_class() {
        None | Some(DriftClass::A) => conditions::new(
            types::DRIFTED,
            Status::False,
            reasons::NO_DRIFT,
            "the node runs the desired config (no drift, or only class A)",
            generation,
            now.clone(),
        ),
        Some(DriftClass::B) => {
            let paths: Vec<&str> = drift
                .of_class(DriftClass::B)
                .map(|e| e.path.as_str())
                .collect();
            conditions::new(
                types::DRIFTED,
                Status::True,
                reasons::SAFE_DRIFT,
                format!(
                    "class B drift at {}: Ichor applies it without a reboot once spec.hold is false",
                    paths.join(", ")
                ),
                generation,
                now.clone(),
            )
        }
        Some(DriftClass::C) => conditions::new(
            types::DRIFTED,
            Status::True,
            reasons::UNSAFE_DRIFT,
            class_c_message(drift),
            generation,
            now.clone(),
        ),
    }
}

/// Which class C paths block the apply, why, and what the operator can do.
pub fn class_c_message(drift: &Drift) -> String {
    let items: Vec<String> = drift
        .of_class(DriftClass::C)
        .map(|e| match &e.reason {
            Some(r) => format!("{} ({r})", e.path),
            None => e.path.clone(),
        })
        .collect();
    format!(
        "class C drift at {}; Ichor never applies class C on its own, and while it is there it applies nothing else to this node either. To resolve it: make the spec (TalosCluster, spec.patches) match what the node runs, or make the change yourself with talosctl after review (a Kubernetes version change is a TalosOperation of kind kubernetes-upgrade)",
        items.join("; ")
    )
}

#[cfg(test)]
mod decide_tests {
    //! The TalosMachine decisions from YAML fixtures (`src/fixtures/`, and
    //! a real Talos v1.12 control-plane config from ichor-render's
    //! fixtures as the live config), with an injected clock.

    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    fn cluster() -> TalosCluster {
        serde_yaml_ng::from_str(include_str!("fixtures/cluster-base.yaml")).expect("fixture")
    }

    fn machine(hold: bool, extra_patch: Option<&str>) -> TalosMachine {
        let mut m: TalosMachine =
            serde_yaml_ng::from_str(include_str!("fixtures/machine-base-labels.yaml"))
                .expect("fixture");
        m.spec.hold = hold;
        if let Some(inline) = extra_patch {
            m.spec.patches.push(ichor_api::MachinePatch {
                name: "extra".into(),
                inline: inline.into(),
            });
        }
        m
    }

    fn live() -> ParsedConfig {
        ParsedConfig::parse_with_origin(
            include_str!("../../ichor-render/tests/fixtures/v1.12-cni-none-controlplane.yaml"),
            "fixture",
        )
        .expect("fixture parses")
    }

    fn reason(status: &TalosMachineStatus, type_: &str) -> Option<String> {
        conditions::find(&status.conditions, type_).map(|c| c.reason.clone())
    }

    /// [`decide_apply`] on the fixtures' live config from an empty status.
    fn decide(machine: &TalosMachine) -> (Option<ApplyPlan>, TalosMachineStatus) {
        let mut status = TalosMachineStatus::default();
        let plan =
            decide_apply(machine, &cluster(), &live(), &mut status, &at(5)).expect("decides");
        (plan, status)
    }

    /// Covers: R1.6
    #[test]
    fn class_b_on_a_released_machine_is_applied() {
        let (plan, status) = decide(&machine(false, None));
        let plan = plan.expect("an apply");
        assert_eq!(plan.paths, vec!["machine.nodeLabels.zone"]);
        assert_eq!(
            reason(&status, types::DRIFTED).as_deref(),
            Some(reasons::SAFE_DRIFT)
        );
        assert!(status.config_hash.is_some());
    }

    #[test]
    fn a_held_machine_gets_its_drift_and_no_apply() {
        let (plan, status) = decide(&machine(true, None));
        assert!(plan.is_none());
        assert_eq!(status.drift.len(), 1);
        assert_eq!(reason(&status, types::APPLIED), None);
    }

    /// Covers: R1.6
    #[test]
    fn class_c_blocks_every_apply_and_says_why() {
        let (plan, status) = decide(&machine(false, Some("machine:\n  somethingNew: 1\n")));
        assert!(plan.is_none());
        assert_eq!(
            reason(&status, types::APPLIED).as_deref(),
            Some(reasons::UNSAFE_DRIFT)
        );
        assert_eq!(
            reason(&status, types::DRIFTED).as_deref(),
            Some(reasons::UNSAFE_DRIFT)
        );
    }

    #[test]
    fn the_read_back_decides_applied() {
        let plan = ApplyPlan {
            desired_yaml: "a: 1\n".into(),
            desired: live().config,
            paths: vec!["machine.nodeLabels.zone".into()],
        };
        let (c, note) =
            read_back_condition(&plan, "a: 1\n", &Drift::default(), "h", Some(2), &at(5));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::APPLIED)
        );
        assert!(note.is_some_and(|n| n.contains("equals the render (config hash h)")));
        let (c, _) = read_back_condition(&plan, "a: 2\n", &Drift::default(), "h", Some(2), &at(5));
        assert!(c.message.contains("on every path"), "{}", c.message);
        let differs = Drift {
            entries: vec![ichor_api::DriftEntry {
                path: "machine.nodeLabels.zone".into(),
                class: DriftClass::B,
                live: None,
                desired: Some("a".into()),
                reason: None,
            }],
        };
        let (c, note) = read_back_condition(&plan, "a: 2\n", &differs, "h", Some(2), &at(5));
        assert_eq!(c.reason, reasons::READ_BACK_MISMATCH);
        assert!(note.is_none());
    }

    /// Covers: R8.3 (hold race)
    #[test]
    fn the_apply_needs_the_machine_still_released_and_unchanged() {
        let mut read = machine(false, None);
        read.metadata.generation = Some(3);
        read.metadata.uid = Some("u1".into());
        assert!(still_released(&read, &read.clone(), &at(5)).is_none());
        let mut held = read.clone();
        held.spec.hold = true;
        held.metadata.generation = Some(4);
        let c = still_released(&read, &held, &at(5)).expect("refused");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::HOLD_TAKEN_BACK)
        );
        let mut changed = read.clone();
        changed.metadata.generation = Some(4);
        let c = still_released(&read, &changed, &at(5)).expect("refused");
        assert_eq!(c.reason, reasons::SPEC_CHANGED);
        assert!(c.message.contains("generation 3 to 4"), "{}", c.message);
        let mut replaced = read.clone();
        replaced.metadata.uid = Some("u2".into());
        assert_eq!(
            still_released(&read, &replaced, &at(5)).map(|c| c.reason),
            Some(reasons::SPEC_CHANGED.to_owned())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_adds_the_talos_port_only_when_absent() {
        assert_eq!(endpoint("10.0.0.2", 50000), "10.0.0.2:50000");
        assert_eq!(endpoint("10.0.0.2:4000", 50000), "10.0.0.2:4000");
        assert_eq!(endpoint("node-1", 50000), "node-1:50000");
        assert_eq!(endpoint("fd00::2", 50000), "[fd00::2]:50000");
        assert_eq!(endpoint("[fd00::2]:4000", 50000), "[fd00::2]:4000");
    }

    /// Found while writing the address fuzz target (tests/fuzz_webhook.rs,
    /// whose bracketed IPv6 inputs hit it): `[fd00::2]`, which the webhook
    /// accepts, was dialled as `[[fd00::2]]:50000`.
    /// Covers: R8.4 (fuzzing regression)
    #[test]
    fn a_bracketed_ipv6_address_without_a_port_is_bracketed_once() {
        assert_eq!(endpoint("[fd00::2]", 50000), "[fd00::2]:50000");
    }

    fn entry(path: &str, class: DriftClass) -> ichor_api::DriftEntry {
        ichor_api::DriftEntry {
            path: path.into(),
            class,
            live: None,
            desired: Some("x".into()),
            reason: Some("because".into()),
        }
    }

    /// Covers: R1.6
    #[test]
    fn drifted_condition_names_class_c_paths_and_what_to_do() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(0).expect("timestamp"));
        let clean = drifted(&Drift::default(), Some(1), &now);
        assert_eq!(
            (clean.status.as_str(), clean.reason.as_str()),
            ("False", reasons::NO_DRIFT)
        );
        let b = Drift {
            entries: vec![entry("machine.nodeLabels", DriftClass::B)],
        };
        let c = drifted(&b, Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::SAFE_DRIFT)
        );
        let bc = Drift {
            entries: vec![
                entry("machine.install.image", DriftClass::C),
                entry("machine.nodeLabels", DriftClass::B),
            ],
        };
        let c = drifted(&bc, Some(1), &now);
        assert_eq!(c.reason, reasons::UNSAFE_DRIFT);
        assert!(
            c.message.contains("machine.install.image (because)"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("machine.nodeLabels"), "{}", c.message);
        assert!(c.message.contains("talosctl"), "{}", c.message);
    }
}
