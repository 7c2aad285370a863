//! The resources Ichor reads, typed: the machine config (live and
//! persisted), machine type, versions, KubePrism, the bootstrap manifests
//! and their config, disks, the machine stage and component images.

use crate::error::Error;
use crate::proto::ichor::specs;
use crate::resources::{self, Kind};

use super::TalosClient;

/// The machine type of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineType {
    Unknown,
    Init,
    ControlPlane,
    Worker,
}

impl TalosClient {
    /// The node's disks (`Disks.block.talos.dev`), ids with their specs;
    /// reader access is enough, so this works over the maintenance API.
    pub async fn disks(&self, node: &str) -> Result<Vec<(String, specs::DiskSpec)>, Error> {
        let items = self
            .cosi_list(node, resources::DISKS.namespace, resources::DISKS.r#type)
            .await?;
        items
            .into_iter()
            .map(|r| {
                let spec = r
                    .decode_spec::<specs::DiskSpec>()
                    .map_err(|e| Error::Decode {
                        node: self.node_label(node),
                        call: format!("COSI List {}", resources::DISKS.r#type),
                        what: "a disk spec".to_string(),
                        reason: e.to_string(),
                    })?;
                Ok((r.id.clone(), spec))
            })
            .collect()
    }

    /// The bootstrap manifests the node renders (`Manifests.kubernetes.talos.dev`,
    /// control planes only; none on a worker), by id in Talos's order (the id
    /// sorts them: `05-…` before `10-…`), each the objects of that manifest.
    pub async fn manifests(
        &self,
        node: &str,
    ) -> Result<Vec<(String, Vec<prost_types::Struct>)>, Error> {
        let mut items = self
            .cosi_list(
                node,
                resources::MANIFESTS.namespace,
                resources::MANIFESTS.r#type,
            )
            .await?;
        items.sort_by(|a, b| a.id.cmp(&b.id));
        items
            .into_iter()
            .map(|r| {
                let spec = r
                    .decode_spec::<specs::ManifestSpec>()
                    .map_err(|e| Error::Decode {
                        node: self.node_label(node),
                        call: format!("COSI List {}", resources::MANIFESTS.r#type),
                        what: format!("manifest {}", r.id),
                        reason: e.to_string(),
                    })?;
                let objects = spec.items.into_iter().filter_map(|i| i.object).collect();
                Ok((r.id.clone(), objects))
            })
            .collect()
    }

    /// The node's machine stage (`MachineStatuses.runtime.talos.dev`):
    /// `MAINTENANCE` for a node waiting for its first config.
    pub async fn machine_status(&self, node: &str) -> Result<specs::MachineStatusSpec, Error> {
        self.get_spec(node, resources::MACHINE_STATUS).await
    }

    /// The live machine config: the exact bytes the node runs (needs `os:admin`).
    pub async fn machine_config(&self, node: &str) -> Result<Vec<u8>, Error> {
        let spec: specs::MachineConfigSpec = self.get_spec(node, resources::MACHINE_CONFIG).await?;
        Ok(spec.yaml_marshalled)
    }

    /// The persisted machine config (what the node boots with next).
    pub async fn persistent_machine_config(&self, node: &str) -> Result<Vec<u8>, Error> {
        let kind = Kind {
            id: resources::MACHINE_CONFIG_PERSISTENT_ID,
            ..resources::MACHINE_CONFIG
        };
        let spec: specs::MachineConfigSpec = self.get_spec(node, kind).await?;
        Ok(spec.yaml_marshalled)
    }

    /// The node's machine type.
    pub async fn machine_type(&self, node: &str) -> Result<MachineType, Error> {
        let spec: specs::MachineTypeSpec = self.get_spec(node, resources::MACHINE_TYPE).await?;
        Ok(match specs::MachineType::try_from(spec.machine_type) {
            Ok(specs::MachineType::Init) => MachineType::Init,
            Ok(specs::MachineType::ControlPlane) => MachineType::ControlPlane,
            Ok(specs::MachineType::Worker) => MachineType::Worker,
            _ => MachineType::Unknown,
        })
    }

    /// The `Versions.runtime.talos.dev` resource.
    pub async fn version_resource(&self, node: &str) -> Result<specs::VersionSpec, Error> {
        self.get_spec(node, resources::VERSION).await
    }

    /// The Kubernetes node name.
    pub async fn nodename(&self, node: &str) -> Result<specs::NodenameSpec, Error> {
        self.get_spec(node, resources::NODENAME).await
    }

    /// KubePrism's configuration; `None` when KubePrism is disabled.
    pub async fn kubeprism_config(
        &self,
        node: &str,
    ) -> Result<Option<specs::KubePrismConfigSpec>, Error> {
        self.get_optional_spec(node, resources::KUBEPRISM_CONFIG)
            .await
    }

    /// KubePrism's status; `None` when KubePrism is disabled.
    pub async fn kubeprism_status(
        &self,
        node: &str,
    ) -> Result<Option<specs::KubePrismStatusesSpec>, Error> {
        self.get_optional_spec(node, resources::KUBEPRISM_STATUS)
            .await
    }

    /// The bootstrap manifests config; `None` on workers (and control-plane
    /// nodes without a Kubernetes network config).
    pub async fn bootstrap_manifests_config(
        &self,
        node: &str,
    ) -> Result<Option<specs::BootstrapManifestsConfigSpec>, Error> {
        self.get_optional_spec(node, resources::BOOTSTRAP_MANIFESTS_CONFIG)
            .await
    }

    /// The image a Kubernetes component runs with on the node, from the
    /// config resource Talos derives from the machine config
    /// (`APIServerConfigs`, `ControllerManagerConfigs`, `SchedulerConfigs`,
    /// `KubeletConfigs`; kube-proxy's from `BootstrapManifestsConfigs`).
    /// `None` when the node has no such component.
    pub async fn component_image(
        &self,
        node: &str,
        component: resources::KubernetesComponent,
    ) -> Result<Option<String>, Error> {
        Ok(match component {
            resources::KubernetesComponent::ApiServer => self
                .get_optional_spec::<specs::ApiServerConfigSpec>(node, resources::APISERVER_CONFIG)
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::ControllerManager => self
                .get_optional_spec::<specs::ControllerManagerConfigSpec>(
                    node,
                    resources::CONTROLLER_MANAGER_CONFIG,
                )
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::Scheduler => self
                .get_optional_spec::<specs::SchedulerConfigSpec>(node, resources::SCHEDULER_CONFIG)
                .await?
                .map(|s| s.image),
            resources::KubernetesComponent::KubeProxy => self
                .bootstrap_manifests_config(node)
                .await?
                .filter(|s| s.proxy_enabled)
                .map(|s| s.proxy_image),
            resources::KubernetesComponent::Kubelet => self
                .get_optional_spec::<specs::KubeletConfigSpec>(node, resources::KUBELET_CONFIG)
                .await?
                .map(|s| s.image),
        })
    }
}
