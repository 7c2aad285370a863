//! The plan: what adopt will do, printed before consent and written nowhere.
//! The TalosCluster is built here, in memory, before anything is written, so
//! the Cilium values installed and the object written come from one value (R1.4d).

use std::collections::BTreeMap;

use ichor_api::{
    ClusterNetwork, ClusterRef, CniPreset, CniSpec, KubeProxyMode, MachineRole, SecretsRef,
    TalosCNI, TalosCluster, TalosClusterSpec, TalosMachine, TalosMachineSpec, Tunnel, UnmanagedCni,
};
use ichor_talos::config::CniName;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::classify::{AdoptMode, CniClassification, Refusal, classify_cni, decide_mode};
use crate::inspection::{Inspection, TalosNode};
use crate::preconditions::{self, Subnets};

pub use ichor_api::ADOPTED_ANNOTATION;
/// The label naming the cluster on the objects adopt writes for it.
pub const CLUSTER_LABEL: &str = "ichor.maesh.dev/cluster";

/// How Ichor itself is present in the cluster (R4.3a).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "camelCase")]
pub enum IchorPresence {
    Absent,
    /// Installed by the installer path (IchorInstallation with manager installer).
    Installer {
        version: Option<String>,
    },
    /// Installed with `helm install`.
    Helm {
        release: String,
        namespace: String,
        version: String,
    },
}

/// One machine adopt will create, held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedMachine {
    pub name: String,
    pub address: String,
    pub role: String,
}

/// What adopt will do.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub cluster: String,
    pub namespace: String,
    pub found: CniClassification,
    pub mode: AdoptMode,
    pub tunnel: Tunnel,
    pub kube_proxy: KubeProxyMode,
    pub ichor: IchorPresence,
    pub endpoint: String,
    pub talos_version: String,
    pub kubernetes_version: String,
    pub subnets: Subnets,
    pub machines: Vec<PlannedMachine>,
    /// The Talos CNI setting recorded for the unmanaged preset.
    pub talos_cni: Option<TalosCNI>,
}

/// Inputs of the plan beyond the inspection.
#[derive(Debug, Clone)]
pub struct PlanInput {
    pub cluster: String,
    pub namespace: String,
    /// `--tunnel`, or the API default.
    pub tunnel: Option<Tunnel>,
    pub ichor: IchorPresence,
}

impl Plan {
    pub fn new(
        input: PlanInput,
        inspection: &Inspection,
        found: CniClassification,
        mode: AdoptMode,
        subnets: Subnets,
    ) -> Plan {
        let control_plane = inspection
            .talos
            .iter()
            .find(|n| n.facts.machine_type.is_control_plane());
        let endpoint = control_plane
            .and_then(|n| n.facts.control_plane_endpoint.clone())
            .unwrap_or_default();
        let kubernetes_version = control_plane
            .and_then(|n| n.facts.kubernetes_version.clone())
            .unwrap_or_default();
        let talos_version = inspection
            .talos
            .iter()
            .map(|n| n.talos_version.clone())
            .min_by(|a, b| version_key(a).cmp(&version_key(b)))
            .unwrap_or_default();
        let machines = inspection
            .talos
            .iter()
            .map(|n| PlannedMachine {
                name: n.hostname.clone(),
                address: n.address.clone(),
                role: if n.facts.machine_type.is_control_plane() {
                    "controlplane"
                } else {
                    "worker"
                }
                .into(),
            })
            .collect();
        let talos_cni = (mode == AdoptMode::Unmanaged).then(|| {
            match control_plane.and_then(|n| n.facts.cni.clone()) {
                Some(CniName::Flannel) => TalosCNI::Flannel,
                Some(CniName::Custom) => TalosCNI::Custom,
                _ => TalosCNI::None,
            }
        });
        Plan {
            cluster: input.cluster,
            namespace: input.namespace,
            found,
            mode,
            tunnel: input.tunnel.unwrap_or_default(),
            kube_proxy: kube_proxy_from_talos(inspection),
            ichor: input.ichor,
            endpoint,
            talos_version,
            kubernetes_version,
            subnets,
            machines,
            talos_cni,
        }
    }

    /// The plan's first line, worded as R1.5a and R1.7c have it.
    pub fn summary(&self) -> String {
        let (tunnel, kube_proxy) = (self.tunnel.as_str(), self.kube_proxy.as_str());
        match self.mode {
            AdoptMode::InstallCilium => format!(
                "no CNI found: Ichor will install Cilium (tunnel {tunnel}, kube-proxy {kube_proxy}) as its own Helm release, then install Ichor, then adopt"
            ),
            AdoptMode::KeepIchorsCilium => format!(
                "{} found: already handled; adopt only checks the release exists (tunnel {tunnel}, kube-proxy {kube_proxy})",
                self.found.describe()
            ),
            AdoptMode::TakeOverCilium => format!(
                "{} found: Ichor will take it over as its own Helm release (tunnel {tunnel}, kube-proxy {kube_proxy}), then adopt",
                self.found.describe()
            ),
            AdoptMode::Unmanaged => format!(
                "{} found: Ichor will adopt the cluster and leave its CNI to you (preset unmanaged)",
                self.found.describe()
            ),
        }
    }

