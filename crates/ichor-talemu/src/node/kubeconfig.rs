//! `MachineService/Kubeconfig`: the admin kubeconfig a control plane
//! generates from its config.

use std::time::SystemTime;

use tonic::Status;

use crate::derive;

use super::Node;

impl Node {
    /// `MachineService/Kubeconfig`: the admin kubeconfig generated from the
    /// node's config (cluster name, endpoint, Kubernetes CA), as the
    /// `.tar.gz` holding one file `kubeconfig` (mode 0600) that Talos streams.
    pub fn kubeconfig_archive(&self) -> Result<Vec<u8>, Status> {
        let active =
            self.lock().active.clone().ok_or_else(|| {
                Status::failed_precondition("the machine config is not loaded yet")
            })?;
        let facts = derive::facts(&active, self.multidoc_kubernetes())
            .map_err(|e| Status::internal(e.to_string()))?;
        let ca = derive::kubernetes_ca(&active)
            .filter(|_| facts.machine_type.is_control_plane())
            .ok_or_else(|| {
                Status::failed_precondition("kubernetes API server CA config is not available")
            })?;
        let endpoint = self
            .discovery
            .kubernetes_api()
            .or_else(|| facts.control_plane_endpoint.clone())
            .unwrap_or_default();
        let kubeconfig =
            crate::pki::admin_kubeconfig(&facts.cluster_name, &endpoint, &ca.cert_pem, &ca.key_pem)
                .map_err(|e| {
                    Status::internal(format!(
                        "generating the kubeconfig: {}",
                        ichor_api::error_text::chain(&e)
                    ))
                })?;
        kubeconfig_tar_gz(kubeconfig.as_bytes())
            .map_err(|e| Status::internal(format!("packing the kubeconfig: {e}")))
    }
}

/// One file `kubeconfig` (0600) in a gzip'd tar, as Talos streams it.
fn kubeconfig_tar_gz(kubeconfig: &[u8]) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(kubeconfig.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    header.set_cksum();
    tar.append_data(&mut header, "kubeconfig", kubeconfig)?;
    tar.into_inner()?.finish()
}
