//! `ichor machine list|add|remove|replace` (and `history|diff|rollback`,
//! in [`history`]): TalosMachines are read,
//! created, marked for removal and deleted here; the controller joins and
//! removes the nodes. Nothing here writes to a node: `add` and `replace`
//! only read the new nodes over the insecure maintenance API, and `remove`
//! only dials its node to see whether it answers.

mod checks;
mod follow;
pub mod history;

use std::collections::BTreeSet;
use std::io::{BufRead as _, IsTerminal as _};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt as _;
use ichor_api::error_text::chain;
use ichor_api::{
    ClusterRef, MachinePatch, MachineRemoval, MachineRole, MembershipPhase, RemovalMode,
    TalosCluster, TalosMachine, TalosMachineSpec,
};
use ichor_talos_client::{ClientOptions, TalosClient};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;

use crate::args::{
    MachineAddArgs, MachineJoin, MachineListArgs, MachinePlace, MachineRemoveArgs,
    MachineReplaceArgs, OutputFormat,
};
use crate::{connect, printer};
use checks::{AddRequest, NodeReading, PlannedMachine, Probe};

/// How long reading one node may take (connection included).
const NODE_READ: Duration = Duration::from_secs(10);

/// One machine as `ichor machine list` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MachineRow {
    name: String,
    cluster: String,
    role: MachineRole,
    address: String,
    /// Membership phase (Member when the controller wrote none).
    phase: MembershipPhase,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// The Ready condition's status (True, False, Unknown).
    ready: String,
    drift: usize,
    held: bool,
}

fn row(m: &TalosMachine) -> MachineRow {
    let st = m.status.clone().unwrap_or_default();
    let membership = st.membership.unwrap_or_default();
    let phase = checks::phase(m);
    MachineRow {
        name: m.name_any(),
        cluster: m.spec.cluster_ref.name.clone(),
        role: m.spec.role,
        address: m.spec.address.clone(),
        phase: if m.metadata.deletion_timestamp.is_some() && phase == MembershipPhase::Member {
            MembershipPhase::Leaving
        } else {
            phase
        },
        step: membership.step,
        message: membership.message,
        ready: ichor_api::conditions::find(&st.conditions, ichor_api::conditions::types::READY)
            .map_or_else(|| "Unknown".to_string(), |c| c.status.clone()),
        drift: st.drift.len(),
        held: m.spec.hold,
    }
}

/// The rows as a table, a header first.
fn table(rows: &[MachineRow]) -> Vec<String> {
    let mut cells: Vec<[String; 8]> = vec![
        [
            "NAME", "CLUSTER", "ROLE", "ADDRESS", "PHASE", "READY", "DRIFT", "HELD",
        ]
        .map(str::to_string),
    ];
    for r in rows {
        let phase = match &r.step {
            Some(step) => format!("{:?} ({step})", r.phase),
            None => format!("{:?}", r.phase),
        };
        cells.push([
            r.name.clone(),
            r.cluster.clone(),
            r.role.to_string(),
            r.address.clone(),
            phase,
            r.ready.clone(),
            r.drift.to_string(),
            if r.held { "yes" } else { "no" }.to_string(),
        ]);
    }
    crate::printer::columns(&cells)
}

fn print_data<T: Serialize>(value: &T, format: OutputFormat) -> anyhow::Result<()> {
    printer::data(&match format {
        OutputFormat::Json => serde_json::to_string_pretty(value)?,
        OutputFormat::Yaml => serde_yaml_ng::to_string(value)?,
    });
    Ok(())
}

async fn machines_api(place: &MachinePlace) -> anyhow::Result<Api<TalosMachine>> {
    let client = connect::kube_client(place.kube.kubeconfig.as_deref()).await?;
    Ok(Api::namespaced(client, &place.namespace))
}

async fn list_machines(
    api: &Api<TalosMachine>,
    namespace: &str,
) -> anyhow::Result<Vec<TalosMachine>> {
    Ok(api
        .list(&ListParams::default())
        .await
        .with_context(|| {
            format!(
                "cannot list the TalosMachines in namespace {namespace}: is Ichor installed, and may this kubeconfig read them?"
            )
        })?
        .items)
}

