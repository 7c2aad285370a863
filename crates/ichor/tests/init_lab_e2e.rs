//! `ichor init` on the lab: fresh nodes in maintenance mode (1 control plane,
//! 2 workers) in both config shapes. The real `ichor` binary applies each
//! config over the insecure API, bootstraps etcd, and fetches the kubeconfig
//! through the Talos API; the lab then runs the real kube-apiserver and etcd
//! with the cluster's own CAs (taken from the bootstrapped node's config),
//! so that kubeconfig reaches the cluster as on real hardware; init
//! installs Ichor there.
//!
//! What is not here yet: Talos's bootstrap-manifest apply of the inline
//! Cilium in the lab (R6.1's `bootstrap_manifests`), without which no pod
//! network comes up, Ichor's pods stay Pending and the webhook wait ends
//! with its diagnosis; the runs here are bounded there (`--wait-timeout`)
//! and assert everything up to it.
//!
//! Covers: R10.2, R10.3, issue 13 items 1 and 3

mod common;

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor_lab::init::{InitLab, InitLabOptions};
use ichor_talemu::WriteAction;
use ichor_testenv::Tool;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

fn init_command(lab: &InitLab, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
    cmd.arg("init")
        .arg("lab")
        .args(["--endpoint", &lab.endpoint])
        .args(["--control-plane", &lab.control_planes().join(",")])
        .args(["--worker", &lab.workers().join(",")])
        .arg("--output-dir")
        .arg(out)
        .args(["--yes", "--wait-timeout", "15s"])
        .arg("--helm")
        .arg(Tool::Helm3.path())
        .arg("--cilium-chart")
        .arg(lab.options.cilium_chart.path())
        .env("NO_COLOR", "1")
        .env("HOME", out.parent().unwrap())
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null());
    cmd
}

async fn lab(talos_version: &str) -> (InitLab, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitLabOptions::new(dir.path().join("lab"));
    options.talos_version = talos_version.to_string();
    options.ichor_bin = Some(env!("CARGO_BIN_EXE_ichor").into());
    (
        InitLab::up(options).await.expect("the init lab starts"),
        dir,
    )
}

