//! `ichor adopt` end to end: inspection → plan → consent → the write phases
//! of R1.5a–f. Each phase is one function here, named as its entry of
//! [`Outcome::phases`], and idempotent (creates keep what exists, applies
//! are server-side, the Cilium step repairs its own release), so a rerun
//! after a failure or a kill finishes the job. The decisions are
//! `ichor-adopt`'s pure functions; this module only reads, asks, and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_adopt::install;
use ichor_adopt::plan::{IchorPresence, Plan, Request, held_machine};
use ichor_adopt::waits;
use ichor_adopt::{AdoptMode, Inspection, Refusal, include_cilium_policies};
use ichor_api::error_text::{chain, with_help};
use ichor_api::{DetectedCni, SecretsRef, TalosCluster, TalosMachine};
use ichor_cilium::{CiliumOptions, ClusterSettings, WaitOptions};
use ichor_helm::wait::{Wait, wait_until};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos_client::TalosClient;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::error::{self, AdoptError, wait_ended, writing};
use crate::ichor::{self, create_or_keep_as};
use crate::inspect;

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

impl AdoptOptions {
    /// What the plan depends on.
    fn request(&self) -> Request<'_> {
        Request {
            cluster: &self.cluster,
            tunnel: self.tunnel,
            cni_unmanaged: self.cni_unmanaged,
            require_ichor: self.require_ichor,
            version: &self.version,
            cilium_values: self.cilium_values.as_ref(),
        }
    }
}

/// The operator's side of adopt: where lines go, and consent.
pub trait Operator: Send + Sync {
    /// A line of progress.
    fn say(&self, line: &str);
    /// Asks for consent to the plan; false ends adopt with nothing written.
    fn consent(&self, plan: &Plan) -> bool;
}

/// What adopt did: each phase that ran, with the seconds it took.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    pub phases: Vec<(String, f64)>,
}

struct PhaseClock {
    start: Instant,
    outcome: Outcome,
}

impl PhaseClock {
    fn done(&mut self, name: &str) {
        let secs = self.start.elapsed().as_secs_f64();
        let before: f64 = self.outcome.phases.iter().map(|(_, s)| s).sum();
        self.outcome.phases.push((name.to_string(), secs - before));
    }
}

/// Inspects, decides and plans; writes nothing. Every refusal adopt can
/// make before consent is made here.
pub async fn plan(
    talos: &TalosClient,
    kube: &kube::Client,
    opts: &AdoptOptions,
) -> Result<(Plan, Inspection), AdoptError> {
    let (inspection, presence) = inspect::inspect(talos, &opts.nodes, kube).await?;
    let mut plan = ichor_adopt::plan::plan(&inspection, presence, &opts.request())
        .map_err(AdoptError::Refused)?;
    if plan.mode == AdoptMode::KeepIchorsCilium {
        agree_with_record(kube, &mut plan, opts.tunnel.is_some()).await?;
    }
    Ok((plan, inspection))
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

/// Runs adopt: the inspection and plan, consent, then the write phases in
/// the order of R1.5a–f. A new phase is a function below and one line here.
pub async fn adopt(
    talos: &TalosClient,
    kube: &kube::Client,
    opts: &AdoptOptions,
    operator: Arc<dyn Operator>,
) -> Result<Outcome, AdoptError> {
    let mut clock = PhaseClock {
        start: Instant::now(),
        outcome: Outcome::default(),
    };
    let a = inspection(talos, kube, opts, operator).await?;
    clock.done("inspection");
    consent(&a)?;
    if a.plan.mode.installs_cilium() {
        cilium(&a).await?;
        clock.done("cilium");
    }
    install(&a).await?;
    clock.done("install");
    let detected = policies(&a).await?;
    clock.done("policies");
    objects(&a, detected).await?;
    clock.done("objects");
    handover(&a).await?;
    clock.done("handover");
    release(&a).await?;
    clock.done("release");
    Ok(clock.outcome)
}

/// What the write phases share: what adopt read and decided before consent.
struct Adoption<'a> {
    kube: &'a kube::Client,
    opts: &'a AdoptOptions,
    operator: Arc<dyn Operator>,
    plan: Plan,
    inspection: Inspection,
    /// The TalosCluster built in memory (R1.4d): the Cilium phase installs
    /// from it and the objects phase writes it.
    cluster: TalosCluster,
    bundle: SecretsBundle,
}

impl Adoption<'_> {
    fn say(&self, line: &str) {
        self.operator.say(line);
    }
}

