//! The inspection: adopt's read-only first phase. Every call is bounded, and
//! the nodes are read concurrently. Nothing here writes anything.

use std::time::Duration;

use ichor_adopt::inspection::{CiliumRecord, CniWorkload, KubeInspection, KubeNode, TalosNode};
use ichor_adopt::install::CHART_SELECTOR_LABEL;
use ichor_adopt::plan::IchorPresence;
use ichor_api::{IchorInstallation, Manager};
use ichor_talos::config::MachineConfig;
use ichor_talos_client::TalosClient;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

/// Upper bound of one Kubernetes read.
pub const KUBE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("reading {what} from node {node} failed")]
    Talos {
        node: String,
        what: &'static str,
        #[source]
        source: ichor_talos_client::Error,
    },
    #[error("node {node}'s machine config cannot be read")]
    Config {
        node: String,
        #[source]
        source: ichor_talos::config::ConfigError,
    },
    #[error(
        "reading {what} from Kubernetes failed; check the kubeconfig and that its user may read {what}"
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
        if ds.metadata.namespace.as_deref() == Some("kube-system")
            && ds.metadata.name.as_deref() == Some("kube-proxy")
        {
            kube_proxy_daemonset = true;
        }
        cni_workloads.extend(CniWorkload::of_daemonset(ds));
    }
    let crd = |name: &str| {
        crds.items
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
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

/// The CRD's Established condition is True.
pub(crate) fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
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
/// with the namespace its record is stored in (ichor-helm's storage query,
/// bounded).
pub async fn helm_records(
    client: &kube::Client,
    name: &str,
) -> Result<Vec<(String, ichor_helm::Release)>, InspectError> {
    bounded(
        "Helm release records (Secrets)",
        ichor_helm::storage::newest_in_every_namespace(client, name),
    )
    .await
}

/// R4.3a: Ichor is present when the IchorInstallation exists (its manager
/// is authoritative then), or a Helm release of the chart `ichor` is deployed
/// in any namespace, or the controller Deployment with the chart's selector
/// label exists.
pub async fn ichor_presence(client: &kube::Client) -> Result<IchorPresence, InspectError> {
    if let Some(installation) = installation(client).await? {
        return match installation.spec.deployment.manager {
            Manager::Helm => helm_managed_presence(client, &installation).await,
            _ => Ok(IchorPresence::Installer {
                version: Some(installation.spec.version.clone()),
            }),
        };
    }
    if let Some(r) = deployed_ichor_chart(client).await? {
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

/// The IchorInstallation, if the CRD and one object exist.
async fn installation(client: &kube::Client) -> Result<Option<IchorInstallation>, InspectError> {
    let installations = Api::<IchorInstallation>::all(client.clone());
    match tokio::time::timeout(
        KUBE_CALL_TIMEOUT,
        installations.list(&ListParams::default()),
    )
    .await
    {
        Ok(Ok(list)) => Ok(list.items.into_iter().next()),
        // The CRD is absent: no Ichor installed by either path yet.
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => Ok(None),
        Ok(Err(source)) => Err(InspectError::Kube {
            what: "IchorInstallation",
            source,
        }),
        Err(_) => Err(InspectError::KubeTimeout {
            what: "IchorInstallation",
            timeout: KUBE_CALL_TIMEOUT,
        }),
    }
}

/// A deployed Helm release of the chart `ichor`, in any namespace.
async fn deployed_ichor_chart(
    client: &kube::Client,
) -> Result<Option<ichor_helm::Release>, InspectError> {
    let lp = ListParams::default().labels(&format!(
        "{},status=deployed",
        ichor_helm::storage::OWNER_SELECTOR
    ));
    let api = Api::<Secret>::all(client.clone());
    let secrets = bounded("Helm release records (Secrets)", api.list(&lp)).await?;
    Ok(secrets
        .items
        .iter()
        .filter_map(|s| ichor_helm::record::from_secret(s).ok())
        .find(|r| r.chart_name() == Some("ichor")))
}

/// The IchorInstallation says Helm manages Ichor: the deployed chart says
/// which Ichor runs (the object's version is written once, when the
/// controller creates it, and a later `helm upgrade` does not change it).
async fn helm_managed_presence(
    client: &kube::Client,
    installation: &IchorInstallation,
) -> Result<IchorPresence, InspectError> {
    if let Some(release) = deployed_ichor_chart(client).await? {
        return Ok(IchorPresence::Helm {
            version: release
                .app_version()
                .map(str::to_string)
                .unwrap_or_else(|| installation.spec.version.clone()),
            release: release.name,
            namespace: release.namespace,
        });
    }
    // No record (a chart applied without helm's storage, or an uninstall
    // that kept the CRDs and so this object).
    match chart_deployment_presence(client).await? {
        Some(p) => Ok(p),
        None => Err(InspectError::HelmInstallGone {
            namespace: installation
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| ichor_api::SYSTEM_NAMESPACE.into()),
            version: installation.spec.version.clone(),
        }),
    }
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
) -> Result<(ichor_adopt::Inspection, IchorPresence), InspectError> {
    let (talos_nodes, kube_side, presence) = tokio::try_join!(
        inspect_talos(talos, nodes),
        inspect_kube(kube),
        ichor_presence(kube)
    )?;
    Ok((
        ichor_adopt::Inspection {
            talos: talos_nodes,
            kube: kube_side,
        },
        presence,
    ))
}
