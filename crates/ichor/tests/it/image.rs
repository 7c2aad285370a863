//! The controller and UI images, end to end: built twice from the same
//! inputs each has one digest; pushed to a real registry (crane's, built from its Go module,
//! on loopback) it is served, validated and exported by crane as we built it;
//! and its file system alone runs ichor and helm, as the image's user, with
//! nothing of the host visible (a chroot into the exported files).
//!
//! What Ichor did: gathered the binaries, libraries and chart and built the
//! image. What the test played: nothing — crane and chroot are the judges.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ichor_image::{controller, gather, layout, ui};
use ichor_testenv::Tool;

const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

fn sources() -> gather::Sources {
    gather::Sources {
        ichor: env!("CARGO_BIN_EXE_ichor").into(),
        helm: Tool::Helm4.path(),
        cilium_chart: Some(cilium_chart()),
        version: VERSION.into(),
        revision: "0000000000000000000000000000000000000000".into(),
        source: env!("CARGO_PKG_REPOSITORY").into(),
        created: 1_700_000_000,
    }
}

/// The pinned Cilium chart, from its Go module (`tools/cilium-chart.sh`, as
/// `make images` takes it).
fn cilium_chart() -> PathBuf {
    let script = ichor_testenv::tools::repo_root().join("tools/cilium-chart.sh");
    let dir = ok(
        Command::new("bash").arg(script).output().unwrap(),
        "tools/cilium-chart.sh",
    );
    PathBuf::from(dir.trim())
}

fn build() -> ichor_image::BuiltImage {
    let inputs = gather::inputs(&sources()).expect("the image's inputs are on this machine");
    ichor_image::build(&controller::image(&inputs)).expect("the image builds")
}

