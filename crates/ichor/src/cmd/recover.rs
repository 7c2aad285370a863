//! `ichor recover`: rebuilds a cluster's etcd from a backup, from a laptop
//! with only the bucket's credentials and an age identity. The decisions
//! (which backup, whether the nodes allow it, the next etcd step) are
//! `ichor_backup::recover`'s; this file reads, asks, writes and waits.
//!
//! Test hook: `ICHOR_RECOVER_KILL_AFTER=<phase>` makes the process kill
//! itself with SIGKILL right after that phase is recorded in the state
//! file, so tests can cut a run at each phase boundary.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use ichor_backup::crypt::Identities;
use ichor_backup::manifest::{Manifest, Part};
use ichor_backup::recover::{self, ControlPlane, Etcd, Nodes, Phase, Reading, State, Unreachable};
use ichor_backup::restore::{Reader, RestoreError, Snapshot};
use ichor_backup::snapshot::Mode;
use ichor_backup::store::{Destination, S3Destination, Store};
use ichor_talos::private_file;
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};
use serde::Serialize;

use crate::args::{OutputFormat, RecoverArgs};
use crate::printer;

/// The files recover writes into `--out`.
pub const STATE_FILE: &str = "recover-state.json";
pub const BUNDLE_FILE: &str = "secrets.yaml";
pub const TALOSCONFIG_FILE: &str = "talosconfig";
pub const OBJECTS_FILE: &str = "objects.yaml";
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// The test hook's variable (see the module's documentation).
pub const KILL_AFTER_ENV: &str = "ICHOR_RECOVER_KILL_AFTER";

/// The bucket's credentials, from the environment only (never a flag: a
/// flag is seen by every user of the machine).
const ACCESS_KEY_ENV: &str = "AWS_ACCESS_KEY_ID";
const SECRET_KEY_ENV: &str = "AWS_SECRET_ACCESS_KEY";

/// The result, as `-o json|yaml` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub cluster: String,
    pub backup: String,
    pub node: String,
    pub phase: Phase,
    pub etcd_revision: u64,
    pub bootstraps: usize,
    pub out: PathBuf,
    pub files: Vec<String>,
}

/// What recover has read before it writes anything.
struct Prepared {
    reader: Reader,
    manifest: Manifest,
    bundle_yaml: Vec<u8>,
    bundle: SecretsBundle,
    objects: Vec<u8>,
    control_planes: Vec<ControlPlane>,
    mode: Mode,
}

pub async fn run(args: RecoverArgs) -> anyhow::Result<()> {
    let p = prepare(&args)
        .await
        .context("ichor recover refused; nothing was written")?;
    let node = p.control_planes[0].address.clone();
    let nodes = TalosNodes::new(&p.bundle, &p.control_planes)?;
    let state_path = args.out.join(STATE_FILE);
    let wanted = State::new(
        &args.cluster,
        &p.manifest.backup,
        &node,
        &p.manifest.etcd.sha256,
    );
    let recorded = read_state(&state_path)?;
    if let Some(r) = &recorded {
        recover::same_run(r, &wanted).with_context(|| {
            format!(
                "ichor recover refused: {} holds another recovery; nothing was written",
                state_path.display()
            )
        })?;
    }
    let mut state = recorded.clone().unwrap_or(wanted);
    if !state.bootstrapped() {
        preflight(&nodes, &p.control_planes)
            .await
            .context("ichor recover refused; nothing was written")?;
    }
    print_plan(&args, &p, &state, recorded.is_some());
    if !args.yes {
        consent()?;
    }
    private_file::prepare_dir(&args.out)
        .with_context(|| format!("cannot prepare the output folder {}", args.out.display()))?;
    save(&state_path, &state)?;
    write_files(&args, &p, &node)?;
    state.reach(Phase::Files);
    save(&state_path, &state)?;

    let reader = p.reader.clone();
    let manifest = p.manifest.clone();
    let mode = p.mode;
    let progress = printer::Progress::start(&format!("restoring etcd on {node}"));
    recover::run_etcd(
        &nodes,
        &mut state,
        args.skip_hash_check,
        || {
            let reader = reader.clone();
            let manifest = manifest.clone();
            async move { reader.snapshot(&manifest, mode).await }
        },
        |s: &State| save(&state_path, s),
        |line: &str| progress.line(line),
        Duration::from_secs(2),
        args.etcd_timeout,
    )
    .await
    .context("ichor recover stopped; run it again to continue")?;
    progress.finish("etcd restored");

    if state.phase < Phase::ApiServing {
        let kube = api_serving(&args, &nodes, &node, p.manifest.etcd.revision).await?;
        state.reach(Phase::ApiServing);
        save(&state_path, &state)?;
        reconciled(&args, &kube, &p.manifest.backup).await?;
        state.reach(Phase::Reconciled);
        save(&state_path, &state)?;
    } else if state.phase < Phase::Reconciled {
        let kube = api_serving(&args, &nodes, &node, p.manifest.etcd.revision).await?;
        reconciled(&args, &kube, &p.manifest.backup).await?;
        state.reach(Phase::Reconciled);
        save(&state_path, &state)?;
    }
    finish(&args, &p, &state)
}

