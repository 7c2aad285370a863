//! Phases `hold` and `objects`: every machine held, then Ichor's objects
//! deleted; no node is written to.

use ichor_adopt::install;
use ichor_api::error_text::chain;
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::{Reclaim, ReclaimError, failed};

/// Phase `hold`: every machine held, so the controller applies nothing to a
/// node from here on; then, while a controller runs, the bounded wait until
/// it has seen every hold (its Held=True at the machine's generation).
pub(super) async fn hold(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    if r.plan.clusters.iter().all(|c| c.machines.is_empty()) {
        return Ok(());
    }
    if !controller_running(r.kube).await? {
        unreachable_webhooks_removed(r).await?;
    }
    for c in &r.plan.clusters {
        let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
        for m in c.machines.iter().filter(|m| !m.held) {
            match machines
                .patch(
                    &m.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"hold": true}})),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                // A controller that does not run cannot serve its webhooks,
                // nor write to a node: without it there is nothing to hold off.
                Err(e) if !controller_running(r.kube).await? => {
                    r.say(&format!(
                        "Ichor's controller is not running, so nothing can write to a node; not holding the machines (holding TalosMachine {} failed: {})",
                        m.name,
                        chain(&e)
                    ));
                    return Ok(());
                }
                Err(e) => return Err(failed(format!("holding TalosMachine {}", m.name))(e)),
            }
        }
    }
    if !controller_running(r.kube).await? {
        r.say("held every TalosMachine; Ichor's controller is not running, so nothing can write to a node");
        return Ok(());
    }
    r.wait("the controller to see every hold", || async {
        let mut left = Vec::new();
        for c in &r.plan.clusters {
            let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
            for m in &c.machines {
                let Some(live) = machines
                    .get_opt(&m.name)
                    .await
                    .map_err(failed(format!("reading TalosMachine {}", m.name)))?
                else {
                    continue;
                };
                if !hold_seen(&live) {
                    left.push(format!("TalosMachine {} not yet Held", m.name));
                }
            }
        }
        Ok(left)
    })
    .await?;
    r.say("held every TalosMachine: the controller applies nothing to a node from now on");
    Ok(())
}

/// The controller reported Held=True for the machine's current generation.
fn hold_seen(m: &TalosMachine) -> bool {
    let generation = m.metadata.generation.unwrap_or_default();
    m.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or_default() >= generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == ichor_api::conditions::types::HELD && c.status == "True")
    })
}

/// Whether a controller of Ichor's (either path's Deployment) has a ready pod.
/// Ichor's webhook configurations, when no controller runs to serve them:
/// they fail closed, so every write to a TalosMachine (its hold, dropping
/// its finalizer) would be refused. Ichor is leaving; a Helm release
/// restores them on its next upgrade.
async fn unreachable_webhooks_removed(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    let gone = |e: &kube::Error| matches!(e, kube::Error::Api(a) if a.code == 404);
    let name = install::WEBHOOK_CONFIGURATION;
    if let Err(e) = Api::<ValidatingWebhookConfiguration>::all(r.kube.clone())
        .delete(name, &DeleteParams::default())
        .await
        && !gone(&e)
    {
        return Err(failed(format!(
            "deleting the ValidatingWebhookConfiguration {name}"
        ))(e));
    }
    let name = install::MUTATING_WEBHOOK_CONFIGURATION;
    if let Err(e) = Api::<MutatingWebhookConfiguration>::all(r.kube.clone())
        .delete(name, &DeleteParams::default())
        .await
        && !gone(&e)
    {
        return Err(failed(format!(
            "deleting the MutatingWebhookConfiguration {name}"
        ))(e));
    }
    r.say("Ichor's controller is not running, so its webhooks cannot answer: their configurations are deleted first");
    Ok(())
}