/// One build shared by the tests (compressing the layers is the slow part).
fn built() -> &'static ichor_image::BuiltImage {
    static IMAGE: std::sync::OnceLock<ichor_image::BuiltImage> = std::sync::OnceLock::new();
    IMAGE.get_or_init(build)
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// crane's registry on a free loopback port, stopped on drop.
struct Registry {
    child: Child,
    host: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry() -> Registry {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = ichor_testenv::command_dying_with_parent(Tool::Crane.path())
        .args([
            "registry",
            "serve",
            "--address",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("crane registry serve starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "crane's registry did not listen on 127.0.0.1:{port} within 30s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Registry {
        child,
        host: format!("127.0.0.1:{port}"),
    }
}

fn crane(args: &[&str]) -> String {
    ok(
        Command::new(Tool::Crane.path())
            .args(args)
            .output()
            .unwrap(),
        &format!("crane {}", args.join(" ")),
    )
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// A host tool by absolute path: the child's environment is the image's, so
/// its PATH cannot find the host's tools.
fn host_tool(name: &str) -> PathBuf {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed on this machine (coreutils/util-linux)"))
}

/// Runs `argv` inside `root` with only the image's environment: as the
/// image's user when the test runs as root, else as root of a user namespace.
fn run_in(root: &Path, env: &[String], argv: &[&str]) -> Output {
    let mut cmd = if is_root() {
        let mut c = Command::new(host_tool("chroot"));
        c.arg("--userspec=65532:65532");
        c
    } else {
        let mut c = Command::new(host_tool("unshare"));
        c.args(["--map-root-user", "chroot"]);
        c
    };
    cmd.arg(root).args(argv).env_clear();
    for kv in env {
        let (k, v) = kv.split_once('=').unwrap();
        cmd.env(k, v);
    }
    cmd.output().expect("chroot runs")
}

/// Covers: the images of ADR 0012 (make images twice gives the same digests; the image
/// config's entrypoint, user and labels; crane pushes the layout as built)
#[test]
fn the_controller_image_has_one_digest_and_a_registry_serves_it_as_built() {
    let first = built();
    let second = build();
    assert_eq!(first.digest(), second.digest(), "two builds, two digests");
    assert_eq!(
        layout::archive(first, 1_700_000_000).unwrap(),
        layout::archive(&second, 1_700_000_000).unwrap(),
        "the layout archives differ"
    );

    let config = &first.config_json["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/ichor"])
    );
    assert_eq!(config["User"], "65532:65532");
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(
        labels["org.opencontainers.image.source"],
        env!("CARGO_PKG_REPOSITORY")
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        "0000000000000000000000000000000000000000"
    );

    let dir = tempfile::tempdir().unwrap();
    let layout_dir = dir.path().join("ichor-controller");
    layout::write_layout(first, &layout_dir).unwrap();

    let registry = registry();
    let reference = format!("{}/ichor-controller:{VERSION}", registry.host);
    crane(&["push", &layout_dir.display().to_string(), &reference]);
    assert_eq!(
        crane(&["digest", &reference]).trim(),
        first.digest(),
        "the registry names the image by another digest"
    );
    crane(&["validate", "--remote", &reference]);
    assert_eq!(
        crane(&["config", &reference]).trim().as_bytes(),
        first.config.bytes.as_slice()
    );
}

fn chart_in_image(image: &ichor_image::BuiltImage) -> String {
    let env: Vec<String> =
        serde_json::from_value(image.config_json["config"]["Env"].clone()).unwrap();
    env.iter()
        .find_map(|e| e.strip_prefix("ICHOR_CILIUM_CHART=").map(str::to_string))
        .unwrap_or_default()
}

/// Covers: the images of ADR 0012 (self-contained: the exported file system alone runs
/// `ichor --version`, `ichor controller --help` and `helm version`, and helm
/// reads the chart the image carries; no shell inside)
#[test]
fn the_controller_image_runs_from_its_own_files_alone() {
    let image = built();
    let dir = tempfile::tempdir().unwrap();
    let layout_dir = dir.path().join("ichor-controller");
    layout::write_layout(image, &layout_dir).unwrap();
    let registry = registry();
    let reference = format!("{}/ichor-controller:{VERSION}", registry.host);
    crane(&["push", &layout_dir.display().to_string(), &reference]);
    let fs_tar = dir.path().join("fs.tar");
    crane(&["export", &reference, &fs_tar.display().to_string()]);
    let root: PathBuf = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    tar::Archive::new(std::fs::File::open(&fs_tar).unwrap())
        .unpack(&root)
        .unwrap();

    for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "bin/busybox"] {
        assert!(!root.join(shell).exists(), "the image has a shell: {shell}");
    }
    let env: Vec<String> =
        serde_json::from_value(image.config_json["config"]["Env"].clone()).unwrap();

    let version = ok(
        run_in(&root, &env, &["/usr/local/bin/ichor", "--version"]),
        "ichor --version in the image",
    );
    assert_eq!(version.trim(), format!("ichor {VERSION}"));
    ok(
        run_in(
            &root,
            &env,
            &["/usr/local/bin/ichor", "controller", "--help"],
        ),
        "ichor controller --help in the image",
    );
    let helm = ok(
        run_in(&root, &env, &["/usr/local/bin/helm", "version"]),
        "helm version in the image",
    );
    assert!(helm.contains(&Tool::Helm4.version()), "helm says {helm}");

    assert_eq!(
        chart_in_image(image),
        format!(
            "/usr/share/ichor/charts/cilium-{}.tgz",
            ichor_cilium::CHART_VERSION
        ),
        "the image carries another Cilium chart than the one Ichor pins"
    );
    let chart = env
        .iter()
        .find_map(|e| e.strip_prefix("ICHOR_CILIUM_CHART="))
        .expect("the image points ichor at its Cilium chart");
    let shown = ok(
        run_in(
            &root,
            &env,
            &["/usr/local/bin/helm", "show", "chart", chart],
        ),
        "helm show chart in the image",
    );
    assert!(shown.contains("name: cilium"), "helm shows {shown}");
}

fn build_ui() -> ichor_image::BuiltImage {
    let inputs = gather::inputs(&sources()).expect("the image's inputs are on this machine");
    ichor_image::build(&ui::image(&inputs)).expect("the UI image builds")
}

/// Pushes `image` to a fresh registry and exports its file system into
/// `dir/root`; the registry stays up while the guard lives.
fn exported(image: &ichor_image::BuiltImage, dir: &Path) -> (Registry, String, PathBuf) {
    let layout_dir = dir.join(&image.name);
    layout::write_layout(image, &layout_dir).unwrap();
    let registry = registry();
    let reference = format!("{}/{}:{VERSION}", registry.host, image.name);
    crane(&["push", &layout_dir.display().to_string(), &reference]);
    let fs_tar = dir.join("fs.tar");
    crane(&["export", &reference, &fs_tar.display().to_string()]);
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    tar::Archive::new(std::fs::File::open(&fs_tar).unwrap())
        .unpack(&root)
        .unwrap();
    (registry, reference, root)
}

/// Covers: the images of ADR 0012 (the `ichor-ui` image the chart names: `make images`
/// builds it; two builds, one digest; a registry serves it as built; its
/// file system alone runs `ichor --version` and `ichor ui --help` as the
/// image's user; no shell, no helm, no chart; the base layer is the
/// controller image's)
#[test]
fn the_ui_image_has_one_digest_and_runs_ichor_ui_from_its_own_files() {
    let first = build_ui();
    let second = build_ui();
    assert_eq!(first.digest(), second.digest(), "two builds, two digests");
    assert_eq!(first.name, "ichor-ui");
    let config = &first.config_json["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/ichor"])
    );
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        VERSION
    );
    assert_eq!(
        first.layers[0].digest,
        built().layers[0].digest,
        "the UI image's base layer is the controller image's"
    );

    let dir = tempfile::tempdir().unwrap();
    let (_registry, reference, root) = exported(&first, dir.path());
    assert_eq!(crane(&["digest", &reference]).trim(), first.digest());
    crane(&["validate", "--remote", &reference]);

    for absent in ["bin/sh", "bin/bash", "usr/bin/sh", "usr/local/bin/helm"] {
        assert!(!root.join(absent).exists(), "the UI image has {absent}");
    }
    assert!(
        !root.join("usr/share/ichor/charts").exists(),
        "the UI image carries a chart"
    );
    let env: Vec<String> = serde_json::from_value(config["Env"].clone()).unwrap();
    let version = ok(
        run_in(&root, &env, &["/usr/local/bin/ichor", "--version"]),
        "ichor --version in the UI image",
    );
    assert_eq!(version.trim(), format!("ichor {VERSION}"));
    let help = ok(
        run_in(&root, &env, &["/usr/local/bin/ichor", "ui", "--help"]),
        "ichor ui --help in the UI image",
    );
    assert!(help.contains("--tls-cert"), "{help}");
    // The chart's image: repository and tag of the one built here.
    let values =
        std::fs::read_to_string(ichor_testenv::tools::repo_root().join("dist/chart/values.yaml"))
            .unwrap();
    assert!(
        values.contains(&format!("repository: ghcr.io/maeshinshin/{}", ui::NAME)),
        "the chart names another UI image"
    );
}
