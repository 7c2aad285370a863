//! `ichor cluster status`: what Ichor manages, read from the cluster.

use ichor_api::{CniPreset, TalosCluster, TalosMachine};
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use crate::args::{ClusterStatusArgs, OutputFormat};
use crate::{connect, printer};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterStatus {
    name: String,
    namespace: String,
    /// "managed Cilium" or "unmanaged (<talosCNI>)".
    cni: String,
    detected: Option<String>,
    handover: Option<String>,
    ready: Option<String>,
    machines: Vec<MachineStatus>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MachineStatus {
    name: String,
    role: String,
    address: String,
    held: bool,
    drift: usize,
    conditions: Vec<String>,
}

pub async fn run(args: ClusterStatusArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let clusters = Api::<TalosCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow::anyhow!("cannot list TalosClusters: {e}. Is Ichor installed (its CRDs), and may this kubeconfig read them?"))?;
    let machines = Api::<TalosMachine>::all(client)
        .list(&ListParams::default())
        .await?;
    let mut out = Vec::new();
    for c in clusters.items.iter().filter(|c| {
        args.cluster
            .as_deref()
            .is_none_or(|n| c.metadata.name.as_deref() == Some(n))
    }) {
        let name = c.metadata.name.clone().unwrap_or_default();
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        let status = c.status.clone().unwrap_or_default();
        let cond = |t: &str| {
            status
                .conditions
                .iter()
                .find(|x| x.type_ == t)
                .map(|x| format!("{} ({})", x.status, x.reason))
        };
        out.push(ClusterStatus {
            cni: match c.spec.cni.preset {
                CniPreset::Cilium => "managed Cilium".into(),
                CniPreset::Unmanaged => format!(
                    "unmanaged (talosCNI {})",
                    c.spec
                        .cni
                        .unmanaged
                        .as_ref()
                        .map(|u| format!("{:?}", u.talos_cni).to_lowercase())
                        .unwrap_or_else(|| "none".into())
                ),
            },
            detected: status
                .cni
                .as_ref()
                .and_then(|d| d.detected)
                .map(|d| format!("{d:?}").to_lowercase()),
            handover: cond(ichor_api::conditions::types::CNI_HANDOVER),
            ready: cond(ichor_api::conditions::types::READY),
            machines: machines
                .items
                .iter()
                .filter(|m| {
                    m.metadata.namespace.as_deref() == Some(&ns) && m.spec.cluster_ref.name == name
                })
                .map(|m| {
                    let st = m.status.clone().unwrap_or_default();
                    MachineStatus {
                        name: m.metadata.name.clone().unwrap_or_default(),
                        role: format!("{:?}", m.spec.role).to_lowercase(),
                        address: m.spec.address.clone(),
                        held: m.spec.hold,
                        drift: st.drift.len(),
                        conditions: st
                            .conditions
                            .iter()
                            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
                            .collect(),
                    }
                })
                .collect(),
            name,
            namespace: ns,
        });
    }
    match args.output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(&out)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(&out)?),
        None => {
            if out.is_empty() {
                printer::data("no TalosCluster: adopt a cluster with ichor adopt");
            }
            for c in &out {
                printer::data(&format!(
                    "cluster {}/{}: {}; detected CNI {}; CNIHandover {}; Ready {}",
                    c.namespace,
                    c.name,
                    c.cni,
                    c.detected.as_deref().unwrap_or("unknown"),
                    c.handover.as_deref().unwrap_or("not reported"),
                    c.ready.as_deref().unwrap_or("not reported")
                ));
                for m in &c.machines {
                    printer::data(&format!(
                        "  machine {} ({}, {}): {}, {} drift entries; {}",
                        m.name,
                        m.role,
                        m.address,
                        if m.held { "held" } else { "released" },
                        m.drift,
                        m.conditions.join(", ")
                    ));
                }
            }
        }
    }
    Ok(())
}