/// Phase `inspection`: the plan, and the bundle (read before consent: a
/// missing one must refuse with nothing written).
async fn inspection<'a>(
    talos: &TalosClient,
    kube: &'a kube::Client,
    opts: &'a AdoptOptions,
    operator: Arc<dyn Operator>,
) -> Result<Adoption<'a>, AdoptError> {
    let (plan, inspection) = plan(talos, kube, opts).await?;
    let bundle = load_bundle(talos, opts).await?;
    let mut cluster = plan.talos_cluster(SecretsRef {
        name: secret_name(&opts.cluster),
        key: None,
    });
    if let Some(values) = &opts.cilium_values {
        let values = Value::Object(values.clone());
        // The operator who runs adopt chose these values; whether they may
        // set privileged ones is the API server's to say (an admission
        // policy checks the annotation against the operator's rights).
        if !ichor_api::validation::privileged_values(&values).is_empty() {
            cluster
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    ichor_api::PRIVILEGED_VALUES_ANNOTATION.to_owned(),
                    "true".to_owned(),
                );
        }
        cluster.spec.cni.cilium = Some(ichor_api::CiliumSpec {
            values: Some(values),
        });
    }
    Ok(Adoption {
        kube,
        opts,
        operator,
        plan,
        inspection,
        cluster,
        bundle,
    })
}

/// The plan is printed and the operator asked; no means nothing is written.
fn consent(a: &Adoption) -> Result<(), AdoptError> {
    a.say(&a.plan.text());
    if a.operator.consent(&a.plan) {
        Ok(())
    } else {
        Err(AdoptError::NotConfirmed)
    }
}

/// Phase `cilium` (a cluster with no CNI, and the rerun of one): Ichor's
/// Cilium release through `ichor_cilium::bootstrap`, up to every node Ready.
async fn cilium(a: &Adoption<'_>) -> Result<(), AdoptError> {
    let cni = &a.cluster.spec.cni;
    a.say(&format!(
        "installing Cilium (tunnel {}, kube-proxy {}) as Ichor's Helm release cilium in kube-system, record in ichor-system",
        cni.tunnel.as_str(),
        cni.kube_proxy.as_str()
    ));
    let node_count = ichor_cilium::node_count_rule(a.inspection.kube.nodes.len(), 0);
    let settings = ClusterSettings::from_cluster(&a.cluster, node_count)
        .map_err(|e| AdoptError::Refused(vec![Refusal::new(chain(&e))]))?;
    let mut options: CiliumOptions = a.opts.cilium.clone();
    // Adopt holds the CNI lock: no TalosMachine exists yet and the
    // controller cannot start a Job, so a pending record is a dead one (R5.6).
    options.apply.exclusive = true;
    let reporter = a.operator.clone();
    let wait = WaitOptions {
        timeout: a.opts.cilium_timeout,
        poll_interval: a.opts.poll_interval,
        on_progress: Some(Arc::new(move |left: &[String]| {
            reporter.say(&format!("waiting for Cilium: {}", left.join("; ")))
        })),
        ..WaitOptions::default()
    };
    let applied = ichor_cilium::bootstrap(a.kube.clone(), &options, &settings, &wait).await?;
    a.say(&format!(
        "Cilium is installed (revision {}) and every node is Ready",
        applied.release.version
    ));
    Ok(())
}

/// Phase `install`: Ichor, unless it is already there; then, however Ichor
/// came here, the wait until its webhooks judge the objects written next.
async fn install(a: &Adoption<'_>) -> Result<(), AdoptError> {
    match &a.plan.ichor {
        IchorPresence::Absent => {
            a.say(&format!("installing Ichor {}", a.opts.version));
            let image = a
                .opts
                .controller_image
                .clone()
                .unwrap_or_else(|| install::controller_image(&a.opts.version));
            ichor::install_ichor(a.kube, &a.opts.version, &image).await?;
            ichor::wait_crds_established(a.kube, a.opts.poll_interval, &*a.operator).await?;
            create_or_keep_as(
                &Api::<ichor_api::IchorInstallation>::namespaced(
                    a.kube.clone(),
                    ichor_api::SYSTEM_NAMESPACE,
                ),
                &install::installation(&a.opts.version),
                "the IchorInstallation",
            )
            .await?;
        }
        IchorPresence::Installer { .. } => {
            a.say("Ichor is already installed; not installing it again");
            // A run killed before the webhooks went in left them out.
            ichor::install_webhooks(a.kube, &a.opts.version).await?;
        }
        IchorPresence::Helm {
            release, version, ..
        } => a.say(&format!(
            "Ichor is installed by Helm (release {release}, version {version}); not touching it"
        )),
    }
    ichor::wait_for_webhooks(
        a.kube,
        a.opts.webhook_timeout,
        a.opts.poll_interval,
        &a.cluster,
        &*a.operator,
    )
    .await?;
    a.say("Ichor is running: the API server calls its webhooks");
    Ok(())
}

/// Phase `policies`: the one gate, evaluated now on what runs now (after
/// the Cilium phase on the no-CNI path, R2.1c); returns the CNI the one
/// detector found, which the objects phase records.
async fn policies(a: &Adoption<'_>) -> Result<DetectedCni, AdoptError> {
    let now = inspect::inspect_kube(a.kube).await?;
    let detected = now.detected_cni();
    let gate = include_cilium_policies(detected, now.cilium_policy_crd_established);
    match (&a.plan.ichor, gate.include) {
        (
            IchorPresence::Helm {
                release, namespace, ..
            },
            true,
        ) => {
            if !helm_enables_policies(a.kube, release, namespace).await? {
                a.say("Ichor's Cilium policies are not enabled in its Helm release: set networkPolicy.cilium.enabled=true and run helm upgrade");
            }
        }
        (_, true) => {
            ichor::apply_objects(a.kube, &install::cilium_policies()).await?;
            a.say("applied Ichor's Cilium network policies");
        }
        (_, false) => a.say(&format!(
            "not applying Ichor's Cilium network policies: {}",
            gate.reason.as_deref().unwrap_or("the gate said no")
        )),
    }
    Ok(detected)
}

