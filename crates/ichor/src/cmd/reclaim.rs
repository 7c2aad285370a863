//! `ichor reclaim`: reads the flags, then hands over to
//! `ichor_adopt_run::reclaim`, where the phases live.

use std::io::{BufRead as _, IsTerminal as _};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use ichor_adopt::reclaim::{IchorChoice, ReclaimPlan, TALOSCONFIG_FILE};
use ichor_adopt_run::reclaim::{ReclaimError, ReclaimOperator, ReclaimOptions};

use crate::args::{OutputFormat, ReclaimArgs};
use crate::printer;

pub async fn run(args: ReclaimArgs) -> anyhow::Result<()> {
    let kube = crate::connect::kube_client(args.kube.kubeconfig.as_deref()).await?;
    let opts = ReclaimOptions {
        output_dir: args.output_dir.clone(),
        keep_cilium_record: args.keep_cilium_record,
        delete_crds: args.delete_crds,
        timeout: args.timeout,
        poll_interval: Duration::from_secs(1),
    };
    if let Some(format) = args.output {
        let plan = ichor_adopt_run::reclaim::plan(&kube, &opts)
            .await
            .map_err(for_people)?;
        printer::data(&match format {
            OutputFormat::Json => serde_json::to_string_pretty(&plan)?,
            OutputFormat::Yaml => serde_yaml_ng::to_string(&plan)?,
        });
        return Ok(());
    }
    if !args.yes && !std::io::stdin().is_terminal() {
        bail!(
            "reclaim asks for consent on a terminal; pass --yes to reclaim without asking (nothing was written)"
        );
    }
    let operator: Arc<dyn ReclaimOperator> = Arc::new(TerminalOperator { yes: args.yes });
    let outcome = ichor_adopt_run::reclaim::reclaim(&kube, &opts, operator)
        .await
        .map_err(for_people)?;
    let Some(plan) = outcome.plan.filter(|p| !p.is_empty()) else {
        return Ok(());
    };
    let phases: Vec<String> = outcome
        .phases
        .iter()
        .map(|(p, s)| format!("{p} {s:.1}s"))
        .collect();
    printer::step(&format!(
        "reclaimed: Ichor holds nothing in this cluster any more ({})",
        phases.join(", ")
    ));
    for line in next_steps(&plan) {
        printer::step(&line);
    }
    Ok(())
}

/// What the operator runs next, one command a line.
fn next_steps(plan: &ReclaimPlan) -> Vec<String> {
    let mut lines = Vec::new();
    for c in &plan.clusters {
        lines.push(format!(
            "  talosctl --talosconfig {}/{TALOSCONFIG_FILE} version",
            c.dir
        ));
    }
    if let IchorChoice::Helm { command, .. } = &plan.ichor {
        lines.push(format!("  {command}"));
    }
    lines.push(
        if matches!(plan.cilium, ichor_adopt::reclaim::CiliumChoice::Keep { .. }) {
            "  helm -n ichor-system list"
        } else {
            "  helm -n kube-system list"
        }
        .to_string(),
    );
    lines
}

/// A refusal says nothing was written.
fn for_people(e: ReclaimError) -> anyhow::Error {
    match e {
        ReclaimError::Refused(_) => {
            anyhow::Error::new(e).context("ichor reclaim refused; nothing was written")
        }
        other => anyhow::Error::new(other),
    }
}

/// The operator at the terminal: progress on stderr, consent asked there
/// unless `--yes`.
struct TerminalOperator {
    yes: bool,
}

impl ReclaimOperator for TerminalOperator {
    fn say(&self, line: &str) {
        printer::step(line);
    }

    fn consent(&self, _plan: &ReclaimPlan) -> bool {
        if self.yes {
            return true;
        }
        printer::ask("Reclaim this cluster from Ichor? [y/N] ");
        let mut answer = String::new();
        if std::io::stdin().lock().read_line(&mut answer).is_err() {
            return false;
        }
        matches!(answer.trim(), "y" | "Y" | "yes")
    }
}
