//! `ichor machine history|diff|rollback`: a machine's revisions as its
//! status keeps them; the values and inputs of each from its history Secret
//! in Ichor's namespace, for those who may read it
//! (docs/guides/history.md).

use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow, bail};
use ichor_api::history::{MachineRevision, RevisionReason};
use ichor_api::{SYSTEM_NAMESPACE, TalosCluster, TalosMachine};
use ichor_reconcile::history::rollback::{self, ROLLBACK_OF_ANNOTATION, RollbackMark};
use ichor_reconcile::history::store::{self, RevisionRecord};
use k8s_openapi::ByteString;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;

use super::{consent, print_data, refused};
use crate::args::{MachineDiffArgs, MachineHistoryArgs, MachinePlace, MachineRollbackArgs};
use crate::{connect, printer};

/// A machine and the client that read it.
struct Target {
    client: kube::Client,
    machines: Api<TalosMachine>,
    machine: TalosMachine,
}

async fn target(place: &MachinePlace, name: &str) -> anyhow::Result<Target> {
    let client = connect::kube_client(place.kube.kubeconfig.as_deref()).await?;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), &place.namespace);
    let machine = machines
        .get_opt(name)
        .await
        .with_context(|| {
            format!(
                "cannot read TalosMachine {}/{name}: is Ichor installed, and may this kubeconfig read it?",
                place.namespace
            )
        })?
        .ok_or_else(|| anyhow!("there is no TalosMachine {}/{name}", place.namespace))?;
    Ok(Target {
        client,
        machines,
        machine,
    })
}

fn revisions(m: &TalosMachine) -> Vec<MachineRevision> {
    m.status
        .as_ref()
        .map(|s| s.revisions.clone())
        .unwrap_or_default()
}

/// A config hash as the table shows it: its first 12 hex digits.
fn short(hash: &str) -> String {
    hash.strip_prefix("sha256:")
        .unwrap_or(hash)
        .chars()
        .take(12)
        .collect()
}

fn reason(r: &MachineRevision) -> String {
    match (r.reason, &r.operation, r.rollback_of) {
        (RevisionReason::Operation, Some(op), _) => format!("Operation {op}"),
        (RevisionReason::Rollback, _, Some(of)) => format!("Rollback to {of}"),
        (reason, _, _) => format!("{reason:?}"),
    }
}

/// The revisions as a table, a header first.
fn history_table(revisions: &[MachineRevision]) -> Vec<String> {
    let mut cells = vec![
        [
            "REV", "TIME", "REASON", "BY", "MODE", "CONFIG", "PATHS", "OUTCOME",
        ]
        .map(str::to_string),
    ];
    for r in revisions {
        cells.push([
            r.number.to_string(),
            r.time.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            reason(r),
            r.changed_by
                .as_ref()
                .map_or_else(|| "-".to_string(), |b| b.user.clone()),
            format!("{:?}", r.apply_mode),
            format!(
                "{}→{}",
                r.config_hash_before.as_deref().map_or("-".into(), short),
                short(&r.config_hash_after)
            ),
            r.changed_paths.len().to_string(),
            format!("{:?}", r.outcome),
        ]);
    }
    crate::printer::columns(&cells)
}

pub async fn list(args: MachineHistoryArgs) -> anyhow::Result<()> {
    let t = target(&args.place, &args.name).await?;
    let revisions = revisions(&t.machine);
    match args.output {
        Some(format) => print_data(&revisions, format)?,
        None if revisions.is_empty() => printer::data(&format!(
            "TalosMachine {}/{} has no revision yet: Ichor has applied nothing to its node since it records them",
            args.place.namespace, args.name
        )),
        None => history_table(&revisions)
            .iter()
            .for_each(|l| printer::data(l)),
    }
    Ok(())
}

/// The machine's history Secret as this kubeconfig may see it.
enum History {
    /// Its data (empty when there is no Secret yet).
    Readable(BTreeMap<String, Vec<u8>>),
    /// This kubeconfig may not get it (namespace/name).
    NotAllowed(String),
}

