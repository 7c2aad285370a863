//! The TalosMachine reconciler.
//!
//! read (cluster, bundle, node's live config) → render → drift → status, and,
//! when the machine is not held and class B is the highest class of drift
//! left, apply in no-reboot mode, read back and record. Class C is never
//! applied: a condition says which paths, why, and what the operator can do.
//! Only `status` is ever written (server-side apply of the status
//! subresource); `spec` and `metadata.generation` are never touched.
//!
//! Objects are watched through [`DeserializeGuard`]: a TalosMachine that
//! cannot be read as the type becomes an error on that object (logged,
//! counted, an Event) and the others keep reconciling.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use ichor_api::conditions::{self, Status, reasons, types};
use ichor_api::{DriftClass, TalosCluster, TalosMachine, TalosMachineStatus};
use ichor_render::{Drift, RenderInput};
use ichor_talos::config::{MachineConfig, ParsedConfig};
use ichor_talos_client::{ApplyMode, ApplyRequest, ClientOptions, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt as _, watcher};

use crate::pipeline;
use crate::{Context, Error, Result};

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosmachine";

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the TalosMachine controller until `shutdown`. Its watch of the
/// TalosClusters fills `clusters` (the store [`Context::clusters`] reads).
pub(crate) async fn run(
    ctx: Arc<Context>,
    clusters: pipeline::Filler<DeserializeGuard<TalosCluster>>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ns = ctx.config.namespace.as_deref();
    let machines: Api<DeserializeGuard<TalosMachine>> = api(&ctx.client, ns);
    let cluster_api: Api<DeserializeGuard<TalosCluster>> = api(&ctx.client, ns);
    // Our own status writes come back as events too; the reconcile that
    // follows finds its inputs unchanged and returns before any read.
    let (store, writer) = kube::runtime::reflector::store();
    let machine_events = watcher(machines, watcher::Config::default())
        .default_backoff()
        .modify(pipeline::forget_managed_fields::<DeserializeGuard<TalosMachine>>)
        .reflect(writer)
        .applied_objects();
    let controller = Controller::for_stream(machine_events, store.clone()).with_config(
        kube::runtime::controller::Config::default().concurrency(ctx.config.machine_concurrency),
    );
    let cluster_store = ctx.clusters.store.clone();
    let cluster_trigger =
        clusters.fill(watcher(cluster_api, watcher::Config::default()).default_backoff());
    // A cluster's status changes with every machine that becomes Ready;
    // its machines are reconciled again only when what their render
    // depends on changed, or the cluster is gone.
    let seen = pipeline::ChangeFilter::<ClusterInputs>::default();
    let drive = controller
        .watches_stream(cluster_trigger, move |c: DeserializeGuard<TalosCluster>| {
            let Ok(c) = c.0 else {
                return Vec::new();
            };
            let ns = c.namespace();
            let name = c.name_any();
            let r = ObjectRef::<DeserializeGuard<TalosCluster>>::new(&name)
                .within(ns.as_deref().unwrap_or_default());
            let now = cluster_store
                .get(&r)
                .is_some()
                .then(|| ClusterInputs::of(&c));
            if seen.changed(r.to_string(), now).is_none() {
                return Vec::new();
            }
            store
                .state()
                .into_iter()
                .filter(|m| {
                    m.0.as_ref()
                        .is_ok_and(|m| m.namespace() == ns && m.spec.cluster_ref.name == name)
                })
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(guarded_reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "TalosMachine reconcile");
            }
        });
    crate::drive_until_stopped("TalosMachine", drive, stop).await;
}

/// [`reconcile`] behind the unwind boundary: a panic fails this object only.
async fn guarded_reconcile(
    obj: Arc<DeserializeGuard<TalosMachine>>,
    ctx: Arc<Context>,
) -> Result<Action> {
    pipeline::unwind_boundary(ctx.clone(), obj.clone(), reconcile(obj, ctx)).await
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosMachine>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    pipeline::error_policy(CONTROLLER, obj, error, ctx)
}