/// Runs init to its end (success or failure) and returns what it printed.
fn run_to_end(cmd: &mut Command) -> (bool, String) {
    let out = tokio::task::block_in_place(|| cmd.output().expect("ichor runs"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs init and SIGKILLs it as soon as it prints `line`.
fn killed_after(cmd: &mut Command, line: &str) -> String {
    tokio::task::block_in_place(|| {
        let mut child = cmd
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut seen = String::new();
        let mut killed = false;
        for l in BufReader::new(stderr).lines() {
            let l = l.unwrap();
            seen.push_str(&l);
            seen.push('\n');
            if l.contains(line) {
                child.kill().unwrap();
                killed = true;
                break;
            }
        }
        let _ = child.wait();
        assert!(killed, "init never printed {line:?}:\n{seen}");
        seen
    })
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Each node's writes: how many configs applied, and bootstraps.
fn applies_and_bootstraps(lab: &InitLab) -> (Vec<usize>, usize) {
    let writes = lab.emulator.writes();
    let applies = lab
        .hostnames
        .iter()
        .map(|h| {
            writes
                .iter()
                .filter(|w| &w.node == h)
                .filter(|w| matches!(w.action, WriteAction::ApplyConfiguration { .. }))
                .count()
        })
        .collect();
    let bootstraps = writes
        .iter()
        .filter(|w| w.action == WriteAction::Bootstrap)
        .count();
    (applies, bootstraps)
}

/// What a finished run leaves: the files 0600, one config per node, one
/// bootstrap, the kubeconfig served through the Talos API reaching the
/// cluster's API server (its CA is the cluster's), Ichor installed there.
async fn assert_initialized(lab: &InitLab, out: &Path, text: &str) {
    for f in ["secrets.yaml", "talosconfig", "kubeconfig"] {
        assert_eq!(mode(&out.join(f)), 0o600, "{f}");
    }
    assert_eq!(applies_and_bootstraps(lab), (vec![1, 1, 1], 1), "{text}");
    let kubeconfig = std::fs::read_to_string(out.join("kubeconfig")).unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        lab.endpoint
    );
    let client = kube::Client::try_from(config).unwrap();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("the kubeconfig from the Talos API reaches the cluster");
    let mut names: Vec<String> = nodes
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    names.sort();
    let mut expected = lab.hostnames.clone();
    expected.sort();
    assert_eq!(names, expected);
    let installations = Api::<ichor_api::IchorInstallation>::namespaced(client, "ichor-system")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(installations.items.len(), 1, "{text}");
    assert!(
        text.contains("bootstrapped etcd on") || text.contains("etcd was already bootstrapped"),
        "{text}"
    );
}

/// The controller's first reconcile: for every TalosMachine init writes, the
/// controller's render over the config the node runs (read back through the
/// Talos API with the cluster's talosconfig) finds no drift.
async fn assert_no_drift(lab: &InitLab, out: &Path) {
    let opts = ichor_adopt_run::init::InitOptions {
        request: ichor_adopt::init::InitRequest {
            cluster: "lab".into(),
            endpoint: lab.endpoint.clone(),
            control_planes: lab.control_planes(),
            workers: lab.workers(),
            secrets_source: "generated".into(),
            ..Default::default()
        },
        output_dir: out.to_path_buf(),
        with_secrets: None,
        talos_port: 50000,
        kube_api_timeout: std::time::Duration::from_secs(60),
        webhook_timeout: std::time::Duration::from_secs(15),
        poll_interval: std::time::Duration::from_secs(1),
        helm: ichor_helm::render::Renderer::new(Tool::Helm3.path()),
        cilium_chart: ichor_helm::render::ChartRef::path(lab.options.cilium_chart.path()),
        version: "v0.1.0".into(),
        controller_image: None,
    };
    // A rerun's inspection: every node now answers the cluster's credentials.
    let (_, writes, _) = ichor_adopt_run::init::plan(&opts).await.unwrap();
    let tc = ichor_talos::talosconfig::Talosconfig::from_file(&out.join("talosconfig")).unwrap();
    let (name, ctx) = tc.context(None, "talosconfig").unwrap();
    let creds = ctx.credentials(name, "talosconfig").unwrap();
    let identity = ichor_talos_client::ClientIdentity::from_pem(
        creds.ca_pem.clone().unwrap(),
        creds.crt_pem.clone().unwrap(),
        creds.key_pem_pkcs8().unwrap(),
    );
    for machine in &writes.machines {
        let address = &machine.spec.address;
        let client = ichor_talos_client::TalosClient::new(
            &format!("{address}:50000"),
            &identity,
            ichor_talos_client::ClientOptions::default(),
        )
        .unwrap();
        let live = client.machine_config("").await.unwrap();
        let live = ichor_talos::config::MachineConfig::parse_live(
            &String::from_utf8(live).unwrap(),
            address,
        )
        .unwrap();
        let desired = ichor_render::render(&ichor_render::RenderInput::from_objects(
            &writes.cluster,
            machine,
            &live,
        ))
        .unwrap();
        let drift = ichor_render::compare(&live, &desired.config).unwrap();
        assert!(drift.entries.is_empty(), "{address}: {:?}", drift.entries);
    }
}

/// Init on fresh nodes in both config shapes: up to Ichor installed in the
/// cluster, each node written once, no drift for the controller.
#[tokio::test(flavor = "multi_thread")]
async fn init_on_the_lab_in_both_shapes() {
    for version in ["v1.13.9", "v1.14.0"] {
        let (lab, dir) = lab(version).await;
        let out = dir.path().join("out");
        let (_, text) = run_to_end(&mut init_command(&lab, &out));
        assert!(
            text.contains("the Kubernetes API answers at"),
            "{version}: {text}"
        );
        assert!(text.contains("installing Ichor"), "{version}: {text}");
        assert_initialized(&lab, &out, &text).await;
        assert_no_drift(&lab, &out).await;
        let config = lab.emulator.active_config(0).unwrap();
        let config = String::from_utf8(config).unwrap();
        if version == "v1.14.0" {
            assert!(
                config.contains("kind: KubeInlineManifestConfig"),
                "{config}"
            );
        } else {
            assert!(config.contains("inlineManifests:"), "{config}");
        }
    }
}

/// SIGKILL at every phase boundary, then a rerun: the rerun finishes what
/// was left and applies nothing twice to a node (the emulator's write log:
/// one ApplyConfiguration per node, one Bootstrap).
#[tokio::test(flavor = "multi_thread")]
async fn killed_at_each_phase_boundary_a_rerun_finishes_and_writes_nothing_twice() {
    let (lab, dir) = lab("v1.13.9").await;
    let out: PathBuf = dir.path().join("out");
    let cp = lab.control_planes()[0].clone();
    let workers = lab.workers();
    let boundaries = [
        "wrote secrets.yaml, talosconfig (0600)".to_string(),
        format!("applied the config of {cp}"),
        format!("applied the config of {}", workers[0]),
        format!("applied the config of {}", workers[1]),
        "bootstrapped etcd on".to_string(),
        "kubeconfig (0600)".to_string(),
        "the Kubernetes API answers at".to_string(),
        "installing Ichor".to_string(),
    ];
    for line in &boundaries {
        killed_after(&mut init_command(&lab, &out), line);
    }
    let (_, text) = run_to_end(&mut init_command(&lab, &out));
    assert!(text.contains("already has its config"), "{text}");
    assert!(text.contains("etcd was already bootstrapped"), "{text}");
    assert_initialized(&lab, &out, &text).await;
}
