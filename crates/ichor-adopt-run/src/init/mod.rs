//! `ichor init` end to end: inspection (read-only, over the insecure
//! maintenance API) → plan → consent → the phases. Each phase is one
//! function, named as its entry of [`Outcome::phases`], and idempotent: a
//! rerun after a kill at any boundary reads what is already done (the files
//! in the output directory, a node that now answers the cluster's
//! talosconfig, etcd's "already bootstrapped", objects that exist) and does
//! only the rest, so nothing is applied to a node twice (R10.3). The
//! decisions are `ichor_adopt::init`'s pure functions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_adopt::Refusal;
use ichor_adopt::init::{self, InitPlan, InitRequest, InitWrites};
use ichor_api::endpoint::Endpoint;
use ichor_api::error_text::{chain, with_help};
use ichor_cilium::{ClusterSettings, effective_values};
use ichor_helm::render::{ChartRef, Renderer};
use ichor_talos::private_file::{self, PrivateFileError};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::{Role, Talosconfig};
use ichor_talos_client::CertFingerprint;

use crate::error::AdoptError;
use crate::phases::{Operator, Outcome};

mod phases;
mod probe;
pub use probe::looks_unreachable;

use phases::{
    apply, bootstrap, files, install, kube_api, kubeconfig, objects, webhooks, write_private,
};
use probe::probe;

/// The files init writes to its output directory, each 0600.
pub const SECRETS_FILE: &str = "secrets.yaml";
pub const TALOSCONFIG_FILE: &str = "talosconfig";
pub const KUBECONFIG_FILE: &str = "kubeconfig";

/// How long init waits for the Kubernetes API after bootstrap.
pub const KUBE_API_WAIT: Duration = Duration::from_secs(10 * 60);
/// How long init waits for Ichor's webhooks (R3.1: 30 minutes in init).
pub const WEBHOOK_WAIT: Duration = Duration::from_secs(30 * 60);

/// Everything `ichor init` was told.
#[derive(Clone)]
pub struct InitOptions {
    pub request: InitRequest,
    /// Where the bundle, talosconfig and kubeconfig go (and are found again on a rerun).
    pub output_dir: PathBuf,
    /// `--with-secrets FILE`, already read.
    pub with_secrets: Option<SecretsBundle>,
    /// `--cert-fingerprint ADDRESS=FINGERPRINT`, as given (the plan judges
    /// them): the maintenance certificate each of those nodes must present.
    pub cert_fingerprints: Vec<String>,
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
    /// A node's Talos API endpoint, written as the one endpoint type shows
    /// it (`host:port`, `[v6]:port`).
    fn endpoint(&self, address: &str) -> String {
        Endpoint {
            host: address.to_owned(),
            port: self.talos_port,
        }
        .to_string()
    }
}

/// Why init stopped: adopt's errors (refusals, writes, waits) and init's own.
pub type InitError = AdoptError;

