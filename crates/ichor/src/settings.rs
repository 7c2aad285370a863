//! The settings of one run, resolved once from the flags and the
//! environment (clap reads `ICHOR_HELM` and `ICHOR_CILIUM_CHART` into the
//! flags; the kubeconfig and talosconfig loaders read `KUBECONFIG` and
//! `TALOSCONFIG`). Commands take what they need from here instead of
//! reading flags or the environment again.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use ichor_cilium::CiliumOptions;
use ichor_helm::{ChartRef, Renderer};

use crate::args::{HelmArgs, KubeArgs};

/// How Ichor reaches the cluster and renders charts.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--kubeconfig`; `None`: `KUBECONFIG`, then `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--helm` / `ICHOR_HELM`.
    pub helm: PathBuf,
    /// `--cilium-chart` / `ICHOR_CILIUM_CHART`; `None`: the pinned chart.
    pub cilium_chart: Option<String>,
}

impl Settings {
    /// The settings of a command with Kubernetes and Helm flags.
    pub fn resolve(kube: &KubeArgs, helm: &HelmArgs) -> Settings {
        Settings {
            kubeconfig: kube.kubeconfig.clone(),
            helm: helm.helm.clone(),
            cilium_chart: helm.cilium_chart.clone(),
        }
    }

    /// The Kubernetes client.
    pub async fn kube_client(&self) -> anyhow::Result<kube::Client> {
        crate::connect::kube_client(self.kubeconfig.as_deref()).await
    }

    /// How Ichor's Cilium release is written: the helm binary, the
    /// kubeconfig it renders against, the chart.
    pub fn cilium_options(&self) -> CiliumOptions {
        let mut renderer = Renderer::new(&self.helm);
        if let Some(k) = &self.kubeconfig {
            renderer = renderer.kubeconfig(k);
        }
        let mut opts = CiliumOptions::new(renderer);
        if let Some(chart) = &self.cilium_chart {
            opts = opts.chart(ChartRef::path(chart));
        }
        opts
    }
}

/// User Cilium values from `--cilium-values FILE`.
pub fn read_cilium_values(
    path: &Path,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --cilium-values {}", path.display()))?;
    Ok(ichor_cilium::user_values_from_yaml(
        &text,
        &path.display().to_string(),
    )?)
}
