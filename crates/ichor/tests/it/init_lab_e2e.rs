//! `ichor init` on the lab, end to end: fresh nodes in maintenance mode (1
//! control plane, 2 workers) in both config shapes. The real `ichor` binary
//! applies each config over the insecure API, bootstraps etcd, and fetches
//! the kubeconfig through the Talos API; the lab then runs the real
//! kube-apiserver and etcd with the cluster's own CAs (taken from the
//! bootstrapped node's config), so that kubeconfig reaches the cluster as on
//! real hardware, and plays Talos's bootstrap-manifest apply of the control
//! plane's inline manifests (`ichor_lab::bootstrap_manifests`): the inline
//! Cilium comes up, with it the pod network, and Ichor runs as the
//! Deployment init installed. Init writes the bundle Secret, the TalosCluster
//! and the TalosMachines; the controller then takes the inline Cilium over
//! (R6.1): the inline entry leaves every control plane's config (its one
//! class-B apply) and Talos's inventory, and only then `CNIHandover=True`.
//!
//! Covers: R10.2, R10.3, R10.4, R6.1, and the lab's side of `ichor init`

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor_api::conditions::{self, types};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_lab::init::{InitLab, InitLabOptions};
use ichor_talemu::WriteAction;
use ichor_talos::bootstrap_inventory::{
    INVENTORY_NAME, INVENTORY_NAMESPACE, OWNING_INVENTORY_ANNOTATION,
};
use ichor_talos::config::MachineConfig;
use ichor_testenv::Tool;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, ListParams};

/// How long the lab may take to bring the cluster from init's end to the
/// hand-over (pods started as processes on a shared machine); a bound on a
/// wait, not a figure asserted.
const HANDOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

fn init_command(lab: &InitLab, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
    cmd.arg("init")
        .arg("lab")
        .args(["--endpoint", &lab.endpoint])
        .args(["--control-plane", &lab.control_planes().join(",")])
        .args(["--worker", &lab.workers().join(",")])
        .arg("--output-dir")
        .arg(out)
        .args(["--yes", "--wait-timeout", "5m"])
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
    options.bootstrap_manifests = Some(ichor_lab::init::talos_bootstrap_manifests());
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

/// The client of the kubeconfig init fetched through the Talos API.
async fn client_of(lab: &InitLab, out: &Path) -> kube::Client {
    let kubeconfig = std::fs::read_to_string(out.join("kubeconfig")).unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        config.cluster_url.to_string().trim_end_matches('/'),
        lab.endpoint
    );
    kube::Client::try_from(config).unwrap()
}

/// Each node's writes by init alone: the first config applied to each
/// node (a later one is the controller's), and the bootstraps.
fn init_applies_and_bootstraps(lab: &InitLab) -> (Vec<usize>, usize) {
    let (applies, bootstraps) = applies_and_bootstraps(lab);
    let control_planes = lab.options.control_planes;
    let init_applies = applies
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let host = &lab.hostnames[i];
            // The controller's apply removes the inline entry: it is not init's.
            let by_controller = if i < control_planes {
                applied_configs(lab, host)
                    .iter()
                    .filter(|c| !has_inline_cni(c))
                    .count()
            } else {
                0
            };
            n - by_controller
        })
        .collect();
    (init_applies, bootstraps)
}

/// What a finished run leaves: the files 0600, one config per node from
/// init, one bootstrap, the kubeconfig served through the Talos API
/// reaching the cluster's API server (its CA is the cluster's), Ichor
/// installed there, the objects phase done: the bundle Secret, the
/// TalosCluster and one TalosMachine per node, none held.
async fn assert_initialized(lab: &InitLab, out: &Path, text: &str) {
    for f in ["secrets.yaml", "talosconfig", "kubeconfig"] {
        assert_eq!(mode(&out.join(f)), 0o600, "{f}");
    }
    assert_eq!(
        init_applies_and_bootstraps(lab),
        (vec![1, 1, 1], 1),
        "{text}"
    );
    let client = client_of(lab, out).await;
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
    let installations =
        Api::<ichor_api::IchorInstallation>::namespaced(client.clone(), "ichor-system")
            .list(&ListParams::default())
            .await
            .unwrap();
    assert_eq!(installations.items.len(), 1, "{text}");
    assert!(
        text.contains("bootstrapped etcd on") || text.contains("etcd was already bootstrapped"),
        "{text}"
    );
    assert!(
        text.contains("Ichor is running: the API server calls its webhooks"),
        "{text}"
    );
    assert!(
        text.contains("created the bundle Secret, TalosCluster lab and 3 TalosMachines"),
        "{text}"
    );
    assert!(
        Api::<Secret>::namespaced(client.clone(), "ichor-system")
            .get_opt("lab-talos-secrets")
            .await
            .unwrap()
            .is_some(),
        "the bundle Secret"
    );
    assert!(
        Api::<TalosCluster>::namespaced(client.clone(), "ichor-system")
            .get_opt("lab")
            .await
            .unwrap()
            .is_some()
    );
    let machines = Api::<TalosMachine>::namespaced(client, "ichor-system")
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut addresses: Vec<String> = machines
        .items
        .iter()
        .map(|m| m.spec.address.clone())
        .collect();
    addresses.sort();
    let mut expected: Vec<String> = lab.addresses.iter().map(ToString::to_string).collect();
    expected.sort();
    assert_eq!(addresses, expected);
    for m in &machines.items {
        assert!(!m.spec.hold, "{:?} is held", m.metadata.name);
    }
}

