//! Ichor itself, on the installer path: its objects and webhooks applied,
//! its CRDs Established, and the bounded wait until the API server calls
//! its webhooks (R3.1–R3.3).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use ichor_adopt::inspection::KubeNode;
use ichor_adopt::install;
use ichor_adopt::waits::{self, PodView, Verdict, WaitWatch};
use ichor_api::TalosCluster;
use ichor_helm::objects::{apply_dynamic, create_or_keep};
use ichor_helm::wait::{Wait, wait_until};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::error::{AdoptError, wait_ended, writing};
use crate::inspect;
use crate::phases::Operator;

/// The field manager of every object adopt writes.
pub const FIELD_MANAGER: &str = "ichor-adopt";

/// Creates `obj`, keeping the one that exists (a rerun).
pub(crate) async fn create_or_keep_as<K>(
    api: &Api<K>,
    obj: &K,
    what: &str,
) -> Result<(), AdoptError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    create_or_keep(api, &PostParams::default(), obj)
        .await
        .map(drop)
        .map_err(writing(what))
}

/// Server-side applies arbitrary objects (the install manifest, the policies).
pub async fn apply_objects(kube: &kube::Client, objects: &[Value]) -> Result<(), AdoptError> {
    for obj in objects {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let what = format!("{kind} {name}");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(kube, &gvk)
            .await
            .map_err(writing(&what))?;
        let namespace = match caps.scope {
            kube::discovery::Scope::Namespaced => obj["metadata"]["namespace"].as_str(),
            kube::discovery::Scope::Cluster => None,
        };
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(kube.clone(), ns, &ar),
            None => Api::all_with(kube.clone(), &ar),
        };
        apply_dynamic(&api, FIELD_MANAGER, name, namespace, obj.clone())
            .await
            .map_err(writing(what))?;
    }
    Ok(())
}

/// Applies the install manifest of Ichor `version` running `image`: every
/// object, then the webhooks' certificate (made once, kept on a rerun), then
/// the webhook configurations with that certificate's CA.
pub async fn install_ichor(
    kube: &kube::Client,
    version: &str,
    image: &str,
) -> Result<(), AdoptError> {
    let objects: Vec<Value> = install::install_objects(version, image)
        .into_iter()
        .filter(|o| !install::is_webhook_configuration(&o["kind"]))
        .collect();
    apply_objects(kube, &objects).await?;
    install_webhooks(kube, version).await
}

