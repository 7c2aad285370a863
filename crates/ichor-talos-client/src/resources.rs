//! The COSI resources Ichor reads: namespace, type and id of each, as Talos
//! names them (see docs/adr/0002-talos-api-client.md).

/// A COSI resource kind: its namespace and type (and the usual id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    pub namespace: &'static str,
    pub r#type: &'static str,
    /// The id Talos gives the one resource of this kind Ichor reads.
    pub id: &'static str,
}

/// The active machine config (SENSITIVE: needs `os:admin`). Also id `persistent`.
pub const MACHINE_CONFIG: Kind = Kind {
    namespace: "config",
    r#type: "MachineConfigs.config.talos.dev",
    id: "v1alpha1",
};
/// The id of the persisted machine config (leads `v1alpha1` after STAGED, lags after TRY).
pub const MACHINE_CONFIG_PERSISTENT_ID: &str = "persistent";
/// The machine type (`controlplane`, `worker`, `init`).
pub const MACHINE_TYPE: Kind = Kind {
    namespace: "config",
    r#type: "MachineTypes.config.talos.dev",
    id: "machine-type",
};
/// The Talos version.
pub const VERSION: Kind = Kind {
    namespace: "runtime",
    r#type: "Versions.runtime.talos.dev",
    id: "version",
};
/// The Kubernetes node name.
pub const NODENAME: Kind = Kind {
    namespace: "k8s",
    r#type: "Nodenames.kubernetes.talos.dev",
    id: "nodename",
};
/// The hostname status.
pub const HOSTNAME_STATUS: Kind = Kind {
    namespace: "network",
    r#type: "HostnameStatuses.net.talos.dev",
    id: "hostname",
};
/// KubePrism's configuration: exists only when KubePrism is enabled.
pub const KUBEPRISM_CONFIG: Kind = Kind {
    namespace: "k8s",
    r#type: "KubePrismConfigs.kubernetes.talos.dev",
    id: "k8s-loadbalancer-config",
};
/// KubePrism's status (`host`, `healthy`).
pub const KUBEPRISM_STATUS: Kind = Kind {
    namespace: "k8s",
    r#type: "KubePrismStatuses.kubernetes.talos.dev",
    id: "k8s-loadbalancer",
};
/// KubePrism's upstream endpoints.
pub const KUBEPRISM_ENDPOINTS: Kind = Kind {
    namespace: "k8s",
    r#type: "KubePrismEndpoints.kubernetes.talos.dev",
    id: "k8s-cluster",
};
/// The bootstrap manifests config (control-plane nodes only): CNI, kube-proxy, pod CIDRs.
pub const BOOTSTRAP_MANIFESTS_CONFIG: Kind = Kind {
    namespace: "controlplane",
    r#type: "BootstrapManifestsConfigs.kubernetes.talos.dev",
    id: "manifests",
};
/// The machine status (stage, readiness).
pub const MACHINE_STATUS: Kind = Kind {
    namespace: "runtime",
    r#type: "MachineStatuses.runtime.talos.dev",
    id: "machine",
};
/// The node's disks (one resource per block device; readable in maintenance mode).
pub const DISKS: Kind = Kind {
    namespace: "runtime",
    r#type: "Disks.block.talos.dev",
    id: "",
};
/// Cluster identity (`clusterId`, `clusterName`).
pub const CLUSTER_INFO: Kind = Kind {
    namespace: "cluster",
    r#type: "Infos.cluster.talos.dev",
    id: "current",
};
/// Resource definitions (how `talosctl get` resolves aliases such as `machineconfig`).
pub const RESOURCE_DEFINITION: Kind = Kind {
    namespace: "meta",
    r#type: "ResourceDefinitions.meta.cosi.dev",
    id: "",
};
/// Namespaces.
pub const NAMESPACE: Kind = Kind {
    namespace: "meta",
    r#type: "Namespaces.meta.cosi.dev",
    id: "",
};

/// kube-apiserver's config, derived from the machine config (control planes).
pub const APISERVER_CONFIG: Kind = Kind {
    namespace: "controlplane",
    r#type: "APIServerConfigs.kubernetes.talos.dev",
    id: "kube-apiserver",
};
/// kube-controller-manager's config (control planes).
pub const CONTROLLER_MANAGER_CONFIG: Kind = Kind {
    namespace: "controlplane",
    r#type: "ControllerManagerConfigs.kubernetes.talos.dev",
    id: "kube-controller-manager",
};
/// kube-scheduler's config (control planes).
pub const SCHEDULER_CONFIG: Kind = Kind {
    namespace: "controlplane",
    r#type: "SchedulerConfigs.kubernetes.talos.dev",
    id: "kube-scheduler",
};
/// The kubelet's config (every node).
pub const KUBELET_CONFIG: Kind = Kind {
    namespace: "k8s",
    r#type: "KubeletConfigs.kubernetes.talos.dev",
    id: "kubelet",
};

/// The bootstrap manifests Talos renders from the machine config (control
/// planes): one resource per manifest, what `talosctl upgrade-k8s`'s
/// manifests step applies.
pub const MANIFESTS: Kind = Kind {
    namespace: "controlplane",
    r#type: "Manifests.kubernetes.talos.dev",
    id: "",
};

/// A Kubernetes component Talos runs from the machine config, as the
/// Talos API reports its image ([`crate::TalosClient::component_image`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KubernetesComponent {
    ApiServer,
    ControllerManager,
    Scheduler,
    KubeProxy,
    Kubelet,
}

/// Every kind above, for listings.
pub const ALL: &[Kind] = &[
    MACHINE_CONFIG,
    MACHINE_TYPE,
    VERSION,
    NODENAME,
    HOSTNAME_STATUS,
    KUBEPRISM_CONFIG,
    KUBEPRISM_STATUS,
    KUBEPRISM_ENDPOINTS,
    BOOTSTRAP_MANIFESTS_CONFIG,
    MACHINE_STATUS,
    CLUSTER_INFO,
    APISERVER_CONFIG,
    CONTROLLER_MANAGER_CONFIG,
    SCHEDULER_CONFIG,
    KUBELET_CONFIG,
];