/// The bundle init works with: `--with-secrets`, else the one an earlier
/// run of this init wrote to the output directory (so a rerun renders the
/// same configs), else a new one. A bundle init did not write is never used
/// unasked: it would become the cluster's PKI.
fn bundle(opts: &InitOptions) -> Result<(SecretsBundle, String), AdoptError> {
    let path = opts.output_dir.join(SECRETS_FILE);
    let refused = |message: String| AdoptError::Refused(vec![Refusal::new(message)]);
    let there = private_file::read(&path).map_err(|e| refused(file_problem(&e)))?;
    if let Some(b) = &opts.with_secrets {
        if there.as_deref().is_some_and(|bytes| !holds(bytes, b)) {
            return Err(refused(format!(
                "{} holds another bundle than --with-secrets {}: move it away, or choose another --output-dir",
                path.display(),
                opts.request.secrets_source
            )));
        }
        return Ok((b.clone(), opts.request.secrets_source.clone()));
    }
    let Some(bytes) = there else {
        let b = SecretsBundle::generate()
            .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
        return Ok((b, "generated".to_string()));
    };
    let ours = read_state(&opts.output_dir).is_some_and(|s| {
        s.plan.cluster == opts.request.cluster
            && s.secrets_sha256.as_deref() == Some(sha256_hex(&bytes).as_str())
    });
    if !ours {
        return Err(refused(format!(
            "{} is not a bundle an earlier run of this init wrote (no {STATE_FILE} of cluster {} beside it records it), and a bundle becomes the cluster's PKI: to build the cluster on it, pass --with-secrets {}; otherwise move it away, or choose another --output-dir",
            path.display(),
            opts.request.cluster,
            path.display()
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| AdoptError::Secrets(format!("{} is not text", path.display())))?;
    let b = SecretsBundle::parse(&text, &path.display().to_string())
        .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
    Ok((b, format!("{} (from an earlier run)", path.display())))
}

/// Whether a bundle file's bytes hold `bundle`.
fn holds(bytes: &[u8], bundle: &SecretsBundle) -> bool {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| SecretsBundle::parse(text, SECRETS_FILE).ok())
        .is_some_and(|found| &found == bundle)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// A file problem as one refusal line: what failed and why.
fn file_problem(e: &PrivateFileError) -> String {
    chain(e)
}

/// The output directory's problems, read only: one others may write to (so
/// they could plant or swap the files), and a symbolic link where a file goes.
fn check_output_dir(dir: &Path) -> Vec<Refusal> {
    match private_file::check_dir(dir) {
        Ok(None) => return Vec::new(),
        Ok(Some(_)) => {}
        Err(e @ PrivateFileError::SharedDirectory { .. }) => {
            return vec![Refusal::new(format!(
                "--output-dir: {e}; remove their write permission (chmod go-w {}), or choose another --output-dir",
                dir.display()
            ))];
        }
        Err(e) => {
            return vec![Refusal::new(format!(
                "--output-dir: {}; choose another --output-dir",
                file_problem(&e)
            ))];
        }
    }
    [SECRETS_FILE, TALOSCONFIG_FILE, KUBECONFIG_FILE, STATE_FILE]
        .iter()
        .filter_map(|f| private_file::read(&dir.join(f)).err())
        .map(|e| {
            Refusal::new(format!(
                "--output-dir: {}; remove {}, or choose another --output-dir",
                file_problem(&e),
                e.path().display()
            ))
        })
        .collect()
}

/// `--cert-fingerprint ADDRESS=FINGERPRINT`, by address; what is wrong with
/// any of them goes to `refused`.
fn pins(opts: &InitOptions, refused: &mut Vec<Refusal>) -> BTreeMap<String, Vec<CertFingerprint>> {
    let nodes: BTreeSet<&str> = opts
        .request
        .control_planes
        .iter()
        .chain(&opts.request.workers)
        .map(String::as_str)
        .collect();
    let mut pins: BTreeMap<String, Vec<CertFingerprint>> = BTreeMap::new();
    for arg in &opts.cert_fingerprints {
        let Some((address, text)) = arg.split_once('=') else {
            refused.push(Refusal::new(format!(
                "--cert-fingerprint {arg:?} is not ADDRESS=FINGERPRINT: give the node's address, '=', and the fingerprint its console shows"
            )));
            continue;
        };
        if !nodes.contains(address) {
            refused.push(Refusal::new(format!(
                "--cert-fingerprint {arg}: {address} is not a node of this init; name it with --control-plane or --worker, or drop the flag"
            )));
            continue;
        }
        match CertFingerprint::parse(text) {
            Ok(fp) => pins.entry(address.to_string()).or_default().push(fp),
            Err(e) => refused.push(Refusal::new(format!(
                "--cert-fingerprint {address}: {}",
                chain(&e)
            ))),
        }
    }
    pins
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
    .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))
}

/// What init remembers between runs (no secret): the plan it made, and the
/// SHA-256 of the bundle it wrote, so that a rerun reuses that bundle and no
/// other.
const STATE_FILE: &str = "init-plan.json";

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(flatten)]
    plan: InitPlan,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secrets_sha256: Option<String>,
}

