//! `ichor install --to`: the installer Job's command. Applies the
//! install manifest of that version (Ichor's image at that tag) and records
//! the version in the IchorInstallation. Refused on a Helm install (R4.6a).

use anyhow::Context as _;
use ichor_api::{INSTALLATION_NAME, IchorInstallation, Manager, SYSTEM_NAMESPACE};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::args::InstallArgs;
use crate::{connect, printer};

pub async fn run(args: InstallArgs) -> anyhow::Result<()> {
    // The one version parser: the image tag and the record carry the v.
    let version = ichor_talos::version::Version::parse(&args.to)
        .context("cannot read --to")?
        .to_string();
    let client = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let installations = Api::<IchorInstallation>::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let installation = installations
        .get_opt(INSTALLATION_NAME)
        .await
        .with_context(|| {
            format!("cannot read IchorInstallation {SYSTEM_NAMESPACE}/{INSTALLATION_NAME}")
        })?;
    if installation
        .as_ref()
        .is_some_and(|i| i.spec.deployment.manager == Manager::Helm)
    {
        anyhow::bail!(
            "Ichor was installed with Helm, so Helm upgrades it: helm upgrade ichor <chart> --namespace {SYSTEM_NAMESPACE} --version {}",
            version.trim_start_matches('v')
        );
    }
    let image = ichor_adopt::install::controller_image(&version);
    printer::step(&format!(
        "applying Ichor {version}'s install manifest ({image})"
    ));
    ichor_adopt_run::ichor::install_ichor(&client, &version, &image)
        .await
        .with_context(|| format!("cannot install Ichor {version}"))?;
    if installation.is_some() {
        installations
            .patch(
                INSTALLATION_NAME,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"version": version}})),
            )
            .await
            .with_context(|| {
                format!("cannot record {version} in IchorInstallation {SYSTEM_NAMESPACE}/{INSTALLATION_NAME}")
            })?;
    }
    printer::step(&format!("Ichor {version} is installed"));
    Ok(())
}
