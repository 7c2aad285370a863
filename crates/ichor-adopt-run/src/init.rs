//! `ichor init` end to end: inspection (read-only, over the insecure
//! maintenance API) → plan → consent → the phases. Each phase is one
//! function, named as its entry of [`Outcome::phases`], and idempotent: a
//! rerun after a kill at any boundary reads what is already done (the files
//! in the output directory, a node that now answers the cluster's
//! talosconfig, etcd's "already bootstrapped", objects that exist) and does
//! only the rest, so nothing is applied to a node twice (R10.3). The
//! decisions are `ichor_adopt::init`'s pure functions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_adopt::Refusal;
use ichor_adopt::init::{self, InitPlan, InitRequest, InitWrites, NodeAnswer, NodeProbe};
use ichor_adopt::{install, waits};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_cilium::{ClusterSettings, effective_values};
use ichor_helm::render::{ChartRef, Renderer};
use ichor_helm::wait::{Wait, wait_until};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_talos_client::{ApplyMode, ApplyRequest, ClientIdentity, ClientOptions, TalosClient};
use kube::api::Api;

use crate::error::{AdoptError, wait_ended};
use crate::ichor::{self, create_or_keep_as};
use crate::phases::{Operator, Outcome, write_bundle};

/// The files init writes to its output directory, each 0600.
pub const SECRETS_FILE: &str = "secrets.yaml";
pub const TALOSCONFIG_FILE: &str = "talosconfig";
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// How long init waits for the Kubernetes API after bootstrap.
pub const KUBE_API_WAIT: Duration = Duration::from_secs(10 * 60);
/// How long init waits for Ichor's webhooks (spec decision 3: 30 minutes in init).
pub const WEBHOOK_WAIT: Duration = Duration::from_secs(30 * 60);

/// Everything `ichor init` was told.
#[derive(Clone)]
pub struct InitOptions {
    pub request: InitRequest,
    /// Where the bundle, talosconfig and kubeconfig go (and are found again on a rerun).
    pub output_dir: PathBuf,
    /// `--with-secrets FILE`, already read.
    pub with_secrets: Option<SecretsBundle>,
    /// The Talos API port of every node (50000).
    pub talos_port: u16,
    pub kube_api_timeout: Duration,
    pub webhook_timeout: Duration,
    pub poll_interval: Duration,
    /// The helm binary and Cilium chart the inline manifest is rendered with.
    pub helm: Renderer,
    pub cilium_chart: ChartRef,
    /// The CLI's version, with its v.
    pub version: String,
    /// The controller image to install (default: Ichor's image of `version`).
    pub controller_image: Option<String>,
}

impl InitOptions {
    fn endpoint(&self, address: &str) -> String {
        if address.contains(':') {
            format!("[{address}]:{}", self.talos_port)
        } else {
            format!("{address}:{}", self.talos_port)
        }
    }
}

/// Why init stopped: adopt's errors (refusals, writes, waits) and init's own.
pub type InitError = AdoptError;

fn client_options() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// The bundle init works with: `--with-secrets`, else the one an earlier run
/// wrote to the output directory (so a rerun renders the same configs), else
/// a new one.
fn bundle(opts: &InitOptions) -> Result<(SecretsBundle, String), AdoptError> {
    if let Some(b) = &opts.with_secrets {
        return Ok((b.clone(), opts.request.secrets_source.clone()));
    }
    let path = opts.output_dir.join(SECRETS_FILE);
    if path.exists() {
        let b = SecretsBundle::from_file(&path).map_err(|e| AdoptError::Secrets(e.to_string()))?;
        return Ok((b, format!("{} (from an earlier run)", path.display())));
    }
    let b = SecretsBundle::generate().map_err(|e| AdoptError::Secrets(e.to_string()))?;
    Ok((b, "generated".to_string()))
}

/// The admin talosconfig of the cluster: endpoints the control planes, nodes every node.
fn talosconfig(opts: &InitOptions, bundle: &SecretsBundle) -> Result<Talosconfig, AdoptError> {
    let endpoints: Vec<String> = opts
        .request
        .control_planes
        .iter()
        .map(|a| opts.endpoint(a))
        .collect();
    let nodes: Vec<String> = opts
        .request
        .control_planes
        .iter()
        .chain(&opts.request.workers)
        .cloned()
        .collect();
    Talosconfig::generate(
        bundle,
        &opts.request.cluster,
        &endpoints,
        &nodes,
        Role::Admin,
        Duration::from_secs(365 * 24 * 3600),
    )
    .map_err(|e| AdoptError::Secrets(e.to_string()))
}

