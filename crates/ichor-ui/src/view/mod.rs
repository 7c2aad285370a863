//! The pages' data, built from the API objects by pure functions (no I/O):
//! what each page shows is decided here and tested here; [`crate::html`]
//! only lays it out.

//!
//! One page a module: [`clusters`] (with Ichor's own install), [`cluster`],
//! [`machines`], [`machine`] (and its [`history`]) and [`operations`] (with one operation's page);
//! what every page reads and may read is here.

mod cluster;
mod clusters;
mod history;
mod machine;
mod machines;
mod operations;

pub use cluster::*;
pub use clusters::*;
pub use history::*;
pub use machine::*;
pub use machines::*;
pub use operations::*;

use std::collections::BTreeSet;
use std::sync::Arc;

use ichor_api::conditions::{self, types};
use ichor_api::{
    DriftClass, DriftEntry, IchorInstallation, MachineRole, OperationPhase, TalosCluster,
    TalosMachine, TalosOperation,
};
use kube::ResourceExt as _;

/// Everything the pages read: the reflector caches' contents at one moment.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub clusters: Vec<Arc<TalosCluster>>,
    pub machines: Vec<Arc<TalosMachine>>,
    pub operations: Vec<Arc<TalosOperation>>,
    /// Absent when Ichor has not recorded its install (R4.3f: the UI works without it).
    pub installation: Option<Arc<IchorInstallation>>,
}

/// Where a user may read one kind of Ichor's objects: everywhere (a
/// cluster-wide `list` grant) or in some namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readable {
    Everywhere,
    In(BTreeSet<String>),
}

impl Default for Readable {
    /// Nowhere.
    fn default() -> Self {
        Readable::In(BTreeSet::new())
    }
}

impl Readable {
    /// Whether objects of namespace `ns` may be shown.
    pub fn allows(&self, ns: &str) -> bool {
        match self {
            Readable::Everywhere => true,
            Readable::In(set) => set.contains(ns),
        }
    }

    pub fn is_nowhere(&self) -> bool {
        matches!(self, Readable::In(set) if set.is_empty())
    }

    /// Adds namespace `ns` (a detail page whose one object the user may `get`).
    pub fn with(mut self, ns: &str) -> Readable {
        if let Readable::In(set) = &mut self {
            set.insert(ns.to_owned());
        }
        self
    }
}

/// What the signed-in user may read, each kind answered by SubjectAccessReviews
/// (`list` cluster-wide, else per namespace); every page shows only that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadGrants {
    pub clusters: Readable,
    pub machines: Readable,
    pub operations: Readable,
}

impl ReadGrants {
    /// Everything: the lab's anonymous view.
    pub fn everything() -> ReadGrants {
        ReadGrants {
            clusters: Readable::Everywhere,
            machines: Readable::Everywhere,
            operations: Readable::Everywhere,
        }
    }

    /// Whether the user may read no object of any of the three kinds.
    pub fn reads_nothing(&self) -> bool {
        self.clusters.is_nowhere() && self.machines.is_nowhere() && self.operations.is_nowhere()
    }
}

/// The part of `inv` that `grants` lets its user read. The IchorInstallation
/// (Ichor's version and how it is installed) is kept: it names no machine.
pub fn visible(inv: &Inventory, grants: &ReadGrants) -> Inventory {
    fn keep<K: kube::Resource>(items: &[Arc<K>], readable: &Readable) -> Vec<Arc<K>> {
        items
            .iter()
            .filter(|o| readable.allows(o.meta().namespace.as_deref().unwrap_or_default()))
            .cloned()
            .collect()
    }
    Inventory {
        clusters: keep(&inv.clusters, &grants.clusters),
        machines: keep(&inv.machines, &grants.machines),
        operations: keep(&inv.operations, &grants.operations),
        installation: inv.installation.clone(),
    }
}

/// The namespaces that hold objects of each kind, in that order: clusters,
/// machines, operations (the namespaces a user's read access is asked for).
pub fn namespaces(inv: &Inventory) -> [BTreeSet<String>; 3] {
    fn of<K: kube::Resource>(items: &[Arc<K>]) -> BTreeSet<String> {
        items
            .iter()
            .filter_map(|o| o.meta().namespace.clone())
            .collect()
    }
    [of(&inv.clusters), of(&inv.machines), of(&inv.operations)]
}

/// What the signed-in user may do where the page acts, each answered by a
/// SubjectAccessReview; all false in read-only mode, so no page carries an action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Permissions {
    /// `patch talosmachines`: release or take a hold.
    pub patch_machines: bool,
    /// `create talosoperations`: start an upgrade or a reboot.
    pub create_operations: bool,
    /// `patch talosoperations`: cancel an operation.
    pub patch_operations: bool,
    /// `delete talosmachines`: remove a machine (drained, out of etcd, its
    /// node reset).
    pub delete_machines: bool,
}

/// What one drift class means, in the words of ADR 0004.
pub fn class_meaning(class: DriftClass) -> &'static str {
    match class {
        DriftClass::A => "nothing to do: both values mean the same to Talos",
        DriftClass::B => {
            "Ichor applies it in no-reboot mode once the machine is not held: Talos applies the path live"
        }
        DriftClass::C => {
            "Ichor never applies it on its own: it needs a reboot, is destructive, belongs to an upgrade, or is unknown; one C entry blocks the automatic apply of the whole machine"
        }
    }
}

/// Every class with its meaning, for the legend of the machine page.
pub fn class_legend() -> Vec<(DriftClass, &'static str)> {
    [DriftClass::A, DriftClass::B, DriftClass::C]
        .into_iter()
        .map(|c| (c, class_meaning(c)))
        .collect()
}

/// The name of a class as the pages write it.
pub fn class_name(class: DriftClass) -> &'static str {
    match class {
        DriftClass::A => "A",
        DriftClass::B => "B",
        DriftClass::C => "C",
    }
}

fn role_name(role: MachineRole) -> &'static str {
    role.as_str()
}

fn is_running(op: &TalosOperation) -> bool {
    matches!(
        op.status.as_ref().and_then(|s| s.phase),
        Some(OperationPhase::Running | OperationPhase::Waiting | OperationPhase::Paused)
    )
}

fn is_finished(op: &TalosOperation) -> bool {
    matches!(
        op.status.as_ref().and_then(|s| s.phase),
        Some(OperationPhase::Succeeded | OperationPhase::Failed)
    )
}

fn machines_of<'a>(
    inv: &'a Inventory,
    namespace: &'a str,
    cluster: &'a str,
) -> impl Iterator<Item = &'a Arc<TalosMachine>> {
    inv.machines.iter().filter(move |m| {
        m.namespace().as_deref() == Some(namespace) && m.spec.cluster_ref.name == cluster
    })
}

fn operations_of<'a>(
    inv: &'a Inventory,
    namespace: &'a str,
    cluster: &'a str,
) -> impl Iterator<Item = &'a Arc<TalosOperation>> {
    inv.operations.iter().filter(move |o| {
        o.namespace().as_deref() == Some(namespace) && o.spec.target.cluster_ref.name == cluster
    })
}

fn machine_in_sync(m: &TalosMachine) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.drift.iter().all(|e| e.class == DriftClass::A) && s.config_hash.is_some()
    })
}

fn drift_entries(m: &TalosMachine) -> &[DriftEntry] {
    m.status
        .as_ref()
        .map(|s| s.drift.as_slice())
        .unwrap_or_default()
}

fn is_ready(m: &TalosMachine) -> bool {
    m.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
}

#[cfg(test)]
mod tests;
