//! The settings a Kubernetes minor removes: command-line flags of
//! kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet,
//! admission plugins and feature gates. A component started with one of
//! them does not start, so `talosctl upgrade-k8s` refuses the path when a
//! node's config still sets one (go-kubernetes's upgrade checks, which list
//! them per minor from Kubernetes's deprecation guide and changelogs). Ichor
//! makes the same check at plan time from each machine's live config: the
//! `extraArgs` of each component (v1alpha1
//! `cluster.apiServer/controllerManager/scheduler.extraArgs` and
//! `machine.kubelet.extraArgs`, or the `extraArgs` of the v1.14 shape's
//! `Kube*Config` documents), `enable-admission-plugins` and `feature-gates`
//! among them. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::version::release;

/// One minor's removals.
pub struct Removals {
    /// The minor that removes them (Kubernetes 1.`minor`).
    pub minor: u64,
    pub apiserver_flags: &'static [&'static str],
    pub controller_manager_flags: &'static [&'static str],
    pub scheduler_flags: &'static [&'static str],
    pub kubelet_flags: &'static [&'static str],
    pub admission_plugins: &'static [&'static str],
    /// Feature gates no component accepts any more.
    pub feature_gates: &'static [&'static str],
}

const NONE: &[&str] = &[];

/// The removals Ichor knows, by minor (1.25 to 1.36; for 1.37 only the
/// removed APIs are known, `super::REMOVED_API_RESOURCES`).
pub const REMOVALS: &[Removals] = &[
    Removals {
        minor: 25,
        apiserver_flags: &["service-account-api-audiences"],
        controller_manager_flags: &[
            "deleting-pods-qps",
            "deleting-pods-burst",
            "register-retry-count",
        ],
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: &["PodSecurityPolicy"],
        feature_gates: &[
            "CSIVolumeFSGroupPolicy",
            "ConfigurableFSGroupPolicy",
            "PodDisruptionBudget",
            "SelectorIndex",
        ],
    },
    Removals {
        minor: 26,
        apiserver_flags: &["master-service-namespace"],
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: NONE,
        feature_gates: &["DynamicKubeletConfig"],
    },
    Removals {
        minor: 27,
        apiserver_flags: NONE,
        controller_manager_flags: &["enable-taint-manager", "pod-eviction-timeout"],
        scheduler_flags: NONE,
        kubelet_flags: &["container-runtime", "master-service-namespace"],
        admission_plugins: NONE,
        feature_gates: &[
            "ExpandCSIVolumes",
            "ExpandInUsePersistentVolumes",
            "ExpandPersistentVolumes",
            "ControllerManagerLeaderMigration",
            "CSIMigration",
            "CSIInlineVolume",
            "EphemeralContainers",
            "LocalStorageCapacityIsolation",
            "NetworkPolicyEndPort",
            "StatefulSetMinReadySeconds",
            "IdentifyPodOS",
            "DaemonSetUpdateSurge",
        ],
    },
    Removals {
        minor: 28,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: NONE,
        feature_gates: &[
            "AdvancedAuditing",
            "DelegateFSGroupToCSIDriver",
            "DevicePlugins",
            "DisableAcceleratorUsageMetrics",
            "EndpointSliceTerminatingCondition",
            "CSIStorageCapacity",
            "CSIMigrationGCE",
            "KubeletCredentialProviders",
            "MixedProtocolLBService",
            "ServiceInternalTrafficPolicy",
            "ServiceIPStaticSubrange",
            "WindowsHostProcessContainers",
        ],
    },
    Removals {
        minor: 30,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: &["SecurityContextDeny"],
        feature_gates: &[
            "ExpandedDNSConfig",
            "ExperimentalHostUserNamespaceDefaultingGate",
            "IPTablesOwnershipCleanup",
            "KubeletPodResources",
            "KubeletPodResourcesGetAllocatable",
            "MinimizeIPTablesRestore",
            "ProxyTerminatingEndpoints",
            "RemoveSelfLink",
        ],
    },
    Removals {
        minor: 31,
        apiserver_flags: NONE,
        controller_manager_flags: &[
            "volume-host-cidr-denylist",
            "volume-host-allow-local-loopback",
            "horizontal-pod-autoscaler-upscale-delay",
            "horizontal-pod-autoscaler-downscale-delay",
        ],
        scheduler_flags: NONE,
        kubelet_flags: &[
            "keep-terminated-pod-volumes",
            "iptables-masquerade-bit",
            "iptables-drop-bit",
        ],
        admission_plugins: NONE,
        feature_gates: &[
            "APIPriorityAndFairness",
            "CSINodeExpandSecret",
            "ConsistentHTTPGetHandlers",
            "DefaultHostNetworkHostPortsInPodTemplates",
            "ServiceNodePortStaticSubrange",
            "SkipReadOnlyValidationGCE",
        ],
    },
    Removals {
        minor: 32,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: NONE,
        feature_gates: &[
            "AllowServiceLBStatusOnNonLB",
            "CloudDualStackNodeIPs",
            "DRAControlPlaneController",
            "HPAContainerMetrics",
            "KMSv2",
            "KMSv2KDF",
            "LegacyServiceAccountTokenCleanUp",
            "MinDomainsInPodTopologySpread",
            "NewVolumeManagerReconstruction",
            "NodeOutOfServiceVolumeDetach",
            "ServerSideApply",
            "ServerSideFieldValidation",
            "StableLoadBalancerNodeSet",
            "ValidatingAdmissionPolicy",
            "ZeroLimitedNominalConcurrencyShares",
        ],
    },
    Removals {
        minor: 33,
        apiserver_flags: &["cloud-config"],
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: NONE,
        feature_gates: &[
            "AppArmor",
            "AppArmorFields",
            "CPUManager",
            "DisableCloudProviders",
            "DisableKubeletCloudCredentialProviders",
            "JobPodFailurePolicy",
            "KubeProxyDrainingTerminatingNodes",
            "PDBUnhealthyPodEvictionPolicy",
            "PersistentVolumeLastPhaseTransitionTime",
            "VolumeCapacityPriority",
        ],
    },
    Removals {
        minor: 34,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: &["cloud-config"],
        admission_plugins: NONE,
        feature_gates: &[
            "DevicePluginCDIDevices",
            "LegacySidecarContainers",
            "PodDisruptionConditions",
        ],
    },
    Removals {
        minor: 35,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: &["pod-infra-container-image"],
        admission_plugins: NONE,
        feature_gates: &[
            "SizeMemoryBackedVolumes",
            "UserNamespacesHostNetworkSupport",
        ],
    },
    Removals {
        minor: 36,
        apiserver_flags: NONE,
        controller_manager_flags: NONE,
        scheduler_flags: NONE,
        kubelet_flags: NONE,
        admission_plugins: NONE,
        feature_gates: &[
            "CSIMigrationPortworx",
            "InTreePluginPortworxUnregister",
            "WatchFromStorageWithoutResourceVersion",
        ],
    },
];

