//! Rendering a chart with the real `helm` binary:
//! `helm install NAME CHART --namespace NS --dry-run=client --output json --values FILE`
//! for a first install, `helm upgrade ... --namespace STORAGE_NS` for an upgrade.
//! Helm prints the release it would create (chart, user values, manifest with
//! hooks split off, notes); see `docs/adr/0005-helm-release-engine.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::record::Release;

/// Where a chart comes from, as `helm install` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartRef {
    /// A local chart folder or `.tgz`, an `oci://` reference, or a chart
    /// name inside [`ChartRef::repo`].
    pub reference: String,
    /// `--version` (ignored by helm for a local path).
    pub version: Option<String>,
    /// `--repo URL` for a chart name in a classic Helm repository.
    pub repo: Option<String>,
}

impl ChartRef {
    /// A chart on disk (folder or archive); needs no network.
    pub fn path(p: impl AsRef<Path>) -> Self {
        ChartRef {
            reference: p.as_ref().display().to_string(),
            version: None,
            repo: None,
        }
    }
}

/// How to run `helm`.
#[derive(Debug, Clone)]
pub struct Renderer {
    /// The `helm` binary (v3.17+ or v4).
    pub helm: PathBuf,
    /// `--kubeconfig`; without it helm uses its own defaults (in-cluster
    /// config in a pod, `$KUBECONFIG`, `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Extra environment for the helm process (`HELM_CACHE_HOME`, ...).
    pub env: Vec<(String, String)>,
    /// Upper bound for one helm run (a remote chart is downloaded in it).
    pub timeout: Duration,
}

impl Renderer {
    pub fn new(helm: impl Into<PathBuf>) -> Self {
        Renderer {
            helm: helm.into(),
            kubeconfig: None,
            env: Vec::new(),
            timeout: Duration::from_secs(300),
        }
    }

    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Renders `chart` as a first install of release `name` in `namespace`
    /// with `values` (written to a temporary file and passed with `--values`).
    /// The returned release carries `chart`, `config`, `manifest`, `hooks` and
    /// `info.notes` as helm produced them; the caller sets revision, status
    /// and times.
    pub async fn render(
        &self,
        name: &str,
        namespace: &str,
        chart: &ChartRef,
        values: &Value,
    ) -> Result<Release, RenderError> {
        self.run("install", name, namespace, chart, values).await
    }

    /// Renders `chart` as an upgrade of release `name` whose records are in
    /// `storage_namespace`: `helm upgrade --dry-run=client` reads the history
    /// there, so the templates see `.Release.IsUpgrade`, the next revision and
    /// the release namespace recorded in the history. The history must not
    /// end in a `pending-*` record (helm refuses then).
    pub async fn render_upgrade(
        &self,
        name: &str,
        storage_namespace: &str,
        chart: &ChartRef,
        values: &Value,
    ) -> Result<Release, RenderError> {
        self.run("upgrade", name, storage_namespace, chart, values)
            .await
    }