/// Everything read and checked before a write: the backup, its parts, the
/// whole snapshot through its checks, the control planes.
async fn prepare(args: &RecoverArgs) -> anyhow::Result<Prepared> {
    let text = std::fs::read_to_string(&args.identity)
        .with_context(|| format!("cannot read the identity file {}", args.identity.display()))?;
    let identities = Identities::parse(&text).with_context(|| {
        format!(
            "the identity file {} is not usable",
            args.identity.display()
        )
    })?;
    let store = Store::open(&destination(args)?)?;
    let reader = Reader::new(store, std::sync::Arc::new(identities), &args.cluster);
    printer::step(&format!(
        "listing the backups of cluster {} in {}",
        args.cluster,
        reader.destination()
    ));
    let listed = reader.list().await?;
    let chosen = ichor_backup::restore::choose(
        &listed,
        &args.cluster,
        args.backup.as_deref(),
        reader.destination(),
    )?
    .name
    .clone();
    let manifest = reader.manifest(&chosen).await?;
    let bundle_yaml = reader.part(&manifest, Part::Bundle).await?;
    let objects = reader.part(&manifest, Part::Objects).await?;
    let mode = if args.skip_hash_check {
        Mode::RawDb
    } else {
        Mode::WithTrailer
    };
    printer::step(&format!(
        "checking backup {chosen}'s etcd snapshot ({} bytes) against its manifest",
        manifest.etcd.db_size
    ));
    reader.verify_snapshot(&manifest, mode).await?;
    let bundle = SecretsBundle::parse(
        &String::from_utf8_lossy(&bundle_yaml),
        &format!("backup {chosen}'s secrets bundle"),
    )?;
    let control_planes = control_planes(args, &objects)?;
    Ok(Prepared {
        reader,
        manifest,
        bundle_yaml,
        bundle,
        objects,
        control_planes,
        mode,
    })
}

fn destination(args: &RecoverArgs) -> anyhow::Result<Destination> {
    if let Some(root) = &args.folder {
        return Ok(Destination::Filesystem { root: root.clone() });
    }
    let Some(bucket) = &args.bucket else {
        bail!("pass --bucket NAME (with --endpoint for a service other than AWS) or --folder DIR");
    };
    let env = |name: &str| {
        std::env::var(name).with_context(|| {
            format!("{name} is not set: recover reads the bucket's credentials from {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}")
        })
    };
    Ok(Destination::S3(S3Destination {
        endpoint: args.endpoint.clone(),
        bucket: bucket.clone(),
        prefix: args.prefix.clone(),
        region: args.region.clone(),
        access_key_id: env(ACCESS_KEY_ENV)?,
        secret_access_key: env(SECRET_KEY_ENV)?,
        allow_http: args.allow_http,
    }))
}

/// `--nodes`, else the backup's control planes by name.
fn control_planes(args: &RecoverArgs, objects: &[u8]) -> anyhow::Result<Vec<ControlPlane>> {
    if !args.nodes.is_empty() {
        return Ok(args
            .nodes
            .iter()
            .map(|a| ControlPlane {
                machine: a.clone(),
                address: a.clone(),
            })
            .collect());
    }
    let docs = object_documents(objects)?;
    let cps = recover::control_planes(&docs, &args.cluster);
    if cps.is_empty() {
        bail!(
            "the backup's objects hold no TalosMachine of cluster {} with role controlplane; pass --nodes ADDR,...",
            args.cluster
        );
    }
    Ok(cps)
}