    /// The whole plan as printed before consent.
    pub fn text(&self) -> String {
        let mut out = vec![self.summary()];
        out.push(match &self.ichor {
            IchorPresence::Absent => "Ichor is not installed: adopt will install it".to_string(),
            IchorPresence::Installer { version } => format!(
                "Ichor is installed ({}); not installing it again",
                version.as_deref().unwrap_or("version unknown")
            ),
            IchorPresence::Helm { release, version, .. } => {
                format!("Ichor is installed by Helm (release {release}, version {version}); not touching it")
            }
        });
        out.push(format!(
            "TalosCluster {}/{}: endpoint {}, Talos {}, Kubernetes {}, pods {}, services {}",
            self.namespace,
            self.cluster,
            self.endpoint,
            self.talos_version,
            self.kubernetes_version,
            self.subnets.pod_subnets.join(","),
            self.subnets.service_subnets.join(","),
        ));
        for m in &self.machines {
            out.push(format!(
                "TalosMachine {} ({}, {}): created held",
                m.name, m.role, m.address
            ));
        }
        out.push("then the holds are released machine by machine".into());
        out.join("\n")
    }

    /// The TalosCluster adopt writes; the Cilium values are derived from it.
    pub fn talos_cluster(&self, secrets: SecretsRef) -> TalosCluster {
        let mut cluster = TalosCluster::new(
            &self.cluster,
            TalosClusterSpec {
                endpoint: self.endpoint.clone(),
                talos_version: self.talos_version.clone(),
                kubernetes_version: self.kubernetes_version.clone(),
                network: ClusterNetwork {
                    pod_subnets: self.subnets.pod_subnets.clone(),
                    service_subnets: self.subnets.service_subnets.clone(),
                },
                cni: CniSpec {
                    preset: self.mode.preset(),
                    tunnel: self.tunnel,
                    kube_proxy: self.kube_proxy,
                    cilium: None,
                    unmanaged: self
                        .talos_cni
                        .filter(|_| self.mode.preset() == CniPreset::Unmanaged)
                        .map(|talos_cni| UnmanagedCni { talos_cni }),
                },
                secrets_ref: secrets,
                backup: None,
                maintenance_windows: Vec::new(),
                alertmanager: None,
                apply_mode: None,
                try_timeout: None,
                revisions_kept: None,
            },
        );
        cluster.metadata.namespace = Some(self.namespace.clone());
        cluster.metadata.annotations = Some(BTreeMap::from([(
            ADOPTED_ANNOTATION.to_string(),
            "true".to_string(),
        )]));
        cluster
    }
}

/// The TalosMachine adopt writes for a node of `cluster`: held (R1.7a),
/// so the controller computes drift and applies nothing until the release.
pub fn held_machine(cluster: &str, node: &TalosNode) -> TalosMachine {
    let mut m = TalosMachine::new(
        &node.hostname,
        TalosMachineSpec {
            cluster_ref: ClusterRef {
                name: cluster.to_string(),
            },
            role: if node.facts.machine_type.is_control_plane() {
                MachineRole::Controlplane
            } else {
                MachineRole::Worker
            },
            address: node.address.clone(),
            hold: true,
            patches: vec![],
            removal: None,
            replaces: None,
            apply_mode: None,
            try_timeout: None,
        },
    );
    m.metadata.labels = Some(BTreeMap::from([(
        CLUSTER_LABEL.to_string(),
        cluster.to_string(),
    )]));
    m
}

/// What the operator asked adopt for, as far as the plan depends on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    pub cluster: &'a str,
    /// `--tunnel`.
    pub tunnel: Option<Tunnel>,
    /// `--cni-unmanaged`.
    pub cni_unmanaged: bool,
    /// `--require-ichor`.
    pub require_ichor: bool,
    /// This ichor's version, with its v.
    pub version: &'a str,
    /// `--cilium-values`, as read from its file.
    pub cilium_values: Option<&'a Map<String, Value>>,
}

