//! What `ichor machine add|remove|replace` decides before it writes
//! anything, without I/O: every refusal at once for the nodes to add, and
//! whether a machine may be removed now (quorum through
//! [`ichor_reconcile::membership::quorum::may_leave`], read from the
//! machines' status).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use ichor_api::endpoint::{Endpoint, TALOS_API_PORT};
use ichor_api::{MachineRole, MembershipPhase, TalosMachine, conditions};
use ichor_reconcile::membership::Member;
use ichor_reconcile::membership::quorum::{QuorumRefusal, may_leave};
use kube::ResourceExt as _;
use serde::Serialize;

/// What one address answered, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeReading {
    /// In maintenance mode: no config yet.
    Maintenance {
        hostname: String,
        talos_version: String,
    },
    /// It answers, but not as a node in maintenance mode.
    Configured { detail: String },
    /// Nothing answers there.
    Unreachable { error: String },
}

/// One address given and what it answered.
#[derive(Debug, Clone)]
pub struct Probe {
    pub address: String,
    pub reading: NodeReading,
}

/// Why a node cannot be added (every one is reported, then nothing is
/// written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddRefusal {
    BadAddress {
        address: String,
        problem: String,
    },
    GivenTwice {
        address: String,
    },
    Unreachable {
        address: String,
        error: String,
    },
    Configured {
        address: String,
        detail: String,
    },
    Version {
        address: String,
        version: String,
        cluster: String,
        runs: Vec<String>,
    },
    AlreadyAMachine {
        address: String,
        machine: String,
    },
    NameTaken {
        name: String,
        address: String,
    },
    NameTwice {
        name: String,
    },
    BadName {
        name: String,
    },
    NameCount {
        names: usize,
        addresses: usize,
    },
}

impl fmt::Display for AddRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddRefusal::BadAddress { address, problem } => {
                write!(f, "{address:?} is not a node address: {problem}")
            }
            AddRefusal::GivenTwice { address } => write!(f, "node {address} is given twice"),
            AddRefusal::Unreachable { address, error } => {
                write!(f, "node {address} is unreachable: {error}")
            }
            AddRefusal::Configured { address, detail } => write!(
                f,
                "node {address} is not in maintenance mode ({detail}): it is configured already; reset it to maintenance mode first"
            ),
            AddRefusal::Version {
                address,
                version,
                cluster,
                runs,
            } => write!(
                f,
                "node {address} runs Talos {version}, which cluster {cluster} does not run ({}): boot it from an image of one of those",
                runs.join(", ")
            ),
            AddRefusal::AlreadyAMachine { address, machine } => write!(
                f,
                "node {address} is already a member: TalosMachine {machine} has that address"
            ),
            AddRefusal::NameTaken { name, address } => write!(
                f,
                "the name {name} (for node {address}) is taken: a TalosMachine of that name exists; give another with --name"
            ),
            AddRefusal::NameTwice { name } => {
                write!(f, "the name {name} would be given to two nodes")
            }
            AddRefusal::BadName { name } => write!(
                f,
                "{name:?} cannot name a TalosMachine: lower-case letters, digits, '-' and '.', at most 253"
            ),
            AddRefusal::NameCount { names, addresses } => write!(
                f,
                "{names} --name for {addresses} addresses: give one --name per address, in order, or none"
            ),
        }
    }
}

/// One machine the plan creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMachine {
    pub name: String,
    pub address: String,
    pub role: MachineRole,
    pub talos_version: String,
    pub hold: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// What `add` is asked for, beside the probes.
#[derive(Debug, Clone)]
pub struct AddRequest<'a> {
    pub cluster: &'a str,
    pub role: MachineRole,
    pub names: &'a [String],
    pub hold: bool,
    pub replaces: Option<&'a str>,
    /// The Talos versions the cluster runs: its spec's and every machine's.
    pub cluster_versions: &'a BTreeSet<String>,
    /// Every TalosMachine of the namespace (names are per namespace).
    pub machines: &'a [TalosMachine],
}

