//! `MachineService`: version, hostname, ApplyConfiguration, reboot, the
//! boot id and the kubeconfig.

use std::time::Duration;

use crate::error::Error;
use crate::proto::machine;

use super::TalosClient;
use super::stream;

/// How ApplyConfiguration applies a config (`ApplyConfigurationRequest.Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Persist, then reboot (refused by Talos v1.14+ on configured nodes).
    Reboot,
    /// Let the node choose (no-reboot when possible).
    Auto,
    /// Apply live; refused when a reboot would be needed.
    NoReboot,
    /// Persist only; applied at the next reboot.
    Staged,
    /// Apply live and revert after the try timeout.
    Try,
}

impl ApplyMode {
    fn to_proto(self) -> machine::apply_configuration_request::Mode {
        use machine::apply_configuration_request::Mode;
        match self {
            ApplyMode::Reboot => Mode::Reboot,
            ApplyMode::Auto => Mode::Auto,
            ApplyMode::NoReboot => Mode::NoReboot,
            ApplyMode::Staged => Mode::Staged,
            ApplyMode::Try => Mode::Try,
        }
    }

    fn from_proto(value: i32) -> Option<Self> {
        use machine::apply_configuration_request::Mode;
        Some(match Mode::try_from(value).ok()? {
            Mode::Reboot => ApplyMode::Reboot,
            Mode::Auto => ApplyMode::Auto,
            Mode::NoReboot => ApplyMode::NoReboot,
            Mode::Staged => ApplyMode::Staged,
            Mode::Try => ApplyMode::Try,
        })
    }
}

/// An ApplyConfiguration request.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    /// The whole multi-document machine config.
    pub data: Vec<u8>,
    pub mode: ApplyMode,
    /// Ask what would happen; nothing is applied.
    pub dry_run: bool,
    /// Revert delay for [`ApplyMode::Try`] (the node's default, 1m, when `None`).
    pub try_timeout: Option<Duration>,
}

impl ApplyRequest {
    /// A request with the given config and mode, not a dry run.
    pub fn new(data: impl Into<Vec<u8>>, mode: ApplyMode) -> Self {
        Self {
            data: data.into(),
            mode,
            dry_run: false,
            try_timeout: None,
        }
    }
}

/// What the node answered to ApplyConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyResult {
    /// The mode the node actually used (AUTO comes back resolved).
    pub mode: Option<ApplyMode>,
    /// The node's explanation (for a dry run, its summary and config diff).
    pub mode_details: String,
    pub warnings: Vec<String>,
}

/// The version a node reports through `MachineService/Version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeVersion {
    /// The Talos version tag, e.g. `v1.13.9`.
    pub tag: String,
    pub sha: String,
    pub arch: String,
    /// Platform name (e.g. `metal`), if the node knows it.
    pub platform: Option<String>,
    /// Platform mode (`metal`, `container`, …), if known.
    pub platform_mode: Option<String>,
    /// RBAC is reported only once the node has a machine config.
    pub rbac: bool,
}