/// Polls `check` until it gives `Some`, bounded by [`HANDOVER_WAIT`];
/// `state` says what was seen when the bound is reached.
async fn wait_until<T, F, Fut, S, SFut>(what: &str, mut check: F, state: S) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
    S: FnOnce() -> SFut,
    SFut: std::future::Future<Output = String>,
{
    let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not after {HANDOVER_WAIT:?}; {}", state().await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// After init: the nodes Ready, Ichor running as the Deployment init
/// installed, and the controller's hand-over of the inline Cilium (R6.1):
/// `CNIHandover=True`, the inline entry gone from every control plane's
/// config (the controller's one class-B apply per control plane, the only
/// write after init's), Talos's inventory naming none of Cilium's objects
/// and their owning-inventory annotation stripped, so the real prune of
/// `talosctl upgrade-k8s` (go-kubernetes's) leaves Cilium; and the
/// controller's render over every node's config as it runs now finds no
/// drift.
async fn assert_handed_over(lab: &InitLab, out: &Path) {
    let client = client_of(lab, out).await;
    let nodes = Api::<Node>::all(client.clone());
    wait_until(
        "every node Ready",
        || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .all(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .then_some(())
        },
        || async { format!("{:?}", nodes.list(&ListParams::default()).await) },
    )
    .await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), "ichor-system");
    let pods = Api::<Pod>::namespaced(client.clone(), "ichor-system");
    wait_until(
        "Ichor's controller running as its Deployment's pod",
        || async {
            let d = deployments.get("ichor-controller").await.ok()?;
            let ready = d.status?.ready_replicas.unwrap_or(0);
            let running = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=ichor-controller"))
                .await
                .ok()?
                .items
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
            (ready >= 1 && running).then_some(())
        },
        || async { format!("{:?}", deployments.get("ichor-controller").await) },
    )
    .await;

    let clusters = Api::<TalosCluster>::namespaced(client.clone(), "ichor-system");
    let machines = Api::<TalosMachine>::namespaced(client.clone(), "ichor-system");
    let cluster = wait_until(
        "CNIHandover=True on TalosCluster lab",
        || async {
            let c = clusters.get("lab").await.ok()?;
            c.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, types::CNI_HANDOVER))
                .then_some(c)
        },
        || async {
            format!(
                "cluster {:#?}\nmachines {:#?}",
                clusters.get("lab").await.map(|c| c.status),
                machines.list(&ListParams::default()).await.map(|l| l
                    .items
                    .into_iter()
                    .map(|m| m.status)
                    .collect::<Vec<_>>())
            )
        },
    )
    .await;

    // The inline entry is gone from every control plane's config; the
    // workers never carried it.
    for (i, host) in lab.hostnames.iter().enumerate() {
        let live = String::from_utf8(lab.emulator.active_config(i).unwrap()).unwrap();
        let names: Vec<String> = MachineConfig::parse(&live)
            .unwrap()
            .facts()
            .inline_manifests
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert!(
            !names.iter().any(|n| n == ichor_render::INLINE_CNI_NAME),
            "{host}: {names:?}"
        );
    }
    // Nothing written after init but the controller's apply that removes
    // the entry, once on each control plane.
    let (applies, bootstraps) = applies_and_bootstraps(lab);
    let control_planes = lab.options.control_planes;
    let expected: Vec<usize> = (0..lab.hostnames.len())
        .map(|i| if i < control_planes { 2 } else { 1 })
        .collect();
    assert_eq!(
        (applies, bootstraps),
        (expected, 1),
        "{:?}",
        lab.emulator.writes()
    );
    for host in &lab.hostnames[..control_planes] {
        let configs = applied_configs(lab, host);
        assert!(
            has_inline_cni(&configs[0]) && !has_inline_cni(&configs[1]),
            "{host}: init's config carries the inline Cilium, the controller's does not"
        );
    }

    // Talos's inventory names none of the taken-over objects (the lab plays
    // only the inline manifests, so nothing is left in it), and the
    // owning-inventory annotation is gone.
    let inventory = Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
        .get_opt(INVENTORY_NAME)
        .await
        .unwrap();
    let left: Vec<String> = inventory
        .and_then(|cm| cm.data)
        .unwrap_or_default()
        .into_keys()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let cilium = Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
        .get("cilium")
        .await
        .unwrap();
    let annotations = cilium.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(OWNING_INVENTORY_ANNOTATION),
        "{annotations:?}"
    );
    // Cilium is Ichor's Helm release now: `cilium` in kube-system owns the
    // DaemonSet, and its record lives in ichor-system.
    assert_eq!(
        annotations
            .get("meta.helm.sh/release-name")
            .map(String::as_str),
        Some("cilium"),
        "{annotations:?}"
    );
    assert_eq!(
        annotations
            .get("meta.helm.sh/release-namespace")
            .map(String::as_str),
        Some("kube-system"),
        "{annotations:?}"
    );
    let records = Api::<Secret>::namespaced(client.clone(), "ichor-system")
        .list(&ListParams::default().labels("owner=helm,name=cilium"))
        .await
        .unwrap();
    assert!(
        !records.items.is_empty(),
        "no Helm record of cilium in ichor-system"
    );

    // `talosctl upgrade-k8s`'s manifests step (go-kubernetes's real prune)
    // with the control plane's manifests as they are now leaves Cilium.
    let live = String::from_utf8(lab.emulator.active_config(0).unwrap()).unwrap();
    let plan = ichor_lab::bootstrap_manifests::plan(&MachineConfig::parse(&live).unwrap()).unwrap();
    let manifests = out.join("bootstrap-manifests.yaml");
    std::fs::write(
        &manifests,
        ichor_lab::bootstrap_manifests::manifest_documents(&plan),
    )
    .unwrap();
    let pruned = tokio::task::block_in_place(|| {
        Command::new(Tool::SsaPrunePeer.path())
            .arg("--kubeconfig")
            .arg(out.join("kubeconfig"))
            .arg(&manifests)
            .output()
            .unwrap()
    });
    let said = String::from_utf8_lossy(&pruned.stdout).to_string()
        + &String::from_utf8_lossy(&pruned.stderr);
    assert!(pruned.status.success(), "{said}");
    assert!(!said.contains("deleted"), "{said}");
    assert!(
        Api::<DaemonSet>::namespaced(client.clone(), "kube-system")
            .get_opt("cilium")
            .await
            .unwrap()
            .is_some_and(|d| d.metadata.deletion_timestamp.is_none()),
        "{said}"
    );

    // The controller's render over each node's config as it runs now (read
    // through the Talos API with the cluster's talosconfig) finds no drift.
    let identity = cluster_identity(out);
    for machine in machines.list(&ListParams::default()).await.unwrap().items {
        let address = machine.spec.address.clone();
        let live = live_config(&identity, &address).await;
        let desired = ichor_render::render(&ichor_render::RenderInput::from_objects(
            &cluster, &machine, &live,
        ))
        .unwrap();
        let drift = ichor_render::compare(&live, &desired.config).unwrap();
        assert!(drift.entries.is_empty(), "{address}: {:?}", drift.entries);
    }
}