    /// Renders `chart` offline, as `helm template` does (no cluster is
    /// asked anything): the manifest, hooks included, for a cluster that
    /// does not exist yet (the inline manifest `ichor init` writes).
    pub async fn template(
        &self,
        name: &str,
        namespace: &str,
        chart: &ChartRef,
        values: &Value,
    ) -> Result<String, RenderError> {
        let (_dir, values_path) = write_values(values)?;
        let mut args: Vec<String> = vec![
            "template".into(),
            name.into(),
            chart.reference.clone(),
            "--namespace".into(),
            namespace.into(),
            "--values".into(),
            values_path.display().to_string(),
        ];
        if let Some(v) = &chart.version {
            args.extend(["--version".into(), v.clone()]);
        }
        if let Some(r) = &chart.repo {
            args.extend(["--repo".into(), r.clone()]);
        }
        let (_, out) = self.exec(args).await?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs helm with `args`, bounded; its output when it succeeds.
    async fn exec(&self, args: Vec<String>) -> Result<(String, std::process::Output), RenderError> {
        let mut cmd = tokio::process::Command::new(&self.helm);
        cmd.args(&args)
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let shown = format!("{} {}", self.helm.display(), args.join(" "));
        let out = match tokio::time::timeout(self.timeout, cmd.output()).await {
            Err(_) => {
                return Err(RenderError::Timeout {
                    command: shown,
                    timeout: self.timeout,
                });
            }
            Ok(Err(source)) => {
                return Err(RenderError::Spawn {
                    helm: self.helm.clone(),
                    source,
                });
            }
            Ok(Ok(out)) => out,
        };
        if !out.status.success() {
            return Err(RenderError::Failed {
                command: shown,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok((shown, out))
    }

    async fn run(
        &self,
        verb: &str,
        name: &str,
        namespace: &str,
        chart: &ChartRef,
        values: &Value,
    ) -> Result<Release, RenderError> {
        // The folder lives until helm has read the file.
        let (_dir, values_path) = write_values(values)?;
        let mut args: Vec<String> = vec![
            verb.into(),
            name.into(),
            chart.reference.clone(),
            "--namespace".into(),
            namespace.into(),
            "--dry-run=client".into(),
            "--output".into(),
            "json".into(),
            "--values".into(),
            values_path.display().to_string(),
        ];
        if let Some(v) = &chart.version {
            args.extend(["--version".into(), v.clone()]);
        }
        if let Some(r) = &chart.repo {
            args.extend(["--repo".into(), r.clone()]);
        }
        if let Some(k) = &self.kubeconfig {
            args.extend(["--kubeconfig".into(), k.display().to_string()]);
        }
        let (shown, out) = self.exec(args).await?;
        parse_rendered(&out.stdout).map_err(|source| RenderError::Output {
            command: shown,
            source,
        })
    }
}

/// Writes `values` to `values.json` in a new temporary folder, for helm's
/// `--values`; the folder is removed when the returned guard drops.
fn write_values(values: &Value) -> Result<(tempfile::TempDir, std::path::PathBuf), RenderError> {
    let dir = tempfile::Builder::new()
        .prefix("ichor-helm-")
        .tempdir()
        .map_err(|source| RenderError::Io {
            what: "creating a temporary folder for the values file".into(),
            source,
        })?;
    let values_path = dir.path().join("values.json");
    let text = serde_json::to_vec_pretty(values).map_err(|e| RenderError::Io {
        what: "encoding the values".into(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&values_path, text).map_err(|source| RenderError::Io {
        what: format!("writing {}", values_path.display()),
        source,
    })?;
    Ok((dir, values_path))
}

/// Parses helm's `--output json`: the release object (some helm versions
/// print warnings before it, so parsing starts at the first `{`).
pub fn parse_rendered(stdout: &[u8]) -> Result<Release, OutputError> {
    let start = stdout
        .iter()
        .position(|b| *b == b'{')
        .ok_or(OutputError::NoJson)?;
    serde_json::from_slice(&stdout[start..]).map_err(OutputError::Release)
}

/// Why helm's `--output json` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("no JSON object in helm's output")]
    NoJson,
    #[error("helm's JSON does not parse as a release")]
    Release(#[source] serde_json::Error),
}

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The CLI's help line says what can help (`--helm`, `ICHOR_HELM`).
    #[error("cannot run helm at {helm}")]
    Spawn {
        helm: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "`{command}` exited with {status}: {stderr}; fix what helm names (the chart, its values, or access to the chart source)"
    )]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` did not finish within {timeout:?}")]
    Timeout { command: String, timeout: Duration },
    #[error("`{command}` printed something Ichor cannot read")]
    Output {
        command: String,
        source: OutputError,
    },
    #[error("{what}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl RenderError {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            RenderError::Timeout { .. } => Some("check access to the chart source".into()),
            _ => None,
        }
    }
}
