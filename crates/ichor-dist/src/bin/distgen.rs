//! Writes Ichor's generated distribution files.
//!
//! `cargo run -p ichor-dist --bin distgen`: regenerates `dist/install.yaml` and
//! the generated parts of `dist/chart` (CRDs, RBAC rules, Cilium policies) in
//! the workspace, at the workspace's version.
//!
//! `distgen --version vX.Y.Z --install-yaml FILE [--install-ui-yaml FILE]`:
//! writes only the install manifest of that version to FILE, and the UI's
//! opt-in manifest to the second (what `make release` does).

// This binary speaks to the person who runs it on stdout/stderr; it has
// no printer module of its own (the print lint forbids printing in libraries).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ichor_api::error_text::chain;

const USAGE: &str =
    "usage: distgen [--version vX.Y.Z --install-yaml FILE [--install-ui-yaml FILE]]";

/// Why distgen stopped.
#[derive(Debug, thiserror::Error)]
enum DistgenError {
    /// The command line is not one distgen reads.
    #[error("{0}")]
    Usage(String),
    #[error("cannot create {}", .path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove {}", .path.display())]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Generate(#[from] ichor_dist::Error),
}

fn write(path: &Path, text: &str) -> Result<(), DistgenError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| DistgenError::CreateDir {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| DistgenError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn run() -> Result<(), DistgenError> {
    let mut version = None;
    let mut install_yaml = None;
    let mut ui_yaml = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--version" => {
                version = Some(
                    args.next()
                        .ok_or_else(|| usage("--version needs a value"))?,
                )
            }
            "--install-yaml" => {
                install_yaml = Some(PathBuf::from(
                    args.next()
                        .ok_or_else(|| usage("--install-yaml needs a value"))?,
                ))
            }
            "--install-ui-yaml" => {
                ui_yaml = Some(PathBuf::from(
                    args.next()
                        .ok_or_else(|| usage("--install-ui-yaml needs a value"))?,
                ))
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(usage(&format!("unknown argument {other:?}"))),
        }
    }
    match (version, install_yaml) {
        (None, None) if ui_yaml.is_none() => {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
            let files = ichor_dist::repo_files()?;
            // Remove CRD templates of CRDs that no longer exist.
            let crd_dir = root.join(ichor_dist::CHART_DIR).join("templates/crd");
            if let Ok(entries) = std::fs::read_dir(&crd_dir) {
                for e in entries.flatten() {
                    let rel = PathBuf::from(ichor_dist::CHART_DIR)
                        .join("templates/crd")
                        .join(e.file_name());
                    if !files.iter().any(|f| f.path == rel) {
                        std::fs::remove_file(e.path()).map_err(|source| DistgenError::Remove {
                            path: e.path(),
                            source,
                        })?;
                        eprintln!("removed {}", e.path().display());
                    }
                }
            }
            for f in files {
                write(&root.join(&f.path), &f.text)?;
            }
            Ok(())
        }
        (Some(version), Some(path)) => {
            let text = ichor_dist::install_yaml(&version)?;
            write(&path, &text)?;
            if let Some(path) = ui_yaml {
                let text = ichor_dist::ui_yaml(&version)?;
                write(&path, &text)?;
            }
            Ok(())
        }
        _ => Err(usage(
            "--version and --install-yaml go together (--install-ui-yaml only with them)",
        )),
    }
}

fn usage(problem: &str) -> DistgenError {
    DistgenError::Usage(problem.to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("distgen: {}", chain(&e));
            if matches!(e, DistgenError::Usage(_)) {
                eprintln!("{USAGE}");
            }
            ExitCode::FAILURE
        }
    }
}
