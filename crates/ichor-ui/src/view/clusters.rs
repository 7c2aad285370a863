//! The clusters page: one row a cluster, and Ichor's own install.

use ichor_api::conditions::{self, types};
use ichor_api::{IchorInstallation, Manager, TalosCluster};
use kube::ResourceExt as _;

use super::*;

/// Ichor's own install, from the IchorInstallation when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IchorSummary {
    /// The version that runs (status), else the one asked for (spec); None without an IchorInstallation.
    pub version: Option<String>,
    /// Whether Helm manages the install.
    pub helm_managed: bool,
    /// On Helm, the command that upgrades Ichor (the UI offers no action then).
    pub helm_upgrade_command: Option<String>,
}

/// The chart Ichor is published as (R4.5).
pub const CHART: &str = "oci://ghcr.io/maeshinshin/charts/ichor";

/// Ichor's install as the clusters page shows it.
pub fn ichor_summary(installation: Option<&IchorInstallation>) -> IchorSummary {
    let Some(inst) = installation else {
        return IchorSummary {
            version: None,
            helm_managed: false,
            helm_upgrade_command: None,
        };
    };
    let version = inst
        .status
        .as_ref()
        .and_then(|s| s.installed_version.clone())
        .unwrap_or_else(|| inst.spec.version.clone());
    let helm_managed = inst.spec.deployment.manager == Manager::Helm;
    let namespace = inst
        .namespace()
        .unwrap_or_else(|| ichor_api::SYSTEM_NAMESPACE.into());
    IchorSummary {
        version: Some(version),
        helm_managed,
        helm_upgrade_command: helm_managed.then(|| {
            format!(
                "helm upgrade ichor {CHART} --version VERSION --namespace {namespace} --reuse-values"
            )
        }),
    }
}

/// One row of the clusters page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRow {
    pub namespace: String,
    pub name: String,
    /// Ready, Upgrading, Degraded or Pending.
    pub phase: &'static str,
    /// The Ready condition's message, when not ready.
    pub health: Option<String>,
    pub talos_version: String,
    pub kubernetes_version: String,
    /// cilium or unmanaged.
    pub cni: &'static str,
    /// The CNIHandover condition: status and reason ("True HandedOver").
    pub handover: Option<String>,
    /// The TalosOperations running on the cluster (names).
    pub running_operations: Vec<String>,
    /// Machines whose node runs the desired config.
    pub in_sync: usize,
    pub machines: usize,
    pub held: usize,
}

/// A row of the clusters page for one cluster.
pub fn cluster_row(inv: &Inventory, cluster: &TalosCluster) -> ClusterRow {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let conds = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let ready = conditions::find(conds, types::READY);
    let running: Vec<String> = operations_of(inv, &namespace, &name)
        .filter(|o| is_running(o))
        .map(|o| o.name_any())
        .collect();
    let phase = if !running.is_empty() {
        "Upgrading"
    } else {
        match ready.map(|c| c.status.as_str()) {
            Some("True") => "Ready",
            Some("False") => "Degraded",
            _ => "Pending",
        }
    };
    let machines: Vec<_> = machines_of(inv, &namespace, &name).collect();
    ClusterRow {
        health: ready
            .filter(|c| c.status != "True")
            .map(|c| format!("{}: {}", c.reason, c.message)),
        talos_version: cluster.spec.talos_version.clone(),
        kubernetes_version: cluster.spec.kubernetes_version.clone(),
        cni: match cluster.spec.cni.preset {
            ichor_api::CniPreset::Cilium => "cilium",
            ichor_api::CniPreset::Unmanaged => "unmanaged",
        },
        handover: conditions::find(conds, types::CNI_HANDOVER)
            .map(|c| format!("{} {}", c.status, c.reason)),
        running_operations: running,
        in_sync: machines.iter().filter(|m| machine_in_sync(m)).count(),
        held: machines.iter().filter(|m| m.spec.hold).count(),
        machines: machines.len(),
        phase,
        namespace,
        name,
    }
}

/// The clusters page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClustersPage {
    pub ichor: IchorSummary,
    pub rows: Vec<ClusterRow>,
}

/// The clusters page, clusters sorted by namespace and name.
pub fn clusters_page(inv: &Inventory) -> ClustersPage {
    let mut rows: Vec<ClusterRow> = inv.clusters.iter().map(|c| cluster_row(inv, c)).collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    ClustersPage {
        ichor: ichor_summary(inv.installation.as_deref()),
        rows,
    }
}
