//! Bench: one backup of an etcd of more than 256 MiB, side by side with
//! `talosctl etcd snapshot` on the same data in the same run.
//!
//! A real etcd of its own is filled with `VALUES` random values of 1 MiB;
//! an emulated control plane (`ichor-talemu`, in this process) serves
//! Talos's `EtcdSnapshot` from it. Each round runs, one after the other:
//!
//! - the peer: the real `talosctl etcd snapshot FILE` against the emulator,
//!   writing a local file;
//! - Ichor: this binary again, as a child process, taking one backup as the
//!   controller does (`EtcdSnapshot` through `ichor-talos-client`, the
//!   snapshot check, age, a multipart upload to the real S3 server
//!   `versitygw`, then the bundle, objects and manifest). The child reports
//!   its peak RSS growth over the take (`VmHWM` after it, minus `VmRSS`
//!   just before the stream starts).
//!
//! Both are timed as whole processes (start, TLS, the stream, the file or
//! the upload, exit), and both run under GNU `time` for their peak RSS.
//! Figures are printed and left in `target/bench-figures/take.json`;
//! nothing is asserted about them.
//!
//! Run: `cargo bench -p ichor-backup --bench take`

// A bench's figures are its output: it prints them (docs/STYLE.md's lint
// forbids printing elsewhere).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt as _;
use ichor_backup::crypt::{Identities, Recipients};
use ichor_backup::manifest::{ClusterRef, Layout, Reason};
use ichor_backup::store::{Destination, S3Destination, Store};
use ichor_backup::take::{Inputs, take};
use ichor_talemu::{ClientCertSpec, Emulator, EmulatorOptions, NodeSpec};
use ichor_talos_client::{ClientIdentity, ClientOptions, TalosClient};
use ichor_testenv::bench::{Figure, duration, record};
use ichor_testenv::s3::S3Server;
use ichor_testenv::tools::Tool;

/// 300 values of 1 MiB: a database of more than 256 MiB (etcd's default
/// request limit is 1.5 MiB, so one value per request).
const VALUES: usize = 300;
const VALUE_BYTES: usize = 1 << 20;
const ROUNDS: usize = 3;
/// Set in the child: the folder holding its inputs.
const CHILD_ENV: &str = "ICHOR_BENCH_TAKE_CHILD";
/// The goals (docs/benchmarks.md).
const WALL_GOAL: f64 = 1.5;
const RSS_GOAL_MIB: f64 = 64.0;

fn main() {
    match std::env::var_os(CHILD_ENV) {
        Some(dir) => child(Path::new(&dir)),
        None => parent(),
    }
}

// ---- the parent: etcd, S3, the emulator, the rounds ----

/// An etcd of its own in a temporary folder, killed when dropped.
struct Etcd {
    child: Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Etcd {
    fn start() -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("ichor-bench-etcd-")
            .tempdir()
            .expect("a temporary folder");
        let client = format!("http://127.0.0.1:{}", ichor_testenv::free_port());
        let peer = format!("http://127.0.0.1:{}", ichor_testenv::free_port());
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log");
        let child = ichor_testenv::command_dying_with_parent(Tool::Etcd.path())
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            // Room for the data and its history (the default is 2 GiB).
            .arg("--quota-backend-bytes=4294967296")
            .arg("--unsafe-no-fsync=true")
            .arg("--log-level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let e = Etcd {
            child,
            endpoint: client,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !e.ctl(&["endpoint", "health"], None).status.success() {
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy within 60 s: {}",
                std::fs::read_to_string(e.dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        e
    }

    /// `etcdctl ARGS`, with `stdin` as its input when given.
    fn ctl(&self, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
        let mut child = Command::new(Tool::Etcdctl.path())
            .arg(format!("--endpoints={}", self.endpoint))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run etcdctl");
        let mut pipe = child.stdin.take().expect("etcdctl's stdin");
        if let Some(bytes) = stdin {
            pipe.write_all(bytes).expect("write etcdctl's stdin");
        }
        drop(pipe);
        child.wait_with_output().expect("etcdctl ends")
    }

    /// `VALUES` random values of `VALUE_BYTES` (a value longer than one
    /// command-line argument may be goes through stdin).
    fn fill(&self) {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for i in 0..VALUES {
            let value = rng.alphanumeric(VALUE_BYTES);
            let key = format!("/bench/value-{i:04}");
            let out = self.ctl(&["put", &key], Some(&value));
            assert!(out.status.success(), "etcdctl put {key}: {out:?}");
        }
    }

    fn db_size(&self) -> u64 {
        let out = self.ctl(&["endpoint", "status", "-w", "json"], None);
        assert!(out.status.success(), "etcdctl endpoint status: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        v[0]["Status"]["dbSize"].as_u64().expect("a dbSize")
    }
}

/// Incompressible, printable values without a dependency.
struct XorShift(u64);

impl XorShift {
    fn alphanumeric(&mut self, len: usize) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..len)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ALPHABET[(self.0 % ALPHABET.len() as u64) as usize]
            })
            .collect()
    }
}

