//! The page of one cluster: its machines, what holds keep back, its Cilium
//! release.

use ichor_api::{DriftClass, MachineRole};
use kube::ResourceExt as _;

use super::*;

/// A held machine and the changes its hold keeps back (the warning users of
/// other tools asked for: all green while held nodes are still unchanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMachine {
    pub name: String,
    /// The paths that differ (class B and C), in path order.
    pub held_back: Vec<String>,
}

/// The cluster page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPage {
    pub row: ClusterRow,
    pub ichor: IchorSummary,
    /// Control-plane machines Ready, of all control-plane machines.
    pub control_plane_ready: (usize, usize),
    pub held: Vec<HeldMachine>,
    /// The operations of this cluster, newest first.
    pub operations: Vec<OperationRow>,
    /// The machines of this cluster (for the operation form).
    pub machine_names: Vec<String>,
    pub can_start_operation: bool,
    /// Ichor's Cilium release as its newest Helm record says (preset
    /// cilium): `None` for an unmanaged CNI.
    pub cilium_release: Option<String>,
}

/// The line the cluster page shows for Ichor's Cilium release, from
/// `status.cni.release` (which the controller reads from the release's
/// newest Helm record).
pub fn cilium_release_line(release: Option<&ichor_api::CiliumReleaseStatus>) -> String {
    let Some(r) = release else {
        return "no Helm record yet".to_string();
    };
    let mut line = format!("{} revision {}: {}", r.name, r.revision, r.status);
    if let Some(deployed) = r.deployed_revision {
        line.push_str(&format!(" (revision {deployed} is the one deployed)"));
    }
    if let Some(v) = &r.chart_version {
        line.push_str(&format!(", chart {v}"));
    }
    if let Some(t) = &r.last_deployed {
        line.push_str(&format!(", deployed {t}"));
    }
    line.push_str(&format!("; record in {}", r.storage_namespace));
    line
}

/// The cluster page of one cluster; None when there is no such cluster.
pub fn cluster_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    perms: Permissions,
) -> Option<ClusterPage> {
    let cluster = inv
        .clusters
        .iter()
        .find(|c| c.namespace().as_deref() == Some(namespace) && c.name_any() == name)?;
    let machines: Vec<_> = machines_of(inv, namespace, name).collect();
    let cps: Vec<_> = machines
        .iter()
        .filter(|m| m.spec.role == MachineRole::Controlplane)
        .collect();
    let mut held: Vec<HeldMachine> = machines
        .iter()
        .filter(|m| m.spec.hold)
        .map(|m| HeldMachine {
            name: m.name_any(),
            held_back: drift_entries(m)
                .iter()
                .filter(|e| e.class != DriftClass::A)
                .map(|e| e.path.clone())
                .collect(),
        })
        .collect();
    held.sort_by(|a, b| a.name.cmp(&b.name));
    let mut machine_names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    machine_names.sort();
    let mut operations: Vec<OperationRow> = operations_of(inv, namespace, name)
        .map(|o| operation_row(o))
        .collect();
    sort_operations(&mut operations);
    Some(ClusterPage {
        row: cluster_row(inv, cluster),
        ichor: ichor_summary(inv.installation.as_deref()),
        control_plane_ready: (cps.iter().filter(|m| is_ready(m)).count(), cps.len()),
        held,
        operations,
        machine_names,
        can_start_operation: perms.create_operations,
        cilium_release: (cluster.spec.cni.preset == ichor_api::CniPreset::Cilium).then(|| {
            cilium_release_line(
                cluster
                    .status
                    .as_ref()
                    .and_then(|s| s.cni.as_ref())
                    .and_then(|c| c.release.as_ref()),
            )
        }),
    })
}
