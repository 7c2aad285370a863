//! The test control plane: a real etcd and a real kube-apiserver, built from
//! their Go modules by `tools/testbin.sh`, started once per test binary on free
//! loopback ports in a temporary folder, with their own CA, service-account keys
//! and an admin (`system:masters`) client certificate.
//!
//! ```no_run
//! # async fn t() {
//! let env = ichor_testenv::TestEnv::shared();
//! let client = env.client().await;
//! let ns = env.namespace("my-test").await; // a fresh namespace per test
//! # }
//! ```
//!
//! Processes never outlive the test binary: each server runs under a small
//! watchdog shell that reads the test process's end of a pipe and kills the
//! server (and removes the folder) when that pipe closes — on a normal exit, a
//! panic or a SIGKILL alike — and the kernel kills the server should the
//! watchdog itself be killed (parent-death signal).
//!
//! What it cannot do: there are no kubelets, no controllers (no namespace
//! deletion, no garbage collection, no Deployment → ReplicaSet → Pod) and no pod
//! network. Tests patch Node and workload status themselves.

pub mod bench;
#[cfg(feature = "browser")]
pub mod browser;
mod certs;
pub mod etcd_loss;
pub mod fixtures;
pub mod install;
pub mod leak;
pub mod rbac;
pub mod s3;
pub mod tools;
pub mod wait;

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use certs::TestCa;
pub use etcd_loss::EtcdStarter;
use etcd_loss::Restart;
pub use tools::Tool;

/// The audit policy: who did what, no bodies (Metadata), once per request.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n";
/// The audit log, in the control plane's folder.
const AUDIT_LOG: &str = "audit.log";

/// One request as the API server's audit log recorded it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub verb: String,
    #[serde(default)]
    pub request_uri: String,
    pub user: AuditUser,
    #[serde(default)]
    pub user_agent: Option<String>,
    #[serde(default)]
    pub response_status: Option<serde_json::Value>,
    #[serde(default)]
    pub object_ref: Option<serde_json::Value>,
}

/// The authenticated user of an [`AuditEvent`].
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AuditUser {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// How long the apiserver may take to report `/readyz` on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start {what}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("writing the test control plane's files in {dir}")]
    Files {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "kube-apiserver was not ready within {timeout:?} ({reason}); last lines of its log:\n{log_tail}"
    )]
    NotReady {
        timeout: Duration,
        reason: String,
        log_tail: String,
    },
    #[error("the test kubeconfig is invalid")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
}

/// An error and its causes on one line (`ichor_api::error_text::chain`,
/// which this crate cannot use: ichor-api's tests use this crate).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut said = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !said.ends_with(&text) {
            said = format!("{said}: {text}");
        }
        next = cause.source();
    }
    said
}

/// Who a control plane is: its CA, service-account key and port.
pub struct ClusterIdentity {
    /// Signs the serving certificate; the API server trusts client
    /// certificates it signed.
    pub ca: TestCa,
    /// The service-account verification key (a public key, or the private
    /// key itself: the API server reads either).
    pub service_account_public_pem: String,
    /// The service-account signing key (PEM, PKCS#1, SEC1 or PKCS#8).
    pub service_account_key_pem: String,
    /// The port the API server listens on (127.0.0.1).
    pub port: u16,
}

/// A running etcd + kube-apiserver pair.
pub struct TestEnv {
    dir: PathBuf,
    kubeconfig_path: PathBuf,
    server_url: String,
    etcd_url: String,
    ca: TestCa,
    /// Starts etcd and the apiserver again (after [`TestEnv::lose_etcd`]).
    starter: EtcdStarter,
    // Dropping these closes the watchdogs' pipes, which stops the servers.
    watchdogs: Arc<Mutex<Vec<Watchdog>>>,
}

struct Watchdog {
    /// The server it runs (`etcd`, `kube-apiserver`).
    what: &'static str,
    /// Its end removes the control plane's folder (the first etcd's does).
    removes_dir: bool,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

static SHARED: OnceLock<TestEnv> = OnceLock::new();

/// Writes the egress selector that sends the API server's traffic to the
/// cluster through the CONNECT proxy on the Unix socket `proxy`; returns
/// the flag that names it.
fn write_egress_selector(dir: &Path, proxy: &Path) -> std::io::Result<String> {
    let file = dir.join("egress-selector.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n  - name: cluster\n    connection:\n      proxyProtocol: HTTPConnect\n      transport:\n        uds:\n          udsName: {}\n",
            proxy.display()
        ),
    )?;
    Ok(format!("--egress-selector-config-file={}", file.display()))
}

