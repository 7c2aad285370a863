//! `ichor init`: reads the operator's files, then hands over to
//! `ichor_adopt_run::init`, where the phases live.

use std::io::{BufRead as _, IsTerminal as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ichor_adopt::init::{InitPlan, InitRequest, PatchFile};
use ichor_adopt_run::init::{InitOptions, KUBE_API_WAIT};
use ichor_adopt_run::{AdoptError, Operator};
use ichor_helm::render::{ChartRef, Renderer};
use ichor_talos::secrets::SecretsBundle;

use crate::args::{InitArgs, PlanFormat};
use crate::cmd::adopt::cli_version;
use crate::{hints, printer};

/// `--config-patch @FILE`: the file's name and text.
pub(crate) fn read_patch(arg: &str) -> anyhow::Result<PatchFile> {
    let Some(path) = arg.strip_prefix('@') else {
        bail!(
            "--config-patch {arg:?}: give the patch as @FILE (a YAML or JSON patch file, as talosctl takes it); nothing was written"
        );
    };
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("--config-patch {arg}: cannot read {path}; nothing was written")
    })?;
    Ok(PatchFile {
        name: path.to_string(),
        text,
    })
}

pub async fn run(args: InitArgs) -> anyhow::Result<()> {
    let patches = args
        .config_patches
        .iter()
        .map(|p| read_patch(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let with_secrets = args
        .with_secrets
        .as_deref()
        .map(SecretsBundle::from_file)
        .transpose()?;
    let chart = match &args.helm.cilium_chart {
        Some(c) => ChartRef::path(c),
        None => ichor_cilium::pinned_chart(),
    };
    let opts = InitOptions {
        request: InitRequest {
            cluster: args.name.clone(),
            endpoint: args.endpoint.clone(),
            control_planes: args.control_planes.clone(),
            workers: args.workers.clone(),
            talos_version: args.talos_version.clone(),
            kubernetes_version: args.kubernetes_version.clone(),
            tunnel: args.tunnel,
            kube_proxy: args.kube_proxy,
            patches,
            secrets_source: args
                .with_secrets
                .as_ref()
                .map_or("generated".to_string(), |p| p.display().to_string()),
        },
        output_dir: args.output_dir.clone(),
        with_secrets,
        cert_fingerprints: args.cert_fingerprints.clone(),
        talos_port: ichor_api::endpoint::TALOS_API_PORT,
        kube_api_timeout: KUBE_API_WAIT,
        webhook_timeout: args.wait_timeout,
        poll_interval: Duration::from_secs(2),
        helm: Renderer::new(&args.helm.helm),
        cilium_chart: chart,
        version: cli_version(),
        controller_image: args.controller_image.clone(),
    };

    if let Some(format) = args.output {
        let (plan, _, _) = ichor_adopt_run::init::plan(&opts)
            .await
            .map_err(init_error_for_people)?;
        printer::data(&match format {
            PlanFormat::Text => plan.text(),
            PlanFormat::Json => serde_json::to_string_pretty(&plan)?,
            PlanFormat::Yaml => serde_yaml_ng::to_string(&plan)?,
        });
        return Ok(());
    }
    if !args.yes && !std::io::stdin().is_terminal() {
        bail!(
            "init asks for consent on a terminal; pass --yes to init without asking (nothing was written)"
        );
    }
    let operator: Arc<dyn Operator> = Arc::new(Steps);
    let yes = args.yes;
    let outcome = ichor_adopt_run::init::run(&opts, operator, |_plan: &InitPlan| {
        yes || ask("Create this cluster? [y/N] ")
    })
    .await
    .map_err(init_error_for_people)?;
    let phases: Vec<String> = outcome
        .phases
        .iter()
        .map(|(p, s)| format!("{p} {s:.1}s"))
        .collect();
    printer::step(&format!(
        "created cluster {} ({}); its files are in {}",
        args.name,
        phases.join(", "),
        args.output_dir.display()
    ));
    Ok(())
}

fn ask(question: &str) -> bool {
    printer::ask(question);
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// Progress lines on stderr.
struct Steps;

impl Operator for Steps {
    fn say(&self, line: &str) {
        printer::step(line);
    }

    fn consent(&self, _plan: &ichor_adopt::plan::Plan) -> bool {
        false
    }
}

/// A refusal says nothing was written; a helm Ichor cannot run says so
/// (rerunning cannot help; the printer's help line says what can); anything
/// else says how to continue.
fn init_error_for_people(e: AdoptError) -> anyhow::Error {
    match e {
        AdoptError::Refused(_) => {
            anyhow::Error::new(e).context("ichor init refused; nothing was written")
        }
        AdoptError::NotConfirmed => anyhow::anyhow!("init was not confirmed; nothing was written"),
        other => {
            let other = anyhow::Error::new(other);
            if hints::missing_helm(&other).is_some() {
                other.context("ichor init could not run helm")
            } else {
                other.context(
                    "ichor init stopped; run the same command again (same --output-dir) to continue where it stopped",
                )
            }
        }
    }
}