/// The webhooks' certificate (made once, kept) and the validating and
/// mutating webhook configurations with its CA.
pub(crate) async fn install_webhooks(kube: &kube::Client, version: &str) -> Result<(), AdoptError> {
    let mut configurations: Vec<Value> = install::install_objects(version, "unused")
        .into_iter()
        .filter(|o| install::is_webhook_configuration(&o["kind"]))
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
    create_or_keep_as(&secrets, &secret, &what).await?;
    let stored = secrets
        .get(install::WEBHOOK_CERT_SECRET)
        .await
        .map_err(writing(&what))?;
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

/// Waits, bounded, until the API server has Established every Ichor CRD.
pub(crate) async fn wait_crds_established(
    kube: &kube::Client,
    poll_interval: Duration,
    operator: &dyn Operator,
) -> Result<(), AdoptError> {
    let api = Api::<CustomResourceDefinition>::all(kube.clone());
    let report = |left: &[String]| {
        operator.say(&format!(
            "waiting for Ichor's CRDs to be Established: {}",
            left.join(", ")
        ))
    };
    let wait = Wait {
        why: "Ichor's CRDs to be Established",
        timeout: waits::CRDS_ESTABLISHED_WAIT,
        poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_established = || async {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(writing("CustomResourceDefinitions"))?;
        Ok(list
            .items
            .iter()
            .filter(|c| c.spec.group == ichor_api::GROUP)
            .filter(|c| !inspect::established(c))
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect())
    };
    wait_ended(wait_until(&wait, not_established).await, |pending| {
        format!(
            "Ichor's CRDs were not Established within {}: {}",
            waits::human(waits::CRDS_ESTABLISHED_WAIT),
            pending.join(", ")
        )
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

/// Why the API server did not give Ichor's webhooks' refusal of the probe
/// (yet): what the last look found, reported while the wait goes on.
#[derive(Debug, thiserror::Error)]
enum NotAnswered {
    /// The API server refused the probe for another reason, in its words
    /// (the webhook is unreachable, its certificate not yet trusted, ...).
    #[error("{message}")]
    Refused { message: String },
    /// The dry run did not get an answer from the API server.
    #[error(transparent)]
    Call(kube::Error),
    /// The API server admitted the probe: nothing called the webhooks.
    #[error(
        "the API server admitted a TalosCluster that Ichor's webhooks refuse: the ValidatingWebhookConfiguration {} does not call them",
        install::WEBHOOK_CONFIGURATION
    )]
    Admitted,
}

/// Asks the API server to create the probe with a dry run: Ok when the API
/// server called Ichor's webhook and it refused the probe; otherwise why not.
async fn ask_the_webhooks(kube: &kube::Client, probe: &TalosCluster) -> Result<(), NotAnswered> {
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
        Err(kube::Error::Api(e)) => Err(NotAnswered::Refused { message: e.message }),
        Err(e) => Err(NotAnswered::Call(e)),
        Ok(_) => Err(NotAnswered::Admitted),
    }
}

/// Decision 3: the bounded wait for Ichor's webhooks — until the API server
/// calls them and gets their answer — with the pods of ichor-system described
/// every 30 s and the no-pod-network early failure. The pure [`WaitWatch`]
/// judges each look (the reports, the bound and what is left, the early
/// failure); `wait_until` runs the looks, its own bound one poll later as a
/// backstop the watch always reaches first.
pub(crate) async fn wait_for_webhooks(
    kube: &kube::Client,
    timeout: Duration,
    poll_interval: Duration,
    cluster: &TalosCluster,
    operator: &dyn Operator,
) -> Result<(), AdoptError> {
    let pods = Api::<Pod>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    let nodes = Api::<Node>::all(kube.clone());
    let watch = Mutex::new(WaitWatch::new("Ichor's webhooks", timeout));
    let probe = webhook_probe(cluster);
    let start = Instant::now();
    let wait = Wait {
        why: "Ichor's webhooks",
        timeout: timeout + poll_interval,
        poll_interval,
        // The watch reports, with the pods; wait_until only logs.
        report_interval: timeout + poll_interval,
        on_progress: None,
    };
    let look = || async {
        let answer = match ask_the_webhooks(kube, &probe).await {
            Ok(()) => return Ok(Vec::new()),
            Err(why) => ichor_api::error_text::chain(&why),
        };
        let pod_views: Vec<PodView> = pods
            .list(&ListParams::default())
            .await
            .map_err(writing("the pods of ichor-system"))?
            .items
            .iter()
            .map(PodView::from_pod)
            .collect();
        let node_views: Vec<KubeNode> = nodes
            .list(&ListParams::default())
            .await
            .map_err(writing("the nodes"))?
            .items
            .iter()
            .map(inspect::kube_node)
            .collect();
        let verdict = watch.lock().expect("the watch is only used here").observe(
            start.elapsed(),
            &pod_views,
            &node_views,
        );
        let last_call = format!("the API server's last call to the webhooks: {answer}");
        match verdict {
            Verdict::Waiting(lines) => {
                if !lines.is_empty() {
                    lines.iter().for_each(|l| operator.say(l));
                    operator.say(&last_call);
                }
                Ok(vec![last_call])
            }
            Verdict::Failed(msg) if msg == waits::NO_POD_NETWORK => Err(AdoptError::Wait(msg)),
            Verdict::Failed(msg) => Err(AdoptError::Wait(format!("{msg}; {last_call}"))),
        }
    };
    wait_ended(wait_until(&wait, look).await, |pending| {
        format!(
            "Ichor's webhooks did not finish within {}; {}",
            waits::human(timeout),
            pending.join("; ")
        )
    })
}