fn object_documents(objects: &[u8]) -> anyhow::Result<Vec<serde_json::Value>> {
    use serde::Deserialize as _;
    let text = String::from_utf8_lossy(objects);
    serde_yaml_ng::Deserializer::from_str(&text)
        .enumerate()
        .map(|(i, doc)| {
            serde_json::Value::deserialize(doc)
                .with_context(|| format!("document {i} of the backup's objects is not YAML"))
        })
        .filter(|d| !matches!(d, Ok(serde_json::Value::Null)))
        .collect()
}

/// Reads every control plane; refuses when etcd runs on any or one cannot
/// be reached.
async fn preflight(nodes: &TalosNodes, cps: &[ControlPlane]) -> anyhow::Result<()> {
    let mut readings = Vec::new();
    for cp in cps {
        let seen = match nodes.boot_id(&cp.address).await {
            Err(e) => Err(Unreachable(ichor_api::error_text::chain(&e))),
            Ok(_) => nodes
                .etcd(&cp.address)
                .await
                .map_err(|e| Unreachable(ichor_api::error_text::chain(&e))),
        };
        readings.push(Reading {
            node: cp.address.clone(),
            seen,
        });
    }
    let refusals = recover::preflight(&readings);
    if refusals.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = refusals
        .iter()
        .map(|r| ichor_api::error_text::chain(r))
        .collect();
    bail!("{}", lines.join("; "))
}

fn print_plan(args: &RecoverArgs, p: &Prepared, state: &State, rerun: bool) {
    let m = &p.manifest;
    printer::step(&format!(
        "recover cluster {} from backup {} (taken {}, reason {:?}, etcd revision {}, database {} bytes, sha256 {})",
        args.cluster, m.backup, m.started, m.reason, m.etcd.revision, m.etcd.db_size, m.etcd.sha256
    ));
    printer::step(&format!(
        "  control planes: {} (etcd waits on each)",
        p.control_planes
            .iter()
            .map(|c| format!("{} {}", c.machine, c.address))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    printer::step(&format!(
        "  1. write {BUNDLE_FILE}, {TALOSCONFIG_FILE}, {OBJECTS_FILE} (0600) and {STATE_FILE} into {}",
        args.out.display()
    ));
    printer::step(&format!(
        "  2. upload the snapshot to {} (EtcdRecover), then Bootstrap{{recover_etcd}} there, once",
        state.node
    ));
    printer::step(&format!(
        "  3. wait for etcd (up to {:?}), the Kubernetes API at revision >= {} (up to {:?}), Ichor's controller and its TalosClusters (up to {:?})",
        args.etcd_timeout, m.etcd.revision, args.api_timeout, args.controller_timeout
    ));
    if rerun {
        printer::step(&format!(
            "  an earlier run reached phase {}; this one continues from there",
            state.phase
        ));
    }
}

fn consent() -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "recover asks for consent on a terminal; pass --yes to recover without asking (nothing was written)"
        );
    }
    printer::ask("Recover this cluster? [y/N] ");
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        bail!("not recovering: no consent (nothing was written)");
    }
    Ok(())
}

