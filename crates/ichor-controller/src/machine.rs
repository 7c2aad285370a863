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
use ichor_talos::config::MachineConfig;
use ichor_talos_client::{ApplyMode, ApplyRequest, ClientOptions, TalosClient};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};

use crate::{Context, Error, FIELD_MANAGER, Result};

/// The controller's name in metrics.
pub const CONTROLLER: &str = "talosmachine";

/// Reasons this crate adds to `ichor_api::conditions::reasons`.
pub mod local_reasons {
    /// A Kubernetes API read the reconcile needed failed.
    pub const API_ERROR: &str = "ApiError";
}

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the TalosMachine controller until `shutdown`.
pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let stop = shutdown.clone();
    let ns = ctx.config.namespace.as_deref();
    let machines: Api<DeserializeGuard<TalosMachine>> = api(&ctx.client, ns);
    let clusters: Api<TalosCluster> = api(&ctx.client, ns);
    // Our own status writes come back as events too; the reconcile that
    // follows finds nothing to change and writes nothing (SSA of an equal
    // status is a no-op), so this settles.
    let controller = Controller::new(machines, watcher::Config::default()).with_config(
        kube::runtime::controller::Config::default().concurrency(ctx.config.machine_concurrency),
    );
    let store = controller.store();
    let drive = controller
        .watches(
            clusters,
            watcher::Config::default(),
            move |c: TalosCluster| {
                let ns = c.namespace();
                let name = c.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|m| {
                        m.0.as_ref()
                            .is_ok_and(|m| m.namespace() == ns && m.spec.cluster_ref.name == name)
                    })
                    .map(|m| ObjectRef::from_obj(&*m))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "TalosMachine reconcile");
            }
        });
    crate::drive_until_stopped("TalosMachine", drive, stop).await;
}

fn error_policy(
    obj: Arc<DeserializeGuard<TalosMachine>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    ctx.metrics.failed(CONTROLLER, error.metric_label());
    tracing::warn!(
        machine = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()),
        error = %error,
        "TalosMachine reconcile failed"
    );
    Action::requeue(ctx.config.error_requeue)
}

fn reference(kind: &str, meta: &kube::api::ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{}/{}", ichor_api::GROUP, ichor_api::VERSION)),
        kind: Some(kind.into()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    }
}

/// Publishes an Event on an Ichor object (failures are logged at debug only:
/// an Event is a courtesy, never a reason to fail a reconcile).
pub(crate) async fn publish_on(
    ctx: &Context,
    kind: &str,
    meta: &kube::api::ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &reference(kind, meta)).await {
        tracing::debug!(error = %e, "publishing an Event");
    }
}

async fn publish(
    ctx: &Context,
    meta: &kube::api::ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish_on(ctx, "TalosMachine", meta, type_, reason, note).await;
}