async fn publish(
    ctx: &Context,
    meta: &kube::api::ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    pipeline::publish_on(ctx, "TalosMachine", meta, type_, reason, note).await;
}

/// Read → decide → write. The read of the node and the apply are
/// interleaved with pure decisions in [`observe_and_act`]; the conditions
/// around it ([`held_condition`], [`ready_condition`]) are pure too.
async fn reconcile(obj: Arc<DeserializeGuard<TalosMachine>>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let machine = pipeline::readable(&ctx, &obj).await?;
    let generation = machine.metadata.generation;
    let mut status = machine.status.clone().unwrap_or_default();
    let now = (ctx.clock)();
    conditions::set(
        &mut status.conditions,
        held_condition(machine.spec.hold, generation, &now),
    );

    // Our own status writes come back as watch events, and so do the
    // cluster's status changes; a machine whose inputs did not change since
    // its last successful reconcile waits for its resync instead of reading
    // the node again.
    let (outcome, key) = match read_cluster(machine, &ctx).await {
        Ok(cluster) => {
            let key = ReconcileInputs::of(machine, &cluster);
            if let Some(left) = ctx.recent_successes.fresh(&key, ctx.config.resync) {
                return Ok(Action::requeue(left));
            }
            (
                observe_and_act(machine, &cluster, &ctx, &mut status, &now).await,
                Some(key),
            )
        }
        Err(e) => (Err(e), None),
    };
    let ready = ready_condition(machine, &status, outcome.as_ref().map(|_| ()), &now);
    let event = match &outcome {
        Ok(Some((reason, note))) => Some((EventType::Normal, *reason, note.clone())),
        Ok(None) => None,
        Err(e) => Some((EventType::Warning, ready.reason.as_str(), e.to_string())),
    }
    .map(|(t, r, n)| (t, r.to_owned(), n));
    conditions::set(&mut status.conditions, ready);
    if let Some((type_, reason, note)) = event {
        publish(&ctx, &machine.metadata, type_, &reason, note).await;
    }
    status.observed_generation = generation;
    let namespace = machine.namespace().unwrap_or_default();
    pipeline::write_status::<TalosMachine>(&ctx.client, &namespace, &machine.name_any(), &status)
        .await?;
    match (outcome, key) {
        (Ok(_), Some(key)) => {
            ctx.recent_successes.mark(key);
            Ok(Action::requeue(ctx.config.resync))
        }
        (Ok(_), None) => Ok(Action::requeue(ctx.config.resync)),
        (Err(e), _) => Err(e),
    }
}

/// `Held` from `spec.hold`.
pub fn held_condition(hold: bool, generation: Option<i64>, now: &Time) -> Condition {
    if hold {
        conditions::new(
            types::HELD,
            Status::True,
            reasons::HOLD_SET,
            "spec.hold is true: Ichor computes the drift and writes nothing to this node; set spec.hold: false to let Ichor apply class B drift",
            generation,
            now.clone(),
        )
    } else {
        conditions::new(
            types::HELD,
            Status::False,
            reasons::RELEASED,
            "spec.hold is false: Ichor applies class B drift to this node in no-reboot mode; class C drift is never applied on its own",
            generation,
            now.clone(),
        )
    }
}

/// `Ready` after a reconcile: True with what was read, or False with the
/// reason of the error.
pub fn ready_condition(
    machine: &TalosMachine,
    status: &TalosMachineStatus,
    outcome: std::result::Result<(), &Error>,
    now: &Time,
) -> Condition {
    let generation = machine.metadata.generation;
    match outcome {
        Ok(()) => conditions::new(
            types::READY,
            Status::True,
            reasons::RECONCILED,
            format!(
                "node {} read (Talos {}); {} drift entr{}",
                machine.spec.address,
                status.talos_version.as_deref().unwrap_or("unknown"),
                status.drift.len(),
                if status.drift.len() == 1 { "y" } else { "ies" }
            ),
            generation,
            now.clone(),
        ),
        Err(e) => conditions::new(
            types::READY,
            Status::False,
            ready_reason(e),
            e.to_string(),
            generation,
            now.clone(),
        ),
    }
}

