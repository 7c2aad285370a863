//! `ichor adopt` end to end: inspection → plan → consent → the write phases of
//! spec 1.5, each idempotent, so a rerun after a failure or a kill finishes
//! the job. The decisions are the pure functions of this crate; this module
//! only reads, asks, and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_api::{
    ClusterRef, DetectedCni, MachineRole, SecretsRef, TalosCluster, TalosMachine, TalosMachineSpec,
};
use ichor_cilium::{CiliumOptions, ClusterSettings, WaitOptions};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos_client::TalosClient;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::classify::{AdoptMode, Refusal, classify_cni, decide_mode};
use crate::gate::include_cilium_policies;
use crate::inspect::{self, InspectError};
use crate::inspection::KubeNode;
use crate::plan::{IchorPresence, Plan, PlanInput};
use crate::waits::{self, PodView, Verdict, WaitWatch};
use crate::{install, preconditions};

/// The field manager of every object adopt writes.
pub const FIELD_MANAGER: &str = "ichor-adopt";

/// Where the secrets bundle comes from.
#[derive(Debug, Clone)]
pub enum SecretsSource {
    /// `--secrets-bundle FILE`, already read.
    Bundle(Box<SecretsBundle>),
    /// `--recover-secrets --recover-from ADDR`: read from that control-plane node's config.
    Recover { from: String },
}

/// Everything `ichor adopt` was told.
#[derive(Clone)]
pub struct AdoptOptions {
    pub cluster: String,
    pub nodes: Vec<String>,
    pub secrets: Option<SecretsSource>,
    pub cni_unmanaged: bool,
    pub tunnel: Option<ichor_api::Tunnel>,
    pub cilium_values: Option<serde_json::Map<String, Value>>,
    pub require_ichor: bool,
    pub webhook_timeout: Duration,
    pub cilium_timeout: Duration,
    pub handover_timeout: Duration,
    /// How often waits poll (tests and the lab shorten it).
    pub poll_interval: Duration,
    pub cilium: CiliumOptions,
    /// The CLI's version, with its v.
    pub version: String,
    /// The controller image to install (default: Ichor's image of `version`).
    pub controller_image: Option<String>,
}

/// The operator's side of adopt: where lines go, and consent.
pub trait Operator: Send + Sync {
    /// A line of progress.
    fn say(&self, line: &str);
    /// Asks for consent to the plan; false ends adopt with nothing written.
    fn consent(&self, plan: &Plan) -> bool;
}

/// Why adopt stopped.
impl From<InspectError> for AdoptError {
    fn from(e: InspectError) -> Self {
        AdoptError::Inspect(Box::new(e))
    }
}