pub async fn list(args: MachineListArgs) -> anyhow::Result<()> {
    let api = machines_api(&args.place).await?;
    let rows: Vec<MachineRow> = list_machines(&api, &args.place.namespace)
        .await?
        .iter()
        .filter(|m| {
            args.cluster
                .as_deref()
                .is_none_or(|c| m.spec.cluster_ref.name == c)
        })
        .map(row)
        .collect();
    match args.output {
        Some(format) => print_data(&rows, format)?,
        None if rows.is_empty() => printer::data(&format!(
            "no TalosMachine in namespace {}{}",
            args.place.namespace,
            args.cluster
                .as_deref()
                .map(|c| format!(" for cluster {c}"))
                .unwrap_or_default()
        )),
        None => table(&rows).iter().for_each(|l| printer::data(l)),
    }
    Ok(())
}

/// Reads one address, read-only, over the insecure maintenance API.
async fn probe(address: String) -> Probe {
    let options = ClientOptions {
        call_timeout: NODE_READ,
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let reading = match TalosClient::maintenance(&address, options) {
        Err(e) => NodeReading::Unreachable { error: chain(&e) },
        Ok(c) => read_maintenance(&c).await,
    };
    Probe { address, reading }
}

async fn read_maintenance(c: &TalosClient) -> NodeReading {
    let version = match c.version("").await {
        Ok(v) => v.tag,
        Err(e) if ichor_adopt_run::init::looks_unreachable(&e) => {
            return NodeReading::Unreachable { error: chain(&e) };
        }
        Err(e) => {
            return NodeReading::Configured {
                detail: format!("its insecure API refuses: {}", chain(&e)),
            };
        }
    };
    match c.machine_status("").await {
        Ok(s) if s.stage == 3 => {}
        Ok(s) => {
            return NodeReading::Configured {
                detail: format!("its machine stage is {}, not maintenance", s.stage),
            };
        }
        Err(e) => {
            return NodeReading::Configured {
                detail: format!("its machine status cannot be read: {}", chain(&e)),
            };
        }
    }
    match c.hostname("").await {
        Ok(hostname) => NodeReading::Maintenance {
            hostname,
            talos_version: version,
        },
        Err(e) => NodeReading::Unreachable { error: chain(&e) },
    }
}

/// Every address read at once, in the order given.
async fn probe_all(addresses: &[String]) -> Vec<Probe> {
    let mut set = tokio::task::JoinSet::new();
    for (i, a) in addresses.iter().enumerate() {
        let a = a.clone();
        set.spawn(async move { (i, probe(a).await) });
    }
    let mut probes: Vec<(usize, Probe)> = Vec::new();
    while let Some(done) = set.join_next().await {
        match done {
            Ok(p) => probes.push(p),
            // A read that panicked is a bug: let it show as one.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    probes.sort_by_key(|(i, _)| *i);
    probes.into_iter().map(|(_, p)| p).collect()
}

/// Whether the node at `address` answers at all (a TLS handshake with its
/// Talos API); `Err` says why not.
async fn answers(address: &str) -> Result<(), String> {
    ichor_talos_client::server_fingerprint(address, Duration::from_secs(5))
        .await
        .map(|_| ())
        .map_err(|e| chain(&e))
}

/// `--config-patch @FILE`s as the machines' patches, in order.
fn read_patches(args: &[String]) -> anyhow::Result<Vec<MachinePatch>> {
    args.iter()
        .map(|a| {
            let p = crate::cmd::init::read_patch(a)?;
            Ok(MachinePatch {
                name: p.name,
                inline: p.text,
            })
        })
        .collect()
}

/// The cluster and the Talos versions it runs (its spec's and every
/// machine's), or why it cannot be read.
async fn cluster_versions(
    place: &MachinePlace,
    cluster: &str,
    machines: &[TalosMachine],
) -> anyhow::Result<BTreeSet<String>> {
    let client = connect::kube_client(place.kube.kubeconfig.as_deref()).await?;
    let c = Api::<TalosCluster>::namespaced(client, &place.namespace)
        .get_opt(cluster)
        .await
        .with_context(|| format!("cannot read TalosCluster {}/{cluster}", place.namespace))?
        .ok_or_else(|| {
            anyhow!(
                "there is no TalosCluster {}/{cluster}; nothing was written",
                place.namespace
            )
        })?;
    let mut versions: BTreeSet<String> = BTreeSet::from([c.spec.talos_version.clone()]);
    versions.extend(
        machines
            .iter()
            .filter(|m| m.spec.cluster_ref.name == cluster)
            .filter_map(|m| m.status.as_ref()?.talos_version.clone()),
    );
    Ok(versions)
}

fn ask(question: &str) -> bool {
    printer::ask(question);
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Consent: `--yes`, or a yes on a terminal.
fn consent(command: &str, yes: bool, question: &str) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "ichor machine {command} asks for consent on a terminal; pass --yes to go on without asking (nothing was written)"
        );
    }
    if !ask(question) {
        bail!("ichor machine {command} was not confirmed; nothing was written");
    }
    Ok(())
}

/// The refusals as one error: that nothing was written, then each on its
/// line.
fn refused(command: &str, lines: &[String]) -> anyhow::Error {
    let text = match lines {
        [one] => one.clone(),
        many => format!("{} problems:\n  - {}", many.len(), many.join("\n  - ")),
    };
    anyhow!("{text}").context(format!(
        "ichor machine {command} refused; nothing was written"
    ))
}

fn plan_lines(cluster: &str, namespace: &str, planned: &[PlannedMachine]) -> Vec<String> {
    let mut lines = vec![format!(
        "plan: {} TalosMachine(s) in cluster {namespace}/{cluster}; the controller joins each released one",
        planned.len()
    )];
    for p in planned {
        lines.push(format!(
            "  {}  {}  {}  Talos {}{}{}",
            p.name,
            p.address,
            p.role,
            p.talos_version,
            if p.hold { "  held" } else { "" },
            p.replaces
                .as_deref()
                .map(|r| format!("  replaces {r} (removed once the new member is a healthy voter)"))
                .unwrap_or_default()
        ));
    }
    lines
}

/// The new TalosMachine of one planned node.
fn machine_of(cluster: &str, p: &PlannedMachine, patches: &[MachinePatch]) -> TalosMachine {
    TalosMachine::new(
        &p.name,
        TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: cluster.to_string(),
            },
            role: p.role,
            address: p.address.clone(),
            hold: p.hold,
            patches: patches.to_vec(),
            removal: None,
            replaces: p.replaces.clone(),
            apply_mode: None,
            try_timeout: None,
        },
    )
}

