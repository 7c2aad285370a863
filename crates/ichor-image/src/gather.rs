//! Reading the controller image's inputs from the build machine: the shared
//! libraries `ichor` links (through `ldd`) and the Debian packages they come
//! from (through `dpkg-query`), the CA bundle, and the Cilium chart packed
//! deterministically from its directory; and for the images' SBOMs, the
//! crates `ichor` links (through `cargo metadata`), helm's version (helm's
//! own answer) and the Go module the chart came from.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;
use crate::controller::{CA_PATH, Chart, Inputs, PackagedFile};
use crate::layer::{FileTree, gzip};
use crate::sbom::{self, RUST_TARGET, RustCrates, Software};

/// Where the inputs are on this machine.
#[derive(Debug, Clone)]
pub struct Sources {
    pub ichor: PathBuf,
    pub helm: PathBuf,
    /// A chart directory (with `Chart.yaml`) or a packaged `.tgz`.
    pub cilium_chart: Option<PathBuf>,
    pub version: String,
    pub revision: String,
    pub source: String,
    pub created: u64,
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Io {
        what: format!("reading {}", path.display()),
        source: e,
    })
}

fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::Io {
            what: format!("running {program}"),
            source: e,
        })?;
    if !out.status.success() {
        return Err(Error::Command(
            format!("{program} {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The paths `ldd` resolves for `binary`, the dynamic linker included; the
/// vDSO (no file) is skipped. Pure over `ldd`'s output.
pub fn parse_ldd(output: &str) -> Vec<String> {
    let mut paths: Vec<String> = output
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path.to_string())
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// `package version` of the Debian package that installed `path`.
fn package_of(path: &str) -> Result<String, Error> {
    let canonical = std::fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string());
    // Debian's merged /usr: dpkg knows a file by the path its package ships.
    let mut candidates = vec![path.to_string(), canonical.clone()];
    for p in [path, canonical.as_str()] {
        if let Some(rest) = p.strip_prefix("/usr") {
            candidates.push(rest.to_string());
        } else {
            candidates.push(format!("/usr{p}"));
        }
    }
    for candidate in &candidates {
        if let Ok(out) = run("dpkg-query", &["-S", candidate]) {
            let package = out
                .lines()
                .next()
                .and_then(|l| l.split_once(':'))
                .map(|(p, _)| p.trim().to_string())
                .unwrap_or_default();
            let version = run("dpkg-query", &["-W", "-f=${Version}", &package])?;
            let name = package.split(':').next().unwrap_or(&package);
            return Ok(format!("{name} {}", version.trim()));
        }
    }
    Err(Error::Unpackaged(path.to_string()))
}

/// The libraries `binary` needs at run time, each at the path the dynamic
/// linker looks for it, with the package it came from.
pub fn libraries(binary: &Path) -> Result<Vec<PackagedFile>, Error> {
    let out = run("ldd", &[&binary.display().to_string()])?;
    parse_ldd(&out)
        .into_iter()
        .map(|path| {
            Ok(PackagedFile {
                content: read(Path::new(&path))?,
                package: package_of(&path)?,
                path,
            })
        })
        .collect()
}

/// A chart directory packed as `helm package` lays it out (`<name>/…`), but
/// with sorted entries and one time, so the archive is reproducible. A
/// `.tgz` is taken as it is.
pub fn chart(path: &Path, mtime: u64) -> Result<Chart, Error> {
    if path.is_file() {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let version = name
            .trim_end_matches(".tgz")
            .trim_start_matches("cilium-")
            .to_string();
        return Ok(Chart {
            version,
            archive: read(path)?,
        });
    }
    let chart_yaml = String::from_utf8_lossy(&read(&path.join("Chart.yaml"))?).into_owned();
    let field = |key: &str| {
        chart_yaml
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}:")))
            .map(|v| v.trim().trim_matches('"').to_string())
            .ok_or_else(|| {
                Error::Chart(
                    path.display().to_string(),
                    format!("no {key} in Chart.yaml"),
                )
            })
    };
    let (name, version) = (field("name")?, field("version")?);
    let mut tree = FileTree::new();
    add_dir(&mut tree, path, &name)?;
    Ok(Chart {
        version,
        archive: gzip(&tree.tar(mtime)?)?,
    })
}

fn add_dir(tree: &mut FileTree, dir: &Path, prefix: &str) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Io {
        what: format!("listing {}", dir.display()),
        source: e,
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Io {
            what: format!("listing {}", dir.display()),
            source: e,
        })?;
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let path = entry.path();
        if path.is_dir() {
            add_dir(tree, &path, &name)?;
        } else {
            tree.file(&name, read(&path)?, 0o644);
        }
    }
    Ok(())
}