/// The `Ready=False` reason of a reconcile error.
pub fn ready_reason(e: &Error) -> &'static str {
    match e {
        Error::ClusterNotFound { .. } => reasons::CLUSTER_NOT_FOUND,
        Error::Bundle { .. } => reasons::BUNDLE_UNAVAILABLE,
        Error::Talos { .. } => reasons::NODE_UNREACHABLE,
        Error::LiveConfig { .. } | Error::Render(_) => reasons::RENDER_FAILED,
        _ => reasons::API_ERROR,
    }
}

/// The machine's TalosCluster: from the store the cluster watch fills, or,
/// when the store does not have it (yet) or cannot read it, from the API.
async fn read_cluster(machine: &TalosMachine, ctx: &Context) -> Result<TalosCluster> {
    let namespace = machine.namespace().unwrap_or_default();
    let cluster_name = &machine.spec.cluster_ref.name;
    if ctx.clusters.ready().await
        && let Some(guarded) = ctx
            .clusters
            .store
            .get(&ObjectRef::new(cluster_name).within(&namespace))
        && let Ok(cluster) = &guarded.0
    {
        return Ok(cluster.clone());
    }
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(cluster_name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosCluster {namespace}/{cluster_name}"
        )))?
        .ok_or_else(|| Error::ClusterNotFound {
            namespace: namespace.clone(),
            machine: machine.name_any(),
            cluster: cluster_name.clone(),
        })
}

fn handover(c: &TalosCluster) -> bool {
    c.status
        .as_ref()
        .is_some_and(|s| conditions::inline_cni_dropped(&s.conditions))
}

/// What of a TalosCluster its machines' reconciles depend on (its status
/// is Ready aggregated from them, which they do not read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterInputs {
    uid: String,
    generation: Option<i64>,
    handover: bool,
}

impl ClusterInputs {
    pub(crate) fn of(cluster: &TalosCluster) -> Self {
        ClusterInputs {
            uid: cluster.uid().unwrap_or_default(),
            generation: cluster.metadata.generation,
            handover: handover(cluster),
        }
    }
}

/// What a machine's reconcile depends on, apart from the node itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReconcileInputs {
    uid: String,
    generation: Option<i64>,
    cluster: ClusterInputs,
}

impl ReconcileInputs {
    fn of(machine: &TalosMachine, cluster: &TalosCluster) -> Self {
        ReconcileInputs {
            uid: machine.uid().unwrap_or_default(),
            generation: machine.metadata.generation,
            cluster: ClusterInputs::of(cluster),
        }
    }
}

/// When each machine was last reconciled successfully, and with which inputs.
#[derive(Debug, Default)]
pub(crate) struct RecentSuccesses {
    seen:
        std::sync::Mutex<std::collections::HashMap<String, (ReconcileInputs, std::time::Instant)>>,
}

impl RecentSuccesses {
    /// The time left before the resync when nothing changed since the last success.
    fn fresh(
        &self,
        key: &ReconcileInputs,
        resync: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (k, at) = seen.get(&key.uid)?;
        let elapsed = at.elapsed();
        (k == key && elapsed < resync).then(|| resync - elapsed)
    }

    fn mark(&self, key: ReconcileInputs) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Deleted machines leave entries behind; drop the old ones now and then.
        if seen.len() >= 4096 {
            seen.retain(|_, (_, at)| at.elapsed() < std::time::Duration::from_secs(3600));
        }
        seen.insert(key.uid.clone(), (key, std::time::Instant::now()));
    }
}

/// `host:port` to dial for `address` (the Talos port added when absent).
pub fn endpoint(address: &str, port: u16) -> String {
    let a = address.trim();
    let has_port = if let Some(rest) = a.strip_prefix('[') {
        rest.contains("]:")
    } else {
        a.matches(':').count() == 1
    };
    if has_port {
        a.to_owned()
    } else if a.starts_with('[') && a.ends_with(']') {
        // An IPv6 address in brackets without a port: brackets once.
        format!("{a}:{port}")
    } else if a.contains(':') {
        format!("[{a}]:{port}")
    } else {
        format!("{a}:{port}")
    }
}