impl From<ichor_cilium::Error> for AdoptError {
    fn from(e: ichor_cilium::Error) -> Self {
        AdoptError::Cilium(Box::new(e))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("{}", .0.iter().map(|r| r.message.as_str()).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<Refusal>),
    #[error("adopt was not confirmed; nothing was written")]
    NotConfirmed,
    #[error(transparent)]
    Inspect(#[from] Box<InspectError>),
    #[error("the secrets bundle: {0}")]
    Secrets(String),
    #[error(
        "installing Cilium: {0}. Run ichor adopt again to continue: it picks up the release where it stopped"
    )]
    Cilium(#[from] Box<ichor_cilium::Error>),
    #[error("writing {what}: {source}. Run ichor adopt again to continue")]
    Write {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Wait(String),
}

/// What adopt did, with the time each phase took.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    pub phases: Vec<(String, f64)>,
}

struct Phases {
    start: Instant,
    outcome: Outcome,
}

impl Phases {
    fn done(&mut self, name: &str) {
        let secs = self.start.elapsed().as_secs_f64();
        let before: f64 = self.outcome.phases.iter().map(|(_, s)| s).sum();
        self.outcome.phases.push((name.to_string(), secs - before));
    }
}

/// Inspects, decides and plans; writes nothing.
pub async fn plan(
    talos: &TalosClient,
    kube: &kube::Client,
    opts: &AdoptOptions,
) -> Result<(Plan, crate::Inspection), AdoptError> {
    let (inspection, presence) = inspect::inspect(talos, &opts.nodes, kube).await?;
    let found = classify_cni(&inspection);
    let mode = decide_mode(&found, opts.cni_unmanaged).map_err(|r| AdoptError::Refused(vec![r]))?;
    let subnets = preconditions::check(&inspection, mode).map_err(AdoptError::Refused)?;
    check_presence(&presence, opts)?;
    let mut plan = Plan::new(
        PlanInput {
            cluster: opts.cluster.clone(),
            namespace: ichor_api::SYSTEM_NAMESPACE.to_string(),
            tunnel: opts.tunnel,
            ichor: presence,
        },
        &inspection,
        found,
        mode,
        subnets,
    );
    if mode == AdoptMode::CiliumAlreadyIchors {
        agree_with_record(kube, &mut plan, opts.tunnel.is_some()).await?;
    }
    Ok((plan, inspection))
}

fn check_presence(presence: &IchorPresence, opts: &AdoptOptions) -> Result<(), AdoptError> {
    match presence {
        IchorPresence::Absent if opts.require_ichor => {
            Err(AdoptError::Refused(vec![Refusal::new(
                "Ichor is not installed in this cluster and --require-ichor is set: install Ichor with Helm first",
            )]))
        }
        IchorPresence::Helm {
            release,
            namespace,
            version,
        } if *version != opts.version => Err(AdoptError::Refused(vec![Refusal::new(format!(
            "Ichor {version} is installed by Helm (release {release}) but this ichor is {cli}; they must be the same version. Upgrade Ichor first: helm upgrade {release} oci://ghcr.io/maeshinshin/charts/ichor --version {chart} --namespace {namespace} --reuse-values",
            cli = opts.version,
            chart = opts.version.trim_start_matches('v'),
        ))])),
        _ => Ok(()),
    }
}

/// R4.4c: a Cilium with Ichor's record (made by `ichor cni bootstrap` or an
/// interrupted adopt) is kept: its tunnel is read back, and the kube-proxy mode
/// the Talos side implies must agree with it.
async fn agree_with_record(
    kube: &kube::Client,
    plan: &mut Plan,
    tunnel_given: bool,
) -> Result<(), AdoptError> {
    let records = inspect::helm_records(kube, ichor_cilium::RELEASE_NAME).await?;
    let Some((_, record)) = records
        .into_iter()
        .find(|(ns, _)| ns == ichor_api::SYSTEM_NAMESPACE)
    else {
        return Ok(());
    };
    let (recorded_tunnel, recorded_kube_proxy) =
        ichor_cilium::recorded_settings(&record.config.clone().unwrap_or_default());
    if let Some(t) = recorded_tunnel {
        if tunnel_given && t != plan.tunnel {
            return Err(AdoptError::Refused(vec![Refusal::new(format!(
                "Ichor's Cilium release was installed with tunnel {}, but --tunnel {} was given; the tunnel cannot change on a running cluster. Run again with --tunnel {} or without --tunnel",
                t.as_str(),
                plan.tunnel.as_str(),
                t.as_str()
            ))]));
        }
        plan.tunnel = t;
    }
    if let Some(recorded) = recorded_kube_proxy
        && recorded != plan.kube_proxy
    {
        return Err(AdoptError::Refused(vec![Refusal::new(format!(
            "Ichor's Cilium release was installed for kube-proxy {}, but Talos says kube-proxy is {}. Run ichor cni bootstrap again with --kube-proxy {}, then ichor adopt",
            recorded.as_str(),
            plan.kube_proxy.as_str(),
            plan.kube_proxy.as_str()
        ))]));
    }
    Ok(())
}

/// Runs adopt: the plan, consent, then the write phases.
pub async fn adopt(
    talos: &TalosClient,
    kube: &kube::Client,
    opts: &AdoptOptions,
    operator: Arc<dyn Operator>,
) -> Result<Outcome, AdoptError> {
    let mut phases = Phases {
        start: Instant::now(),
        outcome: Outcome::default(),
    };
    let (plan, inspection) = plan(talos, kube, opts).await?;
    // Read the bundle before consent: a missing one must refuse with nothing written.
    let bundle = load_bundle(talos, opts).await?;
    phases.done("inspection");
    operator.say(&plan.text());
    if !operator.consent(&plan) {
        return Err(AdoptError::NotConfirmed);
    }

    let mut cluster = plan.talos_cluster(SecretsRef {
        name: secret_name(&opts.cluster),
        key: None,
    });
    if let Some(values) = &opts.cilium_values {
        cluster.spec.cni.cilium = Some(ichor_api::CiliumSpec {
            values: Some(Value::Object(values.clone())),
        });
    }
    let node_count = ichor_cilium::node_count_rule(inspection.kube.nodes.len(), 0);

    // Phase: Cilium first on a cluster with no CNI (and the rerun of one).
    if matches!(
        plan.mode,
        AdoptMode::InstallCilium | AdoptMode::CiliumAlreadyIchors
    ) {
        operator.say(&format!(
            "installing Cilium (tunnel {}, kube-proxy {}) as Ichor's Helm release cilium in kube-system, record in ichor-system",
            cluster.spec.cni.tunnel.as_str(),
            cluster.spec.cni.kube_proxy.as_str()
        ));
        let settings = ClusterSettings::from_cluster(&cluster, node_count)
            .map_err(|e| AdoptError::Refused(vec![Refusal::new(e.to_string())]))?;
        let mut cilium = opts.cilium.clone();
        // Adopt holds the CNI lock: no TalosMachine exists yet and the
        // controller cannot start a Job, so a pending record is a dead one (R5.6).
        cilium.apply.exclusive = true;
        let reporter = operator.clone();
        let wait = WaitOptions {
            timeout: opts.cilium_timeout,
            poll_interval: opts.poll_interval,
            on_progress: Some(Arc::new(move |left: &[String]| {
                reporter.say(&format!("waiting for Cilium: {}", left.join("; ")))
            })),
            ..WaitOptions::default()
        };
        let applied = ichor_cilium::bootstrap(kube.clone(), &cilium, &settings, &wait).await?;
        operator.say(&format!(
            "Cilium is installed (revision {}) and every node is Ready",
            applied.release.version
        ));
        phases.done("cilium");
    }

    // Phase: install Ichor unless it is already there.
    match &plan.ichor {
        IchorPresence::Absent => {
            operator.say(&format!("installing Ichor {}", opts.version));
            let image = opts
                .controller_image
                .clone()
                .unwrap_or_else(|| install::controller_image(&opts.version));
            install_ichor(kube, &opts.version, &image).await?;
            wait_crds_established(kube, opts).await?;
            create_or_keep(
                &Api::<ichor_api::IchorInstallation>::namespaced(
                    kube.clone(),
                    ichor_api::SYSTEM_NAMESPACE,
                ),
                &install::installation(&opts.version),
                "the IchorInstallation",
            )
            .await?;
        }
        IchorPresence::Installer { .. } => {
            operator.say("Ichor is already installed; not installing it again");
            // A run killed before the webhooks went in left them out.
            install_webhooks(kube, &opts.version).await?;
        }
        IchorPresence::Helm {
            release, version, ..
        } => operator.say(&format!(
            "Ichor is installed by Helm (release {release}, version {version}); not touching it"
        )),
    }
    // However Ichor came here, its webhooks judge the objects written next.
    wait_for_ichor(kube, opts, &cluster, &*operator).await?;
    operator.say("Ichor is running: the API server calls its webhooks");
    phases.done("install");

    // Phase: the policy gate, evaluated now (after the Cilium step on the no-CNI path).
    let detected = match plan.mode {
        AdoptMode::InstallCilium | AdoptMode::CiliumAlreadyIchors => DetectedCni::Cilium,
        _ => plan.found.detected(),
    };
    let crd_established = inspect::inspect_kube(kube)
        .await?
        .cilium_policy_crd_established;
    let gate = include_cilium_policies(detected, crd_established);
    match (&plan.ichor, gate.include) {
        (
            IchorPresence::Helm {
                release, namespace, ..
            },
            true,
        ) => {
            if !helm_enables_policies(kube, release, namespace).await? {
                operator.say("Ichor's Cilium policies are not enabled in its Helm release: set networkPolicy.cilium.enabled=true and run helm upgrade");
            }
        }
        (_, true) => {
            apply_objects(kube, &install::cilium_policies()).await?;
            operator.say("applied Ichor's Cilium network policies");
        }
        (_, false) => operator.say(&format!(
            "not applying Ichor's Cilium network policies: {}",
            gate.reason.as_deref().unwrap_or("the gate said no")
        )),
    }
    phases.done("policies");

    // Phase: the objects that describe the cluster.
    write_bundle(kube, &opts.cluster, &bundle).await?;
    let clusters = Api::<TalosCluster>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    create_or_keep(
        &clusters,
        &cluster,
        &format!("TalosCluster {}", opts.cluster),
    )
    .await?;
    // Spec 2.2: detected is cilium from the moment the Cilium step ends.
    clusters
        .patch_status(
            &opts.cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"cni": {"detected": detected}}})),
        )
        .await
        .map_err(|source| AdoptError::Write {
            what: format!("TalosCluster {} status", opts.cluster),
            source,
        })?;
    let machines = Api::<TalosMachine>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    for node in &inspection.talos {
        let mut m = TalosMachine::new(
            &node.hostname,
            TalosMachineSpec {
                cluster_ref: ClusterRef {
                    name: opts.cluster.clone(),
                },
                role: if node.facts.machine_type.is_control_plane() {
                    MachineRole::Controlplane
                } else {
                    MachineRole::Worker
                },
                address: node.address.clone(),
                hold: true,
                patches: vec![],
            },
        );
        m.metadata.labels = Some(BTreeMap::from([(
            "ichor.maesh.dev/cluster".to_string(),
            opts.cluster.clone(),
        )]));
        create_or_keep(&machines, &m, &format!("TalosMachine {}", node.hostname)).await?;
    }
    operator.say(&format!(
        "created the bundle Secret, TalosCluster {} and {} held TalosMachines",
        opts.cluster,
        inspection.talos.len()
    ));
    phases.done("objects");

    // Phase: the hand-over (managed Cilium only).
    if plan.mode.preset() == ichor_api::CniPreset::Cilium {
        wait_handover(kube, opts, &*operator).await?;
        operator.say("CNIHandover=True: Cilium is Ichor's");
    }
    phases.done("handover");

    // Phase: release the holds, machine by machine.
    for node in &inspection.talos {
        machines
            .patch(
                &node.hostname,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"hold": false}})),
            )
            .await
            .map_err(|source| AdoptError::Write {
                what: format!("TalosMachine {} hold", node.hostname),
                source,
            })?;
        operator.say(&format!("released the hold of {}", node.hostname));
    }
    phases.done("release");
    Ok(phases.outcome)
}

