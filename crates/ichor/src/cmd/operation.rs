//! `ichor upgrade talos`, `ichor reboot`, `ichor operation list|status|cancel`:
//! TalosOperations are created, read and cancelled here; the controller does
//! the work. Nothing here talks to a node.

use std::time::Duration;

use anyhow::Context as _;
use ichor_api::operation::{
    OperationKind, OperationTarget, PlannedAction, TalosOperation, TalosOperationSpec,
};
use ichor_api::{ClusterRef, conditions};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::args::{
    OperationCommon, OperationListArgs, OperationNameArgs, OutputFormat, RebootArgs,
    UpgradeTalosArgs, UpgradeVersionArgs,
};
use crate::{connect, printer};

/// How long a new operation's plan is waited for before the command returns.
const PLAN_WAIT: Duration = Duration::from_secs(60);

pub async fn upgrade_talos(args: UpgradeTalosArgs) -> anyhow::Result<()> {
    let spec = TalosOperationSpec {
        kind: OperationKind::TalosUpgrade,
        target: target(&args.common, args.machines),
        version: Some(with_v(&args.to)),
        concurrency: args.common.concurrency,
        installer_image: args.installer_image,
        dry_run: args.common.dry_run,
        skip_backup: None,
        maintenance_windows: None,
        health_checks: Vec::new(),
        alertmanager: None,
        allow_downgrade: false,
    };
    create(&args.common, spec).await
}

/// `ichor upgrade kubernetes` and `ichor upgrade ichor`.
pub async fn upgrade_version(args: UpgradeVersionArgs, kind: OperationKind) -> anyhow::Result<()> {
    let spec = TalosOperationSpec {
        kind,
        target: target(&args.common, args.machines),
        version: Some(with_v(&args.to)),
        concurrency: args.common.concurrency,
        installer_image: None,
        dry_run: args.common.dry_run,
        skip_backup: None,
        maintenance_windows: None,
        health_checks: Vec::new(),
        alertmanager: None,
        allow_downgrade: false,
    };
    create(&args.common, spec).await
}

pub async fn reboot(args: RebootArgs) -> anyhow::Result<()> {
    let spec = TalosOperationSpec {
        kind: OperationKind::Reboot,
        target: target(&args.common, args.machines),
        version: None,
        concurrency: args.common.concurrency,
        installer_image: None,
        dry_run: args.common.dry_run,
        skip_backup: None,
        maintenance_windows: None,
        health_checks: Vec::new(),
        alertmanager: None,
        allow_downgrade: false,
    };
    create(&args.common, spec).await
}

/// A version as the API takes it, with its v (`1.37.0` → `v1.37.0`): people
/// write Kubernetes versions both ways.
fn with_v(version: &str) -> String {
    let version = version.trim();
    if version.starts_with('v') {
        version.to_owned()
    } else {
        format!("v{version}")
    }
}

fn target(common: &OperationCommon, machines: Vec<String>) -> OperationTarget {
    OperationTarget {
        cluster_ref: ClusterRef {
            name: common.cluster.clone(),
        },
        machines,
    }
}

