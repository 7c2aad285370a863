//! `ichor reclaim`'s decisions: the way out without lock-in (R10.5). From
//! what the inspection read, the plan says what reclaim will write to disk,
//! delete and hand back, or why it refuses, before consent and without I/O.
//!
//! Reclaim never writes to a node: the machines are held before they are
//! deleted so the controller applies nothing meanwhile, their membership
//! finalizer is dropped first (no removal runs when they go), and what
//! Ichor holds for talosctl (the secrets bundle, a talosconfig) is written
//! to the output folder before anything is deleted.

use serde::Serialize;

use crate::classify::Refusal;
use crate::plan::IchorPresence;

/// The file of a cluster's secrets bundle in its folder (talosctl's name).
pub const BUNDLE_FILE: &str = "secrets.yaml";
/// The file of the talosconfig reclaim mints from the bundle.
pub const TALOSCONFIG_FILE: &str = "talosconfig";
/// The file of the TalosCluster and TalosMachines as they were (no secret:
/// they name the bundle Secret, they do not hold it).
pub const OBJECTS_FILE: &str = "ichor-objects.yaml";

/// One TalosMachine as reclaim read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FoundMachine {
    pub name: String,
    pub role: String,
    pub address: String,
    /// `spec.hold`.
    pub held: bool,
}

/// One TalosCluster and its machines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FoundCluster {
    pub namespace: String,
    pub name: String,
    /// The bundle Secret `spec.secretsRef` names.
    pub secret: String,
    pub machines: Vec<FoundMachine>,
}

/// One TalosOperation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FoundOperation {
    pub namespace: String,
    pub name: String,
    /// Pending, Running, Succeeded or Failed.
    pub phase: String,
}

impl FoundOperation {
    /// Succeeded or Failed: the controller writes nothing more for it.
    pub fn finished(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// One revision of the Helm release `cilium`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FoundRecord {
    pub revision: u32,
    pub status: String,
}

/// Everything reclaim read; nothing here was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimInspection {
    pub clusters: Vec<FoundCluster>,
    pub operations: Vec<FoundOperation>,
    pub ichor: IchorPresence,
    /// Cilium's records in Ichor's namespace (`ichor-system`).
    pub cilium_records: Vec<FoundRecord>,
    /// Cilium's records in `kube-system` (a plain Helm release, or the copies
    /// an interrupted reclaim made).
    pub handed_back_records: Vec<FoundRecord>,
    /// Ichor's CRDs that exist.
    pub crds: Vec<String>,
}

/// What the operator asked reclaim for.
#[derive(Debug, Clone, Default)]
pub struct ReclaimRequest {
    /// `--output-dir`.
    pub output_dir: String,
    /// `--keep-cilium-record`.
    pub keep_cilium_record: bool,
    /// `--delete-crds`.
    pub delete_crds: bool,
}

/// A cluster's files and objects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReclaim {
    pub namespace: String,
    pub name: String,
    /// The folder its bundle and talosconfig go to.
    pub dir: String,
    pub secret: String,
    pub machines: Vec<FoundMachine>,
}

/// What happens to Cilium's Helm release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "action",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum CiliumChoice {
    /// No record of Ichor's: nothing to hand back.
    NoRecord,
    /// The records move to kube-system (revisions still in ichor-system).
    HandBack { revisions: Vec<u32> },
    /// `--keep-cilium-record`: the records stay in ichor-system.
    Keep { revisions: Vec<u32> },
}

/// What happens to Ichor itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "action",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum IchorChoice {
    /// Not installed (or already uninstalled).
    Absent,
    /// The install-manifest path: reclaim deletes what `ichor adopt` applied.
    Uninstall {
        version: Option<String>,
        /// Whether the namespace goes too (it holds Cilium's records with
        /// `--keep-cilium-record`).
        delete_namespace: bool,
    },
    /// Helm's: the operator runs `command`.
    Helm {
        release: String,
        namespace: String,
        command: String,
    },
}

