//! Connections to the operator's cluster.

use std::path::Path;

use anyhow::Context as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A kube client from `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config`.
pub async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    client_of(kube_config(kubeconfig).await?)
}

/// A kube client of `config`.
pub fn client_of(config: kube::Config) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config).context("cannot build a Kubernetes client from the kubeconfig")
}

/// The client configuration from `--kubeconfig`, else `$KUBECONFIG` /
/// `~/.kube/config` / in-cluster.
pub async fn kube_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).with_context(|| {
                format!(
                    "cannot read the kubeconfig {}: check the path given to --kubeconfig",
                    path.display()
                )
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("the kubeconfig {} is not usable", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig found: pass --kubeconfig FILE or set KUBECONFIG")?,
    })
}