/// Creates the operation, waits (bounded) for the controller's plan, prints it.
async fn create(common: &OperationCommon, spec: TalosOperationSpec) -> anyhow::Result<()> {
    let client = connect::kube_client(common.kube.kubeconfig.as_deref()).await?;
    let api = Api::<TalosOperation>::namespaced(client, &common.namespace);
    let mut op = TalosOperation::new(common.name.as_deref().unwrap_or_default(), spec);
    if common.name.is_none() {
        op.metadata.name = None;
        op.metadata.generate_name = Some(format!("{}-", op.spec.kind.as_str()));
    }
    let created = api
        .create(&PostParams::default(), &op)
        .await
        .with_context(|| {
            format!(
                "cannot create the TalosOperation in namespace {}; is Ichor installed there, and may this kubeconfig create TalosOperations?",
                common.namespace
            )
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    printer::step(&format!(
        "TalosOperation {}/{name} created; waiting for the controller's plan",
        common.namespace
    ));
    let deadline = tokio::time::Instant::now() + PLAN_WAIT;
    let planned = loop {
        let now = api.get(&name).await?;
        let st = now.status.as_ref();
        if st.is_some_and(|s| !s.plan.is_empty() || s.phase.is_some()) {
            break Some(now);
        }
        if tokio::time::Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    match planned {
        Some(op) => {
            print_one(&op, common.output)?;
            let failed = |op: &TalosOperation| {
                op.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Some(ichor_api::OperationPhase::Failed))
            };
            if failed(&op) {
                anyhow::bail!(
                    "TalosOperation {}/{name} was refused or failed: see its Complete condition above",
                    common.namespace
                );
            }
            if common.wait {
                let done = follow(&api, &name).await?;
                print_one(&done, common.output)?;
                if failed(&done) {
                    anyhow::bail!(
                        "TalosOperation {}/{name} failed: see its Complete condition above",
                        common.namespace
                    );
                }
            }
            Ok(())
        }
        None => anyhow::bail!(
            "the controller has not planned TalosOperation {}/{name} within {PLAN_WAIT:?}; is the Ichor controller running? Check later with: ichor operation status {name} -n {}",
            common.namespace,
            common.namespace
        ),
    }
}

/// Follows an operation until it succeeds or fails: a progress bar per
/// machine on a terminal (plain lines otherwise, one per change).
async fn follow(api: &Api<TalosOperation>, name: &str) -> anyhow::Result<TalosOperation> {
    let mut bars = printer::Bars::new();
    loop {
        let op = api
            .get(name)
            .await
            .with_context(|| format!("cannot read TalosOperation {name}"))?;
        for b in machine_bars(&op) {
            bars.show(&b.machine, b.total, b.done, &b.words);
        }
        if op.status.as_ref().is_some_and(|s| {
            matches!(
                s.phase,
                Some(ichor_api::OperationPhase::Succeeded | ichor_api::OperationPhase::Failed)
            )
        }) {
            bars.finish();
            return Ok(op);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One machine's progress as a bar shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MachineBar {
    machine: String,
    /// Steps done and in all.
    done: u64,
    total: u64,
    /// `cp-1 (node cp-1-x): Draining — waiting for …`.
    words: String,
}

/// The bars of an operation, in plan order (skipped machines left out):
/// the machine steps of a talos-upgrade or reboot, or the component steps
/// of a kubernetes-upgrade.
fn machine_bars(op: &TalosOperation) -> Vec<MachineBar> {
    use ichor_api::operation::{ComponentPhase, MachineStep};
    use ichor_controller::operation_decide::step_after;
    let st = op.status.clone().unwrap_or_default();
    let kind = op.spec.kind;
    st.plan
        .iter()
        .filter(|e| e.action != PlannedAction::Skip)
        .filter_map(|e| {
            let p = st.machines.iter().find(|p| p.machine == e.machine)?;
            let node = p.node_name.as_deref().unwrap_or(&p.machine);
            let (done, total, step) = if kind == OperationKind::KubernetesUpgrade {
                let steps: Vec<_> = st
                    .components
                    .iter()
                    .filter(|c| c.machine == e.machine)
                    .collect();
                let done = steps
                    .iter()
                    .filter(|c| c.phase == ComponentPhase::Succeeded)
                    .count();
                let current = steps
                    .iter()
                    .find(|c| c.phase != ComponentPhase::Succeeded)
                    .map(|c| format!("{} {:?}", c.component.as_str(), c.phase))
                    .unwrap_or_else(|| format!("{:?}", p.step));
                (done as u64, steps.len() as u64, current)
            } else {
                let mut walk = vec![MachineStep::Pending];
                while let Some(last) = walk.last().copied().filter(|s| !s.is_terminal()) {
                    walk.push(step_after(kind, e.role, last));
                }
                let total = walk.len() as u64 - 1;
                let done = match p.step {
                    MachineStep::Succeeded => total,
                    s => walk.iter().position(|w| *w == s).unwrap_or(0) as u64,
                };
                (done, total, format!("{:?}", p.step))
            };
            let mut words = format!("{} (node {node}): {step}", e.machine);
            if let Some(m) = p.message.as_deref().filter(|m| !m.is_empty()) {
                words.push_str(&format!(" — {m}"));
            }
            Some(MachineBar {
                machine: e.machine.clone(),
                done,
                total,
                words,
            })
        })
        .collect()
}

pub async fn list(args: OperationListArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let api = match &args.namespace {
        Some(ns) => Api::<TalosOperation>::namespaced(client, ns),
        None => Api::<TalosOperation>::all(client),
    };
    let ops = api
        .list(&ListParams::default())
        .await
        .context("cannot list TalosOperations; is Ichor installed (its CRDs), and may this kubeconfig read them?")?;
    match args.output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(&ops.items)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(&ops.items)?),
        None => {
            if ops.items.is_empty() {
                printer::data("no TalosOperation");
            }
            for op in &ops.items {
                printer::data(&list_line(op));
            }
        }
    }
    Ok(())
}

pub async fn status(args: OperationNameArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let op = Api::<TalosOperation>::namespaced(client, &args.namespace)
        .get(&args.name)
        .await
        .with_context(|| {
            format!(
                "cannot read TalosOperation {}/{}",
                args.namespace, args.name
            )
        })?;
    print_one(&op, args.output)
}

pub async fn cancel(args: OperationNameArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let patch = json!({"metadata": {"annotations": {ichor_controller::operation::CANCEL_ANNOTATION: "true"}}});
    Api::<TalosOperation>::namespaced(client, &args.namespace)
        .patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!(
                "cannot cancel TalosOperation {}/{}",
                args.namespace, args.name
            )
        })?;
    printer::step(&format!(
        "TalosOperation {}/{} will stop before its next step",
        args.namespace, args.name
    ));
    Ok(())
}