/// A component whose settings the check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    ApiServer,
    ControllerManager,
    Scheduler,
    Kubelet,
}

impl Component {
    pub fn as_str(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Kubelet => "kubelet",
        }
    }

    /// (v1alpha1 path, v1.14 document kind).
    fn places(self) -> (&'static [&'static str], &'static str) {
        match self {
            Component::ApiServer => (&["cluster", "apiServer"], "KubeAPIServerConfig"),
            Component::ControllerManager => (
                &["cluster", "controllerManager"],
                "KubeControllerManagerConfig",
            ),
            Component::Scheduler => (&["cluster", "scheduler"], "KubeSchedulerConfig"),
            Component::Kubelet => (&["machine", "kubelet"], "KubeletConfig"),
        }
    }

    fn flags(self, r: &Removals) -> &'static [&'static str] {
        match self {
            Component::ApiServer => r.apiserver_flags,
            Component::ControllerManager => r.controller_manager_flags,
            Component::Scheduler => r.scheduler_flags,
            Component::Kubelet => r.kubelet_flags,
        }
    }
}

/// Each component's extra arguments in a config's documents (as JSON):
/// flag name (no dashes) → value; a flag given more than once is joined
/// with commas, as the component reads a list.
pub fn component_args(docs: &[Value]) -> BTreeMap<Component, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for c in [
        Component::ApiServer,
        Component::ControllerManager,
        Component::Scheduler,
        Component::Kubelet,
    ] {
        let (path, kind) = c.places();
        let mut args = BTreeMap::new();
        for doc in docs {
            let section = if doc.get("kind").and_then(Value::as_str) == Some(kind) {
                Some(doc)
            } else if doc.get("version").and_then(Value::as_str) == Some("v1alpha1") {
                path.iter().try_fold(doc, |v, k| v.get(*k))
            } else {
                None
            };
            let Some(extra) = section
                .and_then(|s| s.get("extraArgs"))
                .and_then(Value::as_object)
            else {
                continue;
            };
            for (k, v) in extra {
                let value = match v {
                    Value::String(s) => s.clone(),
                    Value::Array(items) => items
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(","),
                    other => other.to_string(),
                };
                args.insert(k.trim_start_matches('-').to_string(), value);
            }
        }
        if !args.is_empty() {
            out.insert(c, args);
        }
    }
    out
}

