//! The phases of `ichor init` after consent, in the order [`super::run`]
//! runs them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_adopt::Refusal;
use ichor_adopt::{install, waits};
use ichor_api::error_text::{chain, with_help};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_helm::wait::{Wait, wait_until};
use ichor_talos::private_file::{self, DirState};
use ichor_talos_client::{ApplyMode, ApplyRequest, TalosClient};
use kube::api::Api;

use crate::error::{AdoptError, talos, wait_ended};
use crate::ichor::{self, create_or_keep_as};
use crate::phases::write_bundle;

use super::probe::{admin_client, client_options};
use super::{
    KUBECONFIG_FILE, Run, SECRETS_FILE, TALOSCONFIG_FILE, holds, sha256_hex, talosconfig,
    write_state,
};

/// Writes `bytes` to `path` with mode 0600 through Ichor's one private-file
/// writer: a new temporary file beside it, renamed over it, so a kill never
/// leaves half a file and nothing planted is written through.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AdoptError> {
    Ok(private_file::write(path, bytes)?)
}

/// Phase `files`: the state (the plan and the bundle's digest), the bundle
/// and the talosconfig, 0600 in the output directory (0700). The bundle an
/// earlier run wrote (or the `--with-secrets` file itself) is kept.
pub(super) fn files(r: &Run<'_>) -> Result<(), AdoptError> {
    let dir = &r.opts.output_dir;
    if let DirState::Tightened { was } = private_file::prepare_dir(dir)? {
        r.say(&format!(
            "made {} private (mode 0700, was {was:03o}): it holds the cluster's keys",
            dir.display()
        ));
    }
    let secrets = dir.join(SECRETS_FILE);
    let bytes = match private_file::read(&secrets)? {
        Some(bytes) if holds(&bytes, &r.bundle) => bytes,
        Some(_) => {
            // The plan judged this file; it changed since.
            return Err(AdoptError::Refused(vec![Refusal::new(format!(
                "{} changed since init planned: it holds another bundle than the one this init uses. Move it away, then run ichor init again",
                secrets.display()
            ))]));
        }
        None => r
            .bundle
            .to_yaml()
            .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?
            .into_bytes(),
    };
    // The state first: a rerun then knows the bundle as this init's own.
    write_state(dir, &r.plan, sha256_hex(&bytes))?;
    private_file::write_once(&secrets, &bytes)?;
    let tc = talosconfig(r.opts, &r.bundle)?
        .to_yaml()
        .map_err(|e| AdoptError::Secrets(with_help(chain(&e), e.help())))?;
    write_private(&dir.join(TALOSCONFIG_FILE), tc.as_bytes())?;
    r.say(&format!(
        "wrote {}, {} (0600) to {}",
        SECRETS_FILE,
        TALOSCONFIG_FILE,
        dir.display()
    ));
    Ok(())
}

/// Phase `apply`: each node still in maintenance mode gets its config over
/// the insecure API, pinned to the certificate the plan showed (another
/// certificate fails the handshake, before the config is sent); a node that
/// already answers the cluster's credentials has it, and is skipped.
pub(super) async fn apply(r: &Run<'_>) -> Result<(), AdoptError> {
    for (address, config) in &r.writes.configs {
        let Some(fingerprint) = r.fingerprints.get(address) else {
            // Planned as configured by an earlier run of this init.
            let admin = admin_client(r.opts, &r.bundle, address)?;
            if admin.version("").await.is_ok() {
                r.say(&format!("{address} already has its config"));
                continue;
            }
            return Err(AdoptError::Wait(format!(
                "node {address} no longer answers the cluster's credentials, and the plan holds no maintenance certificate of it, so Ichor sends it nothing. Run ichor init again to inspect it anew"
            )));
        };
        let c = TalosClient::maintenance_pinned(
            &r.opts.endpoint(address),
            &[*fingerprint],
            client_options(),
        )
        .map_err(talos(format!(
            "making a maintenance client of node {address}"
        )))?;

        let in_maintenance = matches!(
            c.machine_status("").await,
            Ok(s) if s.stage == 3
        );
        if !in_maintenance {
            let admin = admin_client(r.opts, &r.bundle, address)?;
            if admin.version("").await.is_ok() {
                r.say(&format!("{address} already has its config"));
                continue;
            }
        }
        c.apply_configuration(
            "",
            &ApplyRequest::new(config.as_bytes().to_vec(), ApplyMode::Auto),
        )
        .await
        .map_err(talos(format!("applying the config of {address}")))?;
        r.say(&format!("applied the config of {address}"));
    }
    Ok(())
}