/// Phase `objects`: the bundle Secret, the TalosCluster (with the CNI
/// detected, R2.2) and the TalosMachines, held.
async fn objects(a: &Adoption<'_>, detected: DetectedCni) -> Result<(), AdoptError> {
    let name = &a.opts.cluster;
    write_bundle(a.kube, name, &a.bundle).await?;
    let clusters = Api::<TalosCluster>::namespaced(a.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    create_or_keep_as(&clusters, &a.cluster, &format!("TalosCluster {name}")).await?;
    clusters
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"cni": {"detected": detected}}})),
        )
        .await
        .map_err(writing(format!("TalosCluster {name} status")))?;
    let machines = Api::<TalosMachine>::namespaced(a.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    for node in &a.inspection.talos {
        let machine = held_machine(name, node);
        create_or_keep_as(
            &machines,
            &machine,
            &format!("TalosMachine {}", node.hostname),
        )
        .await?;
    }
    a.say(&format!(
        "created the bundle Secret, TalosCluster {name} and {} held TalosMachines",
        a.inspection.talos.len()
    ));
    Ok(())
}

/// Phase `handover` (managed Cilium only): the bounded wait until the
/// controller says `CNIHandover=True`.
async fn handover(a: &Adoption<'_>) -> Result<(), AdoptError> {
    if a.plan.mode.preset() != ichor_api::CniPreset::Cilium {
        return Ok(());
    }
    let clusters = Api::<TalosCluster>::namespaced(a.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    let report = |left: &[String]| {
        a.say(&format!(
            "waiting for the CNI hand-over: {}",
            left.join("; ")
        ))
    };
    let wait = Wait {
        why: "the CNI hand-over",
        timeout: a.opts.handover_timeout,
        poll_interval: a.opts.poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_yet = || async {
        let c = clusters
            .get(&a.opts.cluster)
            .await
            .map_err(writing(format!("TalosCluster {}", a.opts.cluster)))?;
        let cond = c.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ichor_api::conditions::types::CNI_HANDOVER)
                .cloned()
        });
        Ok(match cond {
            Some(c) if c.status == "True" => Vec::new(),
            Some(c) => vec![format!(
                "CNIHandover={} ({}: {})",
                c.status, c.reason, c.message
            )],
            None => vec!["the controller has not reported CNIHandover yet".to_string()],
        })
    };
    wait_ended(wait_until(&wait, not_yet).await, |pending| {
        format!(
            "the CNI hand-over did not finish within {} ({})",
            waits::human(a.opts.handover_timeout),
            pending.join("; ")
        )
    })?;
    a.say("CNIHandover=True: Cilium is Ichor's");
    Ok(())
}

/// Phase `release`: the holds, released machine by machine.
async fn release(a: &Adoption<'_>) -> Result<(), AdoptError> {
    let machines = Api::<TalosMachine>::namespaced(a.kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    for node in &a.inspection.talos {
        machines
            .patch(
                &node.hostname,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"hold": false}})),
            )
            .await
            .map_err(writing(format!("TalosMachine {} hold", node.hostname)))?;
        a.say(&format!("released the hold of {}", node.hostname));
    }
    Ok(())
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
                .map_err(error::talos(format!("reading the machine config of {from}")))?;
            let cfg = ichor_talos::config::MachineConfig::parse_with_origin(
                &String::from_utf8_lossy(&bytes),
                &format!("node {from}"),
            )
            .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
            SecretsBundle::from_machine_config(&cfg, &format!("node {from}")).map_err(|e| {
                AdoptError::Secrets(format!(
                    "{} (--recover-from must name a control-plane node)",
                    chain(&e)
                ))
            })
        }
        None => Err(AdoptError::Secrets(
            "adopt needs the cluster's secrets bundle: pass --secrets-bundle FILE, or --recover-secrets --recover-from ADDR to read it from a control-plane node".into(),
        )),
    }
}

pub(crate) async fn write_bundle(
    kube: &kube::Client,
    cluster: &str,
    bundle: &SecretsBundle,
) -> Result<(), AdoptError> {
    let yaml = bundle
        .to_yaml()
        .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
    let mut secret = Secret {
        string_data: Some(BTreeMap::from([("secrets.yaml".to_string(), yaml)])),
        ..Default::default()
    };
    secret.metadata.name = Some(secret_name(cluster));
    secret.metadata.namespace = Some(ichor_api::SYSTEM_NAMESPACE.into());
    secret.metadata.labels = Some(BTreeMap::from([(
        ichor_adopt::plan::CLUSTER_LABEL.to_string(),
        cluster.to_string(),
    )]));
    create_or_keep_as(
        &Api::<Secret>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE),
        &secret,
        &format!("Secret {}", secret_name(cluster)),
    )
    .await
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