/// The inspection and Ichor's presence → the plan, or why adopt refuses.
/// Everything adopt can judge before consent is judged here, so a refusal
/// comes with nothing written.
pub fn plan(
    inspection: &Inspection,
    ichor: IchorPresence,
    request: &Request,
) -> Result<Plan, Vec<Refusal>> {
    let found = classify_cni(inspection);
    let mode = decide_mode(&found, request.cni_unmanaged).map_err(|r| vec![r])?;
    let subnets = preconditions::check(inspection, mode)?;
    check_presence(&ichor, request).map_err(|r| vec![r])?;
    if let Some(values) = request.cilium_values {
        let nodes = ichor_api::cilium::node_count_rule(inspection.kube.nodes.len(), 0);
        check_cilium_values(values, nodes).map_err(|r| vec![r])?;
    }
    Ok(Plan::new(
        PlanInput {
            cluster: request.cluster.to_string(),
            namespace: ichor_api::SYSTEM_NAMESPACE.to_string(),
            tunnel: request.tunnel,
            ichor,
        },
        inspection,
        found,
        mode,
        subnets,
    ))
}

/// R4.3c, R4.3e: `--require-ichor` needs an Ichor, and a Helm-installed Ichor
/// must be this ichor's version.
fn check_presence(presence: &IchorPresence, request: &Request) -> Result<(), Refusal> {
    match presence {
        IchorPresence::Absent if request.require_ichor => Err(Refusal::new(
            "Ichor is not installed in this cluster and --require-ichor is set: install Ichor with Helm first",
        )),
        IchorPresence::Helm {
            release,
            namespace,
            version,
        } if version != request.version => Err(Refusal::new(format!(
            "Ichor {version} is installed by Helm (release {release}) but this ichor is {cli}; they must be the same version. Upgrade Ichor first: helm upgrade {release} oci://ghcr.io/maeshinshin/charts/ichor --version {chart} --namespace {namespace} --reuse-values",
            cli = request.version,
            chart = request.version.trim_start_matches('v'),
        ))),
        _ => Ok(()),
    }
}

/// `--cilium-values` must leave Ichor's own Cilium values to Ichor: refused
/// here, before consent, by the owned-paths table the values function and
/// the webhook read (with the webhook's stricter reading of a null above an
/// owned path), for a cluster of `node_count` nodes.
pub fn check_cilium_values(values: &Map<String, Value>, node_count: u32) -> Result<(), Refusal> {
    let mut set: Vec<String> = Vec::new();
    for path in ichor_api::cilium::owned_paths_for(node_count) {
        if let Some(hit) =
            ichor_api::cilium::user_value_over(values, path, ichor_api::cilium::NullAbove::Replaces)
            && !set.contains(&hit)
        {
            set.push(hit);
        }
    }
    if set.is_empty() {
        return Ok(());
    }
    let them = if set.len() == 1 { "it" } else { "them" };
    Err(Refusal::new(format!(
        "--cilium-values sets {}, which Ichor owns and sets itself; remove {them} from the file (choose the tunnel with --tunnel; kube-proxy replacement follows the kube-proxy setting Talos reports)",
        set.join(", ")
    )))
}

/// R1.4b: kube-proxy from the Talos side alone — the control-plane config, or
/// when it does not say, whether the kube-proxy DaemonSet exists.
pub fn kube_proxy_from_talos(inspection: &Inspection) -> KubeProxyMode {
    let said: Vec<bool> = inspection
        .talos
        .iter()
        .filter(|n| n.facts.machine_type.is_control_plane())
        .filter_map(|n| n.facts.kube_proxy_enabled)
        .collect();
    let enabled = if said.is_empty() {
        inspection.kube.kube_proxy_daemonset
    } else {
        said.iter().all(|e| *e)
    };
    if enabled {
        KubeProxyMode::Enabled
    } else {
        KubeProxyMode::Replaced
    }
}