/// The image carries only `ichor`'s libraries, so helm must link none.
fn require_static(binary: &Path) -> Result<(), Error> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| Error::Io {
            what: "running ldd".to_string(),
            source: e,
        })?;
    let libraries = parse_ldd(&String::from_utf8_lossy(&out.stdout));
    if out.status.success() && !libraries.is_empty() {
        return Err(Error::Dynamic(
            binary.display().to_string(),
            libraries.join(", "),
        ));
    }
    Ok(())
}

/// Reads every input; the first missing one is the error.
pub fn inputs(sources: &Sources) -> Result<Inputs, Error> {
    require_static(&sources.helm)?;
    let cilium_chart = match &sources.cilium_chart {
        Some(path) => Ok(chart(path, sources.created)?),
        None => Err(crate::controller::NoChart::NotGiven),
    };
    Ok(Inputs {
        version: sources.version.clone(),
        revision: sources.revision.clone(),
        source: sources.source.clone(),
        created: sources.created,
        ichor: read(&sources.ichor)?,
        helm: read(&sources.helm)?,
        cilium_chart,
        libraries: libraries(&sources.ichor)?,
        ca_certificates: PackagedFile {
            path: CA_PATH.to_string(),
            content: read(Path::new(CA_PATH))?,
            // update-ca-certificates writes this file from the package's certificates.
            package: format!(
                "ca-certificates {}",
                run("dpkg-query", &["-W", "-f=${Version}", "ca-certificates"])?.trim()
            ),
        },
    })
}

/// The crates linked into `package`'s binary for the images' platform, as
/// the workspace of `manifest` (its Cargo.toml) and its Cargo.lock resolve
/// them. Runs `cargo metadata --locked` (`$CARGO`, else `cargo`).
pub fn rust_crates(manifest: &Path, package: &str) -> Result<RustCrates, Error> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let manifest_arg = manifest.display().to_string();
    let metadata = run(
        &cargo,
        &[
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--filter-platform",
            RUST_TARGET,
            "--manifest-path",
            &manifest_arg,
        ],
    )?;
    let lock = String::from_utf8_lossy(&read(&manifest.with_file_name("Cargo.lock"))?).into_owned();
    sbom::rust_crates(metadata.as_bytes(), &lock, package)
}

/// The release `helm` says it is (`helm version`); when `pinned` is given,
/// the binary must be that release.
pub fn helm_version(helm: &Path, pinned: Option<&str>) -> Result<String, Error> {
    let helm_arg = helm.display().to_string();
    let version = run(&helm_arg, &["version", "--template", "{{.Version}}"])?
        .trim()
        .to_string();
    match pinned {
        Some(pin) if pin != version => Err(Error::Sbom(format!(
            "{helm_arg} says it is helm {version}, but the pinned release is {pin}"
        ))),
        _ => Ok(version),
    }
}

/// What the SBOMs need beyond the images' inputs: the crates in `ichor`
/// (the workspace of `manifest`), helm's release (checked against
/// `pinned_helm` when given) and the Go module the chart folder belongs to.
pub fn software(
    sources: &Sources,
    manifest: &Path,
    pinned_helm: Option<&str>,
) -> Result<Software, Error> {
    let modcache = std::env::var_os("GOMODCACHE").map(PathBuf::from);
    Ok(Software {
        crates: rust_crates(manifest, sbom::ICHOR_PACKAGE)?,
        helm_version: helm_version(&sources.helm, pinned_helm)?,
        chart_module: sources
            .cilium_chart
            .as_deref()
            .filter(|p| p.is_dir())
            .and_then(|p| sbom::go_module(p, modcache.as_deref())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_the_files_and_skip_the_vdso() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(out),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }
}