/// What a machine's settings still use that the path `from` → `to`
/// removes (the minors after `from`, up to `to`), each as
/// `kube-apiserver flag --cloud-config (removed in Kubernetes 1.33)`.
pub fn removed_in_use(
    from: &str,
    to: &str,
    args: &BTreeMap<Component, BTreeMap<String, String>>,
) -> Vec<String> {
    let (Some(f), Some(t)) = (release(from), release(to)) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for r in REMOVALS
        .iter()
        .filter(|r| f.0 == 1 && t.0 == 1 && r.minor > f.1 && r.minor <= t.1)
    {
        let when = format!("removed in Kubernetes 1.{}", r.minor);
        for (c, given) in args {
            for flag in c.flags(r).iter().filter(|fl| given.contains_key(**fl)) {
                found.push(format!("{} flag --{flag} ({when})", c.as_str()));
            }
            let listed = |key: &str| -> Vec<String> {
                given
                    .get(key)
                    .map(|v| {
                        v.split(',')
                            .map(|s| s.split('=').next().unwrap_or_default().trim().to_string())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            for gate in listed("feature-gates")
                .iter()
                .filter(|g| r.feature_gates.contains(&g.as_str()))
            {
                found.push(format!("{} feature gate {gate} ({when})", c.as_str()));
            }
            if *c == Component::ApiServer {
                for plugin in listed("enable-admission-plugins")
                    .iter()
                    .filter(|p| r.admission_plugins.contains(&p.as_str()))
                {
                    found.push(format!("kube-apiserver admission plugin {plugin} ({when})"));
                }
            }
        }
    }
    found
}

/// The plan-time refusal naming each machine and what it still sets.
pub fn refusal(to: &str, machines: &[(String, Vec<String>)]) -> Option<String> {
    let named: Vec<String> = machines
        .iter()
        .filter(|(_, found)| !found.is_empty())
        .map(|(m, found)| format!("TalosMachine {m}: {}", found.join(", ")))
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "Kubernetes {to} no longer accepts settings the machines' configs still give: {}; remove them (the machine's patches or the TalosCluster's) and let Ichor apply the change, then create the operation again",
            named.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1alpha1() -> Value {
        json!({"version": "v1alpha1",
            "machine": {"kubelet": {"extraArgs": {"pod-infra-container-image": "pause:3.9", "feature-gates": "SizeMemoryBackedVolumes=true"}}},
            "cluster": {
                "apiServer": {"extraArgs": {"cloud-config": "/etc/c", "enable-admission-plugins": "NodeRestriction,SecurityContextDeny", "feature-gates": "AppArmor=true,Foo=false"}},
                "controllerManager": {"extraArgs": {"horizontal-pod-autoscaler-upscale-delay": "3m"}},
                "scheduler": {"extraArgs": {"v": "2"}}}})
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (removed flags, admission plugins and feature gates, by the minors on the path)
    #[test]
    fn each_kind_of_removed_setting_is_named_only_on_its_path() {
        let args = component_args(&[v1alpha1()]);
        assert_eq!(args.len(), 4);
        // 1.32 → 1.33: the apiserver's --cloud-config and the AppArmor gate.
        assert_eq!(
            removed_in_use("v1.32.4", "1.33.0", &args),
            [
                "kube-apiserver flag --cloud-config (removed in Kubernetes 1.33)",
                "kube-apiserver feature gate AppArmor (removed in Kubernetes 1.33)",
            ]
        );
        // 1.34 → 1.35: the kubelet's flag and gate.
        assert_eq!(
            removed_in_use("1.34.1", "1.35.0", &args),
            [
                "kubelet flag --pod-infra-container-image (removed in Kubernetes 1.35)",
                "kubelet feature gate SizeMemoryBackedVolumes (removed in Kubernetes 1.35)",
            ]
        );
        // 1.29 → 1.30: the admission plugin; 1.30 → 1.31: the controller-manager's flag.
        assert_eq!(
            removed_in_use("1.29.0", "1.30.2", &args),
            ["kube-apiserver admission plugin SecurityContextDeny (removed in Kubernetes 1.30)"]
        );
        assert_eq!(
            removed_in_use("1.30.0", "1.31.0", &args),
            [
                "kube-controller-manager flag --horizontal-pod-autoscaler-upscale-delay (removed in Kubernetes 1.31)"
            ]
        );
        // A patch upgrade crosses no minor: nothing.
        assert!(removed_in_use("1.33.0", "1.33.5", &args).is_empty());
        assert!(removed_in_use("1.36.0", "1.37.0", &args).is_empty());
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (the v1.14 shape's documents, flags with dashes and lists)
    #[test]
    fn the_multidoc_shape_and_list_values_are_read() {
        let docs = [
            json!({"version": "v1alpha1", "machine": {}}),
            json!({"apiVersion": "v1alpha1", "kind": "KubeAPIServerConfig", "extraArgs": {"--cloud-config": ["/a", "/b"]}}),
            json!({"apiVersion": "v1alpha1", "kind": "KubeletConfig", "extraArgs": {"cloud-config": "/c"}}),
        ];
        let args = component_args(&docs);
        assert_eq!(args[&Component::ApiServer]["cloud-config"], "/a,/b");
        assert_eq!(
            removed_in_use("1.33.0", "1.34.0", &args),
            ["kubelet flag --cloud-config (removed in Kubernetes 1.34)"]
        );
    }

    /// Covers: kubernetes-upgrade, ADR 0014 (the refusal names the machine and the setting)
    #[test]
    fn the_refusal_names_machine_and_setting() {
        let m = refusal(
            "v1.33.0",
            &[
                (
                    "cp-1".into(),
                    vec!["kube-apiserver flag --cloud-config (removed in Kubernetes 1.33)".into()],
                ),
                ("w-1".into(), vec![]),
            ],
        )
        .unwrap();
        assert!(
            m.contains("TalosMachine cp-1: kube-apiserver flag --cloud-config"),
            "{m}"
        );
        assert!(!m.contains("w-1"), "{m}");
        assert_eq!(refusal("v1.33.0", &[("w-1".into(), vec![])]), None);
    }
}