/// An `os:admin` client of one node, with the cluster's own credentials.
fn admin_client(
    opts: &InitOptions,
    bundle: &SecretsBundle,
    address: &str,
) -> Result<TalosClient, AdoptError> {
    let cert = ichor_talos::talosconfig::generate_client_certificate(
        bundle,
        Role::Admin,
        Duration::from_secs(3600),
    )
    .map_err(|e| AdoptError::Secrets(e.to_string()))?;
    let (ca, _) = bundle
        .os_ca_pem()
        .ok_or_else(|| AdoptError::Secrets("the bundle has no OS CA".into()))?;
    let key = ichor_talos::pem::relabel(&cert.key_pem, "PRIVATE KEY").unwrap_or(cert.key_pem);
    let identity = ClientIdentity::from_pem(ca, cert.crt_pem, key);
    TalosClient::new(&opts.endpoint(address), &identity, client_options())
        .map_err(|e| AdoptError::Wait(format!("node {address}: {e}")))
}

/// Reads one node, read-only: over the insecure API when it is in
/// maintenance mode; with the cluster's own credentials when an earlier run
/// of this init configured it (then it is not a refusal, and not applied again).
async fn probe(opts: &InitOptions, bundle: &SecretsBundle, address: &str) -> NodeProbe {
    let answer = match maintenance_answer(opts, address).await {
        Ok(answer) => answer,
        Err(insecure) => match initialized_answer(opts, bundle, address).await {
            Some(answer) => answer,
            None => insecure,
        },
    };
    NodeProbe {
        address: address.to_string(),
        answer,
    }
}

async fn maintenance_answer(opts: &InitOptions, address: &str) -> Result<NodeAnswer, NodeAnswer> {
    let c = TalosClient::maintenance(&opts.endpoint(address), client_options()).map_err(|e| {
        NodeAnswer::Unreachable {
            error: e.to_string(),
        }
    })?;
    let version = match c.version("").await {
        Ok(v) => v,
        Err(e) if looks_unreachable(&e) => {
            return Err(NodeAnswer::Unreachable {
                error: e.to_string(),
            });
        }
        Err(e) => {
            return Err(NodeAnswer::Configured {
                detail: format!("its insecure API refuses: {e}"),
            });
        }
    };
    let stage =
        c.machine_status("")
            .await
            .map(|s| s.stage)
            .map_err(|e| NodeAnswer::Configured {
                detail: format!("its machine status cannot be read: {e}"),
            })?;
    if stage != 3 {
        return Err(NodeAnswer::Configured {
            detail: format!("its machine stage is {stage}, not maintenance"),
        });
    }
    let hostname = c.hostname("").await.map_err(|e| NodeAnswer::Unreachable {
        error: e.to_string(),
    })?;
    let disks = c.disks("").await.map_err(|e| NodeAnswer::Unreachable {
        error: e.to_string(),
    })?;
    Ok(NodeAnswer::Maintenance {
        hostname,
        talos_version: version.tag,
        disks: disks.into_iter().map(|(_, d)| d.dev_path).collect(),
    })
}