fn write_files(args: &RecoverArgs, p: &Prepared, node: &str) -> anyhow::Result<()> {
    let endpoints: Vec<String> = p.control_planes.iter().map(|c| c.address.clone()).collect();
    let tc = Talosconfig::generate(
        &p.bundle,
        &args.cluster,
        &[node.to_string()],
        &endpoints,
        Role::Admin,
        Duration::from_secs(365 * 24 * 3600),
    )?
    .to_yaml()?;
    for (name, bytes) in [
        (BUNDLE_FILE, &p.bundle_yaml[..]),
        (TALOSCONFIG_FILE, tc.as_bytes()),
        (OBJECTS_FILE, &p.objects[..]),
    ] {
        let path = args.out.join(name);
        private_file::write(&path, bytes)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    printer::step(&format!(
        "wrote {BUNDLE_FILE}, {TALOSCONFIG_FILE}, {OBJECTS_FILE} (0600) to {}",
        args.out.display()
    ));
    Ok(())
}

fn read_state(path: &Path) -> anyhow::Result<Option<State>> {
    let Some(bytes) = private_file::read(path)
        .with_context(|| format!("cannot read the state file {}", path.display()))?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .with_context(|| format!("the state file {} is not recover's", path.display()))
}

/// Records `state`; then, under the test hook, dies when its phase is the
/// one named.
fn save(path: &Path, state: &State) -> Result<(), private_file::PrivateFileError> {
    let json = serde_json::to_vec_pretty(state).expect("a state always serialises");
    private_file::write(path, &json)?;
    if std::env::var(KILL_AFTER_ENV)
        .ok()
        .and_then(|p| Phase::parse(&p))
        == Some(state.phase)
    {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        std::process::abort();
    }
    Ok(())
}

/// The admin kubeconfig from the node, written 0600, and a client once the
/// API serves a list at `revision` or later.
async fn api_serving(
    args: &RecoverArgs,
    nodes: &TalosNodes,
    node: &str,
    revision: u64,
) -> anyhow::Result<kube::Client> {
    let progress = printer::Progress::start(&format!(
        "waiting for the Kubernetes API to serve revision {revision} or later"
    ));
    let deadline = tokio::time::Instant::now() + args.api_timeout;
    let mut last = String::from("no answer yet");
    loop {
        match try_api(args, nodes, node, revision).await {
            Ok(Some(client)) => {
                progress.finish("the Kubernetes API serves the restored data");
                return Ok(client);
            }
            Ok(None) => last = "the API serves an older revision".into(),
            Err(e) => {
                let now = ichor_api::error_text::chain(e.as_ref());
                if now != last {
                    progress.line(&format!("  not yet: {now}"));
                }
                last = now;
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "ichor recover stopped: the Kubernetes API did not serve revision {revision} within {:?} ({last}); run it again to continue",
                args.api_timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn try_api(
    args: &RecoverArgs,
    nodes: &TalosNodes,
    node: &str,
    revision: u64,
) -> anyhow::Result<Option<kube::Client>> {
    let kc = nodes.client(node).kubeconfig("").await?;
    let path = args.out.join(KUBECONFIG_FILE);
    private_file::write(&path, &kc)?;
    let client = crate::connect::kube_client(Some(&path)).await?;
    let api = kube::Api::<ichor_api::TalosCluster>::all(client.clone());
    let list = api.list_metadata(&kube::api::ListParams::default()).await?;
    let rv: u64 = list
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((rv >= revision).then_some(client))
}

/// The annotation on the controller's pod template that restarts it after
/// a recovery, valued with the backup's name (a rerun changes nothing).
const RECOVERED_FROM_ANNOTATION: &str = "ichor.maesh.dev/recovered-from";

/// Restarts Ichor's controller, then waits for the new pods to be
/// available and each of the cluster's TalosClusters to be Ready at its
/// generation. The restart is needed: etcd comes back at the snapshot's
/// revision, below what a running controller saw, and the API server
/// neither fails its watches nor makes its caches list again (ADR 0018),
/// so a controller that kept running would miss every change from now on.
async fn reconciled(args: &RecoverArgs, client: &kube::Client, backup: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let progress =
        printer::Progress::start("restarting Ichor's controller and waiting for its TalosClusters");
    let deadline = tokio::time::Instant::now() + args.controller_timeout;
    let deployments = kube::Api::<Deployment>::namespaced(client.clone(), &args.ichor_namespace);
    let name = ichor_adopt::install::CONTROLLER;
    let restart = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
        RECOVERED_FROM_ANNOTATION: backup}}}}});
    deployments
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&restart),
        )
        .await
        .with_context(|| format!("cannot restart Deployment {}/{name}", args.ichor_namespace))?;
    let clusters = kube::Api::<ichor_api::TalosCluster>::all(client.clone());
    let mut said = String::new();
    loop {
        let why = match waiting_on(&deployments, &clusters, &args.cluster).await {
            Ok(None) => {
                progress.finish("Ichor's controller runs and the TalosClusters are Ready");
                return Ok(());
            }
            Ok(Some(why)) => why,
            Err(e) => ichor_api::error_text::chain(e.as_ref()),
        };
        if why != said {
            progress.line(&format!("  waiting: {why}"));
            said = why.clone();
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "ichor recover stopped: {why} after {:?}; run it again to continue",
                args.controller_timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn waiting_on(
    deployments: &kube::Api<k8s_openapi::api::apps::v1::Deployment>,
    clusters: &kube::Api<ichor_api::TalosCluster>,
    cluster: &str,
) -> anyhow::Result<Option<String>> {
    let name = ichor_adopt::install::CONTROLLER;
    let Some(deployment) = deployments.get_opt(name).await? else {
        return Ok(Some(format!("Deployment {name} does not exist")));
    };
    let generation = deployment.metadata.generation;
    let status = deployment.status.unwrap_or_default();
    let rolled = generation.is_some_and(|g| status.observed_generation.is_some_and(|o| o >= g))
        && status.updated_replicas == status.replicas;
    if !rolled {
        return Ok(Some(format!("Deployment {name} is restarting")));
    }
    let available =
        status.conditions.unwrap_or_default().iter().any(|c| {
            c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")
        });
    if !available {
        return Ok(Some(format!("Deployment {name} is not available")));
    }
    for c in clusters.list(&Default::default()).await?.items {
        if c.metadata.name.as_deref() != Some(cluster) {
            continue;
        }
        let generation = c.metadata.generation;
        let status = c.status.clone().unwrap_or_default();
        let ready = status.conditions.iter().any(|k| {
            k.type_ == ichor_api::conditions::types::READY
                && k.status == "True"
                && generation.is_none_or(|g| k.observed_generation == Some(g))
        });
        if !ready {
            return Ok(Some(format!(
                "TalosCluster {cluster} is not Ready at its generation"
            )));
        }
    }
    Ok(None)
}

fn finish(args: &RecoverArgs, p: &Prepared, state: &State) -> anyhow::Result<()> {
    let outcome = Outcome {
        cluster: args.cluster.clone(),
        backup: p.manifest.backup.clone(),
        node: state.node.clone(),
        phase: state.phase,
        etcd_revision: p.manifest.etcd.revision,
        bootstraps: state.bootstraps.len(),
        out: args.out.clone(),
        files: [
            STATE_FILE,
            BUNDLE_FILE,
            TALOSCONFIG_FILE,
            OBJECTS_FILE,
            KUBECONFIG_FILE,
        ]
        .map(str::to_string)
        .to_vec(),
    };
    match args.output {
        Some(OutputFormat::Json) => printer::data(&serde_json::to_string_pretty(&outcome)?),
        Some(OutputFormat::Yaml) => printer::data(&serde_yaml_ng::to_string(&outcome)?),
        None => printer::step(&format!(
            "recovered cluster {} from backup {} on {}; kubeconfig and talosconfig in {}",
            outcome.cluster,
            outcome.backup,
            outcome.node,
            args.out.display()
        )),
    }
    Ok(())
}

/// The control planes through their Talos APIs, with an admin identity
/// made from the backup's bundle.
struct TalosNodes {
    clients: BTreeMap<String, TalosClient>,
}

impl TalosNodes {
    fn new(bundle: &SecretsBundle, cps: &[ControlPlane]) -> anyhow::Result<Self> {
        let cert = ichor_talos::talosconfig::generate_client_certificate(
            bundle,
            Role::Admin,
            Duration::from_secs(3600),
        )?;
        let Some((ca, _)) = bundle.os_ca_pem() else {
            bail!("the backup's secrets bundle has no OS CA");
        };
        let key = ichor_talos::pem::relabel(&cert.key_pem, "PRIVATE KEY").unwrap_or(cert.key_pem);
        let identity = ClientIdentity::from_pem(ca, cert.crt_pem, key);
        let mut clients = BTreeMap::new();
        for cp in cps {
            let client = TalosClient::new(&cp.address, &identity, ClientOptions::default())
                .with_context(|| format!("cannot set up a Talos API client for {}", cp.address))?;
            clients.insert(cp.address.clone(), client);
        }
        Ok(TalosNodes { clients })
    }

    fn client(&self, node: &str) -> &TalosClient {
        &self.clients[node]
    }
}

impl Nodes for TalosNodes {
    type Error = ichor_talos_client::Error;

    async fn boot_id(&self, node: &str) -> Result<String, Self::Error> {
        self.client(node).boot_id("").await
    }

    async fn etcd(&self, node: &str) -> Result<Etcd, Self::Error> {
        Ok(match self.client(node).etcd_service("").await? {
            Some(s) if s.is_running_and_healthy() => Etcd::Running { healthy: true },
            Some(s) if s.state == "Running" => Etcd::Running { healthy: false },
            _ => Etcd::Waiting,
        })
    }

    async fn upload(&self, node: &str, snapshot: Snapshot) -> Result<(), Self::Error> {
        self.client(node).etcd_recover("", snapshot).await
    }

    async fn bootstrap(&self, node: &str, skip_hash_check: bool) -> Result<(), Self::Error> {
        self.client(node)
            .bootstrap_recover("", skip_hash_check)
            .await
    }
}

/// The advice of recover's own errors, for the CLI's help line.
pub fn help(e: &RestoreError) -> Option<String> {
    e.help()
}