/// The machine's history Secret, asked first with a SelfSubjectAccessReview
/// so that not being allowed is told apart from an error.
async fn history_secret(client: &kube::Client, machine: &TalosMachine) -> anyhow::Result<History> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = store::secret_name(&namespace, &machine.name_any());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(SYSTEM_NAMESPACE.to_string()),
                verb: Some("get".into()),
                resource: Some("secrets".into()),
                name: Some(name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .context("cannot ask the API server whether this kubeconfig may read Secrets")?;
    let where_ = format!("{SYSTEM_NAMESPACE}/{name}");
    if !answer.status.is_some_and(|s| s.allowed) {
        return Ok(History::NotAllowed(where_));
    }
    let secret = Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get_opt(&name)
        .await
        .with_context(|| format!("cannot read the history Secret {where_}"))?;
    Ok(History::Readable(
        secret
            .and_then(|s| s.data)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, ByteString(v))| (k, v))
            .collect(),
    ))
}

fn record(
    data: &BTreeMap<String, Vec<u8>>,
    number: u64,
    machine: &str,
) -> anyhow::Result<Option<RevisionRecord>> {
    store::find(data, number)
        .with_context(|| format!("cannot read revision {number} of TalosMachine {machine}"))
}

/// One changed path of a diff.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DiffRow {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<String>,
}

/// `ichor machine diff -o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DiffData {
    from: u64,
    to: u64,
    /// Whether the values are there (from the history Secret), or only the
    /// paths (from status).
    values: bool,
    redacted: bool,
    paths: Vec<DiffRow>,
}

