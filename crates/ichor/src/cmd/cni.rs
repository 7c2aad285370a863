//! `ichor cni bootstrap`: spec step 1.5.2 for a cluster about to get Ichor by Helm.

use std::sync::Arc;

use anyhow::Context as _;
use ichor_cilium::{CiliumOptions, ClusterSettings, KubeProxy, Tunnel, WaitOptions};
use ichor_helm::{ChartRef, Renderer};

use crate::args::{CniBootstrapArgs, HelmArgs, KubeProxyArg, TunnelArg};
use crate::{connect, printer};

pub async fn bootstrap(args: CniBootstrapArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let nodes = k8s_node_count(&client).await?;
    let mut settings =
        ClusterSettings::new(tunnel(args.tunnel), kube_proxy(args.kube_proxy), nodes);
    if let Some(path) = &args.cilium_values {
        settings = settings.with_user_values(read_values(path)?);
    }
    let opts = cilium_options(&args.helm, args.kube.kubeconfig.as_deref());
    let progress = Arc::new(printer::Progress::start(&format!(
        "installing Cilium (tunnel {}, kube-proxy {}) as Ichor's Helm release cilium in kube-system, record in ichor-system",
        settings.tunnel.as_str(),
        settings.kube_proxy.as_str()
    )));
    let reporter = progress.clone();
    let wait = WaitOptions {
        timeout: args.wait_timeout,
        on_progress: Some(Arc::new(move |left: &[String]| {
            reporter.line(&format!("still waiting for: {}", left.join("; ")));
        })),
        ..WaitOptions::default()
    };
    let applied = ichor_cilium::bootstrap(client, &opts, &settings, &wait)
        .await
        .context("ichor cni bootstrap did not finish; run it again to continue (it picks up the release where it stopped)")?;
    if let Ok(p) = Arc::try_unwrap(progress) {
        p.finish(&format!(
            "Cilium is installed (revision {}) and every node is Ready",
            applied.release.version
        ));
    }
    Ok(())
}

pub fn cilium_options(helm: &HelmArgs, kubeconfig: Option<&std::path::Path>) -> CiliumOptions {
    let mut renderer = Renderer::new(&helm.helm);
    if let Some(k) = kubeconfig {
        renderer = renderer.kubeconfig(k);
    }
    let mut opts = CiliumOptions::new(renderer);
    if let Some(chart) = &helm.cilium_chart {
        opts = opts.chart(ChartRef::path(chart));
    }
    opts
}

pub fn read_values(
    path: &std::path::Path,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --cilium-values {}", path.display()))?;
    let value: serde_json::Value = serde_yaml_ng::from_str(&text)
        .with_context(|| format!("--cilium-values {} is not valid YAML", path.display()))?;
    match value {
        serde_json::Value::Object(m) => Ok(m),
        serde_json::Value::Null => Ok(Default::default()),
        _ => anyhow::bail!(
            "--cilium-values {} must be a YAML mapping of chart values",
            path.display()
        ),
    }
}

async fn k8s_node_count(client: &kube::Client) -> anyhow::Result<u32> {
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&Default::default())
        .await
        .context(
            "cannot list the cluster's Nodes: check the kubeconfig and that it may list nodes",
        )?;
    Ok(nodes.items.len() as u32)
}

pub fn tunnel(t: TunnelArg) -> Tunnel {
    match t {
        TunnelArg::Vxlan => Tunnel::Vxlan,
        TunnelArg::Geneve => Tunnel::Geneve,
    }
}

pub fn kube_proxy(k: KubeProxyArg) -> KubeProxy {
    match k {
        KubeProxyArg::Enabled => KubeProxy::Enabled,
        KubeProxyArg::Replaced => KubeProxy::Replaced,
    }
}