/// What happens to Ichor's CRDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "action",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum CrdChoice {
    Keep {
        crds: Vec<String>,
    },
    Delete {
        crds: Vec<String>,
    },
    /// Helm's chart keeps them on uninstall; the operator deletes them after.
    DeleteAfterHelm {
        crds: Vec<String>,
        command: String,
    },
}

/// What reclaim will do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimPlan {
    pub output_dir: String,
    pub clusters: Vec<ClusterReclaim>,
    /// Finished TalosOperations, deleted.
    pub operations: Vec<String>,
    pub cilium: CiliumChoice,
    /// Revisions already in kube-system.
    pub handed_back: Vec<u32>,
    pub ichor: IchorChoice,
    pub crds: CrdChoice,
}

/// The inspection and the request → the plan, or every reason reclaim
/// refuses (all at once, with nothing written).
pub fn plan(
    found: &ReclaimInspection,
    request: &ReclaimRequest,
) -> Result<ReclaimPlan, Vec<Refusal>> {
    let refusals = refusals(found, request);
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let cilium = cilium_choice(found, request);
    let ichor = ichor_choice(&found.ichor, &cilium);
    let crds = crd_choice(&found.crds, &ichor, request.delete_crds);
    Ok(ReclaimPlan {
        output_dir: request.output_dir.clone(),
        clusters: found
            .clusters
            .iter()
            .map(|c| ClusterReclaim {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                dir: cluster_dir(&request.output_dir, &c.name),
                secret: c.secret.clone(),
                machines: c.machines.clone(),
            })
            .collect(),
        operations: found
            .operations
            .iter()
            .map(|o| format!("{}/{}", o.namespace, o.name))
            .collect(),
        cilium,
        handed_back: found
            .handed_back_records
            .iter()
            .map(|r| r.revision)
            .collect(),
        ichor,
        crds,
    })
}

/// Every reason to refuse: an unfinished TalosOperation, a Cilium release
/// in the middle of an operation, two TalosClusters that would share a folder.
fn refusals(found: &ReclaimInspection, request: &ReclaimRequest) -> Vec<Refusal> {
    let mut refusals: Vec<Refusal> = found
        .operations
        .iter()
        .filter(|o| !o.finished())
        .map(|o| {
            Refusal::new(format!(
                "TalosOperation {}/{} is {}: the controller may still write to a node for it. Wait until it finishes, or cancel it with ichor operation cancel {} -n {}, then run ichor reclaim again",
                o.namespace, o.name, o.phase, o.name, o.namespace
            ))
        })
        .collect();
    if let Some(pending) = found
        .cilium_records
        .iter()
        .chain(&found.handed_back_records)
        .find(|r| r.status.starts_with("pending-"))
    {
        refusals.push(Refusal::new(format!(
            "Cilium's Helm release cilium is {} (revision {}): an operation on it is under way or was interrupted. Wait for it to finish (an interrupted ichor adopt finishes it when run again), then run ichor reclaim again",
            pending.status, pending.revision
        )));
    }
    let mut seen: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for c in &found.clusters {
        if let Some(first) = seen.insert(c.name.as_str(), c.namespace.as_str()) {
            refusals.push(Refusal::new(format!(
                "two TalosClusters are named {} (in {first} and {}): their files would share the folder {}. Write one cluster's bundle out yourself (its Secret {}) and delete that TalosCluster, then run ichor reclaim again",
                c.name,
                c.namespace,
                cluster_dir(&request.output_dir, &c.name),
                c.secret
            )));
        }
    }
    refusals
}

fn cilium_choice(found: &ReclaimInspection, request: &ReclaimRequest) -> CiliumChoice {
    let revisions: Vec<u32> = found.cilium_records.iter().map(|r| r.revision).collect();
    match (revisions.is_empty(), request.keep_cilium_record) {
        (true, _) => CiliumChoice::NoRecord,
        (false, true) => CiliumChoice::Keep { revisions },
        (false, false) => CiliumChoice::HandBack { revisions },
    }
}

