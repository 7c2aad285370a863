//! The TalosCluster decision: Ready aggregated from the machines,
//! `status.cni.detected` (R2.2) and the CNI hand-over (R1.5e), from what
//! the controller read ([`Observed`]) and `now`. The hand-over's steps and
//! the ichor-cni Job are in [`handover`]; `BackupHealthy` is decided in
//! [`backup_health`].
//!
//! Hand-over: with preset `cilium`, when Ichor's release `cilium` (record in
//! the storage namespace) is deployed at the hash of this TalosCluster's
//! effective values and the `cilium` DaemonSet is Ready, `CNIHandover=True`.
//! Once True it stays True: the hand-over is a moment, and the render drops
//! the inline CNI entry from then on. When the hash does not match (a
//! takeover, or changed values), the decision starts the ichor-cni Job
//! ([`crate::cni_job`]) when the controller knows the image to run; a failed
//! Job is deleted and the next reconcile starts another. A matching hash
//! never creates a Job (R1.5e).
//!
//! The hand-over has three steps, in this order, and `CNIHandover=True` only
//! when all three hold (R6.1, R10.4): (1) the release is deployed at the hash
//! with its DaemonSet Ready; (2) no control plane's live config carries the
//! inline Cilium manifest — from step 1 on the condition says
//! `RemovingInlineManifest`, the render drops the entry and each machine's
//! reconcile applies that class B change (the controller is the only
//! writer); (3) Talos's bootstrap-manifests inventory names none of the
//! release's objects ([`crate::inventory`]). Each step reads what holds now,
//! so a kill between any two and a rerun end in the same state.

use ichor_api::cni::CniWorkload;
use ichor_api::conditions::{self, Status, gitops, reasons, types};
use ichor_api::{
    CniPreset, CniStatus, DetectedCni, TalosCluster, TalosClusterStatus, TalosMachine,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_core::ResourceExt as _;

use crate::cni_job::JobState;
use crate::inventory::{InventoryStep, ReleaseObject};
pub use crate::why::Waiting;

pub mod backup_health;
pub mod handover;

pub use handover::{handover_condition, inline_pending};

#[cfg(test)]
mod tests;

/// How often a cluster whose ichor-cni Job runs is looked at again (Jobs
/// are not watched; the DaemonSet and record watches usually come first).
const HANDOVER_POLL: std::time::Duration = std::time::Duration::from_secs(10);

/// What the hand-over check read (preset cilium): the hash of the
/// cluster's effective values, the newest deployed revision of Ichor's
/// release and the hash of its values, and the agent DaemonSet's rollout.
/// `ichor_cilium::check_handover` reads it with a client (`ichor-cilium`
/// re-exports this type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoverCheck {
    /// The Helm release checked (Ichor's Cilium).
    pub release: String,
    /// The agent DaemonSet checked, in the release namespace.
    pub agent_daemonset: String,
    /// The hash of the effective values of the settings.
    pub desired_hash: String,
    /// The newest deployed revision and the hash of its values, if any.
    pub deployed: Option<(u32, String)>,
    /// `Ok` when the agent DaemonSet is Ready, else what it waits for.
    pub daemonset: Result<(), Waiting>,
}

/// Why the effective values cannot be derived from
/// `spec.cni.cilium.values`: the error with each of its causes
/// ([`ichor_api::error_text::chain`]), as the condition says it. The error
/// itself is `ichor-cilium`'s, read by the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValues(pub String);

impl From<&str> for InvalidValues {
    fn from(why: &str) -> InvalidValues {
        InvalidValues(why.to_owned())
    }
}

impl HandoverCheck {
    /// The release is at the desired values.
    pub fn at_desired_hash(&self) -> bool {
        self.deployed
            .as_ref()
            .is_some_and(|(_, h)| *h == self.desired_hash)
    }

    /// Hand-over may be declared: desired hash deployed and DaemonSet Ready.
    pub fn complete(&self) -> bool {
        self.at_desired_hash() && self.daemonset.is_ok()
    }
}

/// What the TalosCluster reconcile reads before it decides.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The readable TalosMachines whose `spec.clusterRef` names this cluster.
    pub machines: Vec<TalosMachine>,
    /// The hand-over check (preset cilium), or why the effective values
    /// cannot be derived from `spec.cni.cilium.values`.
    pub handover: Option<std::result::Result<HandoverCheck, InvalidValues>>,
    /// The ichor-cni Job for the desired values hash, when one exists.
    pub job: Option<JobState>,
    /// The DaemonSets recognised as a CNI's, in every namespace.
    pub cni_workloads: Vec<CniWorkload>,
    /// Talos's bootstrap-manifests inventory and the release's objects, read
    /// once the release step holds and until the hand-over is done; `None`
    /// otherwise (the decision then has no inventory step to take).
    pub inventory: Option<InventoryObserved>,
    /// Ichor's Cilium release from its newest record (preset cilium).
    pub cilium_release: Option<ichor_api::CiliumReleaseStatus>,
    /// `BackupHealthy` as [`backup_health::health`] decided it from
    /// the cluster's backups; `None` without `spec.backup` (the condition
    /// is then removed).
    pub backup_health: Option<backup_health::Health>,
}

/// What the inventory step reads.
#[derive(Debug, Clone, Default)]
pub struct InventoryObserved {
    /// The objects of the deployed release, as the inventory names them.
    pub release: Vec<ReleaseObject>,
    /// The inventory ConfigMap, `None` when there is none.
    pub config_map: Option<ConfigMap>,
}

