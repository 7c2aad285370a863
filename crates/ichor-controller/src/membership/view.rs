//! What membership reads: the node over its maintenance API or with the
//! cluster's credentials, etcd's members as the control planes report
//! them, the cluster's other machines (the shared store) and the Node.

use ichor_api::{MachineRole, MembershipPhase, TalosCluster, TalosMachine};
use ichor_reconcile::membership::Member;
use ichor_talos_client::{ClientOptions, TalosClient};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::machine::endpoint;
use crate::{Context, Error, Result};

/// Talos's machine stages (`MachineStatusSpec.stage`).
pub(super) const STAGE_MAINTENANCE: i32 = 3;
pub(super) const STAGE_RESETTING: i32 = 7;

/// A node that answers in maintenance mode.
#[derive(Debug, Clone)]
pub(super) struct Maintenance {
    pub client: TalosClient,
    pub hostname: String,
    pub talos_version: String,
    pub disks: Vec<String>,
}

fn options(ctx: &Context) -> ClientOptions {
    ClientOptions {
        call_timeout: ctx
            .config
            .talos_call_timeout
            .min(std::time::Duration::from_secs(10)),
        connect_timeout: std::time::Duration::from_secs(3),
        ..ClientOptions::default()
    }
}

/// The node over its maintenance API, when it answers there in stage
/// maintenance; `None` otherwise (configured, or not answering).
pub(super) async fn maintenance(ctx: &Context, address: &str) -> Option<Maintenance> {
    let client =
        TalosClient::maintenance(&endpoint(address, ctx.config.talos_port), options(ctx)).ok()?;
    let stage = client.machine_status("").await.ok()?.stage;
    if stage != STAGE_MAINTENANCE {
        return None;
    }
    let version = client.version("").await.ok()?;
    let hostname = client.hostname("").await.ok()?;
    let disks = client
        .disks("")
        .await
        .ok()?
        .into_iter()
        .map(|(_, d)| d.dev_path)
        .collect();
    Some(Maintenance {
        client,
        hostname,
        talos_version: version.tag,
        disks,
    })
}

/// A client of `address` with the cluster's admin identity.
pub(super) async fn admin(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    address: &str,
) -> Result<TalosClient> {
    ctx.credentials
        .talos_client(
            &ctx.client,
            cluster,
            &endpoint(address, ctx.config.talos_port),
            options(ctx),
        )
        .await?
        .map_err(|e| crate::machine::talos_error(machine, e))
}

/// The other TalosMachines of `machine`'s cluster, as the shared store has them.
pub(super) fn cluster_machines(ctx: &Context, machine: &TalosMachine) -> Vec<TalosMachine> {
    let ns = machine.namespace();
    let cluster = &machine.spec.cluster_ref.name;
    ctx.machines
        .store
        .state()
        .iter()
        .filter_map(|m| m.0.as_ref().ok())
        .filter(|m| m.namespace() == ns && &m.spec.cluster_ref.name == cluster)
        .filter(|m| m.uid() != machine.uid())
        .cloned()
        .collect()
}

pub(super) fn phase(m: &TalosMachine) -> Option<MembershipPhase> {
    m.status
        .as_ref()
        .and_then(|s| s.membership.as_ref())
        .map(|s| s.phase)
}

/// etcd as the control planes report it: the members, each one's health
/// (its own `EtcdStatus` answered without errors), leaving when its
/// machine's removal began, and the leader's id.
#[derive(Debug, Clone, Default)]
pub(super) struct EtcdView {
    pub members: Vec<Member>,
    pub leader: Option<u64>,
    /// The address of a control plane that answered (for a removal by id).
    pub peer: Option<String>,
}

/// Reads etcd through the control planes among `machines` (and `also`,
/// the machine being judged). `None` when no control plane answered.
pub(super) async fn etcd(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    also: &TalosMachine,
) -> Option<EtcdView> {
    let cps: Vec<&TalosMachine> = machines
        .iter()
        .chain(std::iter::once(also))
        .filter(|m| m.spec.role == MachineRole::Controlplane)
        .collect();
    let mut view = EtcdView::default();
    let mut listed = None;
    let mut healthy = std::collections::BTreeSet::new();
    for m in &cps {
        let Ok(c) = admin(ctx, cluster, m, &m.spec.address).await else {
            continue;
        };
        if let Ok(s) = c.etcd_status("").await
            && s.errors.is_empty()
        {
            healthy.insert(s.member_id);
            view.leader.get_or_insert(s.leader);
            if listed.is_none()
                && let Ok(list) = c.etcd_members("").await
            {
                listed = Some(list);
                view.peer = Some(m.spec.address.clone());
            }
        }
    }
    let leaving: std::collections::BTreeSet<String> = cps
        .iter()
        .filter(|m| phase(m) == Some(MembershipPhase::Leaving))
        .map(|m| m.name_any())
        .collect();
    view.members = listed?
        .into_iter()
        .map(|m| Member {
            id: m.id,
            healthy: healthy.contains(&m.id),
            leaving: leaving.contains(&m.name),
            name: m.name,
            is_learner: m.is_learner,
        })
        .collect();
    Some(view)
}

/// The Node named `name`, if it exists.
pub(super) async fn node(ctx: &Context, name: &str) -> Result<Option<Node>> {
    Api::<Node>::all(ctx.client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading Node {name}")))
}

pub(super) fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