/// The revisions a diff compares: `to` defaults to the latest kept, `from`
/// to the one kept before `to`.
fn range(
    kept: &[MachineRevision],
    from: Option<u64>,
    to: Option<u64>,
) -> anyhow::Result<(u64, u64)> {
    let numbers: Vec<u64> = kept.iter().map(|r| r.number).collect();
    let listed = || {
        numbers
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(&latest) = numbers.last() else {
        bail!("it has no revision yet");
    };
    let to = to.unwrap_or(latest);
    if !numbers.contains(&to) {
        bail!("its status keeps no revision {to} (kept: {})", listed());
    }
    let from = match from {
        Some(f) => f,
        None => *numbers.iter().rev().find(|n| **n < to).ok_or_else(|| {
            anyhow!("revision {to} is the first one kept: there is none before it to compare with")
        })?,
    };
    if !numbers.contains(&from) {
        bail!("its status keeps no revision {from} (kept: {})", listed());
    }
    if from == to {
        bail!("--from and --to are both revision {to}");
    }
    Ok((from, to))
}

/// The paths status records for the revisions after `from` up to `to`
/// (either way round), without values.
fn status_paths(kept: &[MachineRevision], from: u64, to: u64) -> Vec<DiffRow> {
    let (low, high) = (from.min(to), from.max(to));
    let paths: std::collections::BTreeSet<&String> = kept
        .iter()
        .filter(|r| r.number > low && r.number <= high)
        .flat_map(|r| &r.changed_paths)
        .collect();
    paths
        .into_iter()
        .map(|p| DiffRow {
            path: p.clone(),
            from: None,
            to: None,
        })
        .collect()
}

pub async fn diff(args: MachineDiffArgs) -> anyhow::Result<()> {
    let t = target(&args.place, &args.name).await?;
    let full = format!("{}/{}", args.place.namespace, args.name);
    let kept = revisions(&t.machine);
    let (from, to) = range(&kept, args.from, args.to)
        .with_context(|| format!("cannot compare revisions of TalosMachine {full}"))?;
    let secret = history_secret(&t.client, &t.machine).await?;
    let data = match secret {
        History::NotAllowed(secret) if args.show_secrets => bail!(
            "--show-secrets needs get on the history Secret {secret}, which this kubeconfig may not read; without it, diff shows the values redacted or the paths alone"
        ),
        History::NotAllowed(secret) => {
            printer::step(&format!(
                "paths only, from status: this kubeconfig may not read the history Secret {secret} that keeps the values"
            ));
            None
        }
        History::Readable(data) => Some(data),
    };
    let records = match &data {
        Some(data) => Some((record(data, from, &full)?, record(data, to, &full)?)),
        None => None,
    };
    let rows = match records {
        Some((Some(a), Some(b))) => {
            if args.show_secrets {
                printer::step("showing secret values");
            }
            let entries = ichor_reconcile::history::diff::diff(&a, &b, args.show_secrets)
                .with_context(|| format!("cannot compare revisions of TalosMachine {full}"))?;
            let rows = entries
                .into_iter()
                .map(|e| DiffRow {
                    path: e.path,
                    from: e.live,
                    to: e.desired,
                })
                .collect();
            Some(rows)
        }
        Some(_) if args.show_secrets => bail!(
            "the history Secret of TalosMachine {full} no longer keeps revision {from} or {to} (the oldest go first); --show-secrets has no values to show"
        ),
        Some(_) => {
            printer::step(&format!(
                "paths only, from status: the history Secret no longer keeps revision {from} or {to}"
            ));
            None
        }
        None => None,
    };
    let values = rows.is_some();
    let out = DiffData {
        from,
        to,
        values,
        redacted: !args.show_secrets,
        paths: rows.unwrap_or_else(|| status_paths(&kept, from, to)),
    };
    match args.output {
        Some(format) => print_data(&out, format),
        None => {
            diff_lines(&out, &full)
                .iter()
                .for_each(|l| printer::data(l));
            Ok(())
        }
    }
}

/// A diff for people: the revisions, then a path a line (with its values
/// when there are).
fn diff_lines(out: &DiffData, full: &str) -> Vec<String> {
    let (from, to) = (out.from, out.to);
    if out.paths.is_empty() {
        return vec![format!(
            "revisions {from} and {to} of TalosMachine {full} have the same config"
        )];
    }
    let mut lines = vec![format!("revision {from} → {to}:")];
    lines.extend(out.paths.iter().map(|row| {
        if !out.values {
            return format!("  {}", row.path);
        }
        format!(
            "  {}: {} → {}",
            row.path,
            row.from.as_deref().unwrap_or("(absent)"),
            row.to.as_deref().unwrap_or("(absent)")
        )
    }));
    lines
}

/// The plan as lines for people.
fn plan_lines(
    full: &str,
    cluster: &str,
    record: &RevisionRecord,
    plan: &rollback::Plan,
) -> Vec<String> {
    let r = &record.revision;
    let by = r
        .changed_by
        .as_ref()
        .map(|b| format!(", by {}", b.user))
        .unwrap_or_default();
    let fields = |f: &[String]| {
        f.iter()
            .map(|f| format!("spec.{f}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut lines = vec![format!(
        "plan: roll TalosMachine {full} back to revision {} ({}{by})",
        r.number,
        r.time.0.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )];
    if !plan.machine.fields.is_empty() {
        lines.push(format!(
            "  TalosMachine {full}: write back {}",
            fields(&plan.machine.fields)
        ));
    }
    if let Some(c) = plan.cluster.as_ref().filter(|c| !c.fields.is_empty()) {
        lines.push(format!(
            "  TalosCluster {cluster}: write back {} (every machine of the cluster is rendered from them)",
            fields(&c.fields)
        ));
    }
    if !plan.cluster_left.is_empty() {
        lines.push(format!(
            "  TalosCluster {cluster}'s {} differ from revision {} and stay as they are (--include-cluster writes them back): the config rendered may differ from that revision's",
            fields(&plan.cluster_left),
            r.number
        ));
    }
    lines.push(
        "  the controller then renders the config and applies it (unless the machine is held): a new revision, reason Rollback".into(),
    );
    lines
}

/// The config paths the newest record kept has and `record`'s config has
/// not: writing `record`'s inputs back leaves them, since the render
/// starts from the node's config.
fn added_since(
    data: &BTreeMap<String, Vec<u8>>,
    record: &RevisionRecord,
    machine: &str,
) -> anyhow::Result<Vec<String>> {
    let newest = store::numbers(data).into_iter().max();
    let Some(latest) = newest.filter(|n| *n != record.revision.number) else {
        return Ok(Vec::new());
    };
    let Some(latest) = self::record(data, latest, machine)? else {
        return Ok(Vec::new());
    };
    let entries = ichor_reconcile::history::diff::diff(record, &latest, false)
        .with_context(|| format!("cannot compare revisions of TalosMachine {machine}"))?;
    Ok(entries
        .into_iter()
        .filter(|e| e.live.is_none())
        .map(|e| e.path)
        .collect())
}

/// The history Secret's data and revision `args.to`'s record; refused,
/// nothing written, when this kubeconfig may not read it or it keeps no
/// such revision.
async fn rollback_inputs(
    t: &Target,
    args: &MachineRollbackArgs,
    full: &str,
) -> anyhow::Result<(BTreeMap<String, Vec<u8>>, RevisionRecord)> {
    let data = match history_secret(&t.client, &t.machine).await? {
        History::Readable(data) => data,
        History::NotAllowed(secret) => {
            return Err(refused(
                "rollback",
                &[format!(
                    "the inputs of revision {} are in the history Secret {secret}, which this kubeconfig may not read (get secrets)",
                    args.to
                )],
            ));
        }
    };
    let Some(record) = record(&data, args.to, full)? else {
        let kept: Vec<String> = store::numbers(&data).iter().map(u64::to_string).collect();
        return Err(refused(
            "rollback",
            &[format!(
                "the history Secret of TalosMachine {full} keeps no revision {} (it keeps: {})",
                args.to,
                if kept.is_empty() {
                    "none".into()
                } else {
                    kept.join(", ")
                }
            )],
        ));
    };
    Ok((data, record))
}

/// Writes the plan: the cluster's spec first (when it changes), then the
/// machine's with the mark naming the generations those writes gave.
async fn write_rollback(
    t: &Target,
    args: &MachineRollbackArgs,
    full: &str,
    clusters: &Api<TalosCluster>,
    cluster: &TalosCluster,
    plan: &rollback::Plan,
) -> anyhow::Result<()> {
    let cluster_name = cluster.name_any();
    let cluster_full = format!("{}/{cluster_name}", args.place.namespace);
    let cluster_generation = match plan.cluster.as_ref().filter(|c| !c.fields.is_empty()) {
        Some(c) => {
            let mut written = cluster.clone();
            written.spec = serde_json::from_value(c.spec.clone()).with_context(|| {
                format!("revision {}'s cluster spec does not read as one", args.to)
            })?;
            clusters
                .replace(&cluster_name, &PostParams::default(), &written)
                .await
                .with_context(|| format!("cannot write the spec of TalosCluster {cluster_full}"))?
                .metadata
                .generation
        }
        None => cluster.metadata.generation,
    };
    let mut machine = t.machine.clone();
    machine.spec = serde_json::from_value(plan.machine.spec.clone())
        .with_context(|| format!("revision {}'s machine spec does not read as one", args.to))?;
    let bump = i64::from(!plan.machine.fields.is_empty());
    let mark = |machine_generation: i64| RollbackMark {
        revision: args.to,
        machine_generation,
        cluster_generation: cluster_generation.unwrap_or_default(),
    };
    let expected = t.machine.metadata.generation.unwrap_or_default() + bump;
    machine.annotations_mut().insert(
        ROLLBACK_OF_ANNOTATION.to_string(),
        serde_json::to_string(&mark(expected))?,
    );
    let written = t
        .machines
        .replace(&args.name, &PostParams::default(), &machine)
        .await
        .with_context(|| format!("cannot write the spec of TalosMachine {full}"))?;
    // The mark names the generation the write gave; it is right unless the
    // API server counted otherwise.
    if let Some(actual) = written.metadata.generation.filter(|g| *g != expected) {
        let patch = serde_json::json!({"metadata": {"annotations": {
            ROLLBACK_OF_ANNOTATION: serde_json::to_string(&mark(actual))?
        }}});
        t.machines
            .patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("cannot mark TalosMachine {full} as rolled back"))?;
    }
    Ok(())
}

pub async fn rollback(args: MachineRollbackArgs) -> anyhow::Result<()> {
    let t = target(&args.place, &args.name).await?;
    let full = format!("{}/{}", args.place.namespace, args.name);
    let clusters = Api::<TalosCluster>::namespaced(t.client.clone(), &args.place.namespace);
    let cluster_name = t.machine.spec.cluster_ref.name.clone();
    let cluster_full = format!("{}/{cluster_name}", args.place.namespace);
    let cluster = clusters
        .get(&cluster_name)
        .await
        .with_context(|| format!("cannot read TalosCluster {cluster_full}"))?;
    let (data, record) = rollback_inputs(&t, &args, &full).await?;
    let plan = rollback::plan(
        &record,
        &serde_json::to_value(&t.machine.spec)?,
        &serde_json::to_value(&cluster.spec)?,
        args.include_cluster,
    );
    if plan.is_empty() {
        printer::step(&format!(
            "TalosMachine {full}'s spec{} is revision {}'s already; nothing was written",
            if args.include_cluster {
                " and its cluster's"
            } else {
                ""
            },
            args.to
        ));
        return Ok(());
    }
    for line in plan_lines(&full, &cluster_full, &record, &plan) {
        printer::step(&line);
    }
    let added = added_since(&data, &record, &full)?;
    if !added.is_empty() {
        printer::step(&format!(
            "  {} came after revision {} and stay: Ichor renders over the node's config, and that revision's inputs do not set them",
            added.join(", "),
            args.to
        ));
    }
    consent("rollback", args.yes, "Roll this machine back? [y/N] ")?;
    write_rollback(&t, &args, &full, &clusters, &cluster, &plan).await?;
    printer::step(&format!(
        "TalosMachine {full} rolled back to revision {}'s inputs; `ichor machine history {}` shows the apply that follows",
        args.to, args.name
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::history::{ChangedBy, RevisionApplyMode, RevisionOutcome};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn revision(number: u64, reason: RevisionReason, paths: &[&str]) -> MachineRevision {
        MachineRevision {
            number,
            time: Time(k8s_openapi::jiff::Timestamp::from_second(1_796_198_400).unwrap()),
            config_hash_before: (number > 1).then(|| "sha256:0123456789abcdef".into()),
            config_hash_after: "sha256:fedcba9876543210".into(),
            apply_mode: RevisionApplyMode::NoReboot,
            reason,
            operation: None,
            rollback_of: (reason == RevisionReason::Rollback).then_some(1),
            machine_generation: Some(2),
            cluster_generation: Some(1),
            changed_by: Some(ChangedBy {
                user: "system:serviceaccount:team-a:deployer".into(),
                at: "2026-12-02T07:00:00Z".into(),
            }),
            changed_paths: paths.iter().map(|p| p.to_string()).collect(),
            outcome: RevisionOutcome::Applied,
        }
    }

    /// Covers: R16.6
    #[test]
    fn the_history_table_names_reason_writer_and_hashes() {
        let kept = [
            revision(1, RevisionReason::Drift, &["machine.sysctls"]),
            revision(
                3,
                RevisionReason::Rollback,
                &["machine.sysctls", "machine.files"],
            ),
        ];
        let table = history_table(&kept);
        assert_eq!(
            table,
            [
                "REV  TIME                  REASON         BY                                     MODE      CONFIG                     PATHS  OUTCOME",
                "1    2026-12-02T08:00:00Z  Drift          system:serviceaccount:team-a:deployer  NoReboot  -→fedcba987654             1      Applied",
                "3    2026-12-02T08:00:00Z  Rollback to 1  system:serviceaccount:team-a:deployer  NoReboot  0123456789ab→fedcba987654  2      Applied",
            ]
        );
    }

    /// Covers: R16.6
    #[test]
    fn a_diff_defaults_to_the_latest_against_the_one_before() {
        let kept = [
            revision(4, RevisionReason::Drift, &["a"]),
            revision(5, RevisionReason::Drift, &["b"]),
            revision(7, RevisionReason::Drift, &["c", "a"]),
        ];
        assert_eq!(range(&kept, None, None).unwrap(), (5, 7));
        assert_eq!(range(&kept, Some(4), None).unwrap(), (4, 7));
        assert_eq!(range(&kept, None, Some(5)).unwrap(), (4, 5));
        let why = |r: anyhow::Result<(u64, u64)>| r.unwrap_err().to_string();
        assert!(why(range(&kept, None, Some(4))).contains("first one kept"));
        assert!(why(range(&kept, Some(1), None)).contains("kept: 4, 5, 7"));
        assert!(range(&[], None, None).is_err());
        let paths: Vec<String> = status_paths(&kept, 4, 7)
            .into_iter()
            .map(|r| r.path)
            .collect();
        assert_eq!(paths, ["a", "b", "c"]);
    }
}