/// The reason and note of an Event a reconcile publishes.
type Note = (&'static str, String);

/// Reads the node, decides on the drift ([`decide_apply`]), and applies
/// when that says so. Returns the Event of an apply (or of an apply given
/// up because the machine changed), if there was one.
async fn observe_and_act(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let address = machine.spec.address.clone();
    let talos = ctx
        .credentials
        .talos_client(
            &ctx.client,
            cluster,
            &endpoint(&address, ctx.config.talos_port),
            ClientOptions {
                call_timeout: ctx.config.talos_call_timeout,
                ..ClientOptions::default()
            },
        )
        .await?
        .map_err(|e| talos_error(machine, e))?;
    let version = talos
        .version("")
        .await
        .map_err(|e| talos_error(machine, e))?;
    status.talos_version = Some(version.tag.clone());
    let live = read_live(&talos, machine).await?;
    match decide_apply(machine, cluster, &live, status, now)? {
        Some(plan) => apply_and_read_back(machine, &talos, ctx, &plan, status, now).await,
        None => Ok(None),
    }
}

/// The names of the inline manifests of a config (what the TalosCluster's
/// hand-over waits on; the contents stay on the node).
pub fn inline_manifest_names(config: &MachineConfig) -> Vec<String> {
    config
        .facts()
        .inline_manifests
        .into_iter()
        .map(|m| m.name)
        .collect()
}

/// A class B apply [`decide_apply`] chose.
#[derive(Debug, Clone)]
pub struct ApplyPlan {
    /// The rendered config, as applied.
    pub desired_yaml: String,
    /// The rendered config, to compare the read-back with.
    pub desired: MachineConfig,
    /// The class B paths the apply brings to the render.
    pub paths: Vec<String>,
}

/// The decision on a node's live config: renders, compares, writes the
/// drift and `Drifted` into `status`, and says whether to apply. A held
/// machine gets no apply; class C drift gets none either and says why in
/// `Applied`; only class B left on a released machine is applied.
pub fn decide_apply(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    live: &ParsedConfig,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<ApplyPlan>> {
    let generation = machine.metadata.generation;
    let render = ichor_render::render_machine_from(
        &RenderInput::from_objects(cluster, machine, &live.config),
        &live.mappings,
    )?;
    status.config_hash = Some(render.hash.clone());
    status.inline_manifests = Some(inline_manifest_names(&live.config));
    let drift = &render.drift;
    status.drift = drift.entries.clone();
    conditions::set(&mut status.conditions, drifted(drift, generation, now));

    if machine.spec.hold {
        return Ok(None);
    }
    if drift.max_class() == Some(DriftClass::C) {
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::APPLIED,
                Status::False,
                reasons::UNSAFE_DRIFT,
                format!("not applied: {}", class_c_message(drift)),
                generation,
                now.clone(),
            ),
        );
        return Ok(None);
    }
    if !drift.is_applicable() {
        return Ok(None);
    }
    let paths = drift
        .of_class(DriftClass::B)
        .map(|e| e.path.clone())
        .collect();
    // The YAML only now: a reconcile that applies nothing never writes it.
    let desired_yaml = render.yaml()?;
    Ok(Some(ApplyPlan {
        desired_yaml,
        desired: render.config(),
        paths,
    }))
}

/// Whether the machine as it is now (`current`, read from the API server
/// right before the apply) still allows the apply decided on `read` (the
/// object the reconcile started from). The hold can be taken back, or the
/// spec changed, while Ichor talks to the node; `None` when neither
/// happened, else the `Applied=False` condition saying why nothing was
/// written.
pub fn still_released(
    read: &TalosMachine,
    current: &TalosMachine,
    now: &Time,
) -> Option<Condition> {
    let generation = current.metadata.generation;
    if current.spec.hold {
        return Some(conditions::new(
            types::APPLIED,
            Status::False,
            reasons::HOLD_TAKEN_BACK,
            "not applied: spec.hold was set to true while Ichor was reading the node, so nothing was written to it; set spec.hold: false to let Ichor apply class B drift",
            generation,
            now.clone(),
        ));
    }
    if current.uid() != read.uid() || generation != read.metadata.generation {
        return Some(conditions::new(
            types::APPLIED,
            Status::False,
            reasons::SPEC_CHANGED,
            format!(
                "not applied: the TalosMachine changed (generation {} to {}) while Ichor was reading the node, so nothing was written to it; the next reconcile renders the new spec",
                read.metadata.generation.unwrap_or_default(),
                generation.unwrap_or_default()
            ),
            generation,
            now.clone(),
        ));
    }
    None
}