/// The bundle Secret's name.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-talos-secrets")
}

async fn load_bundle(
    talos: &TalosClient,
    opts: &AdoptOptions,
) -> Result<SecretsBundle, AdoptError> {
    match &opts.secrets {
        Some(SecretsSource::Bundle(b)) => Ok((**b).clone()),
        Some(SecretsSource::Recover { from }) => {
            let bytes = talos
                .machine_config(from)
                .await
                .map_err(|e| AdoptError::Secrets(format!("reading the machine config of {from}: {e}")))?;
            let cfg = ichor_talos::config::MachineConfig::parse_with_origin(
                &String::from_utf8_lossy(&bytes),
                &format!("node {from}"),
            )
            .map_err(|e| AdoptError::Secrets(e.to_string()))?;
            SecretsBundle::from_machine_config(&cfg, &format!("node {from}"))
                .map_err(|e| AdoptError::Secrets(format!("{e} (--recover-from must name a control-plane node)")))
        }
        None => Err(AdoptError::Secrets(
            "adopt needs the cluster's secrets bundle: pass --secrets-bundle FILE, or --recover-secrets --recover-from ADDR to read it from a control-plane node".into(),
        )),
    }
}

async fn write_bundle(
    kube: &kube::Client,
    cluster: &str,
    bundle: &SecretsBundle,
) -> Result<(), AdoptError> {
    let yaml = bundle
        .to_yaml()
        .map_err(|e| AdoptError::Secrets(e.to_string()))?;
    let mut secret = Secret {
        string_data: Some(BTreeMap::from([("secrets.yaml".to_string(), yaml)])),
        ..Default::default()
    };
    secret.metadata.name = Some(secret_name(cluster));
    secret.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.into());
    secret.metadata.labels = Some(BTreeMap::from([(
        "ichor.maesh.dev/cluster".to_string(),
        cluster.to_string(),
    )]));
    create_or_keep(
        &Api::<Secret>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE),
        &secret,
        &format!("Secret {}", secret_name(cluster)),
    )
    .await
}