/// The configs applied to `host`, in order (the emulator's write log).
fn applied_configs(lab: &InitLab, host: &str) -> Vec<String> {
    lab.emulator
        .writes()
        .into_iter()
        .filter(|w| w.node == host)
        .filter_map(|w| match w.action {
            WriteAction::ApplyConfiguration { config, .. } => {
                Some(String::from_utf8(config).unwrap())
            }
            _ => None,
        })
        .collect()
}

fn has_inline_cni(config: &str) -> bool {
    MachineConfig::parse(config)
        .unwrap()
        .facts()
        .inline_manifests
        .iter()
        .any(|m| m.name == ichor_render::INLINE_CNI_NAME)
}

/// The cluster's talosconfig identity, as init wrote it.
fn cluster_identity(out: &Path) -> ichor_talos_client::ClientIdentity {
    let tc = ichor_talos::talosconfig::Talosconfig::from_file(&out.join("talosconfig")).unwrap();
    let (name, ctx) = tc.context(None, "talosconfig").unwrap();
    let creds = ctx.credentials(name, "talosconfig").unwrap();
    ichor_talos_client::ClientIdentity::from_pem(
        creds.ca_pem.clone().unwrap(),
        creds.crt_pem.clone().unwrap(),
        creds.key_pem_pkcs8().unwrap(),
    )
}

