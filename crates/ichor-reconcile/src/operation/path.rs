//! Talos upgrade paths: which releases a machine has to pass through to
//! reach a target Talos cannot install over its version in one step, from
//! Talos's own compatibility rules ([`releases::RELEASES`], refreshed by
//! `tools/talos-releases.sh`). Each hop goes to the newest patch of the
//! newest release line that accepts the version the machine runs then, and
//! the last hop is the target itself. A downgrade Talos refuses is refused
//! here, at plan time; downgrades are never chained.

pub mod releases;

use std::collections::BTreeMap;

use ichor_api::operation::{
    MachineProgress, MachineStep, PlanEntry, PlannedAction, TalosOperationSpec,
    TalosOperationStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::version;

/// (major, minor, patch) of a release, its pre-release ignored (Talos's
/// own check compares these).
pub type Core = (u64, u64, u64);

/// One Talos release line and its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// (major, minor).
    pub line: (u64, u64),
    /// The newest patch released on this line (the version a path passes
    /// through); `None` when the line has no release yet.
    pub newest: Option<&'static str>,
    /// The oldest Talos that upgrades to this line.
    pub upgrades_from: Core,
    /// A Talos at this version or newer cannot be downgraded to this line.
    pub downgrades_from_below: Core,
    /// Versions that may not upgrade to this line.
    pub denied: &'static [Core],
    /// The Kubernetes versions this line runs (inclusive).
    pub kubernetes: (Core, Core),
}

impl Release {
    /// Why Talos of this line refuses to be installed over `host`, or `None`.
    fn refuses(&self, host: Core) -> Option<String> {
        let line = words_line(self.line);
        if host < self.upgrades_from {
            return Some(format!(
                "Talos {line} upgrades only from v{} or newer",
                words_core(self.upgrades_from)
            ));
        }
        if host >= self.downgrades_from_below {
            return Some(format!(
                "Talos {line} can be installed only over a version older than v{}",
                words_core(self.downgrades_from_below)
            ));
        }
        if self.denied.contains(&host) {
            return Some(format!(
                "Talos {line} may not be installed over v{}",
                words_core(host)
            ));
        }
        None
    }
}

/// The release line `line` of the table, if it knows it.
pub fn release(line: (u64, u64)) -> Option<&'static Release> {
    releases::RELEASES.iter().find(|r| r.line == line)
}

/// Why no path leads from a machine's version to the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    /// A version that is no release version (`latest`, `v1.14`).
    #[error("{version:?} is not a Talos release version (vX.Y.Z)")]
    NotAVersion { version: String },
    /// A downgrade Talos refuses (downgrades are never chained).
    #[error(
        "Talos {to} cannot be installed over {from}: {why}; a downgrade that far is refused (Talos's own rule)"
    )]
    Downgrade {
        from: String,
        to: String,
        why: String,
    },
    /// An upgrade no release of the table can start.
    #[error(
        "no Talos release up to {to} upgrades {from} ({why}); upgrade it by hand to a release the table's oldest line accepts first"
    )]
    NoHop {
        from: String,
        to: String,
        why: String,
    },
    /// A line the path has to pass has no release yet.
    #[error(
        "upgrading {from} to {to} passes Talos {line}, which has no release in Ichor's table ({source_}); refresh it with tools/talos-releases.sh"
    )]
    NoRelease {
        from: String,
        to: String,
        line: String,
        source_: &'static str,
    },
}

/// The hops from `from` to `to`, the last one `to`; empty when `from` is
/// `to` already. A target line the table does not know is one hop (the
/// target's installer checks its own rules).
pub fn upgrade_path(from: &str, to: &str) -> Result<Vec<String>, PathRefused> {
    let not_a_version = |v: &str| PathRefused::NotAVersion {
        version: v.to_string(),
    };
    let host = version::release(from).ok_or_else(|| not_a_version(from))?;
    let target = version::release(to).ok_or_else(|| not_a_version(to))?;
    if from.trim_start_matches('v') == to.trim_start_matches('v') {
        return Ok(Vec::new());
    }
    let Some(target_release) = release((target.0, target.1)) else {
        return Ok(vec![to.to_string()]);
    };
    let Some(why) = target_release.refuses(host) else {
        return Ok(vec![to.to_string()]);
    };
    if host >= target {
        return Err(PathRefused::Downgrade {
            from: from.to_string(),
            to: to.to_string(),
            why,
        });
    }
    chain(from, to, target, host, why)
}

