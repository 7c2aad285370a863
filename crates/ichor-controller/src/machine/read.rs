//! What the TalosMachine reconcile reads: its cluster (from the shared
//! store, else the API), the node's live config, and the machine again
//! right before an apply.

use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::config::ParsedConfig;
use ichor_talos_client::TalosClient;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::{Context, Error, LiveConfigError, Result};

/// The machine's TalosCluster: from the store the cluster watch fills, or,
/// when the store does not have it (yet) or cannot read it, from the API.
pub(super) async fn read_cluster(machine: &TalosMachine, ctx: &Context) -> Result<TalosCluster> {
    let namespace = machine.namespace().unwrap_or_default();
    let cluster_name = &machine.spec.cluster_ref.name;
    if ctx.clusters.ready().await
        && let Some(guarded) = ctx
            .clusters
            .store
            .get(&ObjectRef::new(cluster_name).within(&namespace))
        && let Ok(cluster) = &guarded.0
    {
        return Ok(cluster.clone());
    }
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosCluster {namespace}/{cluster_name}"
        )))?
        .ok_or_else(|| Error::ClusterNotFound {
            namespace: namespace.clone(),
            machine: machine.name_any(),
            cluster: cluster_name.clone(),
        })
}

/// The TalosMachine as the API server has it now (a quorum read, not the
/// watch cache).
pub(super) async fn read_machine_now(
    machine: &TalosMachine,
    ctx: &Context,
) -> Result<TalosMachine> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .get(&name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosMachine {namespace}/{name} again before the apply"
        )))
}

pub(super) async fn read_live(talos: &TalosClient, machine: &TalosMachine) -> Result<ParsedConfig> {
    let bytes = talos
        .machine_config("")
        .await
        .map_err(|e| talos_error(machine, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| live_config_error(machine, LiveConfigError::NotUtf8(e)))?;
    let origin = format!("the live config of node {}", machine.spec.address);
    ParsedConfig::parse_with_origin(&text, &origin)
        .map_err(|e| live_config_error(machine, e.into()))
}

pub(crate) fn talos_error(machine: &TalosMachine, source: ichor_talos_client::Error) -> Error {
    Error::Talos {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        source: Box::new(source),
    }
}

pub(super) fn live_config_error(machine: &TalosMachine, source: LiveConfigError) -> Error {
    Error::LiveConfig {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        source: Box::new(source),
    }
}