/// What `add` and `replace` ask for.
struct JoinRequest<'a> {
    command: &'a str,
    cluster: &'a str,
    role: MachineRole,
    addresses: &'a [String],
    names: &'a [String],
    replaces: Option<&'a str>,
}

/// What `add` and `replace` share once their request is known: read the
/// nodes, refuse or plan, consent, create, follow.
async fn join(place: &MachinePlace, r: JoinRequest<'_>, opts: &MachineJoin) -> anyhow::Result<()> {
    let JoinRequest {
        command,
        cluster,
        role,
        addresses,
        names,
        replaces,
    } = r;
    let patches = read_patches(&opts.config_patches)?;
    let api = machines_api(place).await?;
    let machines = list_machines(&api, &place.namespace).await?;
    let versions = cluster_versions(place, cluster, &machines).await?;
    printer::step(&format!(
        "reading {} node(s) in maintenance mode",
        addresses.len()
    ));
    let probes = probe_all(addresses).await;
    let req = AddRequest {
        cluster,
        role,
        names,
        hold: opts.hold,
        replaces,
        cluster_versions: &versions,
        machines: &machines,
    };
    let planned = checks::plan_add(&req, &probes).map_err(|refusals| {
        refused(
            command,
            &refusals.iter().map(ToString::to_string).collect::<Vec<_>>(),
        )
    })?;
    if let Some(format) = opts.output {
        return print_data(&planned, format);
    }
    for line in plan_lines(cluster, &place.namespace, &planned) {
        printer::step(&line);
    }
    consent(command, opts.yes, "Create these TalosMachines? [y/N] ")?;
    create_all(&api, &place.namespace, cluster, &planned, &patches).await?;
    if opts.wait {
        let names: Vec<String> = planned.iter().map(|p| p.name.clone()).collect();
        follow::joined(&api, &names, opts.wait_timeout).await?;
        if let Some(old) = replaces {
            printer::step(&format!(
                "waiting for the controller to remove {old}, now that its replacement counts"
            ));
            follow::removed(&api, old, opts.wait_timeout).await?;
        }
    }
    Ok(())
}