fn read_state(dir: &Path) -> Option<State> {
    let bytes = private_file::read(&dir.join(STATE_FILE)).ok()??;
    serde_json::from_slice(&bytes).ok()
}

fn write_state(dir: &Path, plan: &InitPlan, secrets_sha256: String) -> Result<(), AdoptError> {
    let state = State {
        plan: plan.clone(),
        secrets_sha256: Some(secrets_sha256),
    };
    let bytes = serde_json::to_vec_pretty(&state).expect("the state serialises");
    write_private(&dir.join(STATE_FILE), &bytes)
}

/// Inspects every node (read-only), renders the Cilium manifest and plans;
/// writes nothing. Every refusal comes from here, all at once.
pub async fn plan(opts: &InitOptions) -> Result<(InitPlan, InitWrites, SecretsBundle), AdoptError> {
    let mut refused = Vec::new();
    let (bundle, source) = match bundle(opts) {
        Ok(found) => found,
        Err(AdoptError::Refused(r)) => {
            refused.extend(r);
            // A stand-in, so that the nodes are judged too, all at once.
            let b = SecretsBundle::generate()
                .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
            (b, String::new())
        }
        Err(e) => return Err(e),
    };
    refused.extend(check_output_dir(&opts.output_dir));
    let pins = pins(opts, &mut refused);
    let mut request = opts.request.clone();
    request.secrets_source = source;
    let addresses: Vec<String> = request
        .control_planes
        .iter()
        .chain(&request.workers)
        .cloned()
        .collect();
    let mut probes = Vec::new();
    let mut fingerprints = BTreeMap::new();
    for address in addresses {
        let (probe, fingerprint) = probe(opts, &bundle, &address).await;
        if let Some(fp) = fingerprint {
            if let Some(expected) = pins.get(&address)
                && !expected.contains(&fp)
            {
                let expected: Vec<String> = expected.iter().map(ToString::to_string).collect();
                refused.push(Refusal::new(format!(
                    "node {address} presents maintenance certificate fingerprint {fp}, not the {} --cert-fingerprint gives: another machine may answer at that address. Compare with the fingerprint the node's console shows; Ichor sends it nothing",
                    expected.join(" or ")
                )));
            }
            fingerprints.insert(address.clone(), fp);
        }
        probes.push(probe);
    }
    // Refusals that need no manifest come first, without running helm.
    if let Err(refusals) = init::plan(&request, &probes, &bundle, "") {
        return Err(AdoptError::Refused(
            refusals.into_iter().chain(refused).collect(),
        ));
    }
    if !refused.is_empty() {
        return Err(AdoptError::Refused(refused));
    }
    let manifest = cilium_manifest(opts, &request).await?;
    let (mut plan, writes) =
        init::plan(&request, &probes, &bundle, &manifest).map_err(AdoptError::Refused)?;
    for node in &mut plan.nodes {
        node.cert_fingerprint = fingerprints.get(&node.address).map(ToString::to_string);
    }
    Ok((plan, writes, bundle))
}

/// Ichor's pinned Cilium chart rendered with the values function of the
/// Helm release (`ichor_cilium::effective_values`), so the hand-over finds
/// the same values.
async fn cilium_manifest(opts: &InitOptions, request: &InitRequest) -> Result<String, AdoptError> {
    let cluster = init::talos_cluster(request, "v0.0.0", "v0.0.0");
    let nodes = u32::try_from(request.control_planes.len() + request.workers.len()).unwrap_or(1);
    let settings = ClusterSettings::from_cluster(&cluster, nodes)
        .map_err(|e| AdoptError::Refused(vec![Refusal::new(chain(&e))]))?;
    let values = effective_values(&settings)
        .map_err(|e| AdoptError::Refused(vec![Refusal::new(chain(&e))]))?;
    // No cluster exists yet: rendered offline, as `helm template` does.
    opts.helm
        .template(
            "cilium",
            "kube-system",
            &opts.cilium_chart,
            &serde_json::Value::Object(values),
        )
        .await
        .map_err(AdoptError::Render)
}