async fn reconcile(obj: Arc<DeserializeGuard<TalosMachine>>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled(CONTROLLER);
    let machine = match &obj.0 {
        Ok(m) => m,
        Err(invalid) => {
            let err = Error::Malformed {
                kind: "TalosMachine",
                namespace: invalid.metadata.namespace.clone().unwrap_or_default(),
                name: invalid.metadata.name.clone().unwrap_or_default(),
                reason: invalid.error.clone(),
            };
            publish(
                &ctx,
                &invalid.metadata,
                EventType::Warning,
                "Malformed",
                err.to_string(),
            )
            .await;
            return Err(err);
        }
    };
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    let mut status = machine.status.clone().unwrap_or_default();
    let now = crate::now();

    let held = machine.spec.hold;
    conditions::set(
        &mut status.conditions,
        if held {
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
        },
    );

    // Our own status writes come back as watch events, and so do the
    // cluster's status changes; a machine whose inputs did not change since
    // its last successful reconcile waits for its resync instead of reading
    // the node again.
    let (outcome, key) = match read_cluster(machine, &ctx).await {
        Ok(cluster) => {
            let key = Inputs {
                uid: machine.uid().unwrap_or_default(),
                generation: machine.metadata.generation,
                cluster_uid: cluster.uid().unwrap_or_default(),
                cluster_generation: cluster.metadata.generation,
                handover: handover(&cluster),
            };
            if let Some(left) = ctx.recent.fresh(&key, ctx.config.resync) {
                return Ok(Action::requeue(left));
            }
            (
                observe_and_act(machine, &cluster, &ctx, &mut status, &now).await,
                Some(key),
            )
        }
        Err(e) => (Err(e), None),
    };
    match &outcome {
        Ok(applied) => {
            conditions::set(
                &mut status.conditions,
                conditions::new(
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
            );
            if let Some(note) = applied {
                publish(
                    &ctx,
                    &machine.metadata,
                    EventType::Normal,
                    reasons::APPLIED,
                    note.clone(),
                )
                .await;
            }
        }
        Err(e) => {
            let reason = match e {
                Error::ClusterNotFound { .. } => reasons::CLUSTER_NOT_FOUND,
                Error::Bundle { .. } => reasons::BUNDLE_UNAVAILABLE,
                Error::Talos { .. } => reasons::NODE_UNREACHABLE,
                Error::LiveConfig { .. } | Error::Render(_) => reasons::RENDER_FAILED,
                _ => local_reasons::API_ERROR,
            };
            conditions::set(
                &mut status.conditions,
                conditions::new(
                    types::READY,
                    Status::False,
                    reason,
                    e.to_string(),
                    generation,
                    now.clone(),
                ),
            );
            publish(
                &ctx,
                &machine.metadata,
                EventType::Warning,
                reason,
                e.to_string(),
            )
            .await;
        }
    }
    status.observed_generation = generation;
    write_status(&ctx.client, &namespace, &name, &status).await?;
    match (outcome, key) {
        (Ok(_), Some(key)) => {
            ctx.recent.mark(key);
            Ok(Action::requeue(ctx.config.resync))
        }
        (Ok(_), None) => Ok(Action::requeue(ctx.config.resync)),
        (Err(e), _) => Err(e),
    }
}

/// Server-side apply of the status subresource; nothing else is sent.
async fn write_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: &TalosMachineStatus,
) -> Result<()> {
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", ichor_api::GROUP, ichor_api::VERSION),
        "kind": "TalosMachine",
        "status": status,
    });
    Api::<TalosMachine>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "writing the status of TalosMachine {namespace}/{name}"
        )))?;
    Ok(())
}

/// The machine's TalosCluster.
async fn read_cluster(machine: &TalosMachine, ctx: &Context) -> Result<TalosCluster> {
    let namespace = machine.namespace().unwrap_or_default();
    let cluster_name = &machine.spec.cluster_ref.name;
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
        .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER))
}

/// What a machine's reconcile depends on, apart from the node itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inputs {
    uid: String,
    generation: Option<i64>,
    cluster_uid: String,
    cluster_generation: Option<i64>,
    handover: bool,
}

/// When each machine was last reconciled successfully, and with which inputs.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    seen: std::sync::Mutex<std::collections::HashMap<String, (Inputs, std::time::Instant)>>,
}

impl Recent {
    /// The time left before the resync when nothing changed since the last success.
    fn fresh(&self, key: &Inputs, resync: std::time::Duration) -> Option<std::time::Duration> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (k, at) = seen.get(&key.uid)?;
        let elapsed = at.elapsed();
        (k == key && elapsed < resync).then(|| resync - elapsed)
    }

    fn mark(&self, key: Inputs) {
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
    } else if a.contains(':') {
        format!("[{a}]:{port}")
    } else {
        format!("{a}:{port}")
    }
}