/// The test API server's flags (without the egress selector): served on
/// loopback from the files in `dir`, storing in the etcd at `etcd_url`.
fn apiserver_args(dir: &Path, etcd_url: &str, api_port: u16, server_url: &str) -> Vec<String> {
    let d = |f: &str| dir.join(f).display().to_string();
    vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--cert-dir={}", d("certs")),
        format!("--secure-port={api_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        "--endpoint-reconciler-type=none".into(),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer={server_url}/"),
        format!("--service-account-key-file={}", d("sa.pub")),
        format!("--service-account-signing-key-file={}", d("sa.key")),
        format!("--client-ca-file={}", d("ca.crt")),
        format!("--tls-cert-file={}", d("apiserver.crt")),
        format!("--tls-private-key-file={}", d("apiserver.key")),
        // Webhook and aggregated-API Services resolve through their
        // EndpointSlices (the lab publishes a pod's loopback address
        // there) instead of a ClusterIP no packet could reach; TLS
        // still verifies `<service>.<namespace>.svc`.
        "--enable-aggregator-routing=true".into(),
        // Who made each request, for tests that assert an identity.
        format!("--audit-policy-file={}", d("audit-policy.yaml")),
        format!("--audit-log-path={}", d(AUDIT_LOG)),
        "--audit-log-format=json".into(),
        "--audit-log-mode=blocking".into(),
        "--v=1".into(),
    ]
}

