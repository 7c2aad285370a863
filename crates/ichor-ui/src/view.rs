//! The pages' data, built from the API objects by pure functions (no I/O):
//! what each page shows is decided here and tested here; [`crate::html`]
//! only lays it out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ichor_api::conditions::{self, reasons, types};
use ichor_api::{
    DriftClass, DriftEntry, IchorInstallation, MachineRole, Manager, OperationPhase, TalosCluster,
    TalosMachine, TalosOperation,
};
use ichor_render::path::{ConfigPath, Segment};
use ichor_render::redact::{Redactor, digest};
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

// ---------------------------------------------------------------- Ichor

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

// ---------------------------------------------------------------- clusters

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

fn is_running(op: &TalosOperation) -> bool {
    matches!(
        op.status.as_ref().and_then(|s| s.phase),
        Some(OperationPhase::Running)
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

// ---------------------------------------------------------------- cluster

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

fn is_ready(m: &TalosMachine) -> bool {
    m.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
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

// ---------------------------------------------------------------- machines

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

fn drift_entries(m: &TalosMachine) -> &[DriftEntry] {
    m.status
        .as_ref()
        .map(|s| s.drift.as_slice())
        .unwrap_or_default()
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

// ---------------------------------------------------------------- machine

/// One drift entry as shown: values that may not be shown are digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftRow {
    pub path: String,
    pub class: DriftClass,
    pub live: Option<String>,
    pub desired: Option<String>,
    pub reason: Option<String>,
}

/// How releasing the hold would apply the desired config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Class B and no C: applied in no-reboot mode.
    NoReboot,
    /// A class C entry blocks the automatic apply: nothing is written.
    BlockedByClassC,
    /// Nothing (B or C) differs: nothing is written.
    NothingToApply,
}

/// What releasing the hold would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasePreview {
    /// The paths Ichor would write (class B), when the apply is not blocked.
    pub applies: Vec<String>,
    pub mode: ApplyMode,
    /// Whether the node reboots: never for a drift apply (reboots belong to TalosOperations).
    pub reboots: bool,
    /// The class C paths that block the apply, with why.
    pub blocked_by: Vec<(String, String)>,
}

/// What releasing the hold of a machine with this drift would do.
pub fn release_preview(drift: &[DriftEntry]) -> ReleasePreview {
    let b: Vec<String> = drift
        .iter()
        .filter(|e| e.class == DriftClass::B)
        .map(|e| e.path.clone())
        .collect();
    let blocked_by: Vec<(String, String)> = drift
        .iter()
        .filter(|e| e.class == DriftClass::C)
        .map(|e| {
            (
                e.path.clone(),
                e.reason.clone().unwrap_or_else(|| "unknown".into()),
            )
        })
        .collect();
    let mode = if !blocked_by.is_empty() {
        ApplyMode::BlockedByClassC
    } else if b.is_empty() {
        ApplyMode::NothingToApply
    } else {
        ApplyMode::NoReboot
    };
    ReleasePreview {
        applies: if mode == ApplyMode::NoReboot {
            b
        } else {
            Vec::new()
        },
        mode,
        reboots: false,
        blocked_by,
    }
}

/// One condition as the machine page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRow {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// The machine page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePage {
    pub row: MachineRow,
    pub drift: Vec<DriftRow>,
    pub legend: Vec<(DriftClass, &'static str)>,
    /// While held: what releasing it would do.
    pub release: Option<ReleasePreview>,
    pub conditions: Vec<ConditionRow>,
    pub can_release: bool,
    pub can_take_hold: bool,
}

/// Reads a drift path in display syntax (`a.b[c]["d.e"]`) into a [`ConfigPath`].
pub fn parse_path(text: &str) -> ConfigPath {
    let mut segments = Vec::new();
    let mut chars = text.chars().peekable();
    let mut key = String::new();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !key.is_empty() {
                    segments.push(Segment::Key(std::mem::take(&mut key)));
                }
            }
            '[' => {
                if !key.is_empty() {
                    segments.push(Segment::Key(std::mem::take(&mut key)));
                }
                let quoted = chars.peek() == Some(&'"');
                if quoted {
                    chars.next();
                }
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if (quoted && c == '"') || (!quoted && c == ']') {
                        break;
                    }
                    inner.push(c);
                }
                if quoted {
                    // the closing bracket after the quote
                    chars.next();
                    segments.push(Segment::Key(inner));
                } else {
                    segments.push(Segment::Item(inner));
                }
            }
            c => key.push(c),
        }
    }
    if !key.is_empty() {
        segments.push(Segment::Key(key));
    }
    ConfigPath(segments)
}

/// A value as the UI may show it: as it is on a public path, else its
/// digest. The controller already redacts what it writes to status; this
/// is the second fence, so a value that reached status unredacted is still
/// not shown — one that only starts with `sha256:` included; a URL with
/// credentials is a digest on a public path too.
pub fn shown_value(path: &ConfigPath, value: &str) -> String {
    let public =
        Redactor::default().is_public(path) && !ichor_render::redact::carries_credentials(value);
    if public || ichor_render::redact::is_digest(value) {
        value.to_owned()
    } else {
        digest(value)
    }
}