/// Phase `bootstrap`: etcd on the first control plane, once. Retried
/// (bounded) while the node restarts its API; "already bootstrapped" is done.
pub(super) async fn bootstrap(r: &Run<'_>) -> Result<(), AdoptError> {
    let address = &r.plan.bootstrap_node;
    let c = admin_client(r.opts, &r.bundle, address)?;
    let outcome = std::sync::Mutex::new(None);
    let report =
        |left: &[String]| r.say(&format!("waiting to bootstrap etcd: {}", left.join("; ")));
    let wait = Wait {
        why: "etcd's bootstrap",
        timeout: Duration::from_secs(10 * 60),
        poll_interval: r.opts.poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_yet = || async {
        match c.bootstrap("").await {
            Ok(first) => {
                *outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
                Ok(Vec::new())
            }
            Err(e) => Ok(vec![format!("{address}: {}", chain(&e))]),
        }
    };
    wait_ended(wait_until(&wait, not_yet).await, |pending| {
        format!(
            "etcd could not be bootstrapped on {address} within 10 minutes: {}",
            pending.join("; ")
        )
    })?;
    let first = outcome.into_inner().unwrap_or_else(|e| e.into_inner());
    r.say(&match first {
        Some(true) => format!("bootstrapped etcd on {address}"),
        _ => format!("etcd was already bootstrapped on {address}"),
    });
    Ok(())
}

/// Phase `kubeconfig`: the admin kubeconfig, fetched through the Talos API
/// from the first control plane, written 0600.
pub(super) async fn kubeconfig(r: &Run<'_>) -> Result<PathBuf, AdoptError> {
    let address = &r.plan.bootstrap_node;
    let c = admin_client(r.opts, &r.bundle, address)?;
    let bytes = c
        .kubeconfig("")
        .await
        .map_err(talos(format!("fetching the kubeconfig from {address}")))?;
    let path = r.opts.output_dir.join(KUBECONFIG_FILE);
    write_private(&path, &bytes)?;
    r.say(&format!("wrote {} (0600)", path.display()));
    Ok(path)
}

/// Phase `kubernetes-api`: the bounded wait until the API server answers,
/// saying what it last answered.
pub(super) async fn kube_api(r: &Run<'_>, kubeconfig: &Path) -> Result<kube::Client, AdoptError> {
    let text = std::fs::read_to_string(kubeconfig).map_err(|e| {
        AdoptError::Secrets(format!("reading {}: {}", kubeconfig.display(), chain(&e)))
    })?;
    let kc = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| AdoptError::Secrets(format!("{}: {}", kubeconfig.display(), chain(&e))))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| AdoptError::Secrets(format!("{}: {}", kubeconfig.display(), chain(&e))))?;
    let client = kube::Client::try_from(config)
        .map_err(|e| AdoptError::Secrets(format!("{}: {}", kubeconfig.display(), chain(&e))))?;
    let report = |left: &[String]| {
        r.say(&format!(
            "waiting for the Kubernetes API: {}",
            left.join("; ")
        ))
    };
    let wait = Wait {
        why: "the Kubernetes API",
        timeout: r.opts.kube_api_timeout,
        poll_interval: r.opts.poll_interval,
        report_interval: waits::REPORT_EVERY,
        on_progress: Some(&report),
    };
    let not_yet = || async {
        Ok(match client.apiserver_version().await {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!(
                "{} does not answer yet: {}",
                r.plan.endpoint,
                chain(&e)
            )],
        })
    };
    wait_ended(wait_until(&wait, not_yet).await, |pending| {
        format!(
            "the Kubernetes API did not answer within {} ({}): check that the control plane booted and that {} reaches it",
            waits::human(r.opts.kube_api_timeout),
            pending.join("; "),
            r.plan.endpoint
        )
    })?;
    r.say(&format!(
        "the Kubernetes API answers at {}",
        r.plan.endpoint
    ));
    Ok(client)
}

/// Phase `install`: Ichor's install manifest and the IchorInstallation
/// (applies are server-side and creates keep what exists).
pub(super) async fn install(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    r.say(&format!("installing Ichor {}", r.opts.version));
    let image = r
        .opts
        .controller_image
        .clone()
        .unwrap_or_else(|| install::controller_image(&r.opts.version));
    ichor::install_ichor(kube, &r.opts.version, &image).await?;
    ichor::wait_crds_established(kube, r.opts.poll_interval, &*r.operator).await?;
    create_or_keep_as(
        &Api::<ichor_api::IchorInstallation>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE),
        &install::installation(&r.opts.version),
        "the IchorInstallation",
    )
    .await
}

/// Phase `webhooks`: the bounded wait (30 minutes in init) until the API
/// server calls Ichor's webhooks, which judge the objects written next.
pub(super) async fn webhooks(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    ichor::wait_for_webhooks(
        kube,
        r.opts.webhook_timeout,
        r.opts.poll_interval,
        &r.writes.cluster,
        &*r.operator,
    )
    .await?;
    r.say("Ichor is running: the API server calls its webhooks");
    Ok(())
}

/// Phase `objects`: the bundle Secret, the TalosCluster and the
/// TalosMachines (not held: init wrote what they describe).
pub(super) async fn objects(r: &Run<'_>, kube: &kube::Client) -> Result<(), AdoptError> {
    let name = &r.plan.cluster;
    write_bundle(kube, name, &r.bundle).await?;
    let clusters = Api::<TalosCluster>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    create_or_keep_as(
        &clusters,
        &r.writes.cluster,
        &format!("TalosCluster {name}"),
    )
    .await?;
    let machines = Api::<TalosMachine>::namespaced(kube.clone(), ichor_api::SYSTEM_NAMESPACE);
    for m in &r.writes.machines {
        let what = format!(
            "TalosMachine {}",
            m.metadata.name.as_deref().unwrap_or_default()
        );
        create_or_keep_as(&machines, m, &what).await?;
    }
    r.say(&format!(
        "created the bundle Secret, TalosCluster {name} and {} TalosMachines",
        r.writes.machines.len()
    ));
    Ok(())
}
