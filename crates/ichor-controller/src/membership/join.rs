//! Joining a node that answers in maintenance mode: its config is rendered
//! from the cluster's bundle for its role, in the shape of its Talos
//! version, with the render `ichor init` uses (a base config from the
//! bundle, then Ichor's paths and the machine's patches), and applied over
//! the maintenance API. Then the join waits, saying for what, for Talos to
//! boot, for a control plane's etcd member to count, and for the Node to be
//! Ready. Control planes join one at a time; workers together.

use std::time::Duration;

use ichor_adopt::init::{BaseInput, ConfigShape, base_config};
use ichor_api::history::{RevisionApplyMode, RevisionReason};
use ichor_api::{MachineRole, MembershipPhase, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_reconcile::history::record;
use ichor_reconcile::membership::join::{
    JoinNext, JoinSeen, JoinVerdict, control_plane, join_next,
};
use ichor_render::RenderInput;
use ichor_talos::config::{MachineConfig, ParsedConfig};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::version::Version;
use ichor_talos_client::{ApplyMode, ApplyRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::view::{self, Maintenance};
use super::{event, membership, reasons, set, write};
use crate::machine::history::{self, WholeApply};
use crate::{Context, Result};

/// How soon a join looks again while it waits.
const POLL: Duration = Duration::from_secs(2);

/// The status step of a join whose config was applied.
const APPLIED: &str = "Boot";

/// Whether the machine may be a node to join: one never read, or one
/// whose join began or was refused.
pub(super) fn wanted(status: &TalosMachineStatus) -> bool {
    match status.membership.as_ref().map(|m| m.phase) {
        Some(MembershipPhase::Joining | MembershipPhase::Refused) => true,
        None => status.talos_version.is_none(),
        Some(_) => false,
    }
}

/// One look at a join: `Some(action)` while it goes on (status written),
/// `None` when the node has nothing to join or has joined (then the
/// usual reconcile goes on, with the phase Member in `status`).
pub(super) async fn join(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
) -> Result<Option<Action>> {
    let now = (ctx.clock)();
    let maintenance = view::maintenance(ctx, &machine.spec.address).await;
    if maintenance.is_none() && status.membership.is_none() {
        // A configured node (adopted, or initialised): nothing to join.
        return Ok(None);
    }
    if status.membership.as_ref().and_then(|m| m.step.as_deref()) == Some(APPLIED) {
        history::catch_up(ctx, machine, status).await?;
    }
    let others = view::cluster_machines(ctx, machine);
    let (seen, etcd) = observe(machine, cluster, ctx, maintenance.as_ref(), &others).await?;
    let waited = status
        .membership
        .as_ref()
        .filter(|m| m.step.as_deref() == Some(APPLIED))
        .and_then(|m| m.since.as_ref())
        .and_then(|since| Duration::try_from(now.0.duration_since(since.0)).ok());
    match join_next(&seen, waited) {
        JoinNext::Joined => {
            let (host, role) = (&seen.hostname, machine.spec.role);
            set(
                status,
                MembershipPhase::Member,
                format!("joined as {host}"),
                &now,
            );
            membership(status).step = None;
            let note = format!("node {host} joined the cluster as a {role}");
            event(ctx, machine, EventType::Normal, reasons::JOINED, note).await;
            Ok(None)
        }
        JoinNext::Wait(why) => {
            set(status, MembershipPhase::Joining, why, &now);
            write(ctx, machine, status).await?;
            Ok(Some(Action::requeue(POLL)))
        }
        JoinNext::Apply => {
            let node = maintenance.expect("Apply only in maintenance mode");
            let etcd = etcd.as_ref();
            apply(machine, cluster, ctx, status, &others, etcd, node, &now).await
        }
    }
}

/// What the join sees of the node: in maintenance mode, booted with its
/// config, its etcd member (a control plane), its Node Ready.
async fn observe(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    maintenance: Option<&Maintenance>,
    others: &[TalosMachine],
) -> Result<(JoinSeen, Option<view::EtcdView>)> {
    let control = machine.spec.role == MachineRole::Controlplane;
    let mut seen = JoinSeen {
        control_plane: control,
        maintenance: maintenance.is_some(),
        hostname: maintenance.map_or_else(|| machine.name_any(), |m| m.hostname.clone()),
        ..JoinSeen::default()
    };
    let etcd = if control && (maintenance.is_none() || !machine.spec.hold) {
        view::etcd(ctx, cluster, others, machine).await
    } else {
        None
    };
    if maintenance.is_none() {
        seen.booted = match view::admin(ctx, cluster, machine, &machine.spec.address).await {
            Ok(c) => c.version("").await.is_ok(),
            Err(_) => false,
        };
        seen.member = etcd
            .as_ref()
            .and_then(|e| e.members.iter().find(|m| m.name == seen.hostname).cloned());
        seen.node_ready = view::node(ctx, &seen.hostname)
            .await?
            .is_some_and(|n| view::node_ready(&n));
    }
    Ok((seen, etcd))
}

/// Writes `why` with `phase` and looks again `after`.
async fn stay(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
    (phase, why, after): (MembershipPhase, String, Duration),
    now: &Time,
) -> Result<Option<Action>> {
    set(status, phase, why, now);
    membership(status).step = None;
    write(ctx, machine, status).await?;
    Ok(Some(Action::requeue(after)))
}

/// Why the node may not have its config now: the hold, or etcd (control
/// planes one at a time, a hostname that names a live member); with the
/// phase to show and when to look again. `None`: apply.
fn gate(
    machine: &TalosMachine,
    others: &[TalosMachine],
    etcd: Option<&view::EtcdView>,
    hostname: &str,
    resync: Duration,
) -> Option<(MembershipPhase, String, Duration)> {
    if machine.spec.hold {
        return Some((
            MembershipPhase::Joining,
            format!(
                "node {hostname} answers in maintenance mode; it waits for its release (spec.hold: false) to be joined"
            ),
            resync,
        ));
    }
    if machine.spec.role != MachineRole::Controlplane {
        return None;
    }
    let Some(etcd) = etcd else {
        let why = "waiting for a control plane to answer with etcd's members".to_string();
        return Some((MembershipPhase::Joining, why, POLL * 5));
    };
    let joining: Vec<String> = others
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
        .filter(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.membership.as_ref())
                .is_some_and(|s| {
                    s.phase == MembershipPhase::Joining && s.step.as_deref() == Some(APPLIED)
                })
        })
        .map(|m| m.name_any())
        .collect();
    let joining: Vec<&str> = joining.iter().map(String::as_str).collect();
    match control_plane(&etcd.members, hostname, &joining) {
        JoinVerdict::Join => None,
        JoinVerdict::Wait(why) => Some((MembershipPhase::Joining, format!("waiting: {why}"), POLL)),
        JoinVerdict::Refuse(why) => Some((
            MembershipPhase::Refused,
            format!(
                "not joined: {why}; give the node another hostname, or remove that member first"
            ),
            resync,
        )),
    }
}