/// The settings the decision needs from the controller's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub storage_namespace: String,
    pub release_namespace: String,
    /// Whether the controller may start the ichor-cni Job (it has an image).
    pub can_start_job: bool,
    pub resync: std::time::Duration,
    pub error_requeue: std::time::Duration,
    /// Where the ichor-cni Jobs run (the controller's own namespace).
    pub system_namespace: String,
}

/// What to write to the API, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterAction {
    /// Strip the owning-inventory annotation of the release's objects that
    /// Talos's inventory names, then remove them from `config_map` (as read).
    ReleaseInventory {
        config_map: Box<ConfigMap>,
        step: InventoryStep,
    },
    /// Create the ichor-cni Job for this values hash.
    StartJob { hash: String },
    /// Delete the failed ichor-cni Job (the next reconcile starts another).
    DeleteFailedJob { name: String },
}

/// What the reconcile decided: the status to write, the actions before it,
/// and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub status: TalosClusterStatus,
    pub actions: Vec<ClusterAction>,
    pub requeue: std::time::Duration,
}

/// The decision: pure, from what was read and `now`.
pub fn decide(
    cluster: &TalosCluster,
    observed: &Observed,
    settings: &Settings,
    now: &Time,
) -> Decision {
    let generation = cluster.metadata.generation;
    let status = cluster.status.clone().unwrap_or_default();
    let mine: Vec<&TalosMachine> = observed.machines.iter().collect();
    // Ready is the machines' one only when the rest of the cluster agrees
    // (the hand-over): settled at the end, from every condition.
    let machines_ready = ready(&mine, generation, now);
    let mut decision = Decision {
        status,
        actions: Vec::new(),
        requeue: settings.resync,
    };
    match cluster.spec.cni.preset {
        CniPreset::Unmanaged => {
            conditions::set(
                &mut decision.status.conditions,
                conditions::new(
                    types::CNI_HANDOVER,
                    Status::False,
                    reasons::UNMANAGED,
                    "preset unmanaged: the CNI is the user's, there is nothing to hand over",
                    generation,
                    now.clone(),
                ),
            );
        }
        CniPreset::Cilium => handover::decide(cluster, observed, settings, now, &mut decision),
    };
    let job_failures = decision
        .status
        .cni
        .as_ref()
        .and_then(|c| c.job_failures.clone());
    decision.status.cni = Some(CniStatus {
        detected: Some(detected_cni(observed)),
        release: observed.cilium_release.clone(),
        job_failures,
    });
    decision.status.observed_generation = generation;
    backup_healthy(&mut decision, observed, generation, now);
    let summary = gitops::cluster(&machines_ready, &decision.status.conditions);
    gitops::settle(&mut decision.status.conditions, &summary, generation, now);
    decision
}

/// `BackupHealthy` from what was observed, and a look again when it turns
/// overdue (before the resync, if sooner).
fn backup_healthy(
    decision: &mut Decision,
    observed: &Observed,
    generation: Option<i64>,
    now: &Time,
) {
    let Some(health) = &observed.backup_health else {
        decision
            .status
            .conditions
            .retain(|c| c.type_ != types::BACKUP_HEALTHY);
        return;
    };
    conditions::set(
        &mut decision.status.conditions,
        health.condition(generation, now.clone()),
    );
    if let Some(at) = health.recheck_at {
        let until = at.duration_since(now.0).as_secs().max(0).unsigned_abs() + 1;
        decision.requeue = decision.requeue.min(std::time::Duration::from_secs(until));
    }
}

/// `status.cni.detected`, by the one detector: the CNI DaemonSets, and
/// Cilium from the moment Ichor's Cilium release is deployed (R2.2).
pub fn detected_cni(observed: &Observed) -> DetectedCni {
    let ichor_release_deployed = matches!(&observed.handover, Some(Ok(c)) if c.deployed.is_some());
    ichor_api::cni::detect(&observed.cni_workloads, ichor_release_deployed)
}

/// `Ready` of a cluster from its machines' `Ready`.
pub fn ready(machines: &[&TalosMachine], generation: Option<i64>, now: &Time) -> Condition {
    if machines.is_empty() {
        return conditions::new(
            types::READY,
            Status::False,
            reasons::NO_MACHINES,
            "no TalosMachine refers to this cluster yet",
            generation,
            now.clone(),
        );
    }
    let not_ready: Vec<String> = machines
        .iter()
        .filter_map(|m| {
            let cs = m
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            match conditions::find(cs, types::READY) {
                Some(c) if c.status == "True" => None,
                Some(c) => Some(format!("{} ({})", m.name_any(), c.reason)),
                None => Some(format!("{} (not reconciled yet)", m.name_any())),
            }
        })
        .collect();
    if not_ready.is_empty() {
        conditions::new(
            types::READY,
            Status::True,
            reasons::RECONCILED,
            format!("all {} machines are Ready", machines.len()),
            generation,
            now.clone(),
        )
    } else {
        conditions::new(
            types::READY,
            Status::False,
            reasons::MACHINES_NOT_READY,
            format!(
                "{} of {} machines are not Ready: {}",
                not_ready.len(),
                machines.len(),
                not_ready.join(", ")
            ),
            generation,
            now.clone(),
        )
    }
}