/// The planned TalosMachines created, several in flight (each passes
/// Ichor's webhooks), reported in the plan's order as they finish; every
/// failure is told, not only the first.
async fn create_all(
    api: &Api<TalosMachine>,
    namespace: &str,
    cluster: &str,
    planned: &[PlannedMachine],
    patches: &[MachinePatch],
) -> anyhow::Result<()> {
    let mut created = futures::stream::iter(planned.iter().map(|p| {
        let machine = machine_of(cluster, p, patches);
        let api = api.clone();
        async move { (p, api.create(&PostParams::default(), &machine).await) }
    }))
    .buffered(CREATES_AT_ONCE);
    let mut failed = None;
    while let Some((p, result)) = created.next().await {
        let failure = match result {
            Ok(_) => {
                printer::step(&format!("TalosMachine {}/{} created", namespace, p.name));
                continue;
            }
            Err(e) => anyhow::Error::new(e).context(format!(
                "cannot create TalosMachine {}/{}; may this kubeconfig create TalosMachines?",
                namespace, p.name
            )),
        };
        if let Some(earlier) = failed.replace(failure) {
            printer::step(&format!("error: {earlier:#}"));
        }
    }
    if let Some(failure) = failed {
        return Err(failure);
    }
    Ok(())
}

/// How many TalosMachines `add` creates at once.
const CREATES_AT_ONCE: usize = 16;

pub async fn add(args: MachineAddArgs) -> anyhow::Result<()> {
    let request = JoinRequest {
        command: "add",
        cluster: &args.cluster,
        role: args.role.into(),
        addresses: &args.addresses,
        names: &args.names,
        replaces: None,
    };
    join(&args.place, request, &args.join).await
}

pub async fn replace(args: MachineReplaceArgs) -> anyhow::Result<()> {
    let api = machines_api(&args.place).await?;
    let machines = list_machines(&api, &args.place.namespace).await?;
    let old = machines
        .iter()
        .find(|m| m.name_any() == args.old)
        .ok_or_else(|| {
            anyhow!(
                "there is no TalosMachine {}/{}; nothing was written",
                args.place.namespace,
                args.old
            )
        })?;
    let mut refusals = Vec::new();
    if old.spec.role != MachineRole::Controlplane {
        refusals.push(format!(
            "TalosMachine {} is a worker: replace is for control planes; add the new worker (ichor machine add), then remove this one",
            args.old
        ));
    }
    if checks::is_leaving(old) {
        refusals.push(format!(
            "TalosMachine {} is being removed already",
            args.old
        ));
    }
    if let Some(other) = machines
        .iter()
        .find(|m| m.spec.replaces.as_deref() == Some(args.old.as_str()))
    {
        refusals.push(format!(
            "TalosMachine {} already replaces {}",
            other.name_any(),
            args.old
        ));
    }
    if !refusals.is_empty() {
        return Err(refused("replace", &refusals));
    }
    let names: Vec<String> = args.name.iter().cloned().collect();
    let request = JoinRequest {
        command: "replace",
        cluster: &old.spec.cluster_ref.name,
        role: MachineRole::Controlplane,
        addresses: std::slice::from_ref(&args.with),
        names: &names,
        replaces: Some(&args.old),
    };
    join(&args.place, request, &args.join).await
}

