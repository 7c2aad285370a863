//! `ichor cni bootstrap`: the Cilium step of R1.5b (R4.4b) for a cluster about to get Ichor by Helm.

use std::sync::Arc;

use anyhow::Context as _;
use ichor_cilium::{ClusterSettings, WaitOptions};

use crate::args::{CniBootstrapArgs, CniHelmApplyArgs};
use crate::settings::{Settings, read_cilium_values};
use crate::{hints, printer};

pub async fn bootstrap(args: CniBootstrapArgs) -> anyhow::Result<()> {
    let run = Settings::resolve(&args.kube, &args.helm);
    let client = run.kube_client().await?;
    let nodes = ichor_cilium::node_count(&client).await?;
    let mut settings = ClusterSettings::new(args.tunnel, args.kube_proxy, nodes);
    if let Some(path) = &args.cilium_values {
        settings = settings.with_user_values(read_cilium_values(path)?);
    }
    let opts = run.cilium_options();
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
        .map_err(|e| {
            let e = anyhow::Error::new(e);
            if hints::missing_helm(&e).is_some() {
                // Rerunning cannot help; printer's help line says what can.
                e.context("ichor cni bootstrap could not run helm")
            } else {
                e.context("ichor cni bootstrap did not finish; run it again to continue (it picks up the release where it stopped)")
            }
        })?;
    drop(wait);
    if let Ok(p) = Arc::try_unwrap(progress) {
        p.finish(&format!(
            "Cilium is installed (revision {}) and every node is Ready",
            applied.release.version
        ));
    }
    Ok(())
}

/// `ichor cni helm apply`: the ichor-cni Job's entry (R5.1: the same
/// apply-for-cluster function as the CLI's bootstrap).
pub async fn helm_apply(args: CniHelmApplyArgs) -> anyhow::Result<()> {
    let run = Settings::resolve(&args.kube, &args.helm);
    let client = run.kube_client().await?;
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
    let mut opts = run.cilium_options();
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
