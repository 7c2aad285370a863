//! `ichor-lab`: the local lab. `demo` is the README's main job: it starts the
//! lab, runs the real `ichor adopt` end to end against it, and shows the
//! result; `demo --init` starts fresh nodes in maintenance mode instead and
//! runs the real `ichor init` against them.

// This binary speaks to the person who runs it on stdout/stderr; it has
// no printer module of its own (the print lint forbids printing in libraries).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use ichor_lab::{Lab, LabOptions, LabShape, NodeRole};

/// The local lab: a real kube-apiserver and etcd, emulated Talos nodes, and a
/// node simulator standing in for the kubelets.
#[derive(Parser)]
#[command(name = "ichor-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the lab, adopt it with the real `ichor adopt`, show the result, stop.
    /// With --init: fresh nodes in maintenance mode, created with the real `ichor init`.
    Demo {
        /// Run `ichor init` on fresh nodes (1 control plane, the rest workers)
        /// instead of adopting a running cluster.
        #[arg(long)]
        init: bool,
        /// Emulated Talos nodes (the first is the control plane).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Where the lab writes its kubeconfig, talosconfig and bundle.
        #[arg(long, default_value = "target/lab")]
        state_dir: PathBuf,
        /// The nodes' machine-config shape: v1alpha1 (Talos v1.12/v1.13) or
        /// multidoc (Talos v1.14).
        #[arg(long, default_value = "v1alpha1")]
        shape: LabShape,
    },
    /// Adopt wall time on labs of several sizes, split into phases (a benchmark:
    /// it prints figures and judges nothing).
    Bench {
        /// Node counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "3,10,50")]
        nodes: Vec<usize>,
        #[arg(long, default_value = "target/lab-bench")]
        state_dir: PathBuf,
    },
    /// Start the lab and keep it running until Ctrl-C or `ichor-lab down`;
    /// prints how to reach it (run it in the background with `&`).
    Up {
        /// Emulated Talos nodes in all, control planes first (their hostnames
        /// lab-cp-1…, then lab-worker-1…).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// How many of --nodes are control planes. Each runs Talos's
        /// control-plane config and is an etcd member that every control
        /// plane's Talos API lists (talosctl etcd members), so an upgrade
        /// goes through them one at a time as on a real cluster; the lab's
        /// one kube-apiserver stands in for theirs. The lab also shows each
        /// control plane's kube-apiserver, kube-controller-manager and
        /// kube-scheduler as mirror pods with the images its Talos API
        /// reports. Example: --control-planes 3 --nodes 5.
        #[arg(long, default_value_t = 1, value_name = "N")]
        control_planes: usize,
        #[arg(long, default_value = "target/lab")]
        state_dir: PathBuf,
        /// The nodes' machine-config shape: v1alpha1 (Talos v1.12/v1.13) or
        /// multidoc (Talos v1.14).
        #[arg(long, default_value = "v1alpha1")]
        shape: LabShape,
        /// The Talos version the nodes report (default: the shape's).
        /// Example: --talos-version v1.14.0.
        #[arg(long, value_name = "VERSION")]
        talos_version: Option<String>,
        /// The Kubernetes version of the nodes' configs and kubelets
        /// (default: the lab's kube-apiserver's). A kubernetes-upgrade needs
        /// a target the nodes' Talos runs: Talos v1.14 runs 1.32–1.37, so
        /// --talos-version v1.14.0 --kubernetes-version v1.36.4 allows an
        /// upgrade to 1.37.
        #[arg(long, value_name = "VERSION")]
        kubernetes_version: Option<String>,
    },
    /// Stop a lab started by `ichor-lab up`, and everything it started.
    Down {
        #[arg(long, default_value = "target/lab")]
        state_dir: PathBuf,
    },
    /// The running lab's nodes.
    Node {
        #[command(subcommand)]
        command: NodeCmd,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Start one more emulated node, in maintenance mode (no config, the
    /// insecure Talos API), in the lab `ichor-lab up` runs; prints its
    /// address. Its Node registers once a config is applied to it.
    /// Example: ichor-lab node add --role controlplane
    Add {
        /// The Talos the node runs, as this shape's version: v1alpha1
        /// (Talos v1.13) or multidoc (v1.14); default: the lab's.
        #[arg(long)]
        shape: Option<LabShape>,
        /// What the node is meant for: it names it (lab-cp-N or
        /// lab-worker-N); the config applied to it decides what it runs.
        #[arg(long, default_value = "worker")]
        role: NodeRole,
        #[arg(long, default_value = "target/lab")]
        state_dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter("warn,kube_client::client::builder=off")
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        match cli.command {
            Cmd::Up {
                nodes,
                control_planes,
                state_dir,
                shape,
                talos_version,
                kubernetes_version,
            } => {
                let lab = start_with(nodes, state_dir, shape, |o| {
                    o.control_planes = control_planes;
                    o.components = true;
                    if let Some(v) = talos_version {
                        o.talos_version = v;
                    }
                    if let Some(v) = kubernetes_version {
                        o.kubernetes_version = v;
                    }
                })
                .await?;
                serve(lab).await
            }
            Cmd::Down { state_dir } => down(&state_dir).await,
            Cmd::Node {
                command:
                    NodeCmd::Add {
                        shape,
                        role,
                        state_dir,
                    },
            } => {
                let node = ichor_lab::control::node_add(&state_dir, role, shape).await?;
                eprintln!(
                    "lab: {} ({}, Talos {}) runs in maintenance mode; give it a config with: talosctl apply-config --insecure -n {} -f CONFIG",
                    node.hostname, node.endpoint, node.talos_version, node.address
                );
                println!("{}", node.address);
                Ok(())
            }
            Cmd::Demo {
                init: true,
                nodes,
                state_dir,
                shape,
            } => demo_init(nodes, state_dir, shape).await,
            Cmd::Demo {
                init: false,
                nodes,
                state_dir,
                shape,
            } => demo(nodes, state_dir, shape).await,
            Cmd::Bench { nodes, state_dir } => {
                println!("nodes\tlab-up\tadopt-total\tphases (from ichor adopt)");
                for n in nodes {
                    let started = std::time::Instant::now();
                    let lab = start(n, state_dir.join(format!("n{n}")), LabShape::V1alpha1).await?;
                    let up = started.elapsed();
                    let (total, phases) = adopt(&lab, false).await?;
                    println!(
                        "{n}\t{:.1}s\t{:.1}s\t{phases}",
                        up.as_secs_f64(),
                        total.as_secs_f64()
                    );
                }
                Ok(())
            }
        }
    })
}