pub async fn remove(args: MachineRemoveArgs) -> anyhow::Result<()> {
    let api = machines_api(&args.place).await?;
    let machines = list_machines(&api, &args.place.namespace).await?;
    let target = machines
        .iter()
        .find(|m| m.name_any() == args.name)
        .ok_or_else(|| {
            anyhow!(
                "there is no TalosMachine {}/{}; nothing was written",
                args.place.namespace,
                args.name
            )
        })?;
    if checks::is_leaving(target) {
        printer::step(&format!(
            "TalosMachine {}/{} is being removed already",
            args.place.namespace, args.name
        ));
        let forced = target.spec.removal.is_some_and(|r| r.force);
        if args.force && !forced {
            // A removal the controller refused because the node stopped
            // answering goes on once forced: the advice its status gives.
            consent("remove", args.yes, "Force this removal? [y/N] ")?;
            let mode = target.spec.removal.map_or(RemovalMode::Wipe, |r| r.mode);
            let removal = MachineRemoval { mode, force: true };
            let patch = serde_json::json!({ "spec": { "removal": removal } });
            api.patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| {
                    format!("cannot write spec.removal of TalosMachine {}", args.name)
                })?;
            printer::step("its removal is forced now (spec.removal.force)");
        }
        return follow_removal(&api, &args).await;
    }
    let answer = answers(&target.spec.address).await;
    checks::check_remove(target, &machines, answer.clone(), args.force)
        .map_err(|r| refused("remove", &[r.to_string()]))?;
    let removal = MachineRemoval {
        mode: if args.keep_node {
            RemovalMode::KeepNode
        } else {
            RemovalMode::Wipe
        },
        force: args.force,
    };
    printer::step(&format!(
        "plan: remove TalosMachine {}/{} ({}, {}): {}{}",
        args.place.namespace,
        args.name,
        target.spec.role,
        target.spec.address,
        match removal.mode {
            RemovalMode::KeepNode => "drain it and forget it, the node left running",
            RemovalMode::Wipe => "drain it and reset its node back to maintenance mode",
        },
        match (&answer, target.spec.role) {
            (Err(_), MachineRole::Controlplane) => {
                "; its node does not answer: its etcd member is removed by id from another control plane"
            }
            (Err(_), MachineRole::Worker) => "; its node does not answer: only its Node is deleted",
            (Ok(()), MachineRole::Controlplane) => "; it leaves etcd first",
            (Ok(()), MachineRole::Worker) => "",
        }
    ));
    consent("remove", args.yes, "Remove this machine? [y/N] ")?;
    let patch = serde_json::json!({ "spec": { "removal": removal } });
    api.patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot write spec.removal of TalosMachine {}", args.name))?;
    api.delete(&args.name, &DeleteParams::default())
        .await
        .with_context(|| format!("cannot delete TalosMachine {}", args.name))?;
    printer::step(&format!(
        "TalosMachine {}/{} marked for removal; the controller runs it (ichor machine list shows its step)",
        args.place.namespace, args.name
    ));
    follow_removal(&api, &args).await
}

async fn follow_removal(api: &Api<TalosMachine>, args: &MachineRemoveArgs) -> anyhow::Result<()> {
    if args.wait {
        follow::removed(api, &args.name, args.wait_timeout).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lines_up_and_shows_the_step() {
        let rows = vec![
            MachineRow {
                name: "cp-1".into(),
                cluster: "lab".into(),
                role: MachineRole::Controlplane,
                address: "10.5.0.2".into(),
                phase: MembershipPhase::Member,
                step: None,
                message: None,
                ready: "True".into(),
                drift: 0,
                held: false,
            },
            MachineRow {
                name: "w-12".into(),
                cluster: "lab".into(),
                role: MachineRole::Worker,
                address: "10.5.0.12".into(),
                phase: MembershipPhase::Leaving,
                step: Some("Drain".into()),
                message: None,
                ready: "True".into(),
                drift: 2,
                held: true,
            },
        ];
        assert_eq!(
            table(&rows),
            [
                "NAME  CLUSTER  ROLE          ADDRESS    PHASE            READY  DRIFT  HELD",
                "cp-1  lab      controlplane  10.5.0.2   Member           True   0      no",
                "w-12  lab      worker        10.5.0.12  Leaving (Drain)  True   2      yes",
            ]
        );
    }
}