/// Nothing listens there (as opposed to a node that answers, but not insecurely).
fn looks_unreachable(e: &ichor_talos_client::Error) -> bool {
    if matches!(e, ichor_talos_client::Error::Timeout { .. }) {
        return true;
    }
    let text = e.to_string().to_lowercase();
    [
        "connection refused",
        "tcp connect",
        "no route to host",
        "timed out",
        "deadline",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// A node this init configured before (it answers the cluster's credentials):
/// what it reported then, from the state file, so the plan is the same.
async fn initialized_answer(
    opts: &InitOptions,
    bundle: &SecretsBundle,
    address: &str,
) -> Option<NodeAnswer> {
    let c = admin_client(opts, bundle, address).ok()?;
    c.version("").await.ok()?;
    let state = read_state(&opts.output_dir)?;
    let node = state.nodes.into_iter().find(|n| n.address == address)?;
    Some(NodeAnswer::Initialized {
        hostname: node.name,
        talos_version: node.talos_version,
        disks: vec![node.install_disk],
    })
}

/// What init remembers between runs (no secret): the plan it made.
const STATE_FILE: &str = "init-plan.json";

fn read_state(dir: &Path) -> Option<InitPlan> {
    let text = std::fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Inspects every node (read-only), renders the Cilium manifest and plans;
/// writes nothing. Every refusal comes from here, all at once.
pub async fn plan(opts: &InitOptions) -> Result<(InitPlan, InitWrites, SecretsBundle), AdoptError> {
    let (bundle, source) = bundle(opts)?;
    let mut request = opts.request.clone();
    request.secrets_source = source;
    let addresses: Vec<String> = request
        .control_planes
        .iter()
        .chain(&request.workers)
        .cloned()
        .collect();
    let mut probes = Vec::new();
    for address in addresses {
        probes.push(probe(opts, &bundle, &address).await);
    }
    // Refusals that need no manifest come first, without running helm.
    if let Err(refusals) = init::plan(&request, &probes, &bundle, "") {
        return Err(AdoptError::Refused(refusals));
    }
    let manifest = cilium_manifest(opts, &request).await?;
    let (plan, writes) =
        init::plan(&request, &probes, &bundle, &manifest).map_err(AdoptError::Refused)?;
    Ok((plan, writes, bundle))
}

/// Ichor's pinned Cilium chart rendered with the values function of the
/// Helm release (`ichor_cilium::effective_values`), so the hand-over finds
/// the same values.
async fn cilium_manifest(opts: &InitOptions, request: &InitRequest) -> Result<String, AdoptError> {
    let cluster = init::talos_cluster(request, "v0.0.0", "v0.0.0");
    let nodes = u32::try_from(request.control_planes.len() + request.workers.len()).unwrap_or(1);
    let settings = ClusterSettings::from_cluster(&cluster, nodes)
        .map_err(|e| AdoptError::Refused(vec![Refusal::new(e.to_string())]))?;
    let values = effective_values(&settings)
        .map_err(|e| AdoptError::Refused(vec![Refusal::new(e.to_string())]))?;
    // No cluster exists yet: rendered offline, as `helm template` does.
    opts.helm
        .template(
            "cilium",
            "kube-system",
            &opts.cilium_chart,
            &serde_json::Value::Object(values),
        )
        .await
        .map_err(|e| AdoptError::Wait(format!("rendering Ichor's Cilium chart: {e}")))
}

struct Run<'a> {
    opts: &'a InitOptions,
    operator: Arc<dyn Operator>,
    plan: InitPlan,
    writes: InitWrites,
    bundle: SecretsBundle,
}

impl Run<'_> {
    fn say(&self, line: &str) {
        self.operator.say(line);
    }
}

/// Runs init: plan, consent, then every phase.
pub async fn run(
    opts: &InitOptions,
    operator: Arc<dyn Operator>,
    consent: impl FnOnce(&InitPlan) -> bool,
) -> Result<Outcome, AdoptError> {
    let start = Instant::now();
    let mut outcome = Outcome::default();
    let done = |name: &str, outcome: &mut Outcome| {
        let before: f64 = outcome.phases.iter().map(|(_, s)| s).sum();
        outcome
            .phases
            .push((name.to_string(), start.elapsed().as_secs_f64() - before));
    };
    let (plan, writes, bundle) = plan(opts).await?;
    done("inspection", &mut outcome);
    operator.say(&plan.text());
    if !consent(&plan) {
        return Err(AdoptError::NotConfirmed);
    }
    let r = Run {
        opts,
        operator,
        plan,
        writes,
        bundle,
    };
    files(&r)?;
    done("files", &mut outcome);
    apply(&r).await?;
    done("apply", &mut outcome);
    bootstrap(&r).await?;
    done("bootstrap", &mut outcome);
    let kubeconfig = kubeconfig(&r).await?;
    done("kubeconfig", &mut outcome);
    let kube = kube_api(&r, &kubeconfig).await?;
    done("kubernetes-api", &mut outcome);
    install(&r, &kube).await?;
    done("install", &mut outcome);
    webhooks(&r, &kube).await?;
    done("webhooks", &mut outcome);
    objects(&r, &kube).await?;
    done("objects", &mut outcome);
    r.say("the controller now takes the inline Cilium over as Ichor's Helm release (CNIHandover on the TalosCluster says when)");
    Ok(outcome)
}

/// Writes `bytes` to `path` with mode 0600, through a temporary file, so a
/// kill never leaves half a file.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AdoptError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let io = |e: std::io::Error| AdoptError::Secrets(format!("writing {}: {e}", path.display()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Phase `files`: the bundle, the talosconfig and the plan (what a rerun
/// reads back), 0600 in the output directory. A bundle already there is kept.
fn files(r: &Run<'_>) -> Result<(), AdoptError> {
    let dir = &r.opts.output_dir;
    std::fs::create_dir_all(dir)
        .map_err(|e| AdoptError::Secrets(format!("creating {}: {e}", dir.display())))?;
    let secrets = dir.join(SECRETS_FILE);
    if !secrets.exists() {
        let yaml = r
            .bundle
            .to_yaml()
            .map_err(|e| AdoptError::Secrets(e.to_string()))?;
        write_private(&secrets, yaml.as_bytes())?;
    }
    let tc = talosconfig(r.opts, &r.bundle)?
        .to_yaml()
        .map_err(|e| AdoptError::Secrets(e.to_string()))?;
    write_private(&dir.join(TALOSCONFIG_FILE), tc.as_bytes())?;
    let state = serde_json::to_vec_pretty(&r.plan).expect("the plan serialises");
    write_private(&dir.join(STATE_FILE), &state)?;
    r.say(&format!(
        "wrote {}, {} (0600) to {}",
        SECRETS_FILE,
        TALOSCONFIG_FILE,
        dir.display()
    ));
    Ok(())
}

/// Phase `apply`: each node still in maintenance mode gets its config over
/// the insecure API; a node that already answers the cluster's credentials
/// has it, and is skipped.
async fn apply(r: &Run<'_>) -> Result<(), AdoptError> {
    for (address, config) in &r.writes.configs {
        let c = TalosClient::maintenance(&r.opts.endpoint(address), client_options())
            .map_err(|e| AdoptError::Wait(format!("node {address}: {e}")))?;
        let in_maintenance = matches!(
            c.machine_status("").await,
            Ok(s) if s.stage == 3
        );
        if !in_maintenance {
            let admin = admin_client(r.opts, &r.bundle, address)?;
            if admin.version("").await.is_ok() {
                r.say(&format!("{address} already has its config"));
                continue;
            }
        }
        c.apply_configuration(
            "",
            &ApplyRequest::new(config.as_bytes().to_vec(), ApplyMode::Auto),
        )
        .await
        .map_err(|e| {
            AdoptError::Wait(format!(
                "applying the config of {address}: {e}. Run ichor init again to continue"
            ))
        })?;
        r.say(&format!("applied the config of {address}"));
    }
    Ok(())
}

/// Phase `bootstrap`: etcd on the first control plane, once. Retried
/// (bounded) while the node restarts its API; "already bootstrapped" is done.
async fn bootstrap(r: &Run<'_>) -> Result<(), AdoptError> {
    let address = &r.plan.bootstrap_node;
    let c = admin_client(r.opts, &r.bundle, address)?;
    let outcome = std::sync::Mutex::new(None);
    let report =
        |left: &[String]| r.say(&format!("waiting to bootstrap etcd: {}", left.join("; ")));
    let wait = Wait {
        why: "etcd's bootstrap",
        timeout: Duration::from_secs(10 * 60),
        poll_interval: r.opts.poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_yet = || async {
        match c.bootstrap("").await {
            Ok(first) => {
                *outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
                Ok(Vec::new())
            }
            Err(e) => Ok(vec![format!("{address}: {e}")]),
        }
    };
    wait_ended(wait_until(&wait, not_yet).await, |pending| {
        format!(
            "etcd could not be bootstrapped on {address} within 10 minutes: {}",
            pending.join("; ")
        )
    })?;
    let first = outcome.into_inner().unwrap_or_else(|e| e.into_inner());
    r.say(&match first {
        Some(true) => format!("bootstrapped etcd on {address}"),
        _ => format!("etcd was already bootstrapped on {address}"),
    });
    Ok(())
}

/// Phase `kubeconfig`: the admin kubeconfig, fetched through the Talos API
/// from the first control plane, written 0600.
async fn kubeconfig(r: &Run<'_>) -> Result<PathBuf, AdoptError> {
    let address = &r.plan.bootstrap_node;
    let c = admin_client(r.opts, &r.bundle, address)?;
    let bytes = c
        .kubeconfig("")
        .await
        .map_err(|e| AdoptError::Wait(format!("fetching the kubeconfig from {address}: {e}")))?;
    let path = r.opts.output_dir.join(KUBECONFIG_FILE);
    write_private(&path, &bytes)?;
    r.say(&format!("wrote {} (0600)", path.display()));
    Ok(path)
}

/// Phase `kubernetes-api`: the bounded wait until the API server answers,
/// saying what it last answered.
async fn kube_api(r: &Run<'_>, kubeconfig: &Path) -> Result<kube::Client, AdoptError> {
    let text = std::fs::read_to_string(kubeconfig)
        .map_err(|e| AdoptError::Secrets(format!("reading {}: {e}", kubeconfig.display())))?;
    let kc = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| AdoptError::Secrets(format!("{}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| AdoptError::Secrets(format!("{}: {e}", kubeconfig.display())))?;
    let client = kube::Client::try_from(config)
        .map_err(|e| AdoptError::Secrets(format!("{}: {e}", kubeconfig.display())))?;
    let report = |left: &[String]| {
        r.say(&format!(
            "waiting for the Kubernetes API: {}",
            left.join("; ")
        ))
    };
    let wait = Wait {
        why: "the Kubernetes API",
        timeout: r.opts.kube_api_timeout,
        poll_interval: r.opts.poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_yet = || async {
        Ok(match client.apiserver_version().await {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!("{} does not answer yet: {e}", r.plan.endpoint)],
        })
    };
    wait_ended(wait_until(&wait, not_yet).await, |pending| {
        format!(
            "the Kubernetes API did not answer within {} ({}): check that the control plane booted and that {} reaches it",
            waits::human(r.opts.kube_api_timeout),
            pending.join("; "),
            r.plan.endpoint
        )
    })?;
    r.say(&format!(
        "the Kubernetes API answers at {}",
        r.plan.endpoint
    ));
    Ok(client)
}

/// Phase `install`: Ichor's install manifest and the IchorInstallation
/// (applies are server-side and creates keep what exists).
async fn install(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    r.say(&format!("installing Ichor {}", r.opts.version));
    let image = r
        .opts
        .controller_image
        .clone()
        .unwrap_or_else(|| install::controller_image(&r.opts.version));
    ichor::install_ichor(kube, &r.opts.version, &image).await?;
    ichor::wait_crds_established(kube, r.opts.poll_interval, &*r.operator).await?;
    create_or_keep_as(
        &Api::<ichor_api::IchorInstallation>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE),
        &install::installation(&r.opts.version),
        "the IchorInstallation",
    )
    .await
}

/// Phase `webhooks`: the bounded wait (30 minutes in init) until the API
/// server calls Ichor's webhooks, which judge the objects written next.
async fn webhooks(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    ichor::wait_for_webhooks(
        kube,
        r.opts.webhook_timeout,
        r.opts.poll_interval,
        &r.writes.cluster,
        &*r.operator,
    )
    .await?;
    r.say("Ichor is running: the API server calls its webhooks");
    Ok(())
}

/// Phase `objects`: the bundle Secret, the TalosCluster and the
/// TalosMachines (not held: init wrote what they describe).
async fn objects(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    let name = &r.plan.cluster;
    write_bundle(kube, name, &r.bundle).await?;
    let clusters = Api::<TalosCluster>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    create_or_keep_as(
        &clusters,
        &r.writes.cluster,
        &format!("TalosCluster {name}"),
    )
    .await?;
    let machines = Api::<TalosMachine>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    for m in &r.writes.machines {
        let what = format!(
            "TalosMachine {}",
            m.metadata.name.as_deref().unwrap_or_default()
        );
        create_or_keep_as(&machines, m, &what).await?;
    }
    r.say(&format!(
        "created the bundle Secret, TalosCluster {name} and {} TalosMachines",
        r.writes.machines.len()
    ));
    Ok(())
}