/// Runs the lab until Ctrl-C or SIGTERM, answering its control socket
/// (`ichor-lab node add`) meanwhile.
async fn serve(mut lab: Lab) -> anyhow::Result<()> {
    let pid_file = lab.state_dir().join("lab.pid");
    std::fs::write(&pid_file, std::process::id().to_string())?;
    let control = ichor_lab::control::bind(lab.state_dir())?;
    println!("{}", lab.env_lines());
    eprintln!(
        "lab: running; add a node with ichor-lab node add; stop it with Ctrl-C or ichor-lab down (everything it started stops with it)"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => { r?; break; }
            _ = term.recv() => break,
            accepted = control.accept() => {
                if let Ok((stream, _)) = accepted {
                    ichor_lab::control::answer(&mut lab, stream).await;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(ichor_lab::control::socket_path(lab.state_dir()));
    drop(lab);
    eprintln!("lab: stopped");
    Ok(())
}

/// Sends the running `up` SIGTERM and waits (bounded) until it is gone.
async fn down(state_dir: &std::path::Path) -> anyhow::Result<()> {
    let pid_file = state_dir.join("lab.pid");
    let pid = match std::fs::read_to_string(&pid_file) {
        Ok(p) => p.trim().to_string(),
        Err(_) => {
            eprintln!(
                "lab: no lab is running from {} (no lab.pid)",
                state_dir.display()
            );
            return Ok(());
        }
    };
    let alive = |pid: &str| std::path::Path::new("/proc").join(pid).exists();
    if !alive(&pid) {
        let _ = std::fs::remove_file(&pid_file);
        eprintln!(
            "lab: the lab of {} had already stopped",
            state_dir.display()
        );
        return Ok(());
    }
    let status = Command::new("kill").args(["-TERM", &pid]).status()?;
    if !status.success() {
        bail!("cannot signal the lab (pid {pid}); stop it with Ctrl-C where it runs");
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while alive(&pid) {
        if tokio::time::Instant::now() >= deadline {
            bail!("the lab (pid {pid}) did not stop within 30s; kill it with kill -9 {pid}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    eprintln!("lab: stopped the lab of {}", state_dir.display());
    Ok(())
}

async fn start(nodes: usize, state_dir: PathBuf, shape: LabShape) -> anyhow::Result<Lab> {
    start_with(nodes, state_dir, shape, |_| {}).await
}

async fn start_with(
    nodes: usize,
    state_dir: PathBuf,
    shape: LabShape,
    shape_options: impl FnOnce(&mut LabOptions),
) -> anyhow::Result<Lab> {
    eprintln!(
        "lab: starting a real kube-apiserver and etcd, {nodes} emulated Talos nodes with no CNI, and the node simulator"
    );
    eprintln!(
        "lab: the kubelets, the scheduler and Cilium's operator are SIMULATED: no container runs here"
    );
    let mut options =
        LabOptions::new(std::fs::canonicalize(".")?.join(state_dir)).with_shape(shape);
    options.nodes = nodes;
    shape_options(&mut options);
    if options.control_planes > 1 {
        eprintln!(
            "lab: {} of the nodes are control planes (etcd members of one cluster); one kube-apiserver stands in for theirs",
            options.control_planes
        );
    }
    // The lab runs the Ichor that `ichor adopt` installs (its controller
    // Deployment's pod, its ichor-cni Jobs) as this `ichor` binary.
    let bin = std::env::current_exe()?.with_file_name("ichor");
    if bin.is_file() {
        options.ichor_bin = Some(bin);
    } else {
        eprintln!(
            "lab: {} is missing, so the Ichor that adopt installs will not run here: build it first (cargo build -p ichor)",
            bin.display()
        );
    }
    eprintln!(
        "lab: nodes shaped as Talos {} configs ({shape:?}), Kubernetes {}; Ichor installs {}",
        options.talos_version,
        options.kubernetes_version,
        options.cilium_chart.describe()
    );
    let lab = Lab::up(options).await.context("starting the lab")?;
    eprintln!(
        "lab: nodes {} at {}",
        lab.hostnames.join(", "),
        lab.addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(lab)
}

async fn demo(nodes: usize, state_dir: PathBuf, shape: LabShape) -> anyhow::Result<()> {
    let lab = start(nodes, state_dir, shape).await?;
    adopt(&lab, true).await?;
    Ok(())
}

/// `ichor init` end to end on fresh nodes: the lab starts the cluster's
/// API server with its own CAs when init bootstraps etcd.
async fn demo_init(nodes: usize, state_dir: PathBuf, shape: LabShape) -> anyhow::Result<()> {
    let bin = std::env::current_exe()?.with_file_name("ichor");
    if !bin.is_file() {
        bail!(
            "{} is missing: build it first (cargo build -p ichor)",
            bin.display()
        );
    }
    let state_dir = std::fs::canonicalize(".")?.join(state_dir);
    let mut options = ichor_lab::init::InitLabOptions::new(state_dir.join("lab"));
    options.control_planes = 1;
    options.workers = nodes.saturating_sub(1);
    options.talos_version = shape.talos_version();
    options.ichor_bin = Some(bin.clone());
    options.bootstrap_manifests = Some(ichor_lab::init::talos_bootstrap_manifests());
    eprintln!(
        "lab: starting {nodes} emulated Talos {} nodes in maintenance mode; the cluster's kube-apiserver and etcd start when ichor init bootstraps etcd",
        options.talos_version
    );
    eprintln!(
        "lab: the kubelets, the scheduler and Cilium's operator are SIMULATED: no container runs here"
    );
    let lab = ichor_lab::init::InitLab::up(options)
        .await
        .context("starting the init lab")?;
    let out = state_dir.join("init");
    let mut args: Vec<String> = vec![
        "init".into(),
        "lab".into(),
        "--endpoint".into(),
        lab.endpoint.clone(),
        "--control-plane".into(),
        lab.control_planes().join(","),
    ];
    if !lab.workers().is_empty() {
        args.extend(["--worker".into(), lab.workers().join(",")]);
    }
    args.extend([
        "--output-dir".into(),
        out.display().to_string(),
        "--yes".into(),
    ]);
    eprintln!("lab: running ichor {}", args.join(" "));
    let status = Command::new(&bin)
        .args(&args)
        .arg("--helm")
        .arg(ichor_testenv::Tool::Helm4.path())
        .arg("--cilium-chart")
        .arg(lab.options.cilium_chart.path())
        .status()
        .context("running ichor init")?;
    if let Some(why) = lab.failure() {
        bail!("the lab could not start the cluster's control plane: {why}");
    }
    if !status.success() {
        bail!(
            "ichor init stopped on the lab (exit {status}); its files are in {}",
            out.display()
        );
    }
    let kubeconfig = out.join("kubeconfig");
    wait_handed_over(&kubeconfig).await?;
    eprintln!("lab: ichor cluster status");
    let status = Command::new(&bin)
        .args(["cluster", "status", "--kubeconfig"])
        .arg(&kubeconfig)
        .status()
        .context("running ichor cluster status")?;
    if !status.success() {
        bail!("ichor cluster status failed on the lab (exit {status})");
    }
    eprintln!("lab: done; stopping everything the lab started");
    Ok(())
}

/// Waits (bounded) for the controller's hand-over of the inline Cilium after
/// init: `CNIHandover=True` on the TalosCluster.
async fn wait_handed_over(kubeconfig: &std::path::Path) -> anyhow::Result<()> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let clusters: kube::Api<ichor_api::TalosCluster> =
        kube::Api::namespaced(kube::Client::try_from(config)?, ichor_api::SYSTEM_NAMESPACE);
    eprintln!("lab: waiting for the controller's hand-over of the inline Cilium (CNIHandover)");
    let bound = std::time::Duration::from_secs(600);
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if let Ok(c) = clusters.get("lab").await
            && c.status.as_ref().is_some_and(|s| {
                ichor_api::conditions::is_true(
                    &s.conditions,
                    ichor_api::conditions::types::CNI_HANDOVER,
                )
            })
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("the controller did not finish the hand-over within {bound:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Runs `ichor adopt` against the lab (the lab runs the controller adopt
/// installs); returns adopt's wall
/// time and its phase summary. With `show`, also prints `ichor cluster status`.
async fn adopt(lab: &Lab, show: bool) -> anyhow::Result<(std::time::Duration, String)> {
    let bin = std::env::current_exe()?.with_file_name("ichor");
    if !bin.is_file() {
        bail!(
            "{} is missing: build it first (cargo build -p ichor)",
            bin.display()
        );
    }
    let helm = ichor_testenv::Tool::Helm4.path();
    let chart = lab.options.cilium_chart.path().to_path_buf();
    eprintln!(
        "lab: running ichor adopt (the real binary, the real helm, {})",
        lab.options.cilium_chart.describe()
    );
    let started = std::time::Instant::now();
    let output = Command::new(&bin)
        .args(["adopt", "--cluster", "lab", "--yes"])
        .arg("--talosconfig")
        .arg(&lab.talosconfig)
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .arg("--secrets-bundle")
        .arg(&lab.bundle)
        .arg("--helm")
        .arg(&helm)
        .arg("--cilium-chart")
        .arg(&chart)
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::piped())
        .output()
        .context("running ichor adopt")?;
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&output.stderr);
    eprint!("{said}");
    let status = output.status;
    if !status.success() {
        bail!(
            "ichor adopt failed on the lab (exit {status}); the logs of Ichor's pods are in {}",
            lab.state_dir().display()
        );
    }
    let phases = said
        .lines()
        .find_map(|l| {
            l.strip_prefix("adopted cluster lab (")?
                .strip_suffix(')')
                .map(str::to_string)
        })
        .unwrap_or_default();
    if !show {
        return Ok((took, phases));
    }
    wait_machines_reported(lab).await;
    eprintln!("lab: ichor cluster status");
    let status = Command::new(&bin)
        .args(["cluster", "status", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .status()
        .context("running ichor cluster status")?;
    if !status.success() {
        bail!("ichor cluster status failed on the lab (exit {status})");
    }
    eprintln!("lab: done; stopping everything the lab started");
    Ok((took, phases))
}

/// Gives the controller a bounded moment to report on each released machine.
async fn wait_machines_reported(lab: &Lab) {
    let machines: kube::Api<ichor_api::TalosMachine> =
        kube::Api::namespaced(lab.client().await, ichor_api::SYSTEM_NAMESPACE);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if let Ok(list) = machines.list(&Default::default()).await {
            let reported = list.items.iter().all(|m| {
                m.status
                    .as_ref()
                    .is_some_and(|s| !s.conditions.is_empty() && s.config_hash.is_some())
            });
            if reported && !list.items.is_empty() {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    eprintln!("lab: the controller has not reported on every machine within 60s");
}
