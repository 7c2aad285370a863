//! What the controller image holds, as a pure recipe: the `ichor` binary, the
//! `helm` binary it renders charts with (ADR 0005), the pinned Cilium chart
//! when it could be had, CA certificates, the shared libraries `ichor` links
//! (taken from the build machine's packages, versions recorded), a non-root
//! user and no shell (ADR 0012).

use std::collections::BTreeMap;

use crate::image::ImageSpec;
use crate::layer::FileTree;

/// The controller image's repository name.
pub const NAME: &str = "ichor-controller";
/// The user the image runs as (distroless's `nonroot`).
pub const UID: u64 = 65532;
pub const ICHOR_PATH: &str = "/usr/local/bin/ichor";
pub const HELM_PATH: &str = "/usr/local/bin/helm";
pub const CA_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";
pub const CHARTS_DIR: &str = "/usr/share/ichor/charts";
/// The file in the image that lists every file taken from a Debian package.
pub const PACKAGES_PATH: &str = "/usr/share/ichor/image-packages.txt";
/// The label that says whether the Cilium chart is inside.
pub const CILIUM_CHART_LABEL: &str = "dev.maesh.ichor.cilium-chart";
/// The label that names the base (the packages the libraries came from).
pub const BASE_LABEL: &str = "dev.maesh.ichor.base";

/// A file taken from the build machine's packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackagedFile {
    /// Where it goes in the image (where the dynamic linker looks for it).
    pub path: String,
    pub content: Vec<u8>,
    /// `package version`, e.g. `libc6 2.36-9+deb12u10`.
    pub package: String,
}

/// The Cilium chart archive carried in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    pub version: String,
    pub archive: Vec<u8>,
}

/// Everything the controller image is made from.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// `vX.Y.Z`, the tag and the version label.
    pub version: String,
    /// The commit the binaries were built from.
    pub revision: String,
    /// The repository URL.
    pub source: String,
    /// Seconds since the epoch (the commit's time: reproducible).
    pub created: u64,
    pub ichor: Vec<u8>,
    pub helm: Vec<u8>,
    /// The pinned chart, or why it is not inside.
    pub cilium_chart: Result<Chart, NoChart>,
    /// The shared libraries and the dynamic linker `ichor` needs.
    pub libraries: Vec<PackagedFile>,
    pub ca_certificates: PackagedFile,
}

/// Why the image holds no Cilium chart (its label says so).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoChart {
    #[error("no chart was given to the image build")]
    NotGiven,
}

/// The chart's path inside the image.
pub fn chart_path(version: &str) -> String {
    format!("{CHARTS_DIR}/cilium-{version}.tgz")
}

/// The image recipe: three layers (base, helm and the chart, ichor) so a new
/// `ichor` only changes the last one.
pub fn image(inputs: &Inputs) -> ImageSpec {
    let base = base_layer(inputs);

    let mut tools = FileTree::new();
    tools.file(HELM_PATH, inputs.helm.clone(), 0o755);
    let mut env = vec![
        "PATH=/usr/local/bin".to_string(),
        format!("SSL_CERT_FILE={CA_PATH}"),
        format!("ICHOR_HELM={HELM_PATH}"),
        // helm keeps its cache and config under HOME; /tmp is the only
        // writable place a read-only root file system mounts.
        "HOME=/tmp".to_string(),
        "HELM_CACHE_HOME=/tmp/helm/cache".to_string(),
        "HELM_CONFIG_HOME=/tmp/helm/config".to_string(),
        "HELM_DATA_HOME=/tmp/helm/data".to_string(),
    ];
    let chart_label = match &inputs.cilium_chart {
        Ok(chart) => {
            let path = chart_path(&chart.version);
            tools.file(&path, chart.archive.clone(), 0o644);
            env.push(format!("ICHOR_CILIUM_CHART={path}"));
            format!("cilium {} at {path}", chart.version)
        }
        Err(why) => format!("not included ({why}); set ICHOR_CILIUM_CHART to a chart reference"),
    };

    let mut app = FileTree::new();
    app.file(ICHOR_PATH, inputs.ichor.clone(), 0o755);

    let mut labels = oci_labels(
        inputs,
        NAME,
        "Ichor's controller, webhooks and ichor-cni Job: the ichor binary with helm and the pinned Cilium chart",
    );
    labels.insert(CILIUM_CHART_LABEL.to_string(), chart_label);

    ImageSpec {
        name: NAME.to_string(),
        tag: inputs.version.clone(),
        layers: vec![
            (BASE_LAYER.to_string(), base),
            ("helm and the pinned Cilium chart".to_string(), tools),
            ("ichor".to_string(), app),
        ],
        entrypoint: vec![ICHOR_PATH.to_string()],
        env,
        user: format!("{UID}:{UID}"),
        working_dir: "/".to_string(),
        labels,
        created: inputs.created,
    }
}