/// Applies the node's config when the hold and etcd allow it.
#[allow(clippy::too_many_arguments)]
async fn apply(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
    others: &[TalosMachine],
    etcd: Option<&view::EtcdView>,
    node: Maintenance,
    now: &Time,
) -> Result<Option<Action>> {
    if let Some(why) = gate(machine, others, etcd, &node.hostname, ctx.config.resync) {
        return stay(ctx, machine, status, why, now).await;
    }
    let bundle = crate::credentials::read_bundle(&ctx.client, cluster).await?;
    let cluster_name = cluster_name(ctx, cluster, others).await;
    let facts = NodeFacts {
        hostname: &node.hostname,
        talos_version: &node.talos_version,
        disks: &node.disks,
    };
    let config = match join_config(&bundle, cluster, machine, &facts, &cluster_name) {
        Ok(c) => c,
        Err(JoinConfigError::NoDisk) => {
            let why = format!("node {} lists no disk to install Talos to", node.hostname);
            let refused = (MembershipPhase::Refused, why, ctx.config.resync);
            return stay(ctx, machine, status, refused, now).await;
        }
        Err(JoinConfigError::Render(e)) => return Err(e.into()),
    };
    // The intent first: a control plane that has applied counts as joining
    // for the others from now on.
    let (role, host) = (machine.spec.role, &node.hostname);
    let why = format!("applying the {role} config of {host} over the maintenance API");
    set(status, MembershipPhase::Joining, why, now);
    let m = membership(status);
    m.step = Some(APPLIED.into());
    m.since = Some(now.clone());
    write(ctx, machine, status).await?;
    let note = format!(
        "applying the {role} config of node {host} (Talos {}) over the maintenance API",
        node.talos_version
    );
    event(
        ctx,
        machine,
        EventType::Normal,
        super::reasons::JOINING,
        note,
    )
    .await;
    let change = join_change(machine, &config)?;
    node.client
        .apply_configuration(
            "",
            &ApplyRequest::new(config.clone().into_bytes(), ApplyMode::Auto),
        )
        .await
        .map_err(|e| crate::machine::talos_error(machine, e))?;
    tracing::info!(machine = %machine.name_any(), node = %host, "applied the join config over the maintenance API");
    let apply = WholeApply {
        reason: RevisionReason::Join,
        operation: None,
        mode: RevisionApplyMode::Maintenance,
        change,
        rendered: &config,
    };
    history::record_whole(ctx, machine, cluster, apply, status, now).await;
    write(ctx, machine, status).await?;
    Ok(Some(Action::requeue(POLL)))
}

/// What the join config changes on a node that runs none: every document
/// is new.
fn join_change(machine: &TalosMachine, config: &str) -> Result<record::Change> {
    let parsed = ParsedConfig::parse_with_origin(config, "the join config").map_err(|source| {
        ichor_render::Error::Rendered {
            machine: machine.name_any(),
            source,
        }
    })?;
    Ok(record::change(None, &parsed.mappings))
}

/// What the maintenance API told of the node.
pub(super) struct NodeFacts<'a> {
    pub hostname: &'a str,
    pub talos_version: &'a str,
    pub disks: &'a [String],
}