/// One process run: its wall time, and GNU `time`'s peak RSS and CPU
/// time (user + system).
struct Run {
    wall: Duration,
    max_rss_kib: u64,
    cpu_s: f64,
    stdout: String,
}

/// Runs `program ARGS` under `/usr/bin/time`, whose report goes to a file
/// so the program's own output stays apart.
fn timed(dir: &Path, program: &Path, args: &[&str], env: &[(&str, &Path)]) -> Run {
    let report = dir.join("time.txt");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f")
        .arg("%M %U %S")
        .arg("-o")
        .arg(&report)
        .arg(program)
        .args(args)
        .env_remove("TALOSCONFIG")
        .env("HOME", dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().expect("run under /usr/bin/time");
    let wall = start.elapsed();
    assert!(
        out.status.success(),
        "{}: {}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(&report).expect("time's report");
    let fields: Vec<f64> = report
        .trim()
        .lines()
        .last()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    let [max_rss_kib, user, system] = fields[..] else {
        panic!("time's report: {report}");
    };
    Run {
        wall,
        max_rss_kib: max_rss_kib as u64,
        cpu_s: user + system,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// What the child reads from its folder.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildInputs {
    endpoint: String,
    s3_endpoint: String,
    bucket: String,
    region: String,
    access_key_id: String,
    secret_access_key: String,
    recipients: Vec<String>,
    backup: String,
}

impl ChildInputs {
    /// The S3 server's part of the inputs.
    fn s3(s3: &S3Server) -> ChildInputs {
        ChildInputs {
            endpoint: String::new(),
            s3_endpoint: s3.endpoint(),
            bucket: s3.bucket().to_string(),
            region: s3.region().to_string(),
            access_key_id: s3.access_key_id().to_string(),
            secret_access_key: s3.secret_access_key().to_string(),
            recipients: Vec::new(),
            backup: String::new(),
        }
    }
}

fn s3_destination(inputs: &ChildInputs) -> Destination {
    Destination::S3(S3Destination {
        endpoint: Some(inputs.s3_endpoint.clone()),
        bucket: inputs.bucket.clone(),
        prefix: String::new(),
        region: inputs.region.clone(),
        access_key_id: inputs.access_key_id.clone(),
        secret_access_key: inputs.secret_access_key.clone(),
        allow_http: true,
    })
}

/// What the child reports on its last line of output.
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildReport {
    take_ns: u64,
    /// When the snapshot's last message came, from the take's start: what
    /// follows is the upload's tail (the last parts, completing the
    /// multipart upload, the small parts and the manifest).
    last_message_ns: u64,
    rss_before_kib: u64,
    hwm_after_kib: u64,
    db_size: u64,
    written: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

/// What the rounds run against; dropped in this order (the emulator
/// before its runtime, the servers last).
struct Lab {
    emu: Emulator,
    rt: tokio::runtime::Runtime,
    store: Store,
    s3: S3Server,
    // Serves the emulator's EtcdSnapshot until the rounds end.
    _etcd: Etcd,
    recipients: Vec<String>,
    talosconfig: PathBuf,
    work: tempfile::TempDir,
}

impl Lab {
    /// etcd filled, the S3 server, the emulated control plane, and the
    /// client material both the peer and the child read.
    fn start() -> Lab {
        let work = tempfile::Builder::new()
            .prefix("ichor-bench-take-")
            .tempdir()
            .expect("a temporary folder");
        let etcd = Etcd::start();
        let filling = Instant::now();
        etcd.fill();
        println!(
            "etcd filled: {VALUES} values of {} KiB in {:.1} s, dbSize {:.1} MiB",
            VALUE_BYTES / 1024,
            filling.elapsed().as_secs_f64(),
            etcd.db_size() as f64 / (1 << 20) as f64
        );
        let s3 = S3Server::start().expect("the S3 server starts");
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let emu = rt
            .block_on(Emulator::start_with(
                vec![NodeSpec::new(
                    "cp-1",
                    ichor_testenv::fixtures::talos_bytes("stability-v1.12/base-controlplane.yaml"),
                )],
                EmulatorOptions {
                    etcd_url: Some(etcd.endpoint.clone()),
                    ..EmulatorOptions::default()
                },
            ))
            .expect("the emulator starts");
        let admin = ClientCertSpec::admin();
        let talosconfig = work.path().join("talosconfig");
        std::fs::write(&talosconfig, emu.talosconfig("bench", &admin).unwrap()).unwrap();
        let cert = emu.pki().client_cert(&admin).expect("a client certificate");
        std::fs::write(work.path().join("ca.pem"), emu.ca_pem()).unwrap();
        std::fs::write(work.path().join("crt.pem"), &cert.cert_pem).unwrap();
        std::fs::write(work.path().join("key.pem"), &cert.key_pem).unwrap();
        let store =
            Store::open(&s3_destination(&ChildInputs::s3(&s3))).expect("the S3 destination opens");
        Lab {
            emu,
            rt,
            store,
            s3,
            _etcd: etcd,
            recipients: Identities::generate().recipients(),
            talosconfig,
            work,
        }
    }

    /// `talosctl etcd snapshot FILE`: the run and the file's size.
    fn peer(&self) -> (Run, u64) {
        let file = self.work.path().join("talosctl.snapshot");
        let run = timed(
            self.work.path(),
            &Tool::Talosctl.path(),
            &[
                "--talosconfig",
                self.talosconfig.to_str().unwrap(),
                "-n",
                "127.0.0.1",
                "-e",
                &self.emu.endpoint(0),
                "etcd",
                "snapshot",
                file.to_str().unwrap(),
            ],
            &[],
        );
        let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&file).ok();
        (run, bytes)
    }

    /// One backup taken by the child; deleted after, so the next round
    /// starts from an empty bucket (disk).
    fn ichor(&self, round: usize) -> (Run, ChildReport) {
        let backup = format!("bench-{round}");
        let inputs = ChildInputs {
            endpoint: self.emu.endpoint(0),
            recipients: self.recipients.clone(),
            backup: backup.clone(),
            ..ChildInputs::s3(&self.s3)
        };
        let dir = self.work.path();
        std::fs::write(
            dir.join("inputs.json"),
            serde_json::to_vec(&inputs).unwrap(),
        )
        .unwrap();
        let me = std::env::current_exe().expect("the bench knows its own path");
        let run = timed(dir, &me, &[], &[(CHILD_ENV, dir)]);
        let report: ChildReport = serde_json::from_str(
            run.stdout
                .lines()
                .last()
                .expect("the child reports on its last line"),
        )
        .expect("the child's report");
        let keys: Vec<String> = self
            .rt
            .block_on(self.store.list(&format!("bench/{backup}")))
            .expect("list the backup")
            .into_iter()
            .map(|o| o.key)
            .collect();
        self.rt
            .block_on(self.store.delete(&keys))
            .expect("delete the backup");
        (run, report)
    }
}

/// One round's figures.
struct Round {
    peer: Run,
    ours: Run,
    report: ChildReport,
}

impl Round {
    fn growth_kib(&self) -> f64 {
        self.report
            .hwm_after_kib
            .saturating_sub(self.report.rss_before_kib) as f64
    }
}

fn parent() {
    let lab = Lab::start();
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let (peer, peer_bytes) = lab.peer();
        let (ours, report) = lab.ichor(round);
        let r = Round { peer, ours, report };
        println!(
            "round {round}: talosctl {} ({:.2} s CPU, {} bytes, peak RSS {}); Ichor {} as a process ({:.2} s CPU), {} the take, its last message at {} ({} bytes of snapshot, {} written), peak RSS {} of which {} grew during the take",
            duration(r.peer.wall.as_nanos() as f64),
            r.peer.cpu_s,
            peer_bytes,
            mib(r.peer.max_rss_kib as f64),
            duration(r.ours.wall.as_nanos() as f64),
            r.ours.cpu_s,
            duration(r.report.take_ns as f64),
            duration(r.report.last_message_ns as f64),
            r.report.db_size + 32,
            r.report.written,
            mib(r.ours.max_rss_kib as f64),
            mib(r.growth_kib()),
        );
        rounds.push(r);
    }
    drop(lab);
    record("take", &figures(&rounds));
}

/// The table's rows: the medians of the rounds' times, the largest growth.
fn figures(rounds: &[Round]) -> Vec<Figure> {
    // The size of the database the snapshots held (the manifest's).
    let db_size = rounds.iter().map(|r| r.report.db_size).max().unwrap_or(0);
    let of = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let peer_wall = of(&|r| r.peer.wall.as_nanos() as f64);
    let ours_wall = of(&|r| r.ours.wall.as_nanos() as f64);
    let growth = rounds.iter().map(Round::growth_kib).fold(0.0, f64::max);
    let size = format!("{:.0} MiB", db_size as f64 / (1 << 20) as f64);
    let times = ours_wall / peer_wall;
    let verdict = |met: bool| if met { "pass" } else { "short" }.to_string();
    vec![
        Figure {
            figure: format!(
                "backup of a {size} etcd: EtcdSnapshot → check → age → S3 multipart, and the small parts (wall, a process, median of {ROUNDS})"
            ),
            goal: format!("≤ {WALL_GOAL}× talosctl's time"),
            measured: format!(
                "{} (the take alone {})",
                duration(ours_wall),
                duration(of(&|r| r.report.take_ns as f64))
            ),
            peer: format!("{} (talosctl etcd snapshot to a file)", duration(peer_wall)),
            ratio: format!("{times:.2}× its time"),
            verdict: verdict(times <= WALL_GOAL),
        },
        Figure {
            figure: format!("peak RSS growth of the take, {size} (largest of {ROUNDS})"),
            goal: format!("< {RSS_GOAL_MIB} MiB"),
            measured: format!(
                "{} (the process's peak {})",
                mib(growth),
                mib(of(&|r| r.ours.max_rss_kib as f64))
            ),
            peer: format!(
                "{} (talosctl's peak RSS)",
                mib(of(&|r| r.peer.max_rss_kib as f64))
            ),
            ratio: "-".into(),
            verdict: verdict(growth / 1024.0 < RSS_GOAL_MIB),
        },
    ]
}

// ---- the child: one take, as the controller runs it ----

/// `VmRSS` or `VmHWM` of this process, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    let path: PathBuf = dir.join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn child(dir: &Path) {
    let inputs: ChildInputs =
        serde_json::from_slice(&read(dir, "inputs.json")).expect("the child's inputs");
    // The controller's runtime: tokio's multi-threaded default.
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let report = rt.block_on(async {
        let identity = ClientIdentity::from_pem(
            read(dir, "ca.pem"),
            read(dir, "crt.pem"),
            read(dir, "key.pem"),
        );
        let client = TalosClient::new(&inputs.endpoint, &identity, ClientOptions::default())
            .expect("a Talos client");
        let store = Store::open(&s3_destination(&inputs)).expect("the S3 destination opens");
        let recipients = Recipients::parse(&inputs.recipients).expect("the recipients");
        let rss_before_kib = status_kib("VmRSS");
        let start = Instant::now();
        let last = std::sync::Arc::new(AtomicU64::new(0));
        let seen = last.clone();
        let stream = client
            .etcd_snapshot("")
            .await
            .expect("EtcdSnapshot starts")
            .inspect(move |_| seen.store(start.elapsed().as_nanos() as u64, Ordering::Relaxed));
        let taken = take(
            &store,
            &Layout::new(""),
            &recipients,
            Inputs {
                cluster: ClusterRef {
                    name: "bench".into(),
                    uid: "0b8c5f2e".into(),
                },
                backup: inputs.backup.clone(),
                reason: Reason::Manual,
                started: Utc::now(),
                talos_version: "v1.13.9".into(),
                kubernetes_version: "v1.36.0".into(),
                member: "cp-1".into(),
                revision: 1,
                bundle: b"cluster:\n  id: not-a-real-bundle\n".to_vec(),
                objects: b"---\nkind: TalosCluster\n".to_vec(),
            },
            Box::pin(stream),
            Utc::now,
        )
        .await
        .expect("the backup is taken");
        ChildReport {
            take_ns: start.elapsed().as_nanos() as u64,
            last_message_ns: last.load(Ordering::Relaxed),
            rss_before_kib,
            hwm_after_kib: status_kib("VmHWM"),
            db_size: taken.manifest.etcd.db_size,
            written: taken.written,
        }
    });
    println!("{}", serde_json::to_string(&report).expect("the report"));
}
