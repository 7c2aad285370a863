//! `ichor adopt`: reads the operator's files, then hands over to
//! `ichor_adopt_run`, where the phases live.

use std::io::{BufRead as _, IsTerminal as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ichor_adopt::plan::Plan;
use ichor_adopt_run::{AdoptError, AdoptOptions, Operator, SecretsSource};
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::Talosconfig;
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};

use crate::args::{AdoptArgs, OutputFormat, TalosArgs};
use crate::settings::{Settings, read_cilium_values};
use crate::{hints, printer};

/// The CLI's version as Ichor versions are written (with the v).
pub fn cli_version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

pub async fn run(args: AdoptArgs) -> anyhow::Result<()> {
    let run = Settings::resolve(&args.kube, &args.helm);
    let (talos, nodes) = talos_client(&args.talos)?;
    let kube = run.kube_client().await?;
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
        .map(read_cilium_values)
        .transpose()?;
    let opts = AdoptOptions {
        cluster: args.cluster.clone(),
        nodes,
        secrets,
        cni_unmanaged: args.cni_unmanaged,
        tunnel: args.tunnel,
        cilium_values,
        require_ichor: args.require_ichor,
        webhook_timeout: args.wait_timeout,
        cilium_timeout: args.cilium_wait_timeout,
        handover_timeout: ichor_adopt::waits::HANDOVER_WAIT,
        poll_interval: Duration::from_secs(2),
        cilium: run.cilium_options(),
        version: cli_version(),
        controller_image: args.controller_image.clone(),
    };

    if let Some(format) = args.output {
        let (plan, _) = ichor_adopt_run::plan(&talos, &kube, &opts)
            .await
            .map_err(adopt_error_for_people)?;
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
    let operator: Arc<dyn Operator> = Arc::new(TerminalOperator { yes: args.yes });
    let outcome = ichor_adopt_run::adopt(&talos, &kube, &opts, operator)
        .await
        .map_err(adopt_error_for_people)?;
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

/// The CLI's words around an adopt error: a refusal says nothing was
/// written; a step a rerun finishes (a write, Cilium's release) says to run
/// it again; a Cilium step that could not run helm does not (rerunning
/// cannot help; the printer's help line says what can).
fn adopt_error_for_people(e: AdoptError) -> anyhow::Error {
    match e {
        AdoptError::Refused(_) => {
            anyhow::Error::new(e).context("ichor adopt refused; nothing was written")
        }
        AdoptError::Cilium(cilium) => {
            let inner = anyhow::Error::new(*cilium);
            if hints::missing_helm(&inner).is_some() {
                inner.context("ichor adopt could not install Cilium")
            } else {
                match inner.downcast::<ichor_cilium::Error>() {
                    Ok(cilium) => anyhow::Error::new(AdoptError::Cilium(Box::new(cilium)))
                        .context(
                            "ichor adopt stopped; run it again to continue: it picks up the release where it stopped",
                        ),
                    Err(other) => other,
                }
            }
        }
        AdoptError::Write { .. } => {
            anyhow::Error::new(e).context("ichor adopt stopped; run it again to continue")
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

/// The operator at the terminal: progress lines on stderr, consent asked
/// there unless `--yes`.
struct TerminalOperator {
    yes: bool,
}

impl Operator for TerminalOperator {
    fn say(&self, line: &str) {
        printer::step(line);
    }

    fn consent(&self, _plan: &Plan) -> bool {
        if self.yes {
            return true;
        }
        printer::ask("Adopt this cluster? [y/N] ");
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err() {
            return false;
        }
        matches!(answer.trim(), "y" | "Y" | "yes")
    }
}
