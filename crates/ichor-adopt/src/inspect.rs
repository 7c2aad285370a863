//! The inspection: adopt's read-only first phase. Every call is bounded, and
//! the nodes are read concurrently. Nothing here writes anything.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::{IchorInstallation, Manager};
use ichor_talos::config::MachineConfig;
use ichor_talos_client::TalosClient;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

use crate::inspection::{CiliumRecord, CniWorkload, KubeInspection, KubeNode, TalosNode};
use crate::plan::IchorPresence;

/// Upper bound of one Kubernetes read.
pub const KUBE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The label the chart puts on the controller Deployment's selector.
pub const CHART_SELECTOR_LABEL: (&str, &str) = ("app.kubernetes.io/name", "ichor");

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("reading {what} from node {node} failed: {source}")]
    Talos {
        node: String,
        what: &'static str,
        #[source]
        source: ichor_talos_client::Error,
    },
    #[error("node {node}'s machine config cannot be read: {source}")]
    Config {
        node: String,
        #[source]
        source: ichor_talos::config::ConfigError,
    },
    #[error(
        "reading {what} from Kubernetes failed: {source}. Check the kubeconfig and that its user may read {what}"
    )]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(
        "reading {what} from Kubernetes did not answer within {timeout:?}: check that the API server is reachable"
    )]
    KubeTimeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error(
        "IchorInstallation {namespace}/{name} says Ichor {version} is managed by Helm, but no Helm release of the chart ichor is deployed and no Deployment labelled {label} exists (was it removed with helm uninstall?). Install it again with helm install ichor oci://ghcr.io/maeshinshin/charts/ichor --namespace {namespace}, or delete that IchorInstallation to let ichor adopt install Ichor itself",
        name = ichor_api::INSTALLATION_NAME,
        label = format!("{}={}", CHART_SELECTOR_LABEL.0, CHART_SELECTOR_LABEL.1)
    )]
    HelmInstallGone { namespace: String, version: String },
}

/// Reads every node through the Talos API: version, hostname, machine config.
pub async fn inspect_talos(
    client: &TalosClient,
    nodes: &[String],
) -> Result<Vec<TalosNode>, InspectError> {
    let results = client
        .on_nodes(nodes, |c, node| async move {
            let version = c.version(&node).await?;
            let hostname = c.hostname(&node).await?;
            let config = c.machine_config(&node).await?;
            Ok((version.tag, hostname, config))
        })
        .await;
    let mut out = Vec::with_capacity(results.len());
    for (node, result) in results {
        let (talos_version, hostname, config) = result.map_err(|source| InspectError::Talos {
            node: node.clone(),
            what: "version, hostname and machine config",
            source,
        })?;
        let text = String::from_utf8_lossy(&config);
        let parsed =
            MachineConfig::parse_with_origin(&text, &format!("node {node}")).map_err(|source| {
                InspectError::Config {
                    node: node.clone(),
                    source,
                }
            })?;
        out.push(TalosNode {
            address: node,
            hostname,
            talos_version,
            facts: parsed.facts(),
        });
    }
    Ok(out)
}

async fn bounded<T>(
    what: &'static str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, InspectError> {
    match tokio::time::timeout(KUBE_CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(|source| InspectError::Kube { what, source }),
        Err(_) => Err(InspectError::KubeTimeout {
            what,
            timeout: KUBE_CALL_TIMEOUT,
        }),
    }
}