/// Creates `obj`, keeping the one that exists (a rerun).
async fn create_or_keep<K>(api: &Api<K>, obj: &K, what: &str) -> Result<(), AdoptError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(AdoptError::Write {
            what: what.to_string(),
            source,
        }),
    }
}

/// Server-side applies arbitrary objects (the install manifest, the policies).
pub async fn apply_objects(kube: &kube::Client, objects: &[Value]) -> Result<(), AdoptError> {
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for obj in objects {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{kind} {name}");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(kube, &gvk)
            .await
            .map_err(|source| AdoptError::Write {
                what: what.clone(),
                source,
            })?;
        let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(kube.clone(), ns, &ar)
            }
            _ => Api::all_with(kube.clone(), &ar),
        };
        api.patch(name, &pp, &Patch::Apply(obj))
            .await
            .map_err(|source| AdoptError::Write { what, source })?;
    }
    Ok(())
}

async fn wait_crds_established(kube: &kube::Client, opts: &AdoptOptions) -> Result<(), AdoptError> {
    let api = Api::<CustomResourceDefinition>::all(kube.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|source| AdoptError::Write {
                what: "CustomResourceDefinitions".into(),
                source,
            })?;
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|c| c.spec.group == ichor_api::GROUP)
            .filter(|c| {
                !c.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
            })
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(AdoptError::Wait(format!(
                "Ichor's CRDs were not Established within 60s: {}",
                pending.join(", ")
            )));
        }
        tokio::time::sleep(opts.poll_interval).await;
    }
}

