//! Bench: 100 maintenance-mode worker nodes added to one cluster at once,
//! timed until every one is joined and its Node Ready.
//!
//! The lab of the membership tests (3 control planes, 2 workers, a real
//! kube-apiserver and etcd, emulated Talos nodes) with Ichor installed by
//! the real `ichor adopt`: the controller the lab runs as Ichor's pod (this
//! profile's `ichor` binary) does the joins. Then 100 more nodes boot in
//! maintenance mode in the running lab (`Lab::add_node`, untimed: the
//! machines are racked), and the clock starts with what a user types:
//!
//! ```text
//! ichor machine add ADDRESS×100 --cluster lab --role worker --yes --wait
//! ```
//!
//! It reads every node, creates the 100 TalosMachines and follows them.
//! Beside it the bench lists the TalosMachines and Nodes every 200 ms and
//! notes, per machine, when it first saw the TalosMachine, its config
//! applied (step `Boot`), its Node registered, Member, and Member with its
//! Node Ready; the clock stops when all 100 are Member with a Ready Node.
//! Also: the controller's CPU seconds over the run (`/proc/<pid>/stat`) and
//! its peak RSS (`VmHWM`), and the 1-minute load average.
//!
//! A whole-system measurement of tens of seconds, so a plain `harness =
//! false` binary that prints its figures (and leaves them in
//! `target/bench-figures/join_100.json`); nothing is asserted about time.
//!
//! Run: `cargo bench -p ichor --bench join_100` (`ICHOR_BENCH_JOIN_NODES`
//! changes the 100).
//!
//! Covers: R14.25

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ichor_api::{MembershipPhase, TalosMachine};
use ichor_lab::{Lab, LabOptions, NewNode, NodeRole};
use ichor_testenv::Tool;
use ichor_testenv::bench::{Figure, record};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};

const NS: &str = "ichor-system";
/// The goal (docs/benchmarks.md).
const GOAL: Duration = Duration::from_secs(60);
/// How long the bench waits for the joins before it gives up.
const BOUND: Duration = Duration::from_secs(600);
const LOOK: Duration = Duration::from_millis(200);

/// When the bench first saw each step of one machine's join, from the
/// start of `ichor machine add`.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    created: Option<Duration>,
    applied: Option<Duration>,
    registered: Option<Duration>,
    node_ready: Option<Duration>,
    member: Option<Duration>,
    ready: Option<Duration>,
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn phase(m: &TalosMachine) -> Option<MembershipPhase> {
    m.status.as_ref()?.membership.as_ref().map(|s| s.phase)
}

fn applied(m: &TalosMachine) -> bool {
    m.status
        .as_ref()
        .and_then(|s| s.membership.as_ref())
        .is_some_and(|s| s.step.as_deref() == Some("Boot") || s.phase == MembershipPhase::Member)
}

/// One look at the machines and Nodes, noted into `seen` at `at`.
fn note(
    seen: &mut BTreeMap<String, Seen>,
    machines: &[TalosMachine],
    nodes: &[Node],
    at: Duration,
) {
    let ready: BTreeMap<&str, bool> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, node_ready(n))))
        .collect();
    for m in machines {
        let Some(s) = m.metadata.name.as_deref().and_then(|n| seen.get_mut(n)) else {
            continue;
        };
        let name = m.metadata.name.as_deref().unwrap_or_default();
        s.created.get_or_insert(at);
        if applied(m) {
            s.applied.get_or_insert(at);
        }
        if ready.contains_key(name) {
            s.registered.get_or_insert(at);
        }
        if ready.get(name).copied().unwrap_or(false) {
            s.node_ready.get_or_insert(at);
        }
        let member = phase(m) == Some(MembershipPhase::Member);
        if member {
            s.member.get_or_insert(at);
        }
        if member && ready.get(name).copied().unwrap_or(false) {
            s.ready.get_or_insert(at);
        }
    }
}

/// The `q` quantile (nearest rank) of `values`, sorted here.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The controller the lab runs as Ichor's pod: the `ichor controller`
/// process whose kubeconfig is the pod's, in the lab's state folder.
fn controller_pid(state_dir: &Path) -> Option<u32> {
    let prefix = state_dir.join(format!("pod-{NS}-ichor-controller"));
    let prefix = prefix.to_string_lossy().into_owned();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        if !cmdline.split(|b| *b == 0).any(|a| a == b"controller") {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ
            .split(|b| *b == 0)
            .any(|v| {
                v.strip_prefix(b"KUBECONFIG=")
                    .is_some_and(|p| p.starts_with(prefix.as_bytes()))
            })
            .then_some(pid)
    })
}

