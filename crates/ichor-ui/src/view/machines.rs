//! The machines page: the search, the filters and their counts.

use ichor_api::{DriftClass, TalosMachine};
use kube::ResourceExt as _;

use super::*;

/// The machines page's search and filters, as the query string carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct MachineQuery {
    /// Words every one of which must appear in the machine's name, cluster or address.
    pub q: String,
    /// "yes" or "no"; anything else is no filter.
    pub held: String,
    /// "yes" or "no".
    pub drifted: String,
    /// "A", "B" or "C": the machine's highest drift class.
    pub class: String,
    /// "controlplane" or "worker".
    pub role: String,
}

/// One row of the machines page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRow {
    pub namespace: String,
    pub name: String,
    pub cluster: String,
    pub role: &'static str,
    pub address: String,
    pub held: bool,
    /// The highest class of its drift; None when nothing differs.
    pub max_class: Option<DriftClass>,
    /// Paths that differ in class B or C.
    pub drifted_paths: usize,
    pub ready: bool,
    pub talos_version: Option<String>,
}

/// The row of one machine.
pub fn machine_row(m: &TalosMachine) -> MachineRow {
    let drift = drift_entries(m);
    MachineRow {
        namespace: m.namespace().unwrap_or_default(),
        name: m.name_any(),
        cluster: m.spec.cluster_ref.name.clone(),
        role: role_name(m.spec.role),
        address: m.spec.address.clone(),
        held: m.spec.hold,
        max_class: drift.iter().map(|e| e.class).max(),
        drifted_paths: drift.iter().filter(|e| e.class != DriftClass::A).count(),
        ready: is_ready(m),
        talos_version: m.status.as_ref().and_then(|s| s.talos_version.clone()),
    }
}

impl MachineRow {
    /// Drifted: some path differs in class B or C.
    pub fn is_drifted(&self) -> bool {
        self.drifted_paths > 0
    }
}

/// How many machines each filter would show, among those the search matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterCounts {
    pub all: usize,
    pub held: usize,
    pub drifted: usize,
    pub class_a: usize,
    pub class_b: usize,
    pub class_c: usize,
    pub controlplane: usize,
    pub worker: usize,
}

/// The machines page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinesPage {
    pub query: MachineQuery,
    pub counts: FilterCounts,
    /// The machines that match the search and every filter, by namespace and name.
    pub rows: Vec<MachineRow>,
    /// Every machine known.
    pub total: usize,
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

fn matches_search(row: &MachineRow, words: &[String]) -> bool {
    words.iter().all(|w| {
        row.name.to_lowercase().contains(w)
            || row.cluster.to_lowercase().contains(w)
            || row.address.to_lowercase().contains(w)
            || row.namespace.to_lowercase().contains(w)
    })
}

fn matches_filters(row: &MachineRow, q: &MachineQuery) -> bool {
    yes_no(&q.held).is_none_or(|h| row.held == h)
        && yes_no(&q.drifted).is_none_or(|d| row.is_drifted() == d)
        && match q.class.as_str() {
            "A" | "B" | "C" => row.max_class.map(class_name) == Some(q.class.as_str()),
            _ => true,
        }
        && match q.role.as_str() {
            "controlplane" | "worker" => row.role == q.role,
            _ => true,
        }
}

/// The machines page for a query.
pub fn machines_page(inv: &Inventory, query: MachineQuery) -> MachinesPage {
    let words: Vec<String> = query
        .q
        .split_whitespace()
        .map(|w| w.to_lowercase())
        .collect();
    let searched: Vec<MachineRow> = inv
        .machines
        .iter()
        .map(|m| machine_row(m))
        .filter(|r| matches_search(r, &words))
        .collect();
    let mut counts = FilterCounts {
        all: searched.len(),
        ..FilterCounts::default()
    };
    for r in &searched {
        counts.held += usize::from(r.held);
        counts.drifted += usize::from(r.is_drifted());
        match r.max_class {
            Some(DriftClass::A) => counts.class_a += 1,
            Some(DriftClass::B) => counts.class_b += 1,
            Some(DriftClass::C) => counts.class_c += 1,
            None => {}
        }
        match r.role {
            "controlplane" => counts.controlplane += 1,
            _ => counts.worker += 1,
        }
    }
    let mut rows: Vec<MachineRow> = searched
        .into_iter()
        .filter(|r| matches_filters(r, &query))
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    MachinesPage {
        query,
        counts,
        rows,
        total: inv.machines.len(),
    }
}