impl TestEnv {
    /// The control plane of this test binary, started on first use. Panics with
    /// the reason (and the apiserver's log tail) when it cannot start.
    pub fn shared() -> &'static TestEnv {
        SHARED.get_or_init(|| match TestEnv::start() {
            Ok(env) => env,
            Err(e) => panic!("test control plane: {}", chain(&e)),
        })
    }

    /// Starts a new control plane (most tests want [`TestEnv::shared`]).
    pub fn start() -> Result<TestEnv, Error> {
        Self::start_with_cluster_egress(None)
    }

    /// Starts a new control plane whose API server sends its traffic to the
    /// cluster (admission webhook calls) through the HTTP CONNECT proxy on
    /// the Unix socket `proxy` — the lab's pod network — as a control plane
    /// reaching its cluster through a konnectivity proxy does.
    pub fn start_with_cluster_egress(proxy: Option<&Path>) -> Result<TestEnv, Error> {
        // Resolve the binaries first: a missing tool must not leave a folder behind.
        let etcd_bin = Tool::Etcd.path();
        let apiserver_bin = Tool::KubeApiserver.path();
        let dir = tempfile::Builder::new()
            .prefix("ichor-testenv-")
            .tempdir()
            .map_err(|source| Error::Files {
                dir: std::env::temp_dir(),
                source,
            })?
            .keep();
        let sa = rcgen::KeyPair::generate().expect("generate service-account key");
        let identity = ClusterIdentity {
            ca: TestCa::new("ichor-testenv-ca"),
            service_account_public_pem: sa.public_key_pem(),
            service_account_key_pem: sa.serialize_pem(),
            port: free_port(),
        };
        Self::start_in(dir.clone(), &etcd_bin, &apiserver_bin, proxy, identity).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })
    }

    /// Starts a control plane for a cluster that has its own identity (what
    /// a Talos control plane runs after bootstrap): its Kubernetes CA signs
    /// the serving certificate and authenticates clients (so a kubeconfig
    /// the cluster hands out works here), its service-account key signs
    /// tokens, and it listens on the port of the cluster's endpoint.
    pub fn start_for_cluster(
        identity: ClusterIdentity,
        proxy: Option<&Path>,
    ) -> Result<TestEnv, Error> {
        let etcd_bin = Tool::Etcd.path();
        let apiserver_bin = Tool::KubeApiserver.path();
        let dir = tempfile::Builder::new()
            .prefix("ichor-testenv-")
            .tempdir()
            .map_err(|source| Error::Files {
                dir: std::env::temp_dir(),
                source,
            })?
            .keep();
        Self::start_in(dir.clone(), &etcd_bin, &apiserver_bin, proxy, identity).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })
    }

    fn start_in(
        dir: PathBuf,
        etcd_bin: &Path,
        apiserver_bin: &Path,
        proxy: Option<&Path>,
        identity: ClusterIdentity,
    ) -> Result<TestEnv, Error> {
        let files = |source| Error::Files {
            dir: dir.clone(),
            source,
        };
        let ca = identity.ca;
        let serving = ca.issue_server("kube-apiserver", &["127.0.0.1", "localhost"]);
        let admin = ca.issue_client("ichor-test-admin", &["system:masters"]);

        std::fs::write(dir.join("ca.crt"), ca.cert_pem()).map_err(files)?;
        std::fs::write(dir.join("apiserver.crt"), &serving.cert_pem).map_err(files)?;
        std::fs::write(dir.join("apiserver.key"), &serving.key_pem).map_err(files)?;
        std::fs::write(dir.join("sa.pub"), &identity.service_account_public_pem).map_err(files)?;
        std::fs::write(dir.join("sa.key"), &identity.service_account_key_pem).map_err(files)?;
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY).map_err(files)?;

        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let api_port = identity.port;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let server_url = format!("https://127.0.0.1:{api_port}");

        let egress = match proxy {
            Some(proxy) => vec![write_egress_selector(&dir, proxy).map_err(files)?],
            None => Vec::new(),
        };
        let restart = Restart {
            dir: dir.clone(),
            kubeconfig_path: dir.join("kubeconfig"),
            etcd_url: etcd_url.clone(),
            etcd_bin: etcd_bin.to_path_buf(),
            apiserver_bin: apiserver_bin.to_path_buf(),
            peer_url,
            apiserver_args: apiserver_args(&dir, &etcd_url, api_port, &server_url)
                .into_iter()
                .chain(egress)
                .collect(),
        };
        let etcd_dir = dir.join("etcd");
        // etcd stops last; its watchdog then removes the whole folder.
        let etcd = restart.start_etcd(&etcd_dir, Some(&dir))?;
        let apiserver = restart.start_apiserver()?;

        let kubeconfig_path = restart.kubeconfig_path.clone();
        let kubeconfig =
            kubeconfig_yaml(&server_url, &ca.cert_pem(), &admin.cert_pem, &admin.key_pem);
        std::fs::write(&kubeconfig_path, kubeconfig).map_err(files)?;

        // Stopped in reverse: the apiserver first, then etcd.
        let watchdogs = Arc::new(Mutex::new(vec![etcd, apiserver]));
        let env = TestEnv {
            dir,
            kubeconfig_path,
            server_url,
            etcd_url,
            ca,
            starter: EtcdStarter::new(restart, Arc::clone(&watchdogs), etcd_dir),
            watchdogs,
        };
        env.wait_ready()?;
        Ok(env)
    }

    /// The admin kubeconfig file (O=system:masters client certificate).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// etcd's client URL, `http://127.0.0.1:PORT` (no TLS).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The folder holding the certificates, the kubeconfig and the servers' logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the apiserver's certificate and the admin's; tests use
    /// it to issue certificates for webhook servers they start.
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// A kube client for the current tokio runtime, as the admin.
    pub async fn client(&self) -> kube::Client {
        let config = self.kube_config().await.expect("test kubeconfig");
        kube::Client::try_from(config).expect("kube client from test kubeconfig")
    }

    /// The kube client configuration of the admin.
    pub async fn kube_config(&self) -> Result<kube::Config, Error> {
        let kc = Kubeconfig::read_from(&self.kubeconfig_path).map_err(Error::Kubeconfig)?;
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(Error::Kubeconfig)
    }

    /// Creates a new namespace named `<prefix>-<random>` and returns its name.
    /// Namespaces are never deleted: the test control plane runs no namespace
    /// controller, and it is thrown away with the test binary.
    pub async fn namespace(&self, prefix: &str) -> String {
        let client = self.client().await;
        let name = format!("{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .expect("namespace object");
        Api::<Namespace>::all(client)
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        name
    }

    /// Every request the API server has logged so far (audit level
    /// Metadata: the user, the verb, the URI; no bodies).
    pub fn audit_events(&self) -> Vec<AuditEvent> {
        std::fs::read_to_string(self.dir.join(AUDIT_LOG))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The last `lines` lines of the apiserver's log.
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        log_tail(&self.dir.join("kube-apiserver.log"), lines)
    }

    /// The process ids of the watchdog shells (for tests of the teardown).
    pub fn watchdog_pids(&self) -> Vec<u32> {
        let w = self.watchdogs.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().map(|w| w.child.id()).collect()
    }

    /// Stops both servers now (dropping a non-shared `TestEnv` does the same).
    pub fn stop(&self) {
        let mut w = self.watchdogs.lock().unwrap_or_else(|p| p.into_inner());
        w.drain(..).rev().for_each(drop);
    }

    fn wait_ready(&self) -> Result<(), Error> {
        wait_ready(&self.kubeconfig_path, &self.dir.join("kube-apiserver.log")).inspect_err(|_| {
            self.stop();
        })
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until kube-apiserver answers `/readyz` (`log`: its log, whose tail
/// the error carries).
fn wait_ready(kubeconfig: &Path, log: &Path) -> Result<(), Error> {
    let kubeconfig = kubeconfig.to_path_buf();
    // Its own thread and runtime: callers may be inside any runtime or none.
    let outcome = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(poll_readyz(&kubeconfig))
    })
    .join()
    .expect("readiness thread");
    outcome.map_err(|reason| Error::NotReady {
        timeout: READY_TIMEOUT,
        reason: chain(&reason),
        log_tail: log_tail(log, 40),
    })
}

/// Why kube-apiserver was not ready: the last look's answer.
#[derive(Debug, thiserror::Error)]
enum NotReadyYet {
    #[error("no answer yet")]
    NotAsked,
    #[error("the test kubeconfig cannot be used")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("no client can be made from the test kubeconfig")]
    Client(#[source] kube::Error),
    #[error("/readyz said {0:?}")]
    Said(String),
    #[error("/readyz")]
    Call(#[source] kube::Error),
}

async fn poll_readyz(kubeconfig: &Path) -> Result<(), NotReadyYet> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(NotReadyYet::Kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(NotReadyYet::Kubeconfig)?;
    let client = kube::Client::try_from(config).map_err(NotReadyYet::Client)?;
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = NotReadyYet::NotAsked;
    while Instant::now() < deadline {
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("request");
        match client.request_text(req).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = NotReadyYet::Said(body),
            Err(e) => last = NotReadyYet::Call(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

/// Starts `bin args…` under a watchdog shell: the server runs while the pipe
/// from this process stays open; when it closes the server gets SIGTERM, then
/// SIGKILL, and `cleanup` (a folder) is removed.
fn watchdog(
    what: &'static str,
    bin: &Path,
    args: &[String],
    log: &Path,
    cleanup: Option<&Path>,
) -> Result<Watchdog, Error> {
    // The server also gets SIGKILL from the kernel the moment its watchdog
    // dies (setpriv --pdeathsig), however the watchdog dies; the trap covers a
    // watchdog that is signalled rather than killed.
    const SCRIPT: &str = r#"
log=$1; cleanup=$2; shift 2
if command -v setpriv >/dev/null 2>&1; then
  setpriv --pdeathsig KILL -- "$@" >"$log" 2>&1 </dev/null &
else
  "$@" >"$log" 2>&1 </dev/null &
fi
pid=$!
stop() {
  kill -TERM "$pid" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  [ -n "$cleanup" ] && rm -rf "$cleanup"
  exit 0
}
trap stop TERM INT HUP
# Read the pipe in the background: a shell runs traps only between commands,
# and `wait` returns at once on a signal. Stdin is kept on fd 3 first, since
# a background command's stdin would otherwise be /dev/null.
exec 3<&0
cat <&3 >/dev/null &
wait $!
stop
"#;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(SCRIPT)
        .arg("ichor-testenv-watchdog")
        .arg(log)
        .arg(cleanup.map(|p| p.as_os_str()).unwrap_or_default())
        .arg(bin)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|source| Error::Spawn { what, source })?;
    let mut stdin = child.stdin.take();
    // Nothing is ever written; a zero-length write checks the pipe is open.
    if let Some(s) = stdin.as_mut() {
        let _ = s.write_all(b"");
    }
    Ok(Watchdog {
        what,
        removes_dir: cleanup.is_some(),
        child,
        stdin,
    })
}

/// A command for `program` that the kernel kills (SIGKILL) when the thread
/// that starts it ends — for long-running helpers a test or the lab starts
/// (Ichor's controller), so none outlives a killed test. Plain when the
/// machine has no `setpriv`.
pub fn command_dying_with_parent(program: impl AsRef<std::ffi::OsStr>) -> Command {
    if Path::new("/usr/bin/setpriv").is_file() {
        let mut cmd = Command::new("/usr/bin/setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A free TCP port on loopback, as the OS picks it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "ichor-test", "cluster": {
            "server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": "ichor-test-admin", "user": {
            "client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": "ichor-test", "context": {"cluster": "ichor-test", "user": "ichor-test-admin"}}],
        "current-context": "ichor-test",
    });
    serde_yaml_ng::to_string(&doc).expect("kubeconfig yaml")
}