/// The hops of an upgrade that `to`'s line refuses from `host`: each to the
/// newest line below the target's that accepts the version reached so far.
fn chain(
    from: &str,
    to: &str,
    target: Core,
    host: Core,
    why_not_direct: String,
) -> Result<Vec<String>, PathRefused> {
    let mut hops = Vec::new();
    let mut at = host;
    loop {
        if let Some(r) = release((target.0, target.1))
            && r.refuses(at).is_none()
        {
            hops.push(to.to_string());
            return Ok(hops);
        }
        let next = releases::RELEASES
            .iter()
            .rev()
            .filter(|r| r.line < (target.0, target.1) && (r.line.0, r.line.1, u64::MAX) > at)
            .find(|r| r.refuses(at).is_none());
        let Some(next) = next else {
            return Err(PathRefused::NoHop {
                from: from.to_string(),
                to: to.to_string(),
                why: why_not_direct,
            });
        };
        let Some(newest) = next.newest else {
            return Err(PathRefused::NoRelease {
                from: from.to_string(),
                to: to.to_string(),
                line: words_line(next.line),
                source_: releases::SOURCE,
            });
        };
        let reached = version::release(newest).unwrap_or((next.line.0, next.line.1, 0));
        if reached <= at {
            return Err(PathRefused::NoHop {
                from: from.to_string(),
                to: to.to_string(),
                why: why_not_direct,
            });
        }
        hops.push(newest.to_string());
        at = reached;
    }
}

/// The hops of the whole operation, in order: every version some machine
/// passes through, oldest first (the machines move hop by hop together, so
/// no two control planes are ever more than one hop apart).
pub fn operation_hops<'a>(machines: impl IntoIterator<Item = &'a [String]>) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for hops in machines {
        for h in hops {
            if !all.contains(h) {
                all.push(h.clone());
            }
        }
    }
    all.sort_by_key(|h| version::release(h));
    all
}

/// A machine whose path is refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TalosMachine {machine}")]
pub struct MachinePathRefused {
    pub machine: String,
    #[source]
    pub source: PathRefused,
}

/// Each upgraded machine's hops to the target (`spec.version`), by name;
/// `versions` says what each machine runs (a machine whose version is not
/// known goes straight to the target: its installer checks Talos's rules).
pub fn machine_hops(
    target: &str,
    plan: &[PlanEntry],
    versions: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Vec<String>>, MachinePathRefused> {
    let mut hops = BTreeMap::new();
    for e in plan.iter().filter(|e| e.action == PlannedAction::Upgrade) {
        let path = match versions.get(&e.machine) {
            Some(running) => {
                upgrade_path(running, target).map_err(|source| MachinePathRefused {
                    machine: e.machine.clone(),
                    source,
                })?
            }
            None => vec![target.to_string()],
        };
        hops.insert(e.machine.clone(), path);
    }
    Ok(hops)
}

/// Writes each machine's hops into its progress and, when the operation
/// passes more than one release, starts the first hop
/// (`status.currentHop`): machines that do not pass it wait.
pub fn start_hops(
    status: &mut TalosOperationStatus,
    hops: &BTreeMap<String, Vec<String>>,
    now: &Time,
) {
    for p in &mut status.machines {
        if let Some(h) = hops.get(&p.machine) {
            p.hops = h.clone();
        }
    }
    let all = operation_hops(status.machines.iter().map(|p| p.hops.as_slice()));
    if all.len() > 1 {
        enter_hop(status, &all[0], now);
    }
}

/// The version the machines move to now: the current hop, else the
/// operation's target.
pub fn target_now<'a>(
    spec: &'a TalosOperationSpec,
    status: &'a TalosOperationStatus,
) -> Option<&'a str> {
    status.current_hop.as_deref().or(spec.version.as_deref())
}

/// The spec a machine's steps read for the current hop: its version, and
/// an installer image of `spec.installerImage`'s repository at that version.
pub fn hop_spec(spec: &TalosOperationSpec, status: &TalosOperationStatus) -> TalosOperationSpec {
    let mut hop = spec.clone();
    if let Some(current) = status.current_hop.as_deref()
        && spec.version.as_deref() != Some(current)
    {
        hop.installer_image = spec
            .installer_image
            .as_deref()
            .map(|image| super::installer_image(None, Some(image), current));
        hop.version = Some(current.to_string());
    }
    hop
}

/// `v1.13.9 → v1.14.0`: the operation's hops, when it has more than one.
pub fn hops_words(status: &TalosOperationStatus) -> Option<String> {
    let all = operation_hops(status.machines.iter().map(|p| p.hops.as_slice()));
    (all.len() > 1).then(|| all.join(" → "))
}