/// The TalosMachine as the API server has it now (a quorum read, not the
/// watch cache).
async fn read_machine_now(machine: &TalosMachine, ctx: &Context) -> Result<TalosMachine> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace)
        .get(&name)
        .await
        .map_err(Error::kube(format!(
            "reading TalosMachine {namespace}/{name} again before the apply"
        )))
}

/// Applies `plan` in no-reboot mode, reads the config back and records
/// the outcome ([`read_back_condition`]). Right before the apply the
/// machine is read again: a hold taken back (or a spec changed) since the
/// reconcile's read means no apply ([`still_released`]).
async fn apply_and_read_back(
    machine: &TalosMachine,
    talos: &TalosClient,
    ctx: &Context,
    plan: &ApplyPlan,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<Note>> {
    let generation = machine.metadata.generation;
    let current = read_machine_now(machine, ctx).await?;
    if let Some(refused) = still_released(machine, &current, now) {
        let note = (
            if refused.reason == reasons::HOLD_TAKEN_BACK {
                reasons::HOLD_TAKEN_BACK
            } else {
                reasons::SPEC_CHANGED
            },
            refused.message.clone(),
        );
        conditions::set(&mut status.conditions, refused);
        return Ok(Some(note));
    }
    let request = ApplyRequest::new(plan.desired_yaml.clone().into_bytes(), ApplyMode::NoReboot);
    if let Err(e) = talos.apply_configuration("", &request).await {
        ctx.metrics.applied("failed");
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::APPLIED,
                Status::False,
                reasons::APPLY_FAILED,
                format!(
                    "the node refused the no-reboot apply of {}: {e}; Ichor retries; check the node with talosctl",
                    plan.paths.join(", ")
                ),
                generation,
                now.clone(),
            ),
        );
        return Err(talos_error(machine, e));
    }
    tracing::info!(machine = %format!("{}/{}", machine.namespace().unwrap_or_default(), machine.name_any()), paths = ?plan.paths, "applied class B drift in no-reboot mode");
    let read_back = read_live(talos, machine).await?.config;
    status.inline_manifests = Some(inline_manifest_names(&read_back));
    let after = ichor_render::compare(&read_back, &plan.desired)?;
    status.drift = after.entries.clone();
    conditions::set(&mut status.conditions, drifted(&after, generation, now));
    let read_back_yaml = read_back
        .to_yaml()
        .map_err(|e| live_config_error(machine, e.to_string()))?;
    let hash = status.config_hash.clone().unwrap_or_default();
    let (applied, note) =
        read_back_condition(plan, &read_back_yaml, &after, &hash, generation, now);
    ctx.metrics.applied(if applied.status == "True" {
        "applied"
    } else {
        "read_back_mismatch"
    });
    conditions::set(&mut status.conditions, applied);
    Ok(note.map(|n| (reasons::APPLIED, n)))
}