/// Applies the install manifest of Ichor `version` running `image`: every
/// object, then the webhooks' certificate (made once, kept on a rerun), then
/// the ValidatingWebhookConfiguration with that certificate's CA.
pub async fn install_ichor(
    kube: &kube::Client,
    version: &str,
    image: &str,
) -> Result<(), AdoptError> {
    let objects: Vec<Value> = install::install_objects(version, image)
        .into_iter()
        .filter(|o| o["kind"] != "ValidatingWebhookConfiguration")
        .collect();
    apply_objects(kube, &objects).await?;
    install_webhooks(kube, version).await
}

/// The webhooks' certificate (made once, kept) and the
/// ValidatingWebhookConfiguration with its CA.
async fn install_webhooks(kube: &kube::Client, version: &str) -> Result<(), AdoptError> {
    let mut configurations: Vec<Value> = install::install_objects(version, "unused")
        .into_iter()
        .filter(|o| o["kind"] == "ValidatingWebhookConfiguration")
        .collect();
    let ca = ensure_webhook_certificate(kube).await?;
    for c in &mut configurations {
        install::set_ca_bundle(c, &ca);
    }
    apply_objects(kube, &configurations).await
}

/// The webhooks' serving certificate: the Secret made once (a rerun keeps
/// the one that exists, which the controller may have been serving for a
/// while); returns its CA (PEM), which goes into the configuration's caBundle.
async fn ensure_webhook_certificate(kube: &kube::Client) -> Result<Vec<u8>, AdoptError> {
    let ns = ichor_api::SYSTEM_NAMESPACE;
    let what = format!("Secret {ns}/{}", install::WEBHOOK_CERT_SECRET);
    let secrets = Api::<Secret>::namespaced(kube.clone(), ns);
    let secret: Secret = serde_json::from_value(install::webhook_certificate(ns))
        .expect("the webhook certificate is a Secret");
    create_or_keep(&secrets, &secret, &what).await?;
    let stored = secrets
        .get(install::WEBHOOK_CERT_SECRET)
        .await
        .map_err(|source| AdoptError::Write {
            what: what.clone(),
            source,
        })?;
    stored
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .map(|b| b.0)
        .ok_or_else(|| {
            AdoptError::Wait(format!(
                "the {what} has no ca.crt, so the API server could not trust Ichor's webhooks: delete the Secret and run ichor adopt again to make a new certificate"
            ))
        })
}

/// The name of the TalosCluster the webhook wait asks the API server to
/// create with a dry run (nothing is ever stored under it).
pub const WEBHOOK_PROBE: &str = "ichor-webhook-probe";

/// A TalosCluster only Ichor's webhook refuses: `ipam.mode` is an
/// Ichor-owned Cilium value the CRD's CEL rules do not see (they cover the
/// top-level owned keys only).
pub fn webhook_probe(cluster: &TalosCluster) -> TalosCluster {
    let mut probe = TalosCluster::new(WEBHOOK_PROBE, cluster.spec.clone());
    probe.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.to_string());
    probe.spec.cni.preset = ichor_api::CniPreset::Cilium;
    probe.spec.cni.unmanaged = None;
    probe.spec.cni.cilium = Some(ichor_api::CiliumSpec {
        values: Some(json!({"ipam": {"mode": "cluster-pool"}})),
    });
    probe
}

