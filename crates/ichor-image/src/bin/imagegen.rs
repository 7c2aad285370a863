//! `imagegen`: builds Ichor's container images — the controller's
//! (`ichor-controller`) and the UI's (`ichor-ui`) — as OCI image layouts
//! (what `make images` and `make release` run). No container daemon is needed.
//!
//! Each image is written as `OUT/<name>/` (an OCI image layout: push it with
//! `crane push OUT/<name> REGISTRY/REPO:TAG`) and `OUT/<name>-<tag>.oci.tar`
//! (the same layout in one archive), with its software bill of materials
//! beside it as `OUT/<name>-<tag>.cdx.json` (CycloneDX JSON: the crates in
//! `ichor`, helm, the chart and the base layer's Debian packages), and its
//! digest is appended to `OUT/digests.txt`.

// This binary speaks to the person who runs it on stdout/stderr; it has
// no printer module of its own (the print lint forbids printing in libraries).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use ichor_image::{controller, gather, layout, sbom, ui};

/// Build Ichor's controller and UI images from release binaries, reproducibly.
#[derive(Debug, Parser)]
#[command(
    name = "imagegen",
    after_help = "Examples:\n  imagegen --ichor target/release/ichor --helm \"$(command -v helm)\" --cilium-chart PATH --version v0.1.0 --out bin/images\n\nThe same inputs and --created always give the same digest."
)]
struct Args {
    /// The `ichor` binary to put in the image (a release build).
    #[arg(long, value_name = "PATH")]
    ichor: PathBuf,
    /// The `helm` binary ichor renders charts with (a static build).
    #[arg(long, value_name = "PATH")]
    helm: PathBuf,
    /// The pinned Cilium chart: a chart directory or a packaged .tgz. Without
    /// it the image carries no chart and its label says so.
    #[arg(long, value_name = "PATH")]
    cilium_chart: Option<PathBuf>,
    /// The release version, with its v (the image tag).
    #[arg(long, value_name = "vX.Y.Z")]
    version: String,
    /// The commit the binaries were built from (label org.opencontainers.image.revision).
    #[arg(long, value_name = "SHA", default_value = "unknown")]
    revision: String,
    /// The repository URL (label org.opencontainers.image.source).
    #[arg(long, value_name = "URL")]
    source: String,
    /// Seconds since the epoch for every file's time and the image's creation
    /// (use the commit's time for a reproducible build).
    #[arg(long, value_name = "SECONDS", env = "SOURCE_DATE_EPOCH")]
    created: u64,
    /// Where to write the layouts, archives, SBOMs and digests.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The helm release the --helm binary must be (`helm version`); the SBOM
    /// names it. Without it, the binary's own answer is taken.
    #[arg(long, value_name = "vX.Y.Z")]
    helm_version: Option<String>,
    /// The workspace's Cargo.toml: the SBOM lists the crates its Cargo.lock
    /// resolves for the ichor binary.
    #[arg(long, value_name = "PATH", default_value = "Cargo.toml")]
    cargo_manifest: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let sources = gather::Sources {
        ichor: args.ichor,
        helm: args.helm,
        cilium_chart: args.cilium_chart,
        version: args.version,
        revision: args.revision,
        source: args.source,
        created: args.created,
    };
    let inputs = gather::inputs(&sources).context("reading the images' inputs")?;
    let software = gather::software(&sources, &args.cargo_manifest, args.helm_version.as_deref())
        .context("reading what the images' software is")?;
    let controller_spec = controller::image(&inputs);
    let chart = controller_spec.labels[controller::CILIUM_CHART_LABEL].clone();
    let mut lines = Vec::new();
    for spec in [controller_spec, ui::image(&inputs)] {
        let image = ichor_image::build(&spec)
            .with_context(|| format!("building the {} image", spec.name))?;
        lines.push(write_image(&image, &args.out, args.created)?);
        let document = sbom::document(&spec, &image, &inputs, &software);
        let path = args
            .out
            .join(format!("{}-{}.cdx.json", image.name, image.tag));
        std::fs::write(&path, sbom::to_bytes(&document))
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "  sbom    {} ({} components)",
            path.display(),
            document["components"].as_array().map_or(0, Vec::len)
        );
    }
    let digests = args.out.join("digests.txt");
    std::fs::write(&digests, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", digests.display()))?;
    println!("  chart   {chart} (in ichor-controller)");
    Ok(())
}

/// Writes the image's layout and archive under `out`; its digests.txt line.
fn write_image(
    image: &ichor_image::BuiltImage,
    out: &std::path::Path,
    created: u64,
) -> anyhow::Result<String> {
    let dir = out.join(&image.name);
    layout::write_layout(image, &dir)
        .with_context(|| format!("writing the image layout {}", dir.display()))?;
    let archive_path = out.join(format!("{}-{}.oci.tar", image.name, image.tag));
    let archive = layout::archive(image, created)?;
    std::fs::write(&archive_path, archive)
        .with_context(|| format!("writing {}", archive_path.display()))?;
    let line = format!(
        "{}:{} {} {:.1}MiB compressed",
        image.name,
        image.tag,
        image.digest(),
        image.compressed_size() as f64 / (1024.0 * 1024.0)
    );
    println!("{line}");
    println!("  layout  {}", dir.display());
    println!("  archive {}", archive_path.display());
    Ok(line)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_arguments_are_consistent() {
        super::Args::command().debug_assert();
    }
}