/// The namespace goes with Ichor unless it keeps Cilium's records.
fn ichor_choice(ichor: &IchorPresence, cilium: &CiliumChoice) -> IchorChoice {
    let keeps_records_in_ichor_namespace = matches!(cilium, CiliumChoice::Keep { .. });
    match ichor {
        IchorPresence::Absent => IchorChoice::Absent,
        IchorPresence::Installer { version } => IchorChoice::Uninstall {
            version: version.clone(),
            delete_namespace: !keeps_records_in_ichor_namespace,
        },
        IchorPresence::Helm {
            release, namespace, ..
        } => IchorChoice::Helm {
            release: release.clone(),
            namespace: namespace.clone(),
            command: helm_uninstall_command(release, namespace),
        },
    }
}

fn crd_choice(crds: &[String], ichor: &IchorChoice, delete_crds: bool) -> CrdChoice {
    match (ichor, delete_crds) {
        (_, false) => CrdChoice::Keep {
            crds: crds.to_vec(),
        },
        (IchorChoice::Helm { .. }, true) => CrdChoice::DeleteAfterHelm {
            crds: crds.to_vec(),
            command: format!("kubectl delete crd {}", crds.join(" ")),
        },
        (_, true) => CrdChoice::Delete {
            crds: crds.to_vec(),
        },
    }
}

/// The folder of `cluster`'s files under `output_dir`.
pub fn cluster_dir(output_dir: &str, cluster: &str) -> String {
    format!("{}/{cluster}", output_dir.trim_end_matches('/'))
}

/// The command that uninstalls a Helm-installed Ichor (it keeps the CRDs
/// and does not touch Cilium, R4.6b).
pub fn helm_uninstall_command(release: &str, namespace: &str) -> String {
    format!("helm uninstall {release} --namespace {namespace}")
}

impl ReclaimPlan {
    /// Nothing of Ichor is left: no cluster, no operation, no record, no Ichor,
    /// and no CRD to delete.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
            && self.operations.is_empty()
            && !matches!(self.cilium, CiliumChoice::HandBack { .. })
            && self.ichor == IchorChoice::Absent
            && match &self.crds {
                CrdChoice::Delete { crds } => crds.is_empty(),
                _ => true,
            }
    }

    /// The plan as printed before consent.
    pub fn text(&self) -> String {
        let mut out = vec![
            "Ichor will leave this cluster; no node is written to (their configs stay as they are)"
                .to_string(),
        ];
        for c in &self.clusters {
            out.push(format!(
                "TalosCluster {}/{}: its secrets bundle (Secret {}) and an admin talosconfig are written to {}/ (mode 0600), with the objects as they were",
                c.namespace, c.name, c.secret, c.dir
            ));
            for m in &c.machines {
                out.push(format!(
                    "TalosMachine {} ({}, {}): held, then deleted",
                    m.name, m.role, m.address
                ));
            }
            out.push(format!(
                "TalosCluster {}/{} and Secret {} are deleted (no finalizer: nothing runs on a node)",
                c.namespace, c.name, c.secret
            ));
        }
        if !self.operations.is_empty() {
            out.push(format!(
                "finished TalosOperations are deleted: {}",
                self.operations.join(", ")
            ));
        }
        out.push(match &self.cilium {
            CiliumChoice::NoRecord if self.handed_back.is_empty() => {
                "Cilium: Ichor holds no Helm record of it; left as it is".to_string()
            }
            CiliumChoice::NoRecord => {
                "Cilium is a plain Helm release already: helm -n kube-system manages it".to_string()
            }
            CiliumChoice::HandBack { revisions } => format!(
                "Cilium is handed back as a plain Helm release: the records of release cilium ({}) move from ichor-system to kube-system, so helm -n kube-system list and upgrade manage it; the Cilium pods are not restarted",
                join_revisions(revisions)
            ),
            CiliumChoice::Keep { revisions } => format!(
                "Cilium's records ({}) stay in ichor-system (--keep-cilium-record): manage it with helm -n ichor-system",
                join_revisions(revisions)
            ),
        });
        out.push(match &self.ichor {
            IchorChoice::Absent => "Ichor is not installed: nothing to uninstall".to_string(),
            IchorChoice::Uninstall {
                version,
                delete_namespace,
            } => format!(
                "Ichor {} (installed by ichor adopt) is uninstalled: its controller, webhooks, RBAC and IchorInstallation{}",
                version.as_deref().unwrap_or("(version unknown)"),
                if *delete_namespace {
                    ", then the namespace ichor-system"
                } else {
                    "; the namespace ichor-system stays, it holds Cilium's records"
                }
            ),
            IchorChoice::Helm {
                release,
                namespace,
                command,
            } => format!(
                "Ichor is installed by Helm (release {release} in {namespace}): not touching it; uninstall it yourself afterwards with: {command}"
            ),
        });
        out.push(match &self.crds {
            CrdChoice::Keep { crds } if crds.is_empty() => "no Ichor CRD is left".to_string(),
            CrdChoice::Keep { crds } => format!(
                "Ichor's CRDs are kept ({}); --delete-crds removes them",
                crds.join(", ")
            ),
            CrdChoice::Delete { crds } => format!("Ichor's CRDs are deleted: {}", crds.join(", ")),
            CrdChoice::DeleteAfterHelm { command, .. } => format!(
                "Ichor's CRDs belong to its Helm chart, which keeps them on uninstall: after helm uninstall, delete them with: {command}"
            ),
        });
        out.join("\n")
    }
}