/// The hop after the current one, when the operation has one.
pub fn next_hop(status: &TalosOperationStatus) -> Option<String> {
    let current = status.current_hop.as_deref()?;
    let all = operation_hops(status.machines.iter().map(|p| p.hops.as_slice()));
    let at = all.iter().position(|h| h == current)?;
    all.get(at + 1).cloned()
}

/// Starts hop `hop`: the machines that pass it start again from Pending
/// (their time so far kept in `duration`); those that do not wait,
/// Skipped for this hop. Machines with no hops (skipped by the plan) are
/// left alone.
pub fn enter_hop(status: &mut TalosOperationStatus, hop: &str, now: &Time) {
    status.current_hop = Some(hop.to_string());
    status.pre_pull.clear();
    for p in status.machines.iter_mut().filter(|p| !p.hops.is_empty()) {
        if p.hops.iter().any(|h| h == hop) {
            *p = MachineProgress {
                machine: std::mem::take(&mut p.machine),
                node_name: p.node_name.take(),
                hops: std::mem::take(&mut p.hops),
                duration: p.duration.take(),
                message: Some(format!("waits for hop {hop}")),
                ..MachineProgress::default()
            };
        } else {
            p.step = MachineStep::Skipped;
            p.completion_time = Some(now.clone());
            p.message = Some(format!(
                "not on hop {hop} (its path: {})",
                p.hops.join(" → ")
            ));
        }
    }
}

/// `1.14` of (1, 14).
fn words_line(line: (u64, u64)) -> String {
    format!("{}.{}", line.0, line.1)
}