/// `Applied` after the read-back, and the note of a successful apply. Equal
/// bytes, or (a node that re-encodes what it stores) equal on every path:
/// both are a successful read-back; the message says which.
pub fn read_back_condition(
    plan: &ApplyPlan,
    read_back_yaml: &str,
    after: &Drift,
    hash: &str,
    generation: Option<i64>,
    now: &Time,
) -> (Condition, Option<String>) {
    let same_bytes = read_back_yaml == plan.desired_yaml;
    if same_bytes || after.entries.is_empty() {
        let how = if same_bytes {
            "the config read back equals the render"
        } else {
            "the config read back equals the render on every path (the node serialises it differently)"
        };
        let note = format!(
            "applied {} in no-reboot mode; {how} (config hash {hash})",
            plan.paths.join(", ")
        );
        let c = conditions::new(
            types::APPLIED,
            Status::True,
            reasons::APPLIED,
            note.clone(),
            generation,
            now.clone(),
        );
        return (c, Some(note));
    }
    let paths: Vec<&str> = after.entries.iter().map(|e| e.path.as_str()).collect();
    let c = conditions::new(
        types::APPLIED,
        Status::False,
        reasons::READ_BACK_MISMATCH,
        format!(
            "applied in no-reboot mode, but the config read back differs from the render at {}; status.drift shows the values; check the node with talosctl get machineconfig",
            paths.join(", ")
        ),
        generation,
        now.clone(),
    );
    (c, None)
}

fn talos_error(machine: &TalosMachine, source: ichor_talos_client::Error) -> Error {
    Error::Talos {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        source: Box::new(source),
    }
}

fn live_config_error(machine: &TalosMachine, reason: String) -> Error {
    Error::LiveConfig {
        namespace: machine.namespace().unwrap_or_default(),
        machine: machine.name_any(),
        address: machine.spec.address.clone(),
        reason,
    }
}