struct Run<'a> {
    opts: &'a InitOptions,
    operator: Arc<dyn Operator>,
    plan: InitPlan,
    writes: InitWrites,
    bundle: SecretsBundle,
    /// The maintenance certificate of each node the plan found in
    /// maintenance mode: its config goes only to that certificate.
    fingerprints: BTreeMap<String, CertFingerprint>,
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
    let mut fingerprints = BTreeMap::new();
    for n in &plan.nodes {
        if let Some(text) = &n.cert_fingerprint {
            let fp = CertFingerprint::parse(text)
                .map_err(|e| AdoptError::Wait(format!("node {}: {}", n.address, chain(&e))))?;
            fingerprints.insert(n.address.clone(), fp);
        }
    }
    let r = Run {
        opts,
        operator,
        plan,
        writes,
        bundle,
        fingerprints,
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use proptest::prelude::*;

    use super::*;

    /// A node's endpoint as init wrote it before the one endpoint type.
    fn old_endpoint(address: &str, port: u16) -> String {
        if address.contains(':') {
            format!("[{address}]:{port}")
        } else {
            format!("{address}:{port}")
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Init dials a node at the endpoint it wrote before: IPv4, IPv6,
        /// names and anything else, on any port.
        #[test]
        fn a_node_endpoint_is_written_as_before(
            address in prop_oneof![
                any::<std::net::IpAddr>().prop_map(|ip| ip.to_string()),
                "[a-zA-Z0-9.:\\[\\]/@ _-]{0,16}",
                any::<String>(),
            ],
            port in any::<u16>(),
        ) {
            let opts = InitOptions { talos_port: port, ..options(Path::new("/nonexistent")) };
            prop_assert_eq!(opts.endpoint(&address), old_endpoint(&address, port));
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn options(dir: &Path) -> InitOptions {
        InitOptions {
            request: InitRequest {
                cluster: "lab".into(),
                endpoint: "https://127.0.0.1:6443".into(),
                control_planes: vec!["127.0.0.1".into()],
                secrets_source: "generated".into(),
                ..Default::default()
            },
            output_dir: dir.to_path_buf(),
            with_secrets: None,
            cert_fingerprints: Vec::new(),
            talos_port: 50000,
            kube_api_timeout: Duration::from_secs(1),
            webhook_timeout: Duration::from_secs(1),
            poll_interval: Duration::from_millis(100),
            helm: Renderer::new("helm"),
            cilium_chart: ChartRef::path("cilium"),
            version: "v0.1.0".into(),
            controller_image: None,
        }
    }

    /// A file planted at the name init wrote through (`<file>.tmp`) keeps
    /// neither its mode nor a link: what init writes is 0600 and goes
    /// nowhere else.
    ///
    /// Covers: R18.1
    #[test]
    fn init_never_writes_through_a_planted_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let planted = dir.path().join("talosconfig.tmp");
        std::fs::write(&planted, b"planted").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        symlink(&victim, dir.path().join("kubeconfig.tmp")).unwrap();

        write_private(&dir.path().join(TALOSCONFIG_FILE), b"key").unwrap();
        write_private(&dir.path().join(KUBECONFIG_FILE), b"key").unwrap();
        assert_eq!(mode(&dir.path().join(TALOSCONFIG_FILE)), 0o600);
        assert_eq!(mode(&dir.path().join(KUBECONFIG_FILE)), 0o600);
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");

        // A link at the file itself is refused, not written through.
        let link = dir.path().join(SECRETS_FILE);
        symlink(&victim, &link).unwrap();
        assert!(write_private(&link, b"key").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
    }

    /// A `secrets.yaml` init did not write (no state of this init beside
    /// it) never becomes the cluster's PKI: refused, with the flag that
    /// uses it on purpose.
    ///
    /// Covers: R10.1
    #[test]
    fn a_planted_bundle_is_refused_unless_given_with_with_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let planted = SecretsBundle::generate().unwrap();
        let path = dir.path().join(SECRETS_FILE);
        std::fs::write(&path, planted.to_yaml().unwrap()).unwrap();
        let err = bundle(&options(dir.path())).map(|_| ()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("--with-secrets"), "{text}");

        // Given with --with-secrets, the same file is used on purpose.
        let mut opts = options(dir.path());
        opts.with_secrets = Some(planted.clone());
        opts.request.secrets_source = path.display().to_string();
        let (found, source) = bundle(&opts).unwrap();
        assert_eq!(found, planted);
        assert_eq!(source, path.display().to_string());
        // Another --with-secrets bundle than the one there is refused.
        opts.with_secrets = Some(SecretsBundle::generate().unwrap());
        let text = bundle(&opts).map(|_| ()).unwrap_err().to_string();
        assert!(
            text.contains("holds another bundle than --with-secrets"),
            "{text}"
        );
    }

    fn plan_of(cluster: &str) -> InitPlan {
        serde_json::from_value(serde_json::json!({
            "cluster": cluster, "namespace": "ichor-system", "endpoint": "https://127.0.0.1:6443",
            "talosVersion": "v1.13.9", "kubernetesVersion": "v1.36.0", "configShape": "v1alpha1",
            "tunnel": "vxlan", "kubeProxy": "enabled", "podSubnets": [], "serviceSubnets": [],
            "secrets": "generated", "patches": [], "bootstrapNode": "127.0.0.1", "nodes": []
        }))
        .unwrap()
    }

    /// The bundle init wrote (its digest in the state beside it) is reused
    /// by the rerun; the same file under another cluster's state is not.
    ///
    /// Covers: R10.3
    #[test]
    fn the_bundle_an_interrupted_init_wrote_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let opts = options(dir.path());
        let (first, source) = bundle(&opts).unwrap();
        assert_eq!(source, "generated");
        let yaml = first.to_yaml().unwrap();
        write_state(dir.path(), &plan_of("lab"), sha256_hex(yaml.as_bytes())).unwrap();
        private_file::write_once(&dir.path().join(SECRETS_FILE), yaml.as_bytes()).unwrap();
        let (again, source) = bundle(&opts).unwrap();
        assert_eq!(again, first);
        assert!(source.ends_with("(from an earlier run)"), "{source}");

        write_state(dir.path(), &plan_of("other"), sha256_hex(yaml.as_bytes())).unwrap();
        assert!(
            bundle(&opts).is_err(),
            "another cluster's bundle is not this init's"
        );
    }

    /// An output directory others may write to, or a link where a file goes,
    /// is refused before anything is written.
    ///
    /// Covers: R10.1
    #[test]
    fn a_shared_output_directory_or_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_output_dir(&dir.path().join("absent")).is_empty());
        assert!(check_output_dir(dir.path()).is_empty());
        symlink("/etc/hostname", dir.path().join(KUBECONFIG_FILE)).unwrap();
        let refused = check_output_dir(dir.path());
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].message.contains("is a symbolic link"),
            "{refused:?}"
        );

        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let refused = check_output_dir(&shared);
        assert!(refused[0].message.contains("chmod go-w"), "{refused:?}");
    }

    /// Each `--cert-fingerprint` is ADDRESS=FINGERPRINT of a node of this
    /// init, the fingerprint as a console shows it; anything else is refused.
    #[test]
    fn cert_fingerprints_are_judged() {
        let dir = tempfile::tempdir().unwrap();
        let fp = CertFingerprint::of_public_key_info(b"key");
        let mut opts = options(dir.path());
        opts.cert_fingerprints = vec![
            format!("127.0.0.1={fp}"),
            "127.0.0.1".into(),
            format!("10.0.0.9={fp}"),
            "127.0.0.1=abc".into(),
        ];
        let mut refused = Vec::new();
        let pins = pins(&opts, &mut refused);
        assert_eq!(pins.get("127.0.0.1"), Some(&vec![fp]));
        let text: Vec<&str> = refused.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].contains("is not ADDRESS=FINGERPRINT"), "{text:?}");
        assert!(
            text[1].contains("10.0.0.9 is not a node of this init"),
            "{text:?}"
        );
        assert!(
            text[2].contains("is not a certificate fingerprint"),
            "{text:?}"
        );
    }
}