/// Why a join config cannot be made.
#[derive(Debug)]
pub(super) enum JoinConfigError {
    NoDisk,
    Render(ichor_render::Error),
}

/// The config of a node that joins: `ichor init`'s base config from the
/// bundle (its role, the shape of its Talos version, the first disk), then
/// the render of its TalosMachine over it. Pure.
pub(super) fn join_config(
    bundle: &SecretsBundle,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    node: &NodeFacts<'_>,
    cluster_name: &str,
) -> std::result::Result<String, JoinConfigError> {
    let mut disks = node.disks.to_vec();
    disks.sort();
    let disk = disks.first().ok_or(JoinConfigError::NoDisk)?;
    let shape = Version::parse(node.talos_version)
        .map(|v| ConfigShape::for_version(&v))
        .unwrap_or(ConfigShape::Legacy);
    let base = BaseInput {
        shape,
        control_plane: machine.spec.role == MachineRole::Controlplane,
        cluster_name,
        endpoint: &cluster.spec.endpoint,
        kubernetes_version: &cluster.spec.kubernetes_version,
        talos_version: node.talos_version,
        install_disk: disk,
    };
    let origin = format!("the base config of {}", node.hostname);
    let name = machine.name_any();
    let rendered_error = |source| {
        JoinConfigError::Render(ichor_render::Error::Rendered {
            machine: name.clone(),
            source,
        })
    };
    let live = MachineConfig::from_mappings(base_config(bundle, &base), &origin)
        .map_err(rendered_error)?;
    ichor_render::render(&RenderInput::from_objects(cluster, machine, &live))
        .and_then(|r| r.yaml())
        .map_err(JoinConfigError::Render)
}

/// The cluster's name as its control planes run it (a member's live
/// config), else the TalosCluster's name.
async fn cluster_name(ctx: &Context, cluster: &TalosCluster, others: &[TalosMachine]) -> String {
    for m in others
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
    {
        let Ok(c) = view::admin(ctx, cluster, m, &m.spec.address).await else {
            continue;
        };
        let Ok(bytes) = c.machine_config("").await else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(parsed) = ichor_talos::config::ParsedConfig::parse_with_origin(
            &text,
            "a control plane's live config",
        ) && let Some(name) = parsed.config.facts().cluster_name
        {
            return name;
        }
    }
    cluster.name_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::TalosClusterSpec;

    fn objects(role: &str) -> (TalosCluster, TalosMachine) {
        let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ichor-system"},
            "spec": {
                "endpoint": "https://10.5.0.2:6443", "talosVersion": "v1.13.0",
                "kubernetesVersion": "v1.34.1",
                "network": {"podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
                "cni": {"preset": "cilium"},
                "secretsRef": {"name": "lab-secrets"}
            }
        }))
        .expect("a TalosCluster");
        let _: &TalosClusterSpec = &cluster.spec;
        let machine: TalosMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "lab-worker-3", "namespace": "ichor-system"},
            "spec": {"clusterRef": {"name": "lab"}, "role": role, "address": "10.5.0.20", "hold": false}
        }))
        .expect("a TalosMachine");
        (cluster, machine)
    }

    fn node<'a>(version: &'a str, disks: &'a [String]) -> NodeFacts<'a> {
        NodeFacts {
            hostname: "lab-worker-3",
            talos_version: version,
            disks,
        }
    }

    /// Covers: R14.1 (rendered as init renders, for its role and shape; its
    /// first reconcile finds no drift)
    #[test]
    fn a_join_config_is_inits_render_and_shows_no_drift() {
        let bundle = SecretsBundle::generate().expect("a bundle");
        for (role, version) in [("worker", "v1.13.0"), ("controlplane", "v1.14.0")] {
            let (cluster, machine) = objects(role);
            let yaml = join_config(
                &bundle,
                &cluster,
                &machine,
                &node(version, &["/dev/vdb".to_string(), "/dev/sda".to_string()]),
                "lab",
            )
            .unwrap_or_else(|e| panic!("{role}: {e:?}"));
            let parsed =
                ichor_talos::config::ParsedConfig::parse_with_origin(&yaml, "the join config")
                    .expect("a Talos config");
            let facts = parsed.config.facts();
            assert_eq!(facts.install_disk.as_deref(), Some("/dev/sda"), "{role}");
            assert_eq!(facts.cluster_name.as_deref(), Some("lab"), "{role}");
            let again = ichor_render::render_machine_from(
                &RenderInput::from_objects(&cluster, &machine, &parsed.config),
                &parsed.mappings,
            )
            .expect("the first reconcile's render");
            assert!(
                again
                    .drift
                    .entries
                    .iter()
                    .all(|e| e.class == ichor_api::DriftClass::A),
                "{role}: {:?}",
                again.drift.entries
            );
        }
        let (cluster, machine) = objects("worker");
        assert!(matches!(
            join_config(&bundle, &cluster, &machine, &node("v1.13.0", &[]), "lab"),
            Err(JoinConfigError::NoDisk)
        ));
    }
}