/// The base layer: users, the name-service switch, /tmp and the home
/// folder, CA certificates, the shared libraries ichor links and the record
/// of the packages they came from.
pub(crate) fn base_layer(inputs: &Inputs) -> FileTree {
    let mut base = FileTree::new();
    base.file(
        "/etc/passwd",
        format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:/home/nonroot:/sbin/nologin\n").into_bytes(),
        0o644,
    )
    .file(
        "/etc/group",
        format!("root:x:0:\nnonroot:x:{UID}:\n").into_bytes(),
        0o644,
    )
    // glibc ≥ 2.34 has files and dns built in; this file only says to use them.
    .file("/etc/nsswitch.conf", b"hosts: files dns\n".to_vec(), 0o644)
    .dir("/tmp", 0o1777, 0)
    .dir("/home/nonroot", 0o700, UID)
    .file(
        &inputs.ca_certificates.path,
        inputs.ca_certificates.content.clone(),
        0o644,
    );
    for lib in &inputs.libraries {
        base.file(&lib.path, lib.content.clone(), 0o755);
    }
    base.file(PACKAGES_PATH, packages_record(inputs).into_bytes(), 0o644);
    base
}

/// The distinct packages the base was taken from, sorted.
pub(crate) fn base_packages(inputs: &Inputs) -> Vec<String> {
    let mut packages: Vec<String> = inputs
        .libraries
        .iter()
        .chain([&inputs.ca_certificates])
        .map(|f| f.package.clone())
        .collect();
    packages.sort();
    packages.dedup();
    packages
}

/// One line per packaged file: `path package version`.
fn packages_record(inputs: &Inputs) -> String {
    let mut lines: Vec<String> = inputs
        .libraries
        .iter()
        .chain([&inputs.ca_certificates])
        .map(|f| format!("{} {}", f.path, f.package))
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// The base layer's description (the same layer in every image).
pub(crate) const BASE_LAYER: &str =
    "base: users, CA certificates and the shared libraries ichor links";

/// The OCI labels every Ichor image carries: `title`, `description`, where
/// it comes from, its version and what its base layer holds.
pub(crate) fn oci_labels(
    inputs: &Inputs,
    title: &str,
    description: &str,
) -> BTreeMap<String, String> {
    [
        ("org.opencontainers.image.title", title.to_string()),
        (
            "org.opencontainers.image.description",
            description.to_string(),
        ),
        ("org.opencontainers.image.source", inputs.source.clone()),
        ("org.opencontainers.image.version", inputs.version.clone()),
        ("org.opencontainers.image.revision", inputs.revision.clone()),
        (
            "org.opencontainers.image.licenses",
            "Apache-2.0".to_string(),
        ),
        (
            "org.opencontainers.image.created",
            crate::image::rfc3339(inputs.created),
        ),
        (BASE_LABEL, base_packages(inputs).join(", ")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Inputs of small stand-in files (the UI image's tests use them too).
    pub(crate) fn inputs(chart: Result<Chart, NoChart>) -> Inputs {
        Inputs {
            version: "v0.1.0".into(),
            revision: "0123abc".into(),
            source: "https://example.invalid/ichor".into(),
            created: 1_700_000_000,
            ichor: b"ichor".to_vec(),
            helm: b"helm".to_vec(),
            cilium_chart: chart,
            libraries: vec![PackagedFile {
                path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
                content: b"libc".to_vec(),
                package: "libc6 2.36".into(),
            }],
            ca_certificates: PackagedFile {
                path: CA_PATH.into(),
                content: b"certs".to_vec(),
                package: "ca-certificates 20230311".into(),
            },
        }
    }

    #[test]
    fn the_recipe_has_no_shell_a_nonroot_user_and_the_tools() {
        let spec = image(&inputs(Ok(Chart {
            version: "1.18.5".into(),
            archive: b"tgz".to_vec(),
        })));
        let paths: Vec<&str> = spec.layers.iter().flat_map(|(_, t)| t.paths()).collect();
        assert!(paths.contains(&"usr/local/bin/ichor"));
        assert!(paths.contains(&"usr/local/bin/helm"));
        assert!(paths.contains(&"usr/share/ichor/charts/cilium-1.18.5.tgz"));
        assert!(
            !paths
                .iter()
                .any(|p| p.ends_with("bin/sh") || p.ends_with("bash"))
        );
        assert_eq!(spec.user, "65532:65532");
        assert!(
            spec.env
                .contains(&"ICHOR_CILIUM_CHART=/usr/share/ichor/charts/cilium-1.18.5.tgz".into())
        );
        assert_eq!(
            spec.labels[BASE_LABEL],
            "ca-certificates 20230311, libc6 2.36"
        );
    }

    #[test]
    fn an_image_without_the_chart_says_so() {
        let spec = image(&inputs(Err(NoChart::NotGiven)));
        assert!(spec.labels[CILIUM_CHART_LABEL].starts_with("not included"));
        assert!(
            !spec
                .env
                .iter()
                .any(|e| e.starts_with("ICHOR_CILIUM_CHART="))
        );
    }
}