/// The machine page of one machine; None when there is no such machine.
pub fn machine_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    perms: Permissions,
) -> Option<MachinePage> {
    let m = inv
        .machines
        .iter()
        .find(|m| m.namespace().as_deref() == Some(namespace) && m.name_any() == name)?;
    let drift = drift_entries(m);
    let rows = drift
        .iter()
        .map(|e| {
            let path = parse_path(&e.path);
            DriftRow {
                live: e.live.as_deref().map(|v| shown_value(&path, v)),
                desired: e.desired.as_deref().map(|v| shown_value(&path, v)),
                path: e.path.clone(),
                class: e.class,
                reason: e.reason.clone(),
            }
        })
        .collect();
    let conditions = m
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| ConditionRow {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(MachinePage {
        row: machine_row(m),
        drift: rows,
        legend: class_legend(),
        release: m.spec.hold.then(|| release_preview(drift)),
        conditions,
        can_release: m.spec.hold && perms.patch_machines,
        can_take_hold: !m.spec.hold && perms.patch_machines,
    })
}

// ---------------------------------------------------------------- operations

/// One operation in a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRow {
    pub namespace: String,
    pub name: String,
    pub kind: &'static str,
    pub cluster: String,
    pub version: Option<String>,
    /// Pending, Running, Succeeded or Failed.
    pub phase: &'static str,
    pub message: Option<String>,
    /// Machines finished, of machines planned (skips count as finished).
    pub done: (usize, usize),
    /// When it was created (RFC 3339), for the order.
    pub created: String,
}

fn phase_name(op: &TalosOperation) -> &'static str {
    match op.status.as_ref().and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => "Pending",
        Some(OperationPhase::Running) => "Running",
        Some(OperationPhase::Succeeded) => "Succeeded",
        Some(OperationPhase::Failed) => "Failed",
    }
}

/// The row of one operation.
pub fn operation_row(op: &TalosOperation) -> OperationRow {
    let status = op.status.clone().unwrap_or_default();
    OperationRow {
        namespace: op.namespace().unwrap_or_default(),
        name: op.name_any(),
        kind: op.spec.kind.as_str(),
        cluster: op.spec.target.cluster_ref.name.clone(),
        version: op.spec.version.clone(),
        phase: phase_name(op),
        message: status.message.clone(),
        done: (
            status
                .machines
                .iter()
                .filter(|m| m.step.is_terminal())
                .count(),
            status.plan.len(),
        ),
        created: op
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    }
}

fn sort_operations(rows: &mut [OperationRow]) {
    rows.sort_by(|a, b| {
        b.created
            .cmp(&a.created)
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
}

/// The operations page: every operation, newest first.
pub fn operations_page(inv: &Inventory) -> Vec<OperationRow> {
    let mut rows: Vec<OperationRow> = inv.operations.iter().map(|o| operation_row(o)).collect();
    sort_operations(&mut rows);
    rows
}

/// One machine of an operation: its plan entry and its progress, named by
/// the TalosMachine and its Node alike (one name per machine everywhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRow {
    pub machine: String,
    /// The Kubernetes Node, once the controller has recorded it.
    pub node: Option<String>,
    pub role: &'static str,
    pub batch: u32,
    /// upgrade, reboot or skip.
    pub action: &'static str,
    /// Why it is skipped or placed where it is.
    pub reason: Option<String>,
    /// Pending, Draining, Rebooting, …, Succeeded.
    pub step: String,
    pub message: Option<String>,
    pub version_before: Option<String>,
    pub version_after: Option<String>,
}

/// The page of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationPage {
    pub row: OperationRow,
    pub progress: Vec<ProgressRow>,
    pub conditions: Vec<ConditionRow>,
    /// Cancel is offered while the operation has not finished and the user may patch it.
    pub can_cancel: bool,
    /// Whether a cancel was already asked for.
    pub cancel_requested: bool,
}

pub use ichor_api::CANCEL_ANNOTATION;

/// The page of one operation; None when there is no such operation.
pub fn operation_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    perms: Permissions,
) -> Option<OperationPage> {
    let op = inv
        .operations
        .iter()
        .find(|o| o.namespace().as_deref() == Some(namespace) && o.name_any() == name)?;
    let status = op.status.clone().unwrap_or_default();
    let progress_of: BTreeMap<&str, &ichor_api::MachineProgress> = status
        .machines
        .iter()
        .map(|p| (p.machine.as_str(), p))
        .collect();
    let progress = status
        .plan
        .iter()
        .map(|e| {
            let p = progress_of.get(e.machine.as_str());
            ProgressRow {
                machine: e.machine.clone(),
                node: p.and_then(|p| p.node_name.clone()),
                role: role_name(e.role),
                batch: e.batch,
                action: match e.action {
                    ichor_api::PlannedAction::Upgrade => "upgrade",
                    ichor_api::PlannedAction::Reboot => "reboot",
                    ichor_api::PlannedAction::Skip => "skip",
                },
                reason: e.reason.clone(),
                step: p
                    .map(|p| format!("{:?}", p.step))
                    .unwrap_or_else(|| "Pending".into()),
                message: p.and_then(|p| p.message.clone()),
                version_before: p.and_then(|p| p.version_before.clone()),
                version_after: p.and_then(|p| p.version_after.clone()),
            }
        })
        .collect();
    let cancel_requested = op.annotations().contains_key(CANCEL_ANNOTATION);
    Some(OperationPage {
        row: operation_row(op),
        progress,
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionRow {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
        can_cancel: perms.patch_operations && !is_finished(op) && !cancel_requested,
        cancel_requested,
    })
}

/// Whether the operation was cancelled (its Complete condition says so).
pub fn was_cancelled(op: &TalosOperation) -> bool {
    op.status.as_ref().is_some_and(|s| {
        conditions::find(&s.conditions, types::COMPLETE)
            .is_some_and(|c| c.reason == reasons::CANCELLED)
    })
}

#[cfg(test)]
mod tests;