/// Reads the Kubernetes side: nodes, CNI DaemonSets in every namespace, the
/// Cilium CRDs, and Helm records of `cilium` in any namespace.
pub async fn inspect_kube(client: &kube::Client) -> Result<KubeInspection, InspectError> {
    let lp = ListParams::default();
    let (node_api, ds_api) = (
        Api::<Node>::all(client.clone()),
        Api::<DaemonSet>::all(client.clone()),
    );
    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    let (nodes, daemonsets, crds, records) = tokio::try_join!(
        bounded("Nodes", node_api.list(&lp)),
        bounded("DaemonSets", ds_api.list(&lp)),
        bounded("CustomResourceDefinitions", crd_api.list(&lp)),
        helm_records(client, "cilium"),
    )?;
    let nodes = nodes.items.iter().map(kube_node).collect();
    let mut cni_workloads = Vec::new();
    let mut kube_proxy_daemonset = false;
    for ds in &daemonsets.items {
        let ns = ds.metadata.namespace.clone().unwrap_or_default();
        let name = ds.metadata.name.clone().unwrap_or_default();
        if ns == "kube-system" && name == "kube-proxy" {
            kube_proxy_daemonset = true;
        }
        let images: Vec<String> = ds
            .spec
            .template
            .spec
            .as_ref()
            .map(|p| {
                p.containers
                    .iter()
                    .filter_map(|c| c.image.clone())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(w) = CniWorkload::recognise(&ns, &name, &images) {
            cni_workloads.push(w);
        }
    }
    let crd = |name: &str| {
        crds.items
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    };
    let established = |c: &CustomResourceDefinition| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    };
    Ok(KubeInspection {
        nodes,
        cni_workloads,
        cilium_node_crd: crd("ciliumnodes.cilium.io").is_some(),
        cilium_policy_crd_established: crd("ciliumnetworkpolicies.cilium.io")
            .is_some_and(established),
        cilium_records: records
            .into_iter()
            .map(|(storage_namespace, r)| CiliumRecord {
                storage_namespace,
                release_namespace: r.namespace.clone(),
                status: r.status().as_str().to_string(),
                revision: r.version,
            })
            .collect(),
        kube_proxy_daemonset,
    })
}

pub(crate) fn kube_node(n: &Node) -> KubeNode {
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    KubeNode {
        name: n.metadata.name.clone().unwrap_or_default(),
        ready: ready.is_some_and(|c| c.status == "True"),
        ready_message: ready.and_then(|c| c.message.clone()),
        pod_cidr: n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
    }
}

/// The newest revision of each Helm release named `name`, in any namespace,
/// with the namespace its record is stored in.
pub async fn helm_records(
    client: &kube::Client,
    name: &str,
) -> Result<Vec<(String, ichor_helm::Release)>, InspectError> {
    let lp = ListParams::default().labels(&format!("owner=helm,name={name}"));
    let api = Api::<Secret>::all(client.clone());
    let secrets = bounded("Helm release records (Secrets)", api.list(&lp)).await?;
    let mut newest: BTreeMap<String, ichor_helm::Release> = BTreeMap::new();
    for s in &secrets.items {
        let Ok(release) = ichor_helm::record::from_secret(s) else {
            continue;
        };
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        if newest.get(&ns).is_none_or(|r| r.version < release.version) {
            newest.insert(ns, release);
        }
    }
    Ok(newest.into_iter().collect())
}

/// Spec 4.3: Ichor is present when the IchorInstallation exists (its manager
/// is authoritative then), or a Helm release of the chart `ichor` is deployed
/// in any namespace, or the controller Deployment with the chart's selector
/// label exists.
pub async fn ichor_presence(client: &kube::Client) -> Result<IchorPresence, InspectError> {
    let installations = Api::<IchorInstallation>::all(client.clone());
    let installation = match tokio::time::timeout(
        KUBE_CALL_TIMEOUT,
        installations.list(&ListParams::default()),
    )
    .await
    {
        Ok(Ok(list)) => list.items.into_iter().next(),
        // The CRD is absent: no Ichor installed by either path yet.
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => None,
        Ok(Err(source)) => {
            return Err(InspectError::Kube {
                what: "IchorInstallation",
                source,
            });
        }
        Err(_) => {
            return Err(InspectError::KubeTimeout {
                what: "IchorInstallation",
                timeout: KUBE_CALL_TIMEOUT,
            });
        }
    };
    let helm_release = async {
        let lp = ListParams::default().labels("owner=helm,status=deployed");
        let api = Api::<Secret>::all(client.clone());
        let secrets = bounded("Helm release records (Secrets)", api.list(&lp)).await?;
        Ok::<_, InspectError>(
            secrets
                .items
                .iter()
                .filter_map(|s| ichor_helm::record::from_secret(s).ok())
                .find(|r| r.chart_name() == Some("ichor")),
        )
    };
    if let Some(inst) = installation {
        let version = Some(inst.spec.version.clone());
        return Ok(match inst.spec.deployment.manager {
            Manager::Helm => {
                let release = helm_release.await?;
                if release.is_none() {
                    // No record (a chart applied without helm's storage, or
                    // an uninstall that kept the CRDs and so this object).
                    return match chart_deployment_presence(client).await? {
                        Some(p) => Ok(p),
                        None => Err(InspectError::HelmInstallGone {
                            namespace: inst
                                .metadata
                                .namespace
                                .clone()
                                .unwrap_or_else(|| ichor_api::SYSTEM_NAMESPACE.into()),
                            version: inst.spec.version.clone(),
                        }),
                    };
                }
                IchorPresence::Helm {
                    release: release
                        .as_ref()
                        .map(|r| r.name.clone())
                        .unwrap_or_else(|| "ichor".into()),
                    namespace: release
                        .as_ref()
                        .map(|r| r.namespace.clone())
                        .unwrap_or_else(|| ichor_api::SYSTEM_NAMESPACE.into()),
                    // The deployed chart says which Ichor runs: the object's
                    // version is written once, when the controller creates it,
                    // and a later `helm upgrade` does not change it.
                    version: release
                        .as_ref()
                        .and_then(|r| r.app_version())
                        .map(str::to_string)
                        .unwrap_or_else(|| inst.spec.version.clone()),
                }
            }
            _ => IchorPresence::Installer { version },
        });
    }
    if let Some(r) = helm_release.await? {
        return Ok(IchorPresence::Helm {
            release: r.name.clone(),
            namespace: r.namespace.clone(),
            version: r.app_version().unwrap_or_default().to_string(),
        });
    }
    Ok(chart_deployment_presence(client)
        .await?
        .unwrap_or(IchorPresence::Absent))
}

/// The controller Deployment carrying the chart's selector label, as a Helm
/// presence (release and version from its labels).
async fn chart_deployment_presence(
    client: &kube::Client,
) -> Result<Option<IchorPresence>, InspectError> {
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        CHART_SELECTOR_LABEL.0, CHART_SELECTOR_LABEL.1
    ));
    let api = Api::<Deployment>::all(client.clone());
    let deployments = bounded("Deployments", api.list(&lp)).await?;
    if let Some(d) = deployments.items.first() {
        let version = d
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/version").cloned())
            .unwrap_or_default();
        return Ok(Some(IchorPresence::Helm {
            release: d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/instance").cloned())
                .unwrap_or_else(|| "ichor".into()),
            namespace: d.metadata.namespace.clone().unwrap_or_default(),
            version,
        }));
    }
    Ok(None)
}

/// Reads both sides at once.
pub async fn inspect(
    talos: &TalosClient,
    nodes: &[String],
    kube: &kube::Client,
) -> Result<(crate::Inspection, IchorPresence), InspectError> {
    let (talos_nodes, kube_side, presence) = tokio::try_join!(
        inspect_talos(talos, nodes),
        inspect_kube(kube),
        ichor_presence(kube)
    )?;
    Ok((
        crate::Inspection {
            talos: talos_nodes,
            kube: kube_side,
        },
        presence,
    ))
}