fn print_one(op: &TalosOperation, output: Option<OutputFormat>) -> anyhow::Result<()> {
    match output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(op)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(op)?),
        None => {
            for line in plan_lines(op) {
                printer::data(&line);
            }
        }
    }
    Ok(())
}

/// The lines under an operation's first: its next window while Waiting,
/// its health gate, the hops it passes, how long it took.
fn header_lines(
    op: &TalosOperation,
    st: &ichor_api::operation::TalosOperationStatus,
) -> Vec<String> {
    let mut lines = Vec::new();
    if st.phase == Some(ichor_api::OperationPhase::Waiting) {
        lines.push(match &st.next_window {
            Some(next) => format!("  next window: {}", next.0),
            None => "  next window: none (no window opens again)".to_string(),
        });
    }
    if let Some(g) = &st.health_gate {
        let on = match (&g.object, &g.value) {
            (Some(o), Some(v)) => format!(" on {o}: {v}"),
            (Some(o), None) => format!(" on {o}"),
            (None, Some(v)) => format!(": {v}"),
            (None, None) => String::new(),
        };
        let since = g.since.as_ref().map(|t| format!(" (since {})", t.0));
        lines.push(format!(
            "  health gate {}{on}{}",
            g.check,
            since.unwrap_or_default()
        ));
        if st.phase == Some(ichor_api::OperationPhase::Paused) {
            lines.push(format!(
                "  paused until it passes; to go on anyway: kubectl annotate talosoperation {} {}=yes",
                op.metadata.name.as_deref().unwrap_or_default(),
                ichor_api::operation::SKIP_GATES_ANNOTATION
            ));
        }
    }
    if let Some(hops) = ichor_controller::operation_decide::path::hops_words(st) {
        let running = st.phase == Some(ichor_api::OperationPhase::Running);
        lines.push(match st.current_hop.as_deref().filter(|_| running) {
            Some(now) => format!("  through {hops} (now to {now})"),
            None => format!("  through {hops}"),
        });
    }
    if let Some(took) = &st.duration {
        lines.push(format!("  took {took}"));
    }
    lines
}

/// A machine's progress after its plan line: the hops it passes when more
/// than one, then `[step before → after in 41.007s: message]`.
fn progress_words(p: &ichor_api::operation::MachineProgress) -> String {
    let mut words = String::new();
    if p.hops.len() > 1 {
        words.push_str(&format!(" via {}", p.hops.join(" → ")));
    }
    words.push_str(&format!("  [{:?}", p.step));
    if let (Some(a), Some(b)) = (&p.version_before, &p.version_after) {
        words.push_str(&format!(" {a} → {b}"));
    }
    if let Some(took) = &p.duration {
        words.push_str(&format!(" in {took}"));
    }
    if let Some(m) = &p.message {
        words.push_str(&format!(": {m}"));
    }
    words.push(']');
    words
}

