//! Upgrades: an installer pulled into the system containerd and written
//! by `LifecycleService` (Talos v1.13+), or the deprecated
//! `MachineService/Upgrade`.

use crate::error::Error;
use crate::proto::common;
use crate::proto::machine;

use super::TalosClient;

/// talosctl's `--namespace system` store: `{CRI, NS_SYSTEM}`.
const SYSTEM_CONTAINERD: common::ContainerdInstance = common::ContainerdInstance {
    driver: common::ContainerDriver::Cri as i32,
    namespace: common::ContainerdNamespace::NsSystem as i32,
};

impl TalosClient {
    /// `ImageService/Pull` of an installer into the system containerd (the
    /// store `LifecycleService.Upgrade` reads it from, as talosctl's default
    /// `--namespace system`); returns the pulled image's name.
    pub async fn pull_installer(&self, node: &str, image: &str) -> Result<String, Error> {
        let call = format!("ImageService Pull {image}");
        let request = self.request(
            node,
            machine::ImageServicePullRequest {
                containerd: Some(SYSTEM_CONTAINERD),
                image_ref: image.to_string(),
            },
        )?;
        let mut images = self.images();
        let gather = async {
            let mut stream = images.pull(request).await?.into_inner();
            let mut name = None;
            while let Some(m) = stream.message().await? {
                if let Some(machine::image_service_pull_response::Response::Name(n)) = m.response {
                    name = Some(n);
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new(name))
        };
        self.call(node, &call, gather)
            .await?
            .ok_or_else(|| Error::EmptyResponse {
                node: self.node_label(node),
                call,
            })
    }

    /// `LifecycleService/Upgrade` (Talos >= 1.13): writes the installer to the
    /// other boot slot, no reboot. A non-zero exit code is an error (the
    /// server does not fail the call for it). Returns the progress messages.
    pub async fn lifecycle_upgrade(&self, node: &str, image: &str) -> Result<Vec<String>, Error> {
        let call = format!("LifecycleService Upgrade {image}");
        let request = self.request(
            node,
            machine::LifecycleServiceUpgradeRequest {
                containerd: Some(SYSTEM_CONTAINERD),
                source: Some(machine::InstallArtifactsSource {
                    image_name: image.to_string(),
                }),
            },
        )?;
        let mut lifecycle = self.lifecycle();
        let gather = async {
            let mut stream = lifecycle.upgrade(request).await?.into_inner();
            let mut lines = Vec::new();
            let mut exit = None;
            while let Some(m) = stream.message().await? {
                use machine::lifecycle_service_install_progress::Response as P;
                match m.progress.and_then(|p| p.response) {
                    Some(P::Message(line)) => lines.push(line),
                    Some(P::ExitCode(code)) => exit = Some(code),
                    None => {}
                }
            }
            Ok::<_, tonic::Status>(tonic::Response::new((lines, exit)))
        };
        let (lines, exit) = self.call(node, &call, gather).await?;
        match exit {
            Some(0) => Ok(lines),
            Some(code) => Err(Error::NodeReported {
                node: self.node_label(node),
                call,
                message: format!(
                    "the installer exited with code {code}: {}",
                    lines.last().map(String::as_str).unwrap_or("no message")
                ),
            }),
            None => Err(Error::EmptyResponse {
                node: self.node_label(node),
                call,
            }),
        }
    }

    /// The deprecated `MachineService/Upgrade` (Talos < 1.13): Talos pulls,
    /// checks etcd, writes the slot and reboots by itself. Returns the actor id.
    pub async fn legacy_upgrade(&self, node: &str, image: &str) -> Result<String, Error> {
        let call = format!("Upgrade {image}");
        let request = self.request(
            node,
            machine::UpgradeRequest {
                image: image.to_string(),
                // Talos has kept data on upgrade since 1.8; preserve also skips
                // the server's etcd check, which the caller has done itself.
                preserve: true,
                ..Default::default()
            },
        )?;
        #[allow(deprecated)]
        let response = self
            .call(node, &call, self.machine().upgrade(request))
            .await?;
        let m = self.first(node, &call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.actor_id)
    }
}