async fn read_live(talos: &TalosClient, machine: &TalosMachine) -> Result<ParsedConfig> {
    let bytes = talos
        .machine_config("")
        .await
        .map_err(|e| talos_error(machine, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| live_config_error(machine, "the config is not UTF-8".into()))?;
    let origin = format!("the live config of node {}", machine.spec.address);
    ParsedConfig::parse_with_origin(&text, &origin)
        .map_err(|e| live_config_error(machine, e.to_string()))
}

/// The `Drifted` condition for a drift.
pub fn drifted(drift: &Drift, generation: Option<i64>, now: &Time) -> Condition {
    match drift.max_class() {
        None | Some(DriftClass::A) => conditions::new(
            types::DRIFTED,
            Status::False,
            reasons::NO_DRIFT,
            "the node runs the desired config (no drift, or only class A)",
            generation,
            now.clone(),
        ),
        Some(DriftClass::B) => {
            let paths: Vec<&str> = drift
                .of_class(DriftClass::B)
                .map(|e| e.path.as_str())
                .collect();
            conditions::new(
                types::DRIFTED,
                Status::True,
                reasons::SAFE_DRIFT,
                format!(
                    "class B drift at {}: Ichor applies it without a reboot once spec.hold is false",
                    paths.join(", ")
                ),
                generation,
                now.clone(),
            )
        }
        Some(DriftClass::C) => conditions::new(
            types::DRIFTED,
            Status::True,
            reasons::UNSAFE_DRIFT,
            class_c_message(drift),
            generation,
            now.clone(),
        ),
    }
}

/// Which class C paths block the apply, why, and what the operator can do.
pub fn class_c_message(drift: &Drift) -> String {
    let items: Vec<String> = drift
        .of_class(DriftClass::C)
        .map(|e| match &e.reason {
            Some(r) => format!("{} ({r})", e.path),
            None => e.path.clone(),
        })
        .collect();
    format!(
        "class C drift at {}; Ichor never applies class C on its own, and while it is there it applies nothing else to this node either. To resolve it: make the spec (TalosCluster, spec.patches) match what the node runs, or make the change yourself with talosctl after review (a Kubernetes version change is a TalosOperation of kind kubernetes-upgrade)",
        items.join("; ")
    )
}

#[cfg(test)]
mod decide_tests {
    //! The TalosMachine decisions from YAML fixtures (`src/fixtures/`, and
    //! a real Talos v1.12 control-plane config from ichor-render's
    //! fixtures as the live config), with an injected clock.

    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    fn cluster() -> TalosCluster {
        serde_yaml_ng::from_str(include_str!("fixtures/cluster-base.yaml")).expect("fixture")
    }

    fn machine(hold: bool, extra_patch: Option<&str>) -> TalosMachine {
        let mut m: TalosMachine =
            serde_yaml_ng::from_str(include_str!("fixtures/machine-base-labels.yaml"))
                .expect("fixture");
        m.spec.hold = hold;
        if let Some(inline) = extra_patch {
            m.spec.patches.push(ichor_api::MachinePatch {
                name: "extra".into(),
                inline: inline.into(),
            });
        }
        m
    }

    fn live() -> ParsedConfig {
        ParsedConfig::parse_with_origin(
            include_str!("../../ichor-render/tests/fixtures/v1.12-cni-none-controlplane.yaml"),
            "fixture",
        )
        .expect("fixture parses")
    }

    fn reason(status: &TalosMachineStatus, type_: &str) -> Option<String> {
        conditions::find(&status.conditions, type_).map(|c| c.reason.clone())
    }

    /// [`decide_apply`] on the fixtures' live config from an empty status.
    fn decide(machine: &TalosMachine) -> (Option<ApplyPlan>, TalosMachineStatus) {
        let mut status = TalosMachineStatus::default();
        let plan =
            decide_apply(machine, &cluster(), &live(), &mut status, &at(5)).expect("decides");
        (plan, status)
    }

    /// Covers: R1.6
    #[test]
    fn class_b_on_a_released_machine_is_applied() {
        let (plan, status) = decide(&machine(false, None));
        let plan = plan.expect("an apply");
        assert_eq!(plan.paths, vec!["machine.nodeLabels.zone"]);
        assert_eq!(
            reason(&status, types::DRIFTED).as_deref(),
            Some(reasons::SAFE_DRIFT)
        );
        assert!(status.config_hash.is_some());
    }

    #[test]
    fn a_held_machine_gets_its_drift_and_no_apply() {
        let (plan, status) = decide(&machine(true, None));
        assert!(plan.is_none());
        assert_eq!(status.drift.len(), 1);
        assert_eq!(reason(&status, types::APPLIED), None);
    }

    /// Covers: R1.6
    #[test]
    fn class_c_blocks_every_apply_and_says_why() {
        let (plan, status) = decide(&machine(false, Some("machine:\n  somethingNew: 1\n")));
        assert!(plan.is_none());
        assert_eq!(
            reason(&status, types::APPLIED).as_deref(),
            Some(reasons::UNSAFE_DRIFT)
        );
        assert_eq!(
            reason(&status, types::DRIFTED).as_deref(),
            Some(reasons::UNSAFE_DRIFT)
        );
    }

    #[test]
    fn the_read_back_decides_applied() {
        let plan = ApplyPlan {
            desired_yaml: "a: 1\n".into(),
            desired: live().config,
            paths: vec!["machine.nodeLabels.zone".into()],
        };
        let (c, note) =
            read_back_condition(&plan, "a: 1\n", &Drift::default(), "h", Some(2), &at(5));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::APPLIED)
        );
        assert!(note.is_some_and(|n| n.contains("equals the render (config hash h)")));
        let (c, _) = read_back_condition(&plan, "a: 2\n", &Drift::default(), "h", Some(2), &at(5));
        assert!(c.message.contains("on every path"), "{}", c.message);
        let differs = Drift {
            entries: vec![ichor_api::DriftEntry {
                path: "machine.nodeLabels.zone".into(),
                class: DriftClass::B,
                live: None,
                desired: Some("a".into()),
                reason: None,
            }],
        };
        let (c, note) = read_back_condition(&plan, "a: 2\n", &differs, "h", Some(2), &at(5));
        assert_eq!(c.reason, reasons::READ_BACK_MISMATCH);
        assert!(note.is_none());
    }

    /// Covers: R8.3 (hold race)
    #[test]
    fn the_apply_needs_the_machine_still_released_and_unchanged() {
        let mut read = machine(false, None);
        read.metadata.generation = Some(3);
        read.metadata.uid = Some("u1".into());
        assert!(still_released(&read, &read.clone(), &at(5)).is_none());
        let mut held = read.clone();
        held.spec.hold = true;
        held.metadata.generation = Some(4);
        let c = still_released(&read, &held, &at(5)).expect("refused");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::HOLD_TAKEN_BACK)
        );
        let mut changed = read.clone();
        changed.metadata.generation = Some(4);
        let c = still_released(&read, &changed, &at(5)).expect("refused");
        assert_eq!(c.reason, reasons::SPEC_CHANGED);
        assert!(c.message.contains("generation 3 to 4"), "{}", c.message);
        let mut replaced = read.clone();
        replaced.metadata.uid = Some("u2".into());
        assert_eq!(
            still_released(&read, &replaced, &at(5)).map(|c| c.reason),
            Some(reasons::SPEC_CHANGED.to_owned())
        );
    }

    #[test]
    fn held_and_ready_follow_the_spec_and_the_outcome() {
        let h = held_condition(false, Some(2), &at(5));
        assert_eq!(
            (h.status.as_str(), h.reason.as_str()),
            ("False", reasons::RELEASED)
        );
        assert_eq!(
            held_condition(true, Some(2), &at(5)).reason,
            reasons::HOLD_SET
        );
        let m = machine(true, None);
        let err = Error::ClusterNotFound {
            namespace: "ichor-system".into(),
            machine: "base-cp-1".into(),
            cluster: "base".into(),
        };
        let r = ready_condition(&m, &TalosMachineStatus::default(), Err(&err), &at(5));
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", reasons::CLUSTER_NOT_FOUND)
        );
        let r = ready_condition(&m, &TalosMachineStatus::default(), Ok(()), &at(5));
        assert_eq!(
            r.message,
            "node 10.5.0.2 read (Talos unknown); 0 drift entries"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_adds_the_talos_port_only_when_absent() {
        assert_eq!(endpoint("10.0.0.2", 50000), "10.0.0.2:50000");
        assert_eq!(endpoint("10.0.0.2:4000", 50000), "10.0.0.2:4000");
        assert_eq!(endpoint("node-1", 50000), "node-1:50000");
        assert_eq!(endpoint("fd00::2", 50000), "[fd00::2]:50000");
        assert_eq!(endpoint("[fd00::2]:4000", 50000), "[fd00::2]:4000");
    }

    /// Found while writing the address fuzz target (tests/fuzz_webhook.rs,
    /// whose bracketed IPv6 inputs hit it): `[fd00::2]`, which the webhook
    /// accepts, was dialled as `[[fd00::2]]:50000`.
    /// Covers: R8.4 (fuzzing regression)
    #[test]
    fn a_bracketed_ipv6_address_without_a_port_is_bracketed_once() {
        assert_eq!(endpoint("[fd00::2]", 50000), "[fd00::2]:50000");
    }

    fn entry(path: &str, class: DriftClass) -> ichor_api::DriftEntry {
        ichor_api::DriftEntry {
            path: path.into(),
            class,
            live: None,
            desired: Some("x".into()),
            reason: Some("because".into()),
        }
    }

    /// Covers: R1.6
    #[test]
    fn drifted_condition_names_class_c_paths_and_what_to_do() {
        let now = crate::pipeline::system_clock();
        let clean = drifted(&Drift::default(), Some(1), &now);
        assert_eq!(
            (clean.status.as_str(), clean.reason.as_str()),
            ("False", reasons::NO_DRIFT)
        );
        let b = Drift {
            entries: vec![entry("machine.nodeLabels", DriftClass::B)],
        };
        let c = drifted(&b, Some(1), &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::SAFE_DRIFT)
        );
        let bc = Drift {
            entries: vec![
                entry("machine.install.image", DriftClass::C),
                entry("machine.nodeLabels", DriftClass::B),
            ],
        };
        let c = drifted(&bc, Some(1), &now);
        assert_eq!(c.reason, reasons::UNSAFE_DRIFT);
        assert!(
            c.message.contains("machine.install.image (because)"),
            "{}",
            c.message
        );
        assert!(!c.message.contains("machine.nodeLabels"), "{}", c.message);
        assert!(c.message.contains("talosctl"), "{}", c.message);
    }
}