/// "revision 2", "revisions 1, 2".
pub fn join_revisions(revisions: &[u32]) -> String {
    let list = revisions
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if revisions.len() == 1 {
        format!("revision {list}")
    } else {
        format!("revisions {list}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(name: &str, role: &str, address: &str) -> FoundMachine {
        FoundMachine {
            name: name.into(),
            role: role.into(),
            address: address.into(),
            held: false,
        }
    }

    fn adopted() -> ReclaimInspection {
        ReclaimInspection {
            clusters: vec![FoundCluster {
                namespace: "ichor-system".into(),
                name: "lab".into(),
                secret: "lab-talos-secrets".into(),
                machines: vec![
                    machine("lab-cp-1", "controlplane", "10.5.0.2"),
                    machine("lab-w-1", "worker", "10.5.0.3"),
                ],
            }],
            operations: vec![FoundOperation {
                namespace: "ichor-system".into(),
                name: "reboot-x".into(),
                phase: "Succeeded".into(),
            }],
            ichor: IchorPresence::Installer {
                version: Some("v0.1.0".into()),
            },
            cilium_records: vec![
                FoundRecord {
                    revision: 1,
                    status: "superseded".into(),
                },
                FoundRecord {
                    revision: 2,
                    status: "deployed".into(),
                },
            ],
            handed_back_records: vec![],
            crds: vec![
                "ichorinstallations.ichor.maesh.dev".into(),
                "talosclusters.ichor.maesh.dev".into(),
            ],
        }
    }

    fn request() -> ReclaimRequest {
        ReclaimRequest {
            output_dir: "./reclaimed".into(),
            ..ReclaimRequest::default()
        }
    }

    /// The plan as the user reads it before consent, and as `-o json` and
    /// `-o yaml` print it: a change to either shows in review as a diff.
    /// Covers: R10.5
    #[test]
    fn the_plan_text_and_json_snapshots() {
        let p = plan(&adopted(), &request()).unwrap();
        insta::assert_snapshot!("reclaim-plan-text", p.text());
        insta::assert_snapshot!(
            "reclaim-plan-json",
            serde_json::to_string_pretty(&p).unwrap()
        );
        insta::assert_snapshot!("reclaim-plan-yaml", serde_yaml_ng::to_string(&p).unwrap());
    }

    /// Covers: R10.5
    #[test]
    fn cilium_is_handed_back_unless_the_record_is_kept_and_then_the_namespace_stays() {
        let p = plan(&adopted(), &request()).unwrap();
        assert_eq!(
            p.cilium,
            CiliumChoice::HandBack {
                revisions: vec![1, 2]
            }
        );
        assert_eq!(
            p.ichor,
            IchorChoice::Uninstall {
                version: Some("v0.1.0".into()),
                delete_namespace: true
            }
        );
        let kept = plan(
            &adopted(),
            &ReclaimRequest {
                keep_cilium_record: true,
                ..request()
            },
        )
        .unwrap();
        assert_eq!(
            kept.cilium,
            CiliumChoice::Keep {
                revisions: vec![1, 2]
            }
        );
        assert!(matches!(
            kept.ichor,
            IchorChoice::Uninstall {
                delete_namespace: false,
                ..
            }
        ));
        assert!(kept.text().contains("manage it with helm -n ichor-system"));
    }

    /// Covers: R10.5, R4.6b
    #[test]
    fn a_helm_installed_ichor_is_left_to_helm_with_the_exact_command() {
        let mut found = adopted();
        found.ichor = IchorPresence::Helm {
            release: "ichor".into(),
            namespace: "ichor-system".into(),
            version: "v0.1.0".into(),
        };
        let p = plan(
            &found,
            &ReclaimRequest {
                delete_crds: true,
                ..request()
            },
        )
        .unwrap();
        assert_eq!(
            p.ichor,
            IchorChoice::Helm {
                release: "ichor".into(),
                namespace: "ichor-system".into(),
                command: "helm uninstall ichor --namespace ichor-system".into()
            }
        );
        assert!(matches!(p.crds, CrdChoice::DeleteAfterHelm { .. }));
        insta::assert_snapshot!("reclaim-plan-helm-text", p.text());
    }

    /// Covers: R10.5
    #[test]
    fn crds_are_kept_by_default_and_deleted_when_asked() {
        assert!(matches!(
            plan(&adopted(), &request()).unwrap().crds,
            CrdChoice::Keep { .. }
        ));
        let p = plan(
            &adopted(),
            &ReclaimRequest {
                delete_crds: true,
                ..request()
            },
        )
        .unwrap();
        assert_eq!(
            p.crds,
            CrdChoice::Delete {
                crds: adopted().crds
            }
        );
    }

    #[test]
    fn an_unfinished_operation_or_a_pending_record_is_refused_all_at_once() {
        let mut found = adopted();
        found.operations.push(FoundOperation {
            namespace: "ichor-system".into(),
            name: "upgrade-talos".into(),
            phase: "Running".into(),
        });
        found.cilium_records[1].status = "pending-upgrade".into();
        let refusals = plan(&found, &request()).unwrap_err();
        assert_eq!(refusals.len(), 2, "{refusals:?}");
        assert!(refusals[0].message.contains(
            "TalosOperation ichor-system/upgrade-talos is Running: the controller may still write to a node for it"
        ));
        assert!(
            refusals[0]
                .message
                .contains("ichor operation cancel upgrade-talos -n ichor-system")
        );
        assert!(
            refusals[1]
                .message
                .contains("cilium is pending-upgrade (revision 2)")
        );
    }

    #[test]
    fn a_finished_reclaim_leaves_nothing_to_do() {
        let found = ReclaimInspection {
            clusters: vec![],
            operations: vec![],
            ichor: IchorPresence::Absent,
            cilium_records: vec![],
            handed_back_records: vec![FoundRecord {
                revision: 2,
                status: "deployed".into(),
            }],
            crds: adopted().crds,
        };
        let p = plan(&found, &request()).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert!(
            p.text()
                .contains("Cilium is a plain Helm release already: helm -n kube-system manages it")
        );
        let delete = plan(
            &found,
            &ReclaimRequest {
                delete_crds: true,
                ..request()
            },
        )
        .unwrap();
        assert!(!delete.is_empty(), "CRDs left to delete");
    }
}