impl TalosClient {
    /// `MachineService/Version`. `node` empty targets the endpoint itself.
    pub async fn version(&self, node: &str) -> Result<NodeVersion, Error> {
        let call = "Version";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().version(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        let v = m.version.unwrap_or_default();
        Ok(NodeVersion {
            tag: v.tag,
            sha: v.sha,
            arch: v.arch,
            platform: m.platform.as_ref().map(|p| p.name.clone()),
            platform_mode: m.platform.map(|p| p.mode),
            rbac: m.features.is_some_and(|f| f.rbac),
        })
    }

    /// `MachineService/Hostname`.
    pub async fn hostname(&self, node: &str) -> Result<String, Error> {
        let call = "Hostname";
        let request = self.request(node, ())?;
        let response = self
            .call(node, call, self.machine().hostname(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.hostname)
    }

    /// `MachineService/ApplyConfiguration`.
    pub async fn apply_configuration(
        &self,
        node: &str,
        apply: &ApplyRequest,
    ) -> Result<ApplyResult, Error> {
        let call = if apply.dry_run {
            "ApplyConfiguration (dry run)"
        } else {
            "ApplyConfiguration"
        };
        let message = machine::ApplyConfigurationRequest {
            data: apply.data.clone(),
            mode: apply.mode.to_proto() as i32,
            dry_run: apply.dry_run,
            try_mode_timeout: apply.try_timeout.map(|d| prost_types::Duration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            }),
        };
        let request = self.request(node, message)?;
        let response = self
            .call(node, call, self.machine().apply_configuration(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(ApplyResult {
            mode: ApplyMode::from_proto(m.mode),
            mode_details: m.mode_details,
            warnings: m.warnings,
        })
    }

    /// `MachineService/Reboot`; returns the actor id of the reboot.
    pub async fn reboot(&self, node: &str) -> Result<String, Error> {
        let call = "Reboot";
        let request = self.request(node, machine::RebootRequest { mode: 0 })?;
        let response = self
            .call(node, call, self.machine().reboot(request))
            .await?;
        let m = self.first(node, call, response.messages, |m| m.metadata.as_ref())?;
        Ok(m.actor_id)
    }

    /// The node's boot id (`Read` of `/proc/sys/kernel/random/boot_id`, as
    /// talosctl reads it to tell that a reboot happened).
    pub async fn boot_id(&self, node: &str) -> Result<String, Error> {
        let call = "Read boot_id";
        let request = self.request(
            node,
            machine::ReadRequest {
                path: "/proc/sys/kernel/random/boot_id".to_string(),
            },
        )?;
        let mut client = self.machine();
        let bytes = self
            .call(node, call, stream::data_bytes(client.read(request)))
            .await?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// `MachineService/Kubeconfig` on a control plane: the admin kubeconfig
    /// the node generates, taken out of the `.tar.gz` it streams (one file,
    /// `kubeconfig`).
    pub async fn kubeconfig(&self, node: &str) -> Result<Vec<u8>, Error> {
        let call = "Kubeconfig";
        let request = self.request(node, ())?;
        let mut client = self.machine();
        let archive = self
            .call(node, call, stream::data_bytes(client.kubeconfig(request)))
            .await?;
        kubeconfig_from_archive(&archive).map_err(|e| Error::Decode {
            node: self.node_label(node),
            call: call.to_string(),
            what: "the kubeconfig archive".to_string(),
            reason: e.to_string(),
        })
    }
}

/// Why the archive `MachineService/Kubeconfig` streamed gives no kubeconfig.
#[derive(Debug, thiserror::Error)]
enum ArchiveError {
    /// Not a gzip'd tar, or cut short: the reader's words.
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("the archive holds no file named kubeconfig")]
    NoKubeconfig,
}

/// The `kubeconfig` file of the archive `MachineService/Kubeconfig` streams.
fn kubeconfig_from_archive(archive: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    use std::io::Read as _;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        if path == std::path::Path::new("kubeconfig") {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            return Ok(bytes);
        }
    }
    Err(ArchiveError::NoKubeconfig)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o600);
            header.set_cksum();
            tar.append_data(&mut header, name, *data).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn the_kubeconfig_comes_out_of_its_archive() {
        let archive = tar_gz(&[("other", b"x"), ("kubeconfig", b"apiVersion: v1\n")]);
        assert_eq!(
            kubeconfig_from_archive(&archive).unwrap(),
            b"apiVersion: v1\n"
        );
        let none = kubeconfig_from_archive(&tar_gz(&[("other", b"x")])).unwrap_err();
        assert_eq!(
            none.to_string(),
            "the archive holds no file named kubeconfig"
        );
        assert!(matches!(
            kubeconfig_from_archive(b"not gzip"),
            Err(ArchiveError::Read(_))
        ));
    }
}
