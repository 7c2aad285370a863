//! Phases `uninstall` and `crds`: what `ichor adopt` applied, deleted.

use ichor_adopt::install;
use ichor_adopt::reclaim::{CrdChoice, IchorChoice};
use ichor_api::IchorInstallation;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use super::objects::delete_named;
use super::{Reclaim, ReclaimError, failed};

/// Phase `uninstall`: on the install-manifest path, what `ichor adopt`
/// applied is deleted — the webhooks first (nothing calls a controller that
/// is going), the controller (and the bounded wait until its pods are
/// gone), the rest, the namespace unless it keeps Cilium's records, and the
/// IchorInstallation last (a rerun after a kill still finds Ichor there). On
/// a Helm install the operator is given the command; nothing is touched.
pub(super) async fn uninstall(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    match &r.plan.ichor {
        IchorChoice::Helm { command, .. } => {
            r.say(&format!(
                "Ichor is installed by Helm: not touching it. Uninstall it with: {command}"
            ));
            Ok(())
        }
        IchorChoice::Absent => {
            // A chart uninstalled with its CRDs kept leaves its
            // IchorInstallation: it goes with Ichor.
            delete_installation(r.kube).await
        }
        IchorChoice::Uninstall {
            delete_namespace, ..
        } => {
            let ns = ichor_api::SYSTEM_NAMESPACE;
            let all = install::install_objects("unused", "unused");
            let by_kind = |kind: &str| -> Vec<Value> {
                all.iter().filter(|o| o["kind"] == kind).cloned().collect()
            };
            let configurations: Vec<Value> = all
                .iter()
                .filter(|o| install::is_webhook_configuration(&o["kind"]))
                .cloned()
                .collect();
            delete_objects(r.kube, &configurations).await?;
            delete_objects(r.kube, &by_kind("Deployment")).await?;
            let pods = Api::<Pod>::namespaced(r.kube.clone(), ns);
            let selector = format!("app.kubernetes.io/name={}", install::INSTALLER_NAME_LABEL);
            r.wait("Ichor's controller to stop", || async {
                Ok(pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(failed("reading Ichor's pods"))?
                    .items
                    .iter()
                    .map(|p| format!("pod {}", p.metadata.name.clone().unwrap_or_default()))
                    .collect())
            })
            .await?;
            let rest: Vec<Value> = all
                .iter()
                .filter(|o| {
                    !matches!(
                        o["kind"].as_str(),
                        Some(
                            "Namespace"
                                | "CustomResourceDefinition"
                                | "ValidatingWebhookConfiguration"
                                | "MutatingWebhookConfiguration"
                                | "Deployment"
                        )
                    )
                })
                .cloned()
                .collect();
            delete_objects(r.kube, &rest).await?;
            delete_objects(r.kube, &install::cilium_policies()).await?;
            let secret: Value = json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": install::WEBHOOK_CERT_SECRET, "namespace": ns}});
            delete_objects(r.kube, &[secret]).await?;
            let jobs = Api::<Job>::namespaced(r.kube.clone(), ns);
            for j in jobs
                .list(&ListParams::default().labels("ichor.maesh.dev/cni-for"))
                .await
                .map_err(failed("reading the ichor-cni Jobs"))?
                .items
            {
                delete_named(&jobs, &j.metadata.name.unwrap_or_default(), "Job").await?;
            }
            if *delete_namespace {
                delete_named(&Api::<Namespace>::all(r.kube.clone()), ns, "Namespace").await?;
            }
            // Last: it is what tells a rerun that Ichor is still installed.
            delete_installation(r.kube).await?;
            if *delete_namespace {
                r.say("uninstalled Ichor: its controller, webhooks, RBAC and IchorInstallation are deleted, and the namespace ichor-system is being deleted");
            } else {
                r.say("uninstalled Ichor: its controller, webhooks, RBAC and IchorInstallation are deleted; the namespace ichor-system stays with Cilium's records");
            }
            Ok(())
        }
    }
}

async fn delete_installation(kube: &kube::Client) -> Result<(), ReclaimError> {
    let installations = Api::<IchorInstallation>::all(kube.clone());
    let list = match installations.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(failed("reading the IchorInstallation")(e)),
    };
    for i in list {
        let ns = i.metadata.namespace.clone().unwrap_or_default();
        delete_named(
            &Api::<IchorInstallation>::namespaced(kube.clone(), &ns),
            &i.metadata.name.unwrap_or_default(),
            "IchorInstallation",
        )
        .await?;
    }
    Ok(())
}

/// Deletes objects known as data (kind resolved at run time); a kind not
/// served or an object gone is fine.
async fn delete_objects(kube: &kube::Client, objects: &[Value]) -> Result<(), ReclaimError> {
    for obj in objects {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let Ok((ar, caps)) = kube::discovery::pinned_kind(kube, &gvk).await else {
            continue;
        };
        let api: Api<DynamicObject> = match (caps.scope, obj["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(kube.clone(), ns, &ar)
            }
            _ => Api::all_with(kube.clone(), &ar),
        };
        delete_named(&api, name, kind).await?;
    }
    Ok(())
}

/// Phase `crds`: with `--delete-crds` on the install-manifest path, Ichor's
/// CRDs are deleted and the bounded wait runs until they are gone; kept
/// otherwise (on Helm, the operator is given the command).
pub(super) async fn crds(r: &Reclaim<'_>) -> Result<(), ReclaimError> {
    let api = Api::<CustomResourceDefinition>::all(r.kube.clone());
    match &r.plan.crds {
        CrdChoice::Keep { crds } if !crds.is_empty() => {
            r.say(&format!("kept Ichor's CRDs: {}", crds.join(", ")));
            Ok(())
        }
        CrdChoice::Keep { .. } => Ok(()),
        CrdChoice::DeleteAfterHelm { command, .. } => {
            r.say(&format!(
                "Ichor's CRDs belong to its Helm chart: after helm uninstall, delete them with: {command}"
            ));
            Ok(())
        }
        CrdChoice::Delete { crds } => {
            for name in crds {
                delete_named(&api, name, "CustomResourceDefinition").await?;
            }
            r.wait("Ichor's CRDs to be gone", || async {
                let mut left = Vec::new();
                for name in crds {
                    if api
                        .get_opt(name)
                        .await
                        .map_err(failed("reading the CRDs"))?
                        .is_some()
                    {
                        left.push(format!("CRD {name}"));
                    }
                }
                Ok(left)
            })
            .await?;
            r.say(&format!("deleted Ichor's CRDs: {}", crds.join(", ")));
            Ok(())
        }
    }
}
