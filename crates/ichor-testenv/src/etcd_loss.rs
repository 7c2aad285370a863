//! The loss of a test control plane's etcd, and etcd and kube-apiserver
//! started again on a restored data folder (the lab plays a disaster and a
//! recovery through the Talos API with them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Error, TestEnv, Watchdog, wait_ready, watchdog};

/// What starting etcd and the apiserver again needs.
pub(crate) struct Restart {
    pub(crate) dir: PathBuf,
    pub(crate) kubeconfig_path: PathBuf,
    pub(crate) etcd_url: String,
    pub(crate) etcd_bin: PathBuf,
    pub(crate) apiserver_bin: PathBuf,
    pub(crate) peer_url: String,
    pub(crate) apiserver_args: Vec<String>,
}

impl Restart {
    /// etcd on `data_dir`; `cleanup`: the folder its watchdog removes at its end.
    pub(crate) fn start_etcd(
        &self,
        data_dir: &Path,
        cleanup: Option<&Path>,
    ) -> Result<Watchdog, Error> {
        watchdog(
            "etcd",
            &self.etcd_bin,
            &etcd_args(data_dir, &self.etcd_url, &self.peer_url),
            &self.dir.join("etcd.log"),
            cleanup,
        )
    }

    pub(crate) fn start_apiserver(&self) -> Result<Watchdog, Error> {
        watchdog(
            "kube-apiserver",
            &self.apiserver_bin,
            &self.apiserver_args,
            &self.dir.join("kube-apiserver.log"),
            None,
        )
    }
}

/// Starts a [`TestEnv`]'s etcd on a restored data folder, and its
/// kube-apiserver after it; a handle a task can own (a restore hook).
#[derive(Clone)]
pub struct EtcdStarter {
    restart: Arc<Restart>,
    watchdogs: Arc<Mutex<Vec<Watchdog>>>,
    /// The data folder of the etcd that runs.
    etcd_data: Arc<Mutex<PathBuf>>,
}

impl std::fmt::Debug for EtcdStarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStarter")
            .field("etcd_url", &self.restart.etcd_url)
            .finish_non_exhaustive()
    }
}

impl EtcdStarter {
    pub(crate) fn new(
        restart: Restart,
        watchdogs: Arc<Mutex<Vec<Watchdog>>>,
        etcd_data: PathBuf,
    ) -> Self {
        EtcdStarter {
            restart: Arc::new(restart),
            watchdogs,
            etcd_data: Arc::new(Mutex::new(etcd_data)),
        }
    }

    /// Starts etcd on `data_dir` (a folder `etcdutl snapshot restore` made
    /// with [`TestEnv::etcd_member_args`]) at the same client URL, then
    /// kube-apiserver with the same flags, and waits until it is ready.
    /// Blocks the calling thread.
    pub fn start_from(&self, data_dir: &Path) -> Result<(), Error> {
        let r = &self.restart;
        let etcd = r.start_etcd(data_dir, None)?;
        self.watchdogs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(etcd);
        *self.etcd_data.lock().unwrap_or_else(|p| p.into_inner()) = data_dir.to_path_buf();
        let apiserver = r.start_apiserver()?;
        self.watchdogs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(apiserver);
        wait_ready(&r.kubeconfig_path, &r.dir.join("kube-apiserver.log"))
    }
}

/// etcd's flags: one member named `default` on loopback, its data in `data_dir`.
fn etcd_args(data_dir: &Path, etcd_url: &str, peer_url: &str) -> Vec<String> {
    vec![
        "--name=default".into(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ]
}

/// The process ids of `parent`'s children named `comm`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid …`: comm may hold spaces, so split at the last ')'.
            let Some((head, tail)) = stat.rsplit_once(')') else {
                return false;
            };
            let name = head.split_once('(').map_or("", |(_, n)| n);
            let ppid = tail
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok());
            name == comm && ppid == Some(parent)
        })
        .collect()
}

impl TestEnv {
    /// The `etcdutl snapshot restore` flags that make a restored data folder
    /// this control plane's etcd member (`--name`, `--initial-cluster`,
    /// `--initial-advertise-peer-urls`, as etcd is started).
    pub fn etcd_member_args(&self) -> Vec<String> {
        let peer = &self.starter.restart.peer_url;
        vec![
            "--name=default".into(),
            format!("--initial-cluster=default={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
        ]
    }

    /// Plays the loss of etcd's data: stops kube-apiserver and etcd, then
    /// deletes etcd's data folder. [`TestEnv::start_etcd_from`] starts
    /// them again on a restored one.
    pub fn lose_etcd(&self) -> Result<(), Error> {
        let mut w = self.watchdogs.lock().unwrap_or_else(|p| p.into_inner());
        // The apiserver first, as at the end.
        let (apiservers, rest): (Vec<Watchdog>, Vec<Watchdog>) =
            w.drain(..).partition(|w| w.what == "kube-apiserver");
        apiservers.into_iter().rev().for_each(drop);
        let (restarted, first): (Vec<Watchdog>, Vec<Watchdog>) = rest
            .into_iter()
            .partition(|w| w.what == "etcd" && !w.removes_dir);
        restarted.into_iter().for_each(drop);
        // The first etcd's watchdog removes the whole folder when it ends:
        // it stays, and only its server is stopped.
        for dog in &first {
            for pid in children_named(dog.child.id(), "etcd") {
                stop_process(pid);
            }
        }
        *w = first;
        drop(w);
        let data = self.etcd_data_dir();
        match std::fs::remove_dir_all(&data) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Files {
                dir: data,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Starts etcd on `data_dir` at the same client URL, then kube-apiserver
    /// with the same flags, and waits until it is ready (see
    /// [`EtcdStarter::start_from`]). Blocks the calling thread.
    pub fn start_etcd_from(&self, data_dir: &Path) -> Result<(), Error> {
        self.starter.start_from(data_dir)
    }

    /// A handle that starts etcd again on a restored data folder, for a
    /// task that outlives this borrow (the lab's restore hook).
    pub fn etcd_starter(&self) -> EtcdStarter {
        self.starter.clone()
    }

    /// The data folder of the etcd that runs (or ran last).
    pub fn etcd_data_dir(&self) -> PathBuf {
        self.starter
            .etcd_data
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Sends SIGTERM to `pid` (a server this process started) and waits up to
/// 5 s for it to end, then SIGKILL.
fn stop_process(pid: u32) {
    let gone = || !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid);
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !gone() {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// An ended process its parent has not reaped yet.
fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, t)| t.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}