/// The endpoint an address dials, for comparing addresses written in
/// different ways (`10.0.0.5` and `10.0.0.5:50000` are one node).
fn dialled(address: &str) -> Option<Endpoint> {
    Endpoint::parse(address, TALOS_API_PORT).ok()
}

/// A name Kubernetes takes for an object (an RFC 1123 subdomain).
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// What the plan checks each node against: the namespace's machines, and
/// what the nodes before it took.
struct Ledger {
    /// The first machine of an address names it (machines are listed by name).
    machine_addresses: HashMap<Endpoint, String>,
    machine_names: BTreeSet<String>,
    addresses_given: HashSet<Endpoint>,
    names_given: BTreeSet<String>,
}

impl Ledger {
    fn of(machines: &[TalosMachine]) -> Ledger {
        let mut machine_addresses = HashMap::new();
        for m in machines {
            if let Some(ep) = dialled(&m.spec.address) {
                machine_addresses.entry(ep).or_insert_with(|| m.name_any());
            }
        }
        Ledger {
            machine_addresses,
            machine_names: machines.iter().map(|m| m.name_any()).collect(),
            addresses_given: HashSet::new(),
            names_given: BTreeSet::new(),
        }
    }

    /// The address's refusals; `false` when nothing more about this node
    /// is worth saying (it is no address, or given already).
    fn address(&mut self, address: &str, refusals: &mut Vec<AddRefusal>) -> bool {
        let address = address.to_string();
        match Endpoint::parse(&address, TALOS_API_PORT) {
            Err(e) => {
                refusals.push(AddRefusal::BadAddress {
                    address,
                    problem: e.problem.to_string(),
                });
                false
            }
            Ok(ep) if !self.addresses_given.insert(ep.clone()) => {
                refusals.push(AddRefusal::GivenTwice { address });
                false
            }
            Ok(ep) => {
                if let Some(machine) = self.machine_addresses.get(&ep) {
                    refusals.push(AddRefusal::AlreadyAMachine {
                        address,
                        machine: machine.clone(),
                    });
                }
                true
            }
        }
    }

    /// The name's refusals; `false` when it cannot name a machine at all.
    fn name(&mut self, name: &str, address: &str, refusals: &mut Vec<AddRefusal>) -> bool {
        if !is_object_name(name) {
            refusals.push(AddRefusal::BadName { name: name.into() });
            return false;
        }
        if self.machine_names.contains(name) {
            refusals.push(AddRefusal::NameTaken {
                name: name.into(),
                address: address.into(),
            });
        } else if !self.names_given.insert(name.to_string()) {
            refusals.push(AddRefusal::NameTwice { name: name.into() });
        }
        true
    }
}

/// The node's hostname and Talos version when it is in maintenance mode;
/// else its refusal.
fn fresh(probe: &Probe) -> Result<(&str, &str), AddRefusal> {
    let address = probe.address.clone();
    match &probe.reading {
        NodeReading::Unreachable { error } => Err(AddRefusal::Unreachable {
            address,
            error: error.clone(),
        }),
        NodeReading::Configured { detail } => Err(AddRefusal::Configured {
            address,
            detail: detail.clone(),
        }),
        NodeReading::Maintenance {
            hostname,
            talos_version,
        } => Ok((hostname, talos_version)),
    }
}