/// A process's CPU seconds (user + system; Linux's USER_HZ is 100).
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the whole line.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A `/proc/<pid>/status` figure in MiB (`VmHWM`, `VmRSS`).
fn status_mib(pid: u32, key: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The lab of the membership tests with Ichor adopted, its five Nodes
/// Ready (Cilium installed by Ichor) and the controller running.
async fn lab_with_ichor(dir: &Path) -> Lab {
    let mut options = LabOptions::new(dir.join("lab"));
    options.nodes = 5;
    options.control_planes = 3;
    options.ichor_bin = Some(env!("CARGO_BIN_EXE_ichor").into());
    let lab = Lab::up(options).await.expect("the lab starts");
    let adopt = std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .args(["adopt", "--cluster", "lab", "--yes", "--talosconfig"])
        .arg(&lab.talosconfig)
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .arg("--secrets-bundle")
        .arg(&lab.bundle)
        .arg("--helm")
        .arg(Tool::Helm4.path())
        .arg("--cilium-chart")
        .arg(lab.options.cilium_chart.path())
        .output()
        .expect("run ichor adopt");
    assert!(
        adopt.status.success(),
        "ichor adopt failed:\n{}{}",
        String::from_utf8_lossy(&adopt.stdout),
        String::from_utf8_lossy(&adopt.stderr)
    );
    let nodes = Api::<Node>::all(lab.client().await);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let all = nodes.list(&ListParams::default()).await.expect("Nodes");
        let ready = all.items.iter().filter(|n| node_ready(n)).count();
        if ready == lab.hostnames.len() && controller_pid(lab.state_dir()).is_some() {
            return lab;
        }
        assert!(
            Instant::now() < deadline,
            "the lab's Nodes Ready ({ready} of {}) and Ichor's controller running, in vain",
            lab.hostnames.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The lines `ichor machine add` printed, each with when it came.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<(Duration, String)>>>);

impl Lines {
    fn follow(&self, out: Option<impl AsyncRead + Unpin + Send + 'static>, started: Instant) {
        let Some(out) = out else { return };
        let lines = self.0.clone();
        tokio::spawn(async move {
            let mut out = BufReader::new(out).lines();
            while let Ok(Some(line)) = out.next_line().await {
                let mut lines = lines.lock().unwrap_or_else(|e| e.into_inner());
                lines.push((started.elapsed(), line));
            }
        });
    }

    fn taken(&self) -> Vec<(Duration, String)> {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        lines.sort_by_key(|(at, _)| *at);
        lines
    }

    /// When the first and the last line holding `what` came.
    fn span(&self, what: &str) -> (Option<Duration>, Option<Duration>) {
        let at: Vec<Duration> = self
            .taken()
            .into_iter()
            .filter(|(_, l)| l.contains(what))
            .map(|(at, _)| at)
            .collect();
        (at.first().copied(), at.last().copied())
    }
}

/// What one run measured.
struct Run {
    lines: Lines,
    total: Option<Duration>,
    seen: BTreeMap<String, Seen>,
    add_exit: Option<(Duration, bool)>,
    cpu: Option<f64>,
    hwm_mib: Option<f64>,
    loads: (String, String),
}

/// `ichor machine add` of every address, and the looks until all are
/// Member with a Ready Node (or the bound passes).
async fn join_all(lab: &Lab, added: &[ichor_lab::AddedNode]) -> Run {
    let client = lab.client().await;
    let machines = Api::<TalosMachine>::namespaced(client.clone(), NS);
    let nodes = Api::<Node>::all(client);
    let mut seen: BTreeMap<String, Seen> = added
        .iter()
        .map(|a| (a.hostname.clone(), Seen::default()))
        .collect();
    let pid = controller_pid(lab.state_dir());
    let cpu_before = pid.and_then(cpu_secs);
    let load_before = load();
    let started = Instant::now();
    let mut add = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .args(["machine", "add"])
        .args(added.iter().map(|a| a.address.to_string()))
        .args(["--cluster", "lab", "--role", "worker", "--yes", "--wait"])
        .args(["--wait-timeout", "9m", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .spawn()
        .expect("run ichor machine add");
    let lines = Lines::default();
    lines.follow(add.stdout.take(), started);
    lines.follow(add.stderr.take(), started);
    let mut add_exit = None;
    let total = loop {
        let at = started.elapsed();
        let (m, n) = (
            machines.list(&ListParams::default()).await,
            nodes.list(&ListParams::default()).await,
        );
        if let (Ok(m), Ok(n)) = (m, n) {
            note(&mut seen, &m.items, &n.items, at);
        }
        if add_exit.is_none()
            && let Ok(Some(status)) = add.try_wait()
        {
            add_exit = Some((started.elapsed(), status.success()));
        }
        if seen.values().all(|s| s.ready.is_some()) {
            break Some(at);
        }
        if at > BOUND {
            break None;
        }
        tokio::time::sleep(LOOK).await;
    };
    let load_after = load();
    if add_exit.is_none() {
        let status = tokio::time::timeout(Duration::from_secs(60), add.wait()).await;
        add_exit = match status {
            Ok(Ok(s)) => Some((started.elapsed(), s.success())),
            _ => None,
        };
    }
    Run {
        lines,
        total,
        seen,
        add_exit,
        cpu: pid
            .and_then(cpu_secs)
            .zip(cpu_before)
            .map(|(after, before)| after - before),
        hwm_mib: pid.and_then(|p| status_mib(p, "VmHWM:")),
        loads: (load_before, load_after),
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// The p50 and p95 of one step's time over the machines, as text.
fn spread(seen: &BTreeMap<String, Seen>, step: impl Fn(&Seen) -> Option<Duration>) -> String {
    let mut values: Vec<f64> = seen
        .values()
        .filter_map(|s| Some((step(s)? - s.created?).as_secs_f64()))
        .collect();
    let n = values.len();
    let (p50, p95) = (quantile(&mut values, 0.5), quantile(&mut values, 0.95));
    let max = values.last().copied().unwrap_or(f64::NAN);
    format!("p50 {p50:.1} s, p95 {p95:.1} s, max {max:.1} s ({n} machines)")
}

fn report(run: &Run, nodes: usize, lab_secs: f64) {
    let s = &run.seen;
    let first_created = s.values().filter_map(|s| s.created).min();
    let last_created = s.values().filter_map(|s| s.created).max();
    println!("\njoin_100: {nodes} maintenance-mode workers, `ichor machine add … --wait`");
    println!("  lab up, Ichor adopted, {nodes} nodes booted: {lab_secs:.1} s (untimed)");
    println!(
        "  load (1 min) at the start / end: {} / {}",
        run.loads.0, run.loads.1
    );
    let (read, _) = run.lines.span("plan:");
    let (first_made, last_made) = run.lines.span("created");
    println!(
        "  ichor machine add: the {nodes} nodes read, plan printed at {}; TalosMachines created {} to {}",
        secs(read),
        secs(first_made),
        secs(last_made)
    );
    println!(
        "  first / last TalosMachine seen: {} / {}",
        secs(first_created),
        secs(last_created)
    );
    println!("  all Member with a Ready Node: {}", secs(run.total));
    match run.add_exit {
        Some((d, ok)) => println!(
            "  `ichor machine add --wait` exited after {:.1} s ({})",
            d.as_secs_f64(),
            if ok { "success" } else { "failure" }
        ),
        None => println!("  `ichor machine add --wait` had not exited"),
    }
    println!("  per machine, from its TalosMachine seen:");
    println!("    config applied:   {}", spread(s, |s| s.applied));
    println!("    Node registered:  {}", spread(s, |s| s.registered));
    println!("    Node Ready:       {}", spread(s, |s| s.node_ready));
    println!("    Member:           {}", spread(s, |s| s.member));
    println!("    Member + Ready:   {}", spread(s, |s| s.ready));
    let cpu = run.cpu.map_or_else(|| "-".into(), |c| format!("{c:.1} s"));
    let hwm = run
        .hwm_mib
        .map_or_else(|| "-".into(), |m| format!("{m:.0} MiB"));
    println!("  controller: {cpu} CPU over the joins, peak RSS {hwm}");
    let met = run.total.map(|t| t < GOAL);
    let mut figures = vec![Figure::alone(
        format!("{nodes} maintenance-mode nodes joined at once, until all Ready (lab)"),
        "< 60 s",
        format!(
            "{} (load {} → {})",
            secs(run.total),
            run.loads.0,
            run.loads.1
        ),
        met,
    )];
    figures.push(Figure::alone(
        "per node, TalosMachine seen → Member + Node Ready",
        "-",
        spread(s, |s| s.ready),
        None,
    ));
    figures.push(Figure::alone(
        "the controller over the joins",
        "-",
        format!("{cpu} CPU, peak RSS {hwm}"),
        None,
    ));
    record("join_100", &figures);
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let count: usize = std::env::var("ICHOR_BENCH_JOIN_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let up = Instant::now();
    let mut lab = lab_with_ichor(dir.path()).await;
    let mut added = Vec::with_capacity(count);
    for _ in 0..count {
        let node = NewNode {
            role: NodeRole::Worker,
            shape: None,
        };
        added.push(
            lab.add_node(node)
                .await
                .expect("a node in maintenance mode"),
        );
    }
    let lab_secs = up.elapsed().as_secs_f64();
    let run = join_all(&lab, &added).await;
    report(&run, count, lab_secs);
    let log = ichor_testenv::bench::target_dir().join("bench-figures/join_100-machine-add.log");
    let text: String = run
        .lines
        .taken()
        .iter()
        .map(|(at, l)| format!("{:7.2} s  {l}\n", at.as_secs_f64()))
        .collect();
    if std::fs::write(&log, &text).is_ok() {
        println!("  ichor machine add's output, timed: {}", log.display());
    }
    if run.total.is_none() {
        eprintln!("not all joined within {} s", BOUND.as_secs());
    }
}