/// `  pre-pull: cp-1 Pulled (0.012s), w-1 Failed (why)`, when the
/// operation pulls ahead.
fn pre_pull_lines(st: &ichor_api::operation::TalosOperationStatus) -> Vec<String> {
    if st.pre_pull.is_empty() {
        return Vec::new();
    }
    let each: Vec<String> = st
        .pre_pull
        .iter()
        .map(|e| {
            let detail = e.message.as_deref().or(e.duration.as_deref());
            match detail {
                Some(d) => format!("{} {:?} ({d})", e.machine, e.phase),
                None => format!("{} {:?}", e.machine, e.phase),
            }
        })
        .collect();
    vec![format!("  pre-pull: {}", each.join(", "))]
}

/// `ns/name  kind  phase  message`.
fn list_line(op: &TalosOperation) -> String {
    let st = op.status.clone().unwrap_or_default();
    format!(
        "{}/{}  {}  {}  {}",
        op.metadata.namespace.as_deref().unwrap_or_default(),
        op.metadata.name.as_deref().unwrap_or_default(),
        op.spec.kind.as_str(),
        st.phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "Pending".into()),
        st.message.unwrap_or_default()
    )
}

/// The plan and progress as text: a header, then one line per machine in
/// plan order (batch, machine, role, what is done to it, where it is).
fn plan_lines(op: &TalosOperation) -> Vec<String> {
    let st = op.status.clone().unwrap_or_default();
    let mut lines = vec![list_line(op)];
    lines.extend(header_lines(op, &st));
    for e in &st.plan {
        let progress = st.machines.iter().find(|p| p.machine == e.machine);
        let action = match e.action {
            PlannedAction::Skip => format!(
                "skipped ({})",
                e.reason.as_deref().unwrap_or("no reason given")
            ),
            PlannedAction::Upgrade | PlannedAction::Reboot => {
                let verb = if e.action == PlannedAction::Upgrade {
                    "upgrade"
                } else {
                    "reboot"
                };
                match &e.reason {
                    Some(r) => format!("{verb} ({r})"),
                    None => verb.to_string(),
                }
            }
        };
        let role = e.role.as_str();
        let mut line = format!("  {:>3}  {}  {role}  {action}", e.batch + 1, e.machine);
        if let Some(p) = progress
            && e.action != PlannedAction::Skip
        {
            line.push_str(&progress_words(p));
        }
        lines.push(line);
    }
    lines.extend(pre_pull_lines(&st));
    if !st.components.is_empty() {
        lines.push("  component steps, in order:".to_string());
    }
    for (i, c) in st.components.iter().enumerate() {
        let mut line = format!(
            "  {:>3}  {}  {}  [{:?}",
            i + 1,
            c.component.as_str(),
            c.machine,
            c.phase
        );
        if let (Some(a), Some(b)) = (&c.image_before, &c.image) {
            line.push_str(&format!(" {a} → {b}"));
        }
        line.push(']');
        lines.push(line);
    }
    for c in &st.conditions {
        if c.type_ == conditions::types::COMPLETE || c.type_ == conditions::types::SKIPPED {
            if c.message.is_empty() {
                continue;
            }
            lines.push(format!(
                "  {}={} ({}): {}",
                c.type_, c.status, c.reason, c.message
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan as the status says it, one machine a line, skipped ones with
    /// why; and each machine's bar for `--wait` (steps done of its steps).
    /// Covers: the operation CLI, docs/guides/upgrades.md (the CLI prints the plan from status; --wait follows with a progress bar per machine)
    #[test]
    fn plan_lines_from_status() {
        let op: TalosOperation = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "up", "namespace": "ichor-system"},
            "spec": {"kind": "talos-upgrade", "target": {"clusterRef": {"name": "lab"}}, "version": "v1.14.0"},
            "status": {
                "phase": "Running", "message": "planned: cp-1 → w-1",
                "plan": [
                    {"machine": "cp-1", "role": "controlplane", "batch": 0, "action": "upgrade"},
                    {"machine": "w-2", "role": "worker", "batch": 0, "action": "skip", "reason": "held"},
                    {"machine": "w-1", "role": "worker", "batch": 1, "action": "upgrade", "reason": "runs Ichor's controller"}
                ],
                "machines": [
                    {"machine": "cp-1", "step": "Succeeded", "versionBefore": "v1.13.9", "versionAfter": "v1.14.0", "message": "done"},
                    {"machine": "w-2", "step": "Skipped", "message": "skipped (held)"},
                    {"machine": "w-1", "step": "Draining", "message": "started"}
                ]
            }
        }))
        .unwrap();
        assert_eq!(
            machine_bars(&op),
            vec![
                MachineBar {
                    machine: "cp-1".into(),
                    done: 8,
                    total: 8,
                    words: "cp-1 (node cp-1): Succeeded — done".into()
                },
                MachineBar {
                    machine: "w-1".into(),
                    done: 3,
                    total: 7,
                    words: "w-1 (node w-1): Draining — started".into()
                },
            ]
        );
        assert_eq!(
            plan_lines(&op),
            vec![
                "ichor-system/up  talos-upgrade  Running  planned: cp-1 → w-1",
                "    1  cp-1  controlplane  upgrade  [Succeeded v1.13.9 → v1.14.0: done]",
                "    1  w-2  worker  skipped (held)",
                "    2  w-1  worker  upgrade (runs Ichor's controller)  [Draining: started]",
            ]
        );
    }

    /// A waiting operation says when its next window opens.
    /// Covers: R15.1
    #[test]
    fn a_waiting_operation_shows_its_next_window() {
        let op: TalosOperation = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "up", "namespace": "ichor-system"},
            "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "lab"}}},
            "status": {"phase": "Waiting", "message": "outside its maintenance window", "nextWindow": "2026-12-05T02:00:00Z"}
        }))
        .unwrap();
        assert_eq!(
            plan_lines(&op),
            vec![
                "ichor-system/up  reboot  Waiting  outside its maintenance window",
                "  next window: 2026-12-05T02:00:00Z",
            ]
        );
    }

    /// A paused operation names its failing gate and how to go on anyway.
    /// Covers: R15.5
    #[test]
    fn a_paused_operation_names_its_gate() {
        let op: TalosOperation = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "up", "namespace": "lab"},
            "spec": {"kind": "reboot", "target": {"clusterRef": {"name": "lab"}}},
            "status": {"phase": "Paused", "message": "paused: health check api-available fails",
                "healthGate": {"check": "api-available", "object": "Deployment web/api",
                    "value": "false", "since": "2026-12-05T02:00:00Z"}}
        }))
        .unwrap();
        assert_eq!(
            plan_lines(&op),
            vec![
                "lab/up  reboot  Paused  paused: health check api-available fails",
                "  health gate api-available on Deployment web/api: false (since 2026-12-05T02:00:00Z)",
                "  paused until it passes; to go on anyway: kubectl annotate talosoperation up ichor.maesh.dev/skip-gates=yes",
            ]
        );
    }

    /// A dry run to a release Talos cannot install in one step prints
    /// every machine's hops, the operation's, and the pre-pull and times
    /// once it runs.
    /// Covers: R15.3, R15.4, R15.9
    #[test]
    fn a_plan_through_releases_shows_every_hop() {
        let op: TalosOperation = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "up", "namespace": "lab"},
            "spec": {"kind": "talos-upgrade", "target": {"clusterRef": {"name": "lab"}}, "version": "v1.14.0", "dryRun": true},
            "status": {
                "phase": "Succeeded", "message": "dry run", "duration": "0.020s",
                "plan": [
                    {"machine": "cp-1", "role": "controlplane", "batch": 0, "action": "upgrade"},
                    {"machine": "w-1", "role": "worker", "batch": 1, "action": "upgrade"}
                ],
                "machines": [
                    {"machine": "cp-1", "step": "Pending", "hops": ["v1.13.9", "v1.14.0"]},
                    {"machine": "w-1", "step": "Succeeded", "hops": ["v1.14.0"], "duration": "3.500s"}
                ],
                "currentHop": "v1.13.9",
                "prePull": [{"machine": "cp-1", "image": "i:v1.13.9", "phase": "Pulled", "duration": "0.004s"}]
            }
        }))
        .unwrap();
        assert_eq!(
            plan_lines(&op),
            vec![
                "lab/up  talos-upgrade  Succeeded  dry run",
                "  through v1.13.9 → v1.14.0",
                "  took 0.020s",
                "    1  cp-1  controlplane  upgrade via v1.13.9 → v1.14.0  [Pending]",
                "    2  w-1  worker  upgrade  [Succeeded in 3.500s]",
                "  pre-pull: cp-1 Pulled (0.004s)",
            ]
        );
    }
}