/// Reads, renders, compares, writes the drift into `status`, and applies
/// when allowed. Returns the note of an apply, if one happened.
async fn observe_and_act(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    ctx: &Context,
    status: &mut TalosMachineStatus,
    now: &Time,
) -> Result<Option<String>> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let generation = machine.metadata.generation;
    let address = machine.spec.address.clone();
    let talos_err = |source: ichor_talos_client::Error| Error::Talos {
        namespace: namespace.clone(),
        machine: name.clone(),
        address: address.clone(),
        source: Box::new(source),
    };
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
        .map_err(talos_err)?;
    let version = talos.version("").await.map_err(talos_err)?;
    status.talos_version = Some(version.tag.clone());
    let live = read_live(&talos, machine).await?;

    let rendered = ichor_render::render(&RenderInput::from_objects(cluster, machine, &live))?;
    let desired_yaml = rendered.yaml()?;
    status.config_hash = Some(rendered.hash()?);
    let drift = ichor_render::compare(&live, &rendered.config)?;
    status.drift = drift.entries.clone();
    conditions::set(&mut status.conditions, drifted(&drift, generation, now));

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
                format!("not applied: {}", class_c_message(&drift)),
                generation,
                now.clone(),
            ),
        );
        return Ok(None);
    }
    if !drift.is_applicable() {
        return Ok(None);
    }

    // Only class B is left and the machine is released: apply, no reboot.
    let b_paths: Vec<&str> = drift
        .of_class(DriftClass::B)
        .map(|e| e.path.as_str())
        .collect();
    let request = ApplyRequest::new(desired_yaml.clone().into_bytes(), ApplyMode::NoReboot);
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
                    b_paths.join(", ")
                ),
                generation,
                now.clone(),
            ),
        );
        return Err(talos_err(e));
    }
    tracing::info!(machine = %format!("{namespace}/{name}"), paths = ?b_paths, "applied class B drift in no-reboot mode");
    let read_back = read_live(&talos, machine).await?;
    let after = ichor_render::compare(&read_back, &rendered.config)?;
    status.drift = after.entries.clone();
    conditions::set(&mut status.conditions, drifted(&after, generation, now));
    let read_back_yaml = read_back.to_yaml().map_err(|e| Error::LiveConfig {
        namespace: namespace.clone(),
        machine: name.clone(),
        address: address.clone(),
        reason: e.to_string(),
    })?;
    let hash = status.config_hash.clone().unwrap_or_default();
    // Equal bytes, or (a node that re-encodes what it stores) equal on every
    // path: both are a successful read-back; the message says which.
    if read_back_yaml == desired_yaml || after.entries.is_empty() {
        ctx.metrics.applied("applied");
        let how = if read_back_yaml == desired_yaml {
            "the config read back equals the render"
        } else {
            "the config read back equals the render on every path (the node serialises it differently)"
        };
        let note = format!(
            "applied {} in no-reboot mode; {how} (config hash {hash})",
            b_paths.join(", ")
        );
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::APPLIED,
                Status::True,
                reasons::APPLIED,
                note.clone(),
                generation,
                now.clone(),
            ),
        );
        Ok(Some(note))
    } else {
        ctx.metrics.applied("read_back_mismatch");
        let paths: Vec<&str> = after.entries.iter().map(|e| e.path.as_str()).collect();
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::APPLIED,
                Status::False,
                reasons::READ_BACK_MISMATCH,
                format!(
                    "applied in no-reboot mode, but the config read back differs from the render at {}; status.drift shows the values; check the node with talosctl get machineconfig",
                    paths.join(", ")
                ),
                generation,
                now.clone(),
            ),
        );
        Ok(None)
    }
}

async fn read_live(talos: &TalosClient, machine: &TalosMachine) -> Result<MachineConfig> {
    let namespace = machine.namespace().unwrap_or_default();
    let name = machine.name_any();
    let address = machine.spec.address.clone();
    let bytes = talos
        .machine_config("")
        .await
        .map_err(|source| Error::Talos {
            namespace: namespace.clone(),
            machine: name.clone(),
            address: address.clone(),
            source: Box::new(source),
        })?;
    let text = String::from_utf8(bytes).map_err(|_| Error::LiveConfig {
        namespace: namespace.clone(),
        machine: name.clone(),
        address: address.clone(),
        reason: "the config is not UTF-8".into(),
    })?;
    MachineConfig::parse_with_origin(&text, &format!("the live config of node {address}")).map_err(
        |e| Error::LiveConfig {
            namespace,
            machine: name,
            address,
            reason: e.to_string(),
        },
    )
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
        let now = crate::now();
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
