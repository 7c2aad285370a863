//! `ichor cni bootstrap`: spec step 1.5.2 for a cluster about to get Ichor by Helm.

use std::sync::Arc;

use anyhow::Context as _;
use ichor_cilium::{CiliumOptions, ClusterSettings, KubeProxy, Tunnel, WaitOptions};
use ichor_helm::{ChartRef, Renderer};

use crate::args::{CniBootstrapArgs, CniHelmApplyArgs, HelmArgs, KubeProxyArg, TunnelArg};
use crate::{connect, printer};

pub async fn bootstrap(args: CniBootstrapArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let nodes = ichor_cilium::node_count(&client).await?;
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
    drop(wait);
    if let Ok(p) = Arc::try_unwrap(progress) {
        p.finish(&format!(
            "Cilium is installed (revision {}) and every node is Ready",
            applied.release.version
        ));
    }
    Ok(())
}

/// `ichor cni helm apply`: the ichor-cni Job's entry (spec R5.1: the same
/// apply-for-cluster function as the CLI's bootstrap).
pub async fn helm_apply(args: CniHelmApplyArgs) -> anyhow::Result<()> {
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let cluster = kube::Api::<ichor_api::TalosCluster>::namespaced(client.clone(), &args.namespace)
        .get(&args.cluster)
        .await
        .with_context(|| {
            format!(
                "cannot read TalosCluster {}/{}",
                args.namespace, args.cluster
            )
        })?;
    let nodes = ichor_cilium::node_count(&client).await?;
    let settings = ClusterSettings::from_cluster(&cluster, nodes)?;
    let mut opts = cilium_options(&args.helm, args.kube.kubeconfig.as_deref());
    // The Job holds the CNI lock (R5.6): a pending record is a dead one.
    opts.apply.exclusive = true;
    let applied = ichor_cilium::apply_for_cluster(client, &opts, &settings)
        .await
        .with_context(|| {
            format!(
                "applying Ichor's Cilium release for TalosCluster {}/{}",
                args.namespace, args.cluster
            )
        })?;
    printer::step(&format!(
        "Cilium release cilium is deployed at revision {} (values hash {}){}",
        applied.release.version,
        applied.values_hash,
        if applied.changed {
            ""
        } else {
            "; nothing changed"
        }
    ));
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
    Ok(ichor_cilium::user_values_from_yaml(
        &text,
        &path.display().to_string(),
    )?)
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
