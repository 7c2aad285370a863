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
    /// The status of the Held condition, as the controller last wrote it.
    #[serde(skip)]
    held_condition: Option<String>,
    drift: usize,
    conditions: Vec<String>,
}

/// The hold as the status line says it: `spec.hold`, and where the
/// controller has not written a matching `Held` yet, that it has not
/// observed the change (so "released" never stands beside `Held=True`
/// unexplained).
fn hold_words(spec_hold: bool, held_condition: Option<&str>) -> &'static str {
    match (spec_hold, held_condition) {
        (true, Some("False")) => "held (the controller has not observed the hold yet: Held=False)",
        (true, _) => "held",
        (false, Some("True")) => {
            "released (the controller has not observed the release yet: Held=True)"
        }
        (false, _) => "released",
    }
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
    let out: Vec<ClusterStatus> = clusters
        .items
        .iter()
        .filter(|c| {
            args.cluster
                .as_deref()
                .is_none_or(|n| c.metadata.name.as_deref() == Some(n))
        })
        .map(|c| cluster_status(c, &machines.items))
        .collect();
    match args.output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(&out)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(&out)?),
        None => {
            if out.is_empty() {
                printer::data("no TalosCluster: adopt a cluster with ichor adopt");
            }
            for line in out.iter().flat_map(text_lines) {
                printer::data(&line);
            }
        }
    }
    Ok(())
}

/// One cluster as `ichor cluster status` shows it.
fn cluster_status(c: &TalosCluster, machines: &[TalosMachine]) -> ClusterStatus {
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
    ClusterStatus {
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
            .iter()
            .filter(|m| {
                m.metadata.namespace.as_deref() == Some(&ns) && m.spec.cluster_ref.name == name
            })
            .map(machine_status)
            .collect(),
        name,
        namespace: ns,
    }
}

fn machine_status(m: &TalosMachine) -> MachineStatus {
    let st = m.status.clone().unwrap_or_default();
    MachineStatus {
        name: m.metadata.name.clone().unwrap_or_default(),
        role: format!("{:?}", m.spec.role).to_lowercase(),
        address: m.spec.address.clone(),
        held: m.spec.hold,
        held_condition: ichor_api::conditions::find(
            &st.conditions,
            ichor_api::conditions::types::HELD,
        )
        .map(|c| c.status.clone()),
        drift: st.drift.len(),
        conditions: st
            .conditions
            .iter()
            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
            .collect(),
    }
}

/// The text lines of one cluster: its own, then one per machine.
fn text_lines(c: &ClusterStatus) -> Vec<String> {
    let mut lines = vec![format!(
        "cluster {}/{}: {}; detected CNI {}; CNIHandover {}; Ready {}",
        c.namespace,
        c.name,
        c.cni,
        c.detected.as_deref().unwrap_or("unknown"),
        c.handover.as_deref().unwrap_or("not reported"),
        c.ready.as_deref().unwrap_or("not reported")
    )];
    lines.extend(c.machines.iter().map(|m| {
        format!(
            "  machine {} ({}, {}): {}, {} drift entries; {}",
            m.name,
            m.role,
            m.address,
            hold_words(m.held, m.held_condition.as_deref()),
            m.drift,
            m.conditions.join(", ")
        )
    }));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_beside_held_true_says_the_controller_has_not_seen_it() {
        assert_eq!(hold_words(false, Some("False")), "released");
        assert_eq!(hold_words(false, None), "released");
        assert_eq!(
            hold_words(false, Some("True")),
            "released (the controller has not observed the release yet: Held=True)"
        );
        assert_eq!(hold_words(true, Some("True")), "held");
        assert!(hold_words(true, Some("False")).contains("has not observed the hold yet"));
    }
}