/// Asks the API server to create the probe with a dry run: Ok when the API
/// server called Ichor's webhook and it refused the probe; otherwise why not.
async fn ask_the_webhooks(kube: &kube::Client, probe: &TalosCluster) -> Result<(), String> {
    let api = Api::<TalosCluster>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    let pp = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.to_string()),
    };
    match api.create(&pp, probe).await {
        Err(kube::Error::Api(e))
            if e.message.contains("denied the request") && e.message.contains("ipam.mode") =>
        {
            Ok(())
        }
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => Err(e.to_string()),
        Ok(_) => Err(format!(
            "the API server admitted a TalosCluster that Ichor's webhooks refuse: the ValidatingWebhookConfiguration {} does not call them",
            install::WEBHOOK_CONFIGURATION
        )),
    }
}

/// Decision 3: the bounded wait for Ichor's webhooks — until the API server
/// calls them and gets their answer — with the pods of ichor-system described
/// every 30 s and the no-pod-network early failure.
async fn wait_for_ichor(
    kube: &kube::Client,
    opts: &AdoptOptions,
    cluster: &TalosCluster,
    operator: &dyn Operator,
) -> Result<(), AdoptError> {
    let pods = Api::<Pod>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    let nodes = Api::<Node>::all(kube.clone());
    let mut watch = WaitWatch::new("Ichor's webhooks", opts.webhook_timeout);
    let probe = webhook_probe(cluster);
    let start = Instant::now();
    let read = |what: &'static str| {
        move |source| AdoptError::Write {
            what: what.into(),
            source,
        }
    };
    loop {
        let answer = match ask_the_webhooks(kube, &probe).await {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        let pod_views: Vec<PodView> = pods
            .list(&ListParams::default())
            .await
            .map_err(read("the pods of ichor-system"))?
            .items
            .iter()
            .map(PodView::from_pod)
            .collect();
        let node_views: Vec<KubeNode> = nodes
            .list(&ListParams::default())
            .await
            .map_err(read("the nodes"))?
            .items
            .iter()
            .map(inspect::kube_node)
            .collect();
        match watch.observe(start.elapsed(), &pod_views, &node_views) {
            Verdict::Waiting(lines) if lines.is_empty() => {}
            Verdict::Waiting(lines) => {
                lines.iter().for_each(|l| operator.say(l));
                operator.say(&format!(
                    "the API server's last call to the webhooks: {answer}"
                ));
            }
            Verdict::Failed(msg) if msg == waits::NO_POD_NETWORK => {
                return Err(AdoptError::Wait(msg));
            }
            Verdict::Failed(msg) => {
                return Err(AdoptError::Wait(format!(
                    "{msg}; the API server's last call to the webhooks: {answer}"
                )));
            }
        }
        tokio::time::sleep(opts.poll_interval).await;
    }
}

async fn wait_handover(
    kube: &kube::Client,
    opts: &AdoptOptions,
    operator: &dyn Operator,
) -> Result<(), AdoptError> {
    let clusters = Api::<TalosCluster>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    let start = Instant::now();
    let mut next_report = start;
    loop {
        let c = clusters
            .get(&opts.cluster)
            .await
            .map_err(|source| AdoptError::Write {
                what: format!("TalosCluster {}", opts.cluster),
                source,
            })?;
        let cond = c.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ichor_api::conditions::types::CNI_HANDOVER)
                .cloned()
        });
        if cond.as_ref().is_some_and(|c| c.status == "True") {
            return Ok(());
        }
        let state = cond
            .map(|c| format!("CNIHandover={} ({}: {})", c.status, c.reason, c.message))
            .unwrap_or_else(|| "the controller has not reported CNIHandover yet".into());
        if start.elapsed() >= opts.handover_timeout {
            return Err(AdoptError::Wait(format!(
                "the CNI hand-over did not finish within {} ({state})",
                waits::human(opts.handover_timeout)
            )));
        }
        if Instant::now() >= next_report {
            operator.say(&format!("waiting for the CNI hand-over: {state}"));
            next_report = Instant::now() + waits::REPORT_EVERY;
        }
        tokio::time::sleep(opts.poll_interval).await;
    }
}

async fn helm_enables_policies(
    kube: &kube::Client,
    release: &str,
    namespace: &str,
) -> Result<bool, AdoptError> {
    let records = inspect::helm_records(kube, release).await?;
    Ok(records
        .into_iter()
        .find(|(ns, _)| ns == namespace)
        .and_then(|(_, r)| r.config)
        .and_then(|c| {
            c.get("networkPolicy")?
                .get("cilium")?
                .get("enabled")?
                .as_bool()
        })
        .unwrap_or(false))
}