/// The machines to create, or every reason not to.
pub fn plan_add(
    req: &AddRequest<'_>,
    probes: &[Probe],
) -> Result<Vec<PlannedMachine>, Vec<AddRefusal>> {
    let mut refusals = Vec::new();
    if !req.names.is_empty() && req.names.len() != probes.len() {
        refusals.push(AddRefusal::NameCount {
            names: req.names.len(),
            addresses: probes.len(),
        });
    }
    let mut ledger = Ledger::of(req.machines);
    let mut planned = Vec::new();
    for (i, probe) in probes.iter().enumerate() {
        if !ledger.address(&probe.address, &mut refusals) {
            continue;
        }
        let (hostname, version) = match fresh(probe) {
            Ok(found) => found,
            Err(r) => {
                refusals.push(r);
                continue;
            }
        };
        if !req.cluster_versions.contains(version) {
            refusals.push(AddRefusal::Version {
                address: probe.address.clone(),
                version: version.to_string(),
                cluster: req.cluster.to_string(),
                runs: req.cluster_versions.iter().cloned().collect(),
            });
        }
        let name = req.names.get(i).map_or(hostname, String::as_str);
        if !ledger.name(name, &probe.address, &mut refusals) {
            continue;
        }
        planned.push(PlannedMachine {
            name: name.to_string(),
            address: probe.address.clone(),
            role: req.role,
            talos_version: version.to_string(),
            hold: req.hold,
            replaces: req.replaces.map(str::to_string),
        });
    }
    if refusals.is_empty() {
        Ok(planned)
    } else {
        Err(refusals)
    }
}

/// The machine's membership phase, `Member` when the controller wrote none
/// (a machine adopted or created by init is a member from the start).
pub fn phase(m: &TalosMachine) -> MembershipPhase {
    m.status
        .as_ref()
        .and_then(|s| s.membership.as_ref())
        .map_or(MembershipPhase::Member, |ms| ms.phase)
}

/// Whether the machine's Ready condition is True.
pub fn is_ready(m: &TalosMachine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, conditions::types::READY))
        .is_some_and(|c| c.status == "True")
}

/// Whether the machine is on its way out: its removal began, or it is
/// being deleted.
pub fn is_leaving(m: &TalosMachine) -> bool {
    m.metadata.deletion_timestamp.is_some()
        || matches!(
            phase(m),
            MembershipPhase::Leaving | MembershipPhase::Removed
        )
}

/// etcd's members as the cluster's control-plane machines report them: a
/// Ready member counts as a healthy voter, a joining one as a learner, one
/// whose removal began as leaving. The CLI has no Talos credentials; the
/// controller checks again against etcd itself before anything leaves.
pub fn members(cluster: &str, machines: &[TalosMachine]) -> Vec<Member> {
    machines
        .iter()
        .filter(|m| m.spec.cluster_ref.name == cluster && m.spec.role == MachineRole::Controlplane)
        .enumerate()
        .map(|(i, m)| Member {
            id: i as u64 + 1,
            name: m.name_any(),
            is_learner: phase(m) == MembershipPhase::Joining,
            healthy: is_ready(m),
            leaving: is_leaving(m),
        })
        .collect()
}

/// Why a machine may not be removed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveRefusal {
    Quorum(QuorumRefusal),
    Unreachable {
        name: String,
        address: String,
        error: String,
    },
}

impl fmt::Display for RemoveRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoveRefusal::Quorum(q) => write!(f, "{q}: {}", q.help()),
            RemoveRefusal::Unreachable {
                name,
                address,
                error,
            } => write!(
                f,
                "the node of TalosMachine {name} ({address}) does not answer ({error}): pass --force to remove it anyway (its etcd member is then removed by id from another control plane, its Node deleted)"
            ),
        }
    }
}

/// Whether `target` may be removed now. `answer`: what dialling its node
/// gave (`Err` with why it did not answer).
pub fn check_remove(
    target: &TalosMachine,
    machines: &[TalosMachine],
    answer: Result<(), String>,
    force: bool,
) -> Result<(), RemoveRefusal> {
    let name = target.name_any();
    if let (Err(error), false) = (&answer, force) {
        return Err(RemoveRefusal::Unreachable {
            name,
            address: target.spec.address.clone(),
            error: error.clone(),
        });
    }
    if target.spec.role == MachineRole::Controlplane {
        let members = members(&target.spec.cluster_ref.name, machines);
        may_leave(&members, &name, answer.is_ok()).map_err(RemoveRefusal::Quorum)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