async fn controller_running(kube: &kube::Client) -> Result<bool, ReclaimError> {
    let selector = format!(
        "app.kubernetes.io/name in ({},{})",
        install::INSTALLER_NAME_LABEL,
        install::CHART_SELECTOR_LABEL.1
    );
    let deployments = Api::<Deployment>::all(kube.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(failed("reading Ichor's controller Deployment"))?;
    Ok(deployments.items.iter().any(|d| {
        d.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or_default()
            > 0
    }))
}

/// Phase `objects`: the finished TalosOperations, the TalosMachines, then
/// the TalosClusters and their bundle Secrets (on disk since the files
/// phase). A machine's membership finalizer is dropped first: nothing runs
/// when they go.
pub(super) async fn objects(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    for op in &r.plan.operations {
        let (ns, name) = op.split_once('/').unwrap_or(("", op));
        delete_named(
            &Api::<TalosOperation>::namespaced(r.kube.clone(), ns),
            name,
            "TalosOperation",
        )
        .await?;
    }
    for c in &r.plan.clusters {
        let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
        for m in &c.machines {
            forget_membership(&machines, &m.name).await?;
            delete_named(&machines, &m.name, "TalosMachine").await?;
        }
        forget_history(r.kube, c).await?;
        delete_named(
            &Api::<TalosCluster>::namespaced(r.kube.clone(), &c.namespace),
            &c.name,
            "TalosCluster",
        )
        .await?;
        delete_named(
            &Api::<Secret>::namespaced(r.kube.clone(), &c.namespace),
            &c.secret,
            "Secret",
        )
        .await?;
    }
    r.wait("the TalosMachines and TalosClusters to be gone", || async {
        let mut left = Vec::new();
        for c in &r.plan.clusters {
            let machines = Api::<TalosMachine>::namespaced(r.kube.clone(), &c.namespace);
            for m in &c.machines {
                if machines
                    .get_opt(&m.name)
                    .await
                    .map_err(failed("reading TalosMachines"))?
                    .is_some()
                {
                    left.push(format!("TalosMachine {}", m.name));
                }
            }
            if Api::<TalosCluster>::namespaced(r.kube.clone(), &c.namespace)
                .get_opt(&c.name)
                .await
                .map_err(failed("reading TalosClusters"))?
                .is_some()
            {
                left.push(format!("TalosCluster {}", c.name));
            }
        }
        Ok(left)
    })
    .await?;
    for c in &r.plan.clusters {
        r.say(&format!(
            "deleted TalosCluster {}/{}, its {} TalosMachines and Secret {}; no node was written to",
            c.namespace,
            c.name,
            c.machines.len(),
            c.secret
        ));
    }
    Ok(())
}

/// Deletes `name`; gone already, or already being deleted (409, a
/// terminating namespace), is fine (a rerun).
/// Drops the membership finalizer of a released machine, so its deletion
/// runs no removal: reclaim hands the node back as it is, and a controller
/// that no longer runs would keep the machine for ever. Its history
/// finalizer goes too ([`forget_history`] deletes what it kept).
async fn forget_membership(machines: &Api<TalosMachine>, name: &str) -> Result<(), ReclaimError> {
    let ours = [
        ichor_api::machine::MEMBERSHIP_FINALIZER,
        ichor_api::history::HISTORY_FINALIZER,
    ];
    let Some(m) = machines
        .get_opt(name)
        .await
        .map_err(failed(format!("reading TalosMachine {name}")))?
    else {
        return Ok(());
    };
    let Some(list) = m
        .metadata
        .finalizers
        .as_ref()
        .filter(|l| l.iter().any(|f| ours.contains(&f.as_str())))
    else {
        return Ok(());
    };
    let kept: Vec<&String> = list
        .iter()
        .filter(|f| !ours.contains(&f.as_str()))
        .collect();
    let patch =
        json!({"metadata": {"finalizers": kept, "resourceVersion": m.metadata.resource_version}});
    match machines
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(failed(format!(
            "dropping the membership finalizer of TalosMachine {name}"
        ))(e)),
    }
}

/// Deletes the history Secrets of the cluster's machines (in Ichor's
/// namespace, found by the machine they name): a machine in Ichor's
/// namespace takes its own with it, one elsewhere cannot.
async fn forget_history(
    kube: &kube::Client,
    c: &ichor_adopt::reclaim::ClusterReclaim,
) -> Result<(), ReclaimError> {
    let selector = "app.kubernetes.io/part-of=ichor,app.kubernetes.io/component=history";
    let secrets = Api::<Secret>::all(kube.clone())
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(failed("listing Ichor's history Secrets"))?;
    let wanted: Vec<String> = c
        .machines
        .iter()
        .map(|m| format!("{}/{}", c.namespace, m.name))
        .collect();
    for s in secrets.items {
        let of = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ichor_api::history::HISTORY_OF_ANNOTATION));
        if !of.is_some_and(|of| wanted.contains(of)) {
            continue;
        }
        let namespace = s.metadata.namespace.clone().unwrap_or_default();
        let name = s.metadata.name.clone().unwrap_or_default();
        delete_named(
            &Api::<Secret>::namespaced(kube.clone(), &namespace),
            &name,
            "Secret",
        )
        .await?;
    }
    Ok(())
}

pub(super) async fn delete_named<K>(
    api: &Api<K>,
    name: &str,
    kind: &str,
) -> Result<(), ReclaimError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(failed(format!("deleting {kind} {name}"))(e)),
    }
}