/// A node's config as it runs, read through the Talos API.
async fn live_config(
    identity: &ichor_talos_client::ClientIdentity,
    address: &str,
) -> MachineConfig {
    let client = ichor_talos_client::TalosClient::new(
        &format!("{address}:50000"),
        identity,
        ichor_talos_client::ClientOptions::default(),
    )
    .unwrap();
    let live = client.machine_config("").await.unwrap();
    MachineConfig::parse_live(&String::from_utf8(live).unwrap(), address).unwrap()
}

/// The controller's first reconcile: for every TalosMachine init writes, the
/// controller's render over the config init applied to the node (what it
/// ran when the controller first looked, before the hand-over; the
/// emulator's write log) finds no drift.
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
        cert_fingerprints: Vec::new(),
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
    for machine in &writes.machines {
        let address = &machine.spec.address;
        let i = lab
            .addresses
            .iter()
            .position(|a| &a.to_string() == address)
            .unwrap();
        let applied = applied_configs(lab, &lab.hostnames[i]);
        let first = MachineConfig::parse_live(&applied[0], address).unwrap();
        let desired = ichor_render::render(&ichor_render::RenderInput::from_objects(
            &writes.cluster,
            machine,
            &first,
        ))
        .unwrap();
        let drift = ichor_render::compare(&first, &desired.config).unwrap();
        assert!(drift.entries.is_empty(), "{address}: {:?}", drift.entries);
    }
}

/// Init on fresh nodes in both config shapes, end to end: the nodes Ready,
/// Ichor running as its Deployment, the objects written, no drift for the
/// controller's first reconcile, then the hand-over: `CNIHandover=True`, the
/// inline entry gone (it was there in init's config, in the shape's form),
/// Talos's inventory clean.
///
/// Covers: R10.2, R10.3, R10.4, R6.1
#[tokio::test(flavor = "multi_thread")]
async fn init_on_the_lab_in_both_shapes() {
    for version in ["v1.13.9", "v1.14.0"] {
        let (lab, dir) = lab(version).await;
        let out = dir.path().join("out");
        let (ok, text) = run_to_end(&mut init_command(&lab, &out));
        assert!(ok, "{version}: {text}");
        assert!(
            text.contains("the Kubernetes API answers at"),
            "{version}: {text}"
        );
        assert!(text.contains("installing Ichor"), "{version}: {text}");
        assert_initialized(&lab, &out, &text).await;
        assert_no_drift(&lab, &out).await;
        let init_config = applied_configs(&lab, &lab.hostnames[0]).remove(0);
        if version == "v1.14.0" {
            assert!(
                init_config.contains("kind: KubeInlineManifestConfig"),
                "{init_config}"
            );
        } else {
            assert!(init_config.contains("inlineManifests:"), "{init_config}");
        }
        assert_handed_over(&lab, &out).await;
    }
}

/// SIGKILL at every phase boundary, then a rerun: the rerun finishes what
/// was left and applies nothing twice to a node (the emulator's write log:
/// one ApplyConfiguration per node from init, one Bootstrap); the only
/// other write is the controller's class-B apply that removes the inline
/// entry from the control plane at the hand-over, which then completes.
///
/// Covers: R10.3, R6.1
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
        "Ichor is running: the API server calls its webhooks".to_string(),
    ];
    for line in &boundaries {
        killed_after(&mut init_command(&lab, &out), line);
    }
    let (ok, text) = run_to_end(&mut init_command(&lab, &out));
    assert!(ok, "{text}");
    assert!(text.contains("already has its config"), "{text}");
    assert!(text.contains("etcd was already bootstrapped"), "{text}");
    assert_initialized(&lab, &out, &text).await;
    assert_handed_over(&lab, &out).await;
}