/// `1.12.0` of (1, 12, 0).
fn words_core(v: Core) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is Talos's own: 1.14 upgrades from 1.12.0, 1.13 from
    /// 1.11.0, 1.12 from 1.10.0 (pkg/machinery/compatibility/talos11{2,3,4}).
    #[test]
    fn the_table_holds_talos_rules() {
        let from = |line| release(line).expect("line in the table").upgrades_from;
        assert_eq!(from((1, 14)), (1, 12, 0));
        assert_eq!(from((1, 13)), (1, 11, 0));
        assert_eq!(from((1, 12)), (1, 10, 0));
        assert_eq!(release((1, 14)).unwrap().downgrades_from_below, (1, 16, 0));
        assert!(
            releases::RELEASES.windows(2).all(|w| w[0].line < w[1].line),
            "oldest first"
        );
    }

    /// A 1.11 lab to 1.14 passes the newest 1.13 (1.14 refuses 1.11; 1.13
    /// takes it); a 1.12 machine goes straight; a patch upgrade is one hop.
    /// Covers: R15.3
    #[test]
    fn a_path_through_the_releases_talos_needs() {
        let newest_113 = release((1, 13)).unwrap().newest.unwrap();
        assert_eq!(
            upgrade_path("v1.11.6", "v1.14.0").unwrap(),
            vec![newest_113.to_string(), "v1.14.0".to_string()]
        );
        assert_eq!(upgrade_path("v1.12.3", "v1.14.0").unwrap(), vec!["v1.14.0"]);
        assert_eq!(upgrade_path("v1.13.2", "v1.13.9").unwrap(), vec!["v1.13.9"]);
        assert!(upgrade_path("v1.14.0", "v1.14.0").unwrap().is_empty());
        // Two lines too old: 1.9 → newest 1.11 → newest 1.13 → target.
        let newest_111 = release((1, 11)).unwrap().newest.unwrap();
        assert_eq!(
            upgrade_path("v1.9.5", "v1.14.0").unwrap(),
            vec![newest_111, newest_113, "v1.14.0"]
        );
        // A pre-release target is compared by its release, as Talos does.
        assert_eq!(
            upgrade_path("v1.11.0", "v1.14.0-rc.1").unwrap(),
            vec![newest_113, "v1.14.0-rc.1"]
        );
    }

    /// A downgrade Talos refuses is refused at plan time, naming both
    /// versions and the rule; one Talos accepts is one hop.
    /// Covers: R15.3
    #[test]
    fn an_impossible_downgrade_is_refused() {
        let refused = upgrade_path("v1.14.0", "v1.12.11").expect_err("two lines down");
        assert!(
            matches!(&refused, PathRefused::Downgrade { from, to, .. } if from == "v1.14.0" && to == "v1.12.11"),
            "{refused:?}"
        );
        let words = refused.to_string();
        assert!(words.contains("older than v1.14.0"), "{words}");
        assert_eq!(upgrade_path("v1.14.0", "v1.13.9").unwrap(), vec!["v1.13.9"]);
    }

    /// Versions that are not release versions are refused, naming them; a
    /// line the table does not know is one hop.
    #[test]
    fn unreadable_and_unknown_versions() {
        assert_eq!(
            upgrade_path("latest", "v1.14.0"),
            Err(PathRefused::NotAVersion {
                version: "latest".into()
            })
        );
        assert_eq!(upgrade_path("v1.14.0", "v1.99.0").unwrap(), vec!["v1.99.0"]);
        assert!(matches!(
            upgrade_path("v0.14.0", "v1.14.0"),
            Err(PathRefused::NoHop { .. })
        ));
    }

    fn entry(machine: &str) -> PlanEntry {
        PlanEntry {
            machine: machine.into(),
            role: ichor_api::machine::MachineRole::Worker,
            batch: 0,
            action: PlannedAction::Upgrade,
            reason: None,
        }
    }

    /// A 1.11-shaped lab to 1.14: every machine's hops, the first hop
    /// started (machines already past it wait), then the next; the steps
    /// read the hop's version and installer image.
    /// Covers: R15.3
    #[test]
    fn hops_of_a_lab_step_by_step() {
        let newest_113 = release((1, 13)).unwrap().newest.unwrap();
        let plan = vec![entry("cp-1"), entry("w-1")];
        let versions: BTreeMap<String, String> = [
            ("cp-1".to_string(), "v1.11.6".to_string()),
            ("w-1".to_string(), newest_113.to_string()),
        ]
        .into();
        let hops = machine_hops("v1.14.0", &plan, &versions).unwrap();
        assert_eq!(hops["cp-1"], vec![newest_113, "v1.14.0"]);
        assert_eq!(hops["w-1"], vec!["v1.14.0"]);
        let mut status = TalosOperationStatus {
            machines: super::super::initial_progress(&plan, &Time(Default::default())),
            ..Default::default()
        };
        start_hops(&mut status, &hops, &Time(Default::default()));
        assert_eq!(status.current_hop.as_deref(), Some(newest_113));
        let steps: Vec<MachineStep> = status.machines.iter().map(|p| p.step).collect();
        assert_eq!(steps, vec![MachineStep::Pending, MachineStep::Skipped]);
        let spec = TalosOperationSpec {
            version: Some("v1.14.0".into()),
            installer_image: Some("ghcr.io/siderolabs/installer:v1.14.0".into()),
            ..serde_json::from_value(serde_json::json!({
                "kind": "talos-upgrade", "target": {"clusterRef": {"name": "lab"}}
            }))
            .unwrap()
        };
        let hop = hop_spec(&spec, &status);
        assert_eq!(hop.version.as_deref(), Some(newest_113));
        assert_eq!(
            hop.installer_image,
            Some(format!("ghcr.io/siderolabs/installer:{newest_113}"))
        );
        status.machines[0].step = MachineStep::Succeeded;
        status.machines[0].duration = Some("5s".into());
        assert_eq!(next_hop(&status).as_deref(), Some("v1.14.0"));
        enter_hop(&mut status, "v1.14.0", &Time(Default::default()));
        assert!(
            status
                .machines
                .iter()
                .all(|p| p.step == MachineStep::Pending)
        );
        assert_eq!(status.machines[0].duration.as_deref(), Some("5s"));
        assert_eq!(hop_spec(&spec, &status), spec);
        assert_eq!(next_hop(&status), None);
        // A refused machine is named.
        let versions: BTreeMap<String, String> =
            [("w-1".to_string(), "v1.15.0".to_string())].into();
        let refused = machine_hops("v1.13.0", &plan, &versions).expect_err("downgrade");
        assert_eq!(refused.machine, "w-1");
    }

    /// The operation's hops: every version of every machine, in order.
    #[test]
    fn operation_hops_in_order() {
        let a = vec!["v1.13.9".to_string(), "v1.14.0".to_string()];
        let b = vec!["v1.14.0".to_string()];
        let c = vec![
            "v1.11.6".to_string(),
            "v1.13.9".to_string(),
            "v1.14.0".to_string(),
        ];
        assert_eq!(
            operation_hops([b.as_slice(), a.as_slice(), c.as_slice()]),
            vec!["v1.11.6", "v1.13.9", "v1.14.0"]
        );
    }
}
