//! `ichor adopt`: reads the operator's files, then hands over to
//! `ichor_adopt::run`, where the phases live.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ichor_adopt::plan::Plan;
use ichor_adopt::run::{AdoptError, AdoptOptions, Operator, SecretsSource};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::Talosconfig;
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};

use crate::args::{AdoptArgs, OutputFormat, TalosArgs, TunnelArg};
use crate::cmd::cni;
use crate::{connect, printer};

/// The CLI's version as Ichor versions are written (with the v).
pub fn cli_version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

pub async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let (talos, nodes) = talos_client(&args.talos)?;
    let kube = connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let secrets = match (&args.secrets_bundle, &args.recover_from) {
        (Some(path), _) => Some(SecretsSource::Bundle(Box::new(SecretsBundle::from_file(
            path,
        )?))),
        (None, Some(from)) if args.recover_secrets => {
            Some(SecretsSource::Recover { from: from.clone() })
        }
        _ => None,
    };
    let cilium_values = args
        .cilium_values
        .as_deref()
        .map(cni::read_values)
        .transpose()?;
    let opts = AdoptOptions {
        cluster: args.cluster.clone(),
        nodes,
        secrets,
        cni_unmanaged: args.cni_unmanaged,
        tunnel: args.tunnel.map(|t| match t {
            TunnelArg::Vxlan => ichor_api::Tunnel::Vxlan,
            TunnelArg::Geneve => ichor_api::Tunnel::Geneve,
        }),
        cilium_values,
        require_ichor: args.require_ichor,
        webhook_timeout: args.wait_timeout,
        cilium_timeout: args.cilium_wait_timeout,
        handover_timeout: ichor_adopt::waits::HANDOVER_WAIT,
        poll_interval: Duration::from_secs(2),
        cilium: cni::cilium_options(&args.helm, args.kube.kubeconfig.as_deref()),
        version: cli_version(),
        controller_image: args.controller_image.clone(),
    };

    if let Some(format) = args.output {
        let (plan, _) = ichor_adopt::run::plan(&talos, &kube, &opts)
            .await
            .map_err(explain)?;
        printer::data(&match format {
            OutputFormat::Json => serde_json::to_string_pretty(&plan)?,
            OutputFormat::Yaml => serde_yaml_ng::to_string(&plan)?,
        });
        return Ok(());
    }
    if !args.yes && !std::io::stdin().is_terminal() {
        bail!(
            "adopt asks for consent on a terminal; pass --yes to adopt without asking (nothing was written)"
        );
    }
    let operator: Arc<dyn Operator> = Arc::new(Cli { yes: args.yes });
    let outcome = ichor_adopt::run::adopt(&talos, &kube, &opts, operator)
        .await
        .map_err(explain)?;
    let phases: Vec<String> = outcome
        .phases
        .iter()
        .map(|(p, s)| format!("{p} {s:.1}s"))
        .collect();
    printer::step(&format!(
        "adopted cluster {} ({})",
        args.cluster,
        phases.join(", ")
    ));
    Ok(())
}

fn explain(e: AdoptError) -> anyhow::Error {
    match e {
        AdoptError::Refused(_) => {
            anyhow::Error::new(e).context("ichor adopt refused; nothing was written")
        }
        other => anyhow::Error::new(other),
    }
}

/// A Talos client for the talosconfig's context, and the nodes to read.
pub fn talos_client(args: &TalosArgs) -> anyhow::Result<(TalosClient, Vec<String>)> {
    let (config, path) = Talosconfig::load(args.talosconfig.as_deref())?;
    let origin = path.display().to_string();
    let (name, context) = config.context(args.context.as_deref(), &origin)?;
    let endpoints = context.require_endpoints(name, &origin)?;
    let creds = context.credentials(name, &origin)?;
    let (Some(ca), Some(crt), Some(key)) = (
        creds.ca_pem.clone(),
        creds.crt_pem.clone(),
        creds.key_pem_pkcs8(),
    ) else {
        bail!(
            "the talosconfig {origin}, context {name}, lacks its ca, crt or key: generate it again with talosctl config new or ichor"
        );
    };
    let nodes = if args.nodes.is_empty() {
        context.nodes.clone().unwrap_or_default()
    } else {
        args.nodes.clone()
    };
    if nodes.is_empty() {
        bail!(
            "no nodes to adopt: the talosconfig {origin}, context {name}, names none; pass --nodes ADDR,..."
        );
    }
    let identity = ClientIdentity::from_pem(ca, crt, key);
    let client = TalosClient::new(&endpoints[0], &identity, ClientOptions::default())
        .with_context(|| {
            format!(
                "cannot set up a Talos API client for endpoint {}",
                endpoints[0]
            )
        })?;
    Ok((client, nodes))
}

struct Cli {
    yes: bool,
}

impl Operator for Cli {
    fn say(&self, line: &str) {
        printer::step(line);
    }

    fn consent(&self, _plan: &Plan) -> bool {
        if self.yes {
            return true;
        }
        eprint!("Adopt this cluster? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err() {
            return false;
        }
        matches!(answer.trim(), "y" | "Y" | "yes")
    }
}