fn version_key(v: &str) -> Option<ichor_talos::version::Version> {
    ichor_talos::version::Version::parse(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspection::{KubeInspection, TalosNode};
    use ichor_talos::config::MachineConfig;
    use serde_json::json;

    fn node(address: &str, machine_type: &str, proxy_disabled: bool) -> TalosNode {
        let text = format!(
            "version: v1alpha1\nmachine:\n  type: {machine_type}\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.34.1\ncluster:\n  controlPlane:\n    endpoint: https://10.5.0.2:6443\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: {proxy_disabled}\n"
        );
        TalosNode {
            address: address.into(),
            hostname: format!("node-{address}"),
            talos_version: "v1.13.9".into(),
            facts: MachineConfig::parse(&text).unwrap().facts(),
        }
    }

    fn plan(proxy_disabled: bool, tunnel: Option<Tunnel>) -> Plan {
        let inspection = Inspection {
            talos: vec![
                node("10.5.0.2", "controlplane", proxy_disabled),
                node("10.5.0.3", "worker", proxy_disabled),
            ],
            kube: KubeInspection::default(),
        };
        Plan::new(
            PlanInput {
                cluster: "lab".into(),
                namespace: "ichor-system".into(),
                tunnel,
                ichor: IchorPresence::Absent,
            },
            &inspection,
            CniClassification::NoCni,
            AdoptMode::InstallCilium,
            Subnets {
                pod_subnets: vec!["10.244.0.0/16".into()],
                service_subnets: vec!["10.96.0.0/12".into()],
            },
        )
    }

    fn values(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn cilium_values_that_set_an_owned_key_are_refused_before_consent_naming_the_key() {
        let refusal =
            check_cilium_values(&values(json!({"ipam": {"mode": "cluster-pool"}})), 3).unwrap_err();
        assert_eq!(
            refusal.message,
            "--cilium-values sets ipam.mode, which Ichor owns and sets itself; remove it from the file (choose the tunnel with --tunnel; kube-proxy replacement follows the kube-proxy setting Talos reports)"
        );
        assert!(!refusal.message.contains("again"), "{refusal}");
        let two = check_cilium_values(
            &values(json!({"tunnelProtocol": "geneve", "kubeProxyReplacement": true})),
            3,
        )
        .unwrap_err();
        assert!(
            two.message
                .contains("sets tunnelProtocol, kubeProxyReplacement")
                || two
                    .message
                    .contains("sets kubeProxyReplacement, tunnelProtocol"),
            "{two}"
        );
        assert!(two.message.contains("remove them"), "{two}");
        // A null above an owned path would replace Ichor's map: the webhook refuses it, so adopt does.
        assert!(check_cilium_values(&values(json!({"ipam": null})), 3).is_err());
    }

    #[test]
    fn cilium_values_of_the_users_own_keys_pass() {
        let own = values(
            json!({"hubble": {"relay": {"enabled": true}}, "ipam": {"operator": {"clusterPoolIPv4MaskSize": 24}}}),
        );
        assert_eq!(check_cilium_values(&own, 3), Ok(()));
        // operator.replicas is Ichor's on one node only.
        let replicas = values(json!({"operator": {"replicas": 2}}));
        assert_eq!(check_cilium_values(&replicas, 3), Ok(()));
        assert!(check_cilium_values(&replicas, 1).is_err());
    }

    /// The plan as the user reads it before consent, and as `-o json`
    /// prints it: a change to either shows in review as a snapshot diff.
    /// Covers: R1.4a, R1.5a
    #[test]
    fn the_plan_text_and_json_snapshots() {
        let p = plan(true, Some(Tunnel::Geneve));
        insta::assert_snapshot!("plan-no-cni-text", p.text());
        insta::assert_snapshot!(
            "plan-no-cni-json",
            serde_json::to_string_pretty(&p).unwrap()
        );
    }

    /// Covers: R1.5a, R1.4a, R1.4b
    #[test]
    fn the_no_cni_plan_says_what_the_spec_says() {
        assert_eq!(
            plan(false, None).summary(),
            "no CNI found: Ichor will install Cilium (tunnel vxlan, kube-proxy enabled) as its own Helm release, then install Ichor, then adopt"
        );
        assert_eq!(
            plan(true, Some(Tunnel::Geneve)).summary(),
            "no CNI found: Ichor will install Cilium (tunnel geneve, kube-proxy replaced) as its own Helm release, then install Ichor, then adopt"
        );
    }

    /// Covers: R4.3b
    #[test]
    fn a_helm_installed_ichor_is_not_touched() {
        let mut p = plan(false, None);
        p.ichor = IchorPresence::Helm {
            release: "ichor".into(),
            namespace: "ichor-system".into(),
            version: "v0.1.0".into(),
        };
        assert!(p.text().contains(
            "Ichor is installed by Helm (release ichor, version v0.1.0); not touching it"
        ));
    }

    /// Covers: R1.2a, R1.4a, R1.4b, R1.4c, R1.4d
    #[test]
    fn the_cluster_is_built_in_memory_with_preset_tunnel_kube_proxy_and_annotation() {
        let c = plan(true, Some(Tunnel::Geneve)).talos_cluster(SecretsRef {
            name: "lab-secrets".into(),
            key: None,
        });
        assert_eq!(c.spec.cni.preset, CniPreset::Cilium);
        assert_eq!(c.spec.cni.tunnel, Tunnel::Geneve);
        assert_eq!(c.spec.cni.kube_proxy, KubeProxyMode::Replaced);
        assert_eq!(
            c.spec.cni.cilium, None,
            "no user values unless --cilium-values"
        );
        assert_eq!(c.spec.endpoint, "https://10.5.0.2:6443");
        assert_eq!(c.spec.kubernetes_version, "v1.34.1");
        assert_eq!(c.spec.network.pod_subnets, vec!["10.244.0.0/16"]);
        assert_eq!(c.metadata.annotations.unwrap()[ADOPTED_ANNOTATION], "true");
    }
}
