//! The IchorInstallation singleton (`ichor` in the system namespace).
//!
//! Deployed by Helm (`--deployed-by helm`, set by the chart) and absent: the
//! controller creates it once with `spec.deployment.manager: helm` (R5.2;
//! the chart never renders it). Otherwise its absence is fine (R4.3f):
//! nothing in the controller needs it. Once it exists, its manager field is
//! authoritative and the controller never changes it.

use ichor_api::conditions::{self, reasons};
use ichor_api::{
    DeploymentSpec, INSTALLATION_NAME, IchorInstallation, IchorInstallationSpec, Manager,
};
use kube::api::{Api, Patch, PatchParams, PostParams};

use ichor_helm::objects::{CreateOrKeep, create_or_keep};

use crate::{Config, DeployedBy, Error, Result};

/// Makes sure the singleton exists when it should, and records in its status
/// the version that runs (`status.installedVersion`, `Ready`); returns it when
/// it exists.
pub async fn ensure(client: &kube::Client, config: &Config) -> Result<Option<IchorInstallation>> {
    let Some(obj) = ensure_exists(client, config).await? else {
        return Ok(None);
    };
    let ns = &config.system_namespace;
    let mut status = obj.status.clone().unwrap_or_default();
    status.installed_version = Some(config.version.clone());
    status.observed_generation = obj.metadata.generation;
    // A running controller is all there is to reconcile: Ready, and every
    // condition at this generation (gitops::settle).
    conditions::gitops::settle(
        &mut status.conditions,
        &conditions::gitops::Summary::new(
            conditions::gitops::Standing::Ready,
            reasons::RECONCILED,
            format!("the controller {} runs", config.version),
        ),
        obj.metadata.generation,
        &crate::pipeline::system_clock(),
    );
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", ichor_api::GROUP, ichor_api::VERSION),
        "kind": "IchorInstallation",
        "status": status,
    });
    Api::<IchorInstallation>::namespaced(client.clone(), ns)
        .patch_status(
            INSTALLATION_NAME,
            &PatchParams::apply(crate::FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map(Some)
        .map_err(Error::kube(format!(
            "writing the status of IchorInstallation {ns}/{INSTALLATION_NAME}"
        )))
}

async fn ensure_exists(
    client: &kube::Client,
    config: &Config,
) -> Result<Option<IchorInstallation>> {
    let ns = &config.system_namespace;
    let api = Api::<IchorInstallation>::namespaced(client.clone(), ns);
    let read = || {
        Error::kube(format!(
            "reading IchorInstallation {ns}/{INSTALLATION_NAME}"
        ))
    };
    if let Some(existing) = api.get_opt(INSTALLATION_NAME).await.map_err(read())? {
        if config.deployed_by == DeployedBy::Helm
            && existing.spec.deployment.manager != Manager::Helm
        {
            tracing::warn!(
                "IchorInstallation {ns}/{INSTALLATION_NAME} says manager {:?} while this controller was deployed by Helm; the object is authoritative and is left as it is",
                existing.spec.deployment.manager
            );
        }
        return Ok(Some(existing));
    }
    if config.deployed_by != DeployedBy::Helm {
        tracing::info!(
            "no IchorInstallation {ns}/{INSTALLATION_NAME}; nothing needs it, carrying on"
        );
        return Ok(None);
    }
    let obj = IchorInstallation::new(
        INSTALLATION_NAME,
        IchorInstallationSpec {
            version: config.version.clone(),
            deployment: DeploymentSpec {
                manager: Manager::Helm,
            },
            installer_repository: None,
        },
    );
    let params = PostParams {
        field_manager: Some(crate::FIELD_MANAGER.into()),
        ..Default::default()
    };
    match create_or_keep(&api, &params, &obj).await {
        Ok(CreateOrKeep::Created(o)) => {
            tracing::info!("created IchorInstallation {ns}/{INSTALLATION_NAME} (manager helm)");
            Ok(Some(o))
        }
        Ok(CreateOrKeep::Kept) => api.get_opt(INSTALLATION_NAME).await.map_err(read()),
        Err(source) => Err(Error::Kube {
            what: format!("creating IchorInstallation {ns}/{INSTALLATION_NAME}"),
            source,
        }),
    }
}
