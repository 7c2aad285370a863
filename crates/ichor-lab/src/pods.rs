//! Ichor's own pods, run for real: the lab's kubelet for the images it can
//! run because they are ours.
//!
//! For every Deployment whose container runs one of Ichor's images (the
//! controller, whether `ichor adopt` or `helm install` put it there, and the
//! UI, `ichor ui`, from the chart or `install-ui.yaml`: both images carry
//! the `ichor` binary), each replica is a pod object and a local process of
//! the `ichor` binary:
//!
//! - with the container's command and args from the Deployment (the image's
//!   entrypoint is `ichor`, so a command's first word is replaced by the local
//!   binary);
//! - under a token of the pod's ServiceAccount from the TokenRequest API,
//!   written into a kubeconfig the process finds through `KUBECONFIG` (the
//!   in-cluster configuration reads fixed paths this lab cannot provide), so
//!   the RBAC the manifest grants is exactly the RBAC the process has;
//! - with its Secret and ConfigMap volumes written into the lab's state
//!   folder as the kubelet's atomic writer does (a `..data` link swapped in
//!   one rename, so a rotated certificate and its key change together, and
//!   kept current while the pod runs); an argument under a `mountPath` is
//!   rewritten to the projection, and no process starts without its volumes;
//! - Running and Ready from the process's own readiness probe (`/readyz` on
//!   the probe's port; over TLS without verifying the certificate when the
//!   probe says `scheme: HTTPS`, as the kubelet does), restarted with the
//!   kubelet's back-off (10 s doubling to 5 min) when it exits, shown as
//!   CrashLoopBackOff meanwhile.
//!
//! Addresses and ports. A pod gets a podIP from its node's pod CIDR, as a
//! CNI would give it, and the EndpointSlices (and Endpoints) of the Services
//! that select it carry that podIP and the declared `containerPort` — what
//! a real cluster shows. The process cannot listen there (no pod network
//! namespace, and the API server refuses loopback addresses in endpoints),
//! so the lab maps each declared containerPort to a free port on a loopback
//! address of the pod's own: an argument `HOST:PORT` whose PORT is a
//! declared containerPort becomes `LOOPBACK:MAPPED`. The lab's pod network
//! ([`PodNetwork`]) is the one place that knows the mapping: the test
//! control plane's API server sends its traffic to the cluster (webhook
//! calls) through it, as an HTTP CONNECT egress proxy (the API server's
//! `cluster` egress selection), and it joins `podIP:containerPort` to the
//! process. The API server resolves a webhook Service through its endpoints
//! (`--enable-aggregator-routing`); TLS still verifies
//! `<service>.<namespace>.svc`.
//!
//! A test reaches a Service the way a client in the cluster would through
//! [`ServiceForward`]: a local port whose connections go, by the Service's
//! Endpoints, through the same pod network.
//!
//! The ichor-cni Job runs under its ServiceAccount's token the same way
//! ([`token_kubeconfig`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, Endpoints, Node, Pod, PodSpec, Service, ServiceAccount, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The image repository the lab runs as the local `ichor` binary.
pub const ICHOR_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller";
/// The UI's image (`ichor ui`): it carries the same `ichor` binary, so the
/// lab runs it the same way.
pub const ICHOR_UI_IMAGE: &str = "ghcr.io/maeshinshin/ichor-ui";
/// The file name of the pod network's socket in the lab's state directory.
pub const NETWORK_SOCKET: &str = "pod-network.sock";
/// The field manager of the EndpointSlices the lab publishes.
const MANAGER: &str = "ichor-lab-kubelet";
/// The kubelet's restart back-off: first delay and cap.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// A process that ran this long without exiting starts its back-off afresh.
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How long a replaced pod stays up after leaving the endpoints.
const DRAIN: Duration = Duration::from_secs(3);
/// How often a running pod's volumes are written again from their Secrets
/// (the kubelet's sync period is a minute; the lab's tests wait less).
const VOLUME_SYNC: Duration = Duration::from_secs(2);
/// How long a token the lab requests lives (the lab is short-lived).
const TOKEN_SECONDS: i64 = 24 * 3600;

/// The lab's pod network: `podIP:containerPort` → where the process listens.
/// Served as an HTTP CONNECT proxy on a Unix socket, which the API server
/// uses for its `cluster` egress (webhook calls).
#[derive(Debug, Clone)]
pub struct PodNetwork {
    socket: PathBuf,
    routes: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
    listener: Arc<Mutex<Option<std::os::unix::net::UnixListener>>>,
}

impl PodNetwork {
    /// Binds the proxy's socket at `socket` (before the API server starts:
    /// its egress configuration names it); [`PodNetwork::serve`] answers on it.
    pub fn bind(socket: &Path) -> std::io::Result<PodNetwork> {
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)?;
        listener.set_nonblocking(true)?;
        Ok(PodNetwork {
            socket: socket.to_path_buf(),
            routes: Arc::default(),
            listener: Arc::new(Mutex::new(Some(listener))),
        })
    }

    /// Where the proxy listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn route(&self, pod: SocketAddr, process: SocketAddr) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod, process);
    }

    /// Answers CONNECT requests until the returned task is aborted; a
    /// target that is no pod's address and port is refused (502).
    pub fn serve(&self) -> Option<tokio::task::JoinHandle<()>> {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let listener = tokio::net::UnixListener::from_std(listener).ok()?;
        let routes = self.routes.clone();
        Some(tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let routes = routes.clone();
                tokio::spawn(async move {
                    if let Err(e) = tunnel(conn, routes).await {
                        tracing::debug!(error = %ichor_api::error_text::chain(&e), "lab pod network");
                    }
                });
            }
        }))
    }
}

async fn tunnel(
    mut conn: tokio::net::UnixStream,
    routes: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || conn.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let target = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("CONNECT "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse::<SocketAddr>().ok());
    let process = target.and_then(|t| {
        routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&t)
            .copied()
    });
    let Some(process) = process else {
        conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
        return Ok(());
    };
    let mut upstream = tokio::net::TcpStream::connect(process).await?;
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

/// What the lab needs to run Ichor's processes: the binary standing in for
/// the image, what the image carries (helm, the Cilium chart), and how to
/// reach the API server with a token.
#[derive(Debug, Clone)]
pub struct ProcessRunner {
    pub ichor: PathBuf,
    pub helm: PathBuf,
    pub cilium_chart: PathBuf,
    /// The API server's URL and CA (PEM), for the tokens' kubeconfigs.
    pub server: String,
    pub ca_pem: String,
    /// Where kubeconfigs and logs go.
    pub state_dir: PathBuf,
    /// The pod network the API server reaches the pods through.
    pub network: PodNetwork,
    /// `ICHOR_LOG` for every process (see `LabOptions::ichor_log`).
    pub ichor_log: Option<String>,
}

/// Whether the lab runs this container as the local `ichor` binary: one of
/// Ichor's images (the controller's or the UI's), with a tag it can pull.
pub fn is_ichors(container: &Container) -> bool {
    container.image.as_deref().is_some_and(|i| {
        is_ichor_image(i) && i.rsplit(':').next() != Some(crate::simulator::BROKEN_TAG)
    })
}

/// Whether `image` names one of Ichor's repositories (any tag or digest).
pub fn is_ichor_image(image: &str) -> bool {
    [ICHOR_IMAGE, ICHOR_UI_IMAGE].iter().any(|repo| {
        image
            .strip_prefix(repo)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([':', '@']))
    })
}

/// Whether every container of the Deployment is Ichor's (a pod the lab runs).
pub fn runs_deployment(d: &Deployment) -> bool {
    d.spec
        .template
        .spec
        .as_ref()
        .is_some_and(|p| !p.containers.is_empty() && p.containers.iter().all(is_ichors))
}

/// A kubeconfig for `namespace/service_account` with a fresh token from the
/// TokenRequest API, written to `path`.
pub async fn token_kubeconfig(
    client: &kube::Client,
    runner: &ProcessRunner,
    namespace: &str,
    service_account: &str,
    path: &Path,
) -> Result<(), String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .map_err(|e| {
            format!(
                "requesting a token of ServiceAccount {namespace}/{service_account}: {}",
                ichor_api::error_text::chain(&e)
            )
        })?
        .status
        .map(|s| s.token)
        .ok_or_else(|| format!("the TokenRequest of {namespace}/{service_account} has no token"))?;
    let ca = serde_json::to_value(k8s_openapi::ByteString(runner.ca_pem.clone().into_bytes()))
        .expect("bytes serialise");
    let user = format!("system:serviceaccount:{namespace}:{service_account}");
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": runner.server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user, "namespace": namespace}}],
        "current-context": "lab",
    });
    let text = serde_yaml_ng::to_string(&doc).expect("kubeconfig serialises");
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The command line of a container run as the local binary: the command's
/// first word (the image's path of `ichor`) replaced, then the args; every
/// `HOST:PORT` whose port is mapped rewritten to the pod's address.
/// A path under a volume's `mountPath` becomes the same path under the
/// lab's projection of that volume.
pub fn command_line(
    container: &Container,
    ip: Ipv4Addr,
    ports: &BTreeMap<u16, u16>,
    mounts: &[Mount],
) -> Vec<String> {
    let mut words: Vec<String> = container
        .command
        .clone()
        .unwrap_or_default()
        .into_iter()
        .skip(1)
        .collect();
    words.extend(container.args.clone().unwrap_or_default());
    words
        .into_iter()
        .map(|w| match w.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && (host.parse::<std::net::IpAddr>().is_ok()
                        || host
                            .trim_matches(['[', ']'])
                            .parse::<std::net::IpAddr>()
                            .is_ok()) =>
            {
                match port.parse::<u16>().ok().and_then(|p| ports.get(&p)) {
                    Some(mapped) => format!("{ip}:{mapped}"),
                    None => w,
                }
            }
            _ => mounted_path(&w, mounts).unwrap_or(w),
        })
        .collect()
}

/// `word` as a path inside the lab's projection of a mounted volume, when it
/// names one (the mount path itself or a path below it).
fn mounted_path(word: &str, mounts: &[Mount]) -> Option<String> {
    mounts.iter().find_map(|m| {
        let base = m.mount_path.trim_end_matches('/');
        let rest = word.strip_prefix(base)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| format!("{}{rest}", m.dir.display()))
    })
}

/// Where a volume's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A Secret's keys (`items` picks and renames them).
    Secret {
        name: String,
        items: Vec<(String, String)>,
    },
    /// A ConfigMap's keys.
    ConfigMap {
        name: String,
        items: Vec<(String, String)>,
    },
    /// Anything else (an emptyDir): an empty folder.
    Empty,
}

/// A volume the container mounts, as the lab projects it: the files of its
/// Secret or ConfigMap under `dir`, the folder the process sees in place
/// of `mount_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub volume: String,
    pub mount_path: String,
    pub dir: PathBuf,
    pub source: VolumeSource,
    /// A Secret or ConfigMap the volume may lack (`optional: true`): then
    /// the folder is empty instead of the container not starting.
    pub optional: bool,
}

/// The container's volume mounts, each projected into `base/<volume>`.
pub fn mounts(pod_spec: &PodSpec, container: &Container, base: &Path) -> Vec<Mount> {
    let items = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| {
        items
            .into_iter()
            .flatten()
            .map(|i| (i.key.clone(), i.path.clone()))
            .collect::<Vec<_>>()
    };
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|vm| {
            let volume = pod_spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == vm.name);
            let optional = volume.is_some_and(|v| {
                v.secret.as_ref().and_then(|s| s.optional).unwrap_or(false)
                    || v.config_map
                        .as_ref()
                        .and_then(|c| c.optional)
                        .unwrap_or(false)
            });
            let source = match volume {
                Some(v) if v.secret.is_some() => {
                    let s = v.secret.as_ref().expect("checked");
                    VolumeSource::Secret {
                        name: s.secret_name.clone().unwrap_or_default(),
                        items: items(s.items.as_ref()),
                    }
                }
                Some(v) if v.config_map.is_some() => {
                    let c = v.config_map.as_ref().expect("checked");
                    VolumeSource::ConfigMap {
                        name: c.name.clone(),
                        items: items(c.items.as_ref()),
                    }
                }
                _ => VolumeSource::Empty,
            };
            Mount {
                volume: vm.name.clone(),
                mount_path: vm.mount_path.clone(),
                dir: base.join(&vm.name),
                source,
                optional,
            }
        })
        .collect()
}

/// The files a volume holds: every key, or the `items` chosen, at their paths.
fn volume_files(
    data: BTreeMap<String, Vec<u8>>,
    items: &[(String, String)],
) -> BTreeMap<String, Vec<u8>> {
    if items.is_empty() {
        return data;
    }
    items
        .iter()
        .filter_map(|(key, path)| data.get(key).map(|v| (path.clone(), v.clone())))
        .collect()
}

/// Reads the volume's Secret or ConfigMap and writes its files; the error
/// is the kubelet's (the container does not start without its volume).
async fn project_volume(client: &kube::Client, ns: &str, m: &Mount) -> Result<(), String> {
    let files = match &m.source {
        VolumeSource::Secret { name, items } => {
            let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|e| {
                    format!(
                        "MountVolume.SetUp failed for volume \"{}\": reading secret \"{name}\": {}",
                        m.volume,
                        ichor_api::error_text::chain(&e)
                    )
                })?
                .or_else(|| m.optional.then(Default::default))
                .ok_or_else(|| {
                    format!(
                        "MountVolume.SetUp failed for volume \"{}\": secret \"{name}\" not found",
                        m.volume
                    )
                })?;
            let data = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            volume_files(data, items)
        }
        VolumeSource::ConfigMap { name, items } => {
            let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|e| format!("MountVolume.SetUp failed for volume \"{}\": reading configmap \"{name}\": {}", m.volume, ichor_api::error_text::chain(&e)))?
                .or_else(|| m.optional.then(Default::default))
                .ok_or_else(|| format!("MountVolume.SetUp failed for volume \"{}\": configmap \"{name}\" not found", m.volume))?;
            let mut data: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            data.extend(
                cm.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            volume_files(data, items)
        }
        VolumeSource::Empty => BTreeMap::new(),
    };
    atomic_write(&m.dir, &files).map_err(|e| {
        format!(
            "writing volume \"{}\" into {}: {e}",
            m.volume,
            m.dir.display()
        )
    })
}

/// Writes `files` into `dir` as the kubelet's atomic writer does: a fresh
/// timestamped folder, a `..data` link swapped to it in one rename, and one
/// link per file through `..data`, so a reader never sees half an update
/// (a certificate beside the previous key). Unchanged files write nothing.
pub fn atomic_write(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    let current: Option<BTreeMap<String, Vec<u8>>> = std::fs::read_link(&data).ok().map(|_| {
        files
            .keys()
            .filter_map(|k| std::fs::read(data.join(k)).ok().map(|v| (k.clone(), v)))
            .collect()
    });
    let listed = std::fs::read_dir(&data).map(|r| r.count()).unwrap_or(0);
    if current.as_ref() == Some(files) && listed == files.len() {
        return Ok(());
    }
    let stamp = format!("..{}", chrono::Utc::now().format("%Y_%m_%d_%H_%M_%S.%f"));
    let fresh = dir.join(&stamp);
    std::fs::create_dir_all(&fresh)?;
    for (name, bytes) in files {
        let path = fresh.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    let old = std::fs::read_link(&data).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    for name in files.keys() {
        let top = name.split('/').next().unwrap_or(name);
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
        }
    }
    // Links to files the volume no longer has, and the previous folder, go.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let gone =
            !name.starts_with("..") && !files.keys().any(|k| k.split('/').next() == Some(&name));
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old.filter(|o| o != Path::new(&stamp)) {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// The container port a probe or a Service's targetPort names (a number, or
/// a port name of the container).
fn container_port(container: &Container, port: &Value) -> Option<u16> {
    match port {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
        _ => None,
    }
}

/// One pod and its process.
struct PodProcess {
    name: String,
    /// The Node it was placed on (`spec.nodeName`, and the downward API's).
    node: String,
    /// The pod's address in the cluster (from its node's pod CIDR).
    pod_ip: Ipv4Addr,
    /// The loopback address its process listens on.
    ip: Ipv4Addr,
    /// containerPort → the free port the lab gave it on `ip`.
    ports: BTreeMap<u16, u16>,
    child: Option<tokio::process::Child>,
    started_at: Option<Instant>,
    restarts: i32,
    next_start: Instant,
    last_exit: Option<String>,
    ready: bool,
    last_status: Value,
    /// When its volumes were last written from their Secrets and ConfigMaps.
    volumes_synced: Instant,
}

/// The pods of one Deployment, at one template generation.
struct DeploymentPods {
    generation: i64,
    pods: Vec<PodProcess>,
}

/// The lab's kubelet for Ichor's pods; [`IchorPods::sync`] runs once a tick.
pub struct IchorPods {
    runner: ProcessRunner,
    _proxy: Option<AbortOnDrop>,
    deployments: HashMap<(String, String), DeploymentPods>,
    /// The pods of a Deployment's previous template, serving until the new
    /// ones are Ready, then drained (out of the endpoints) until the instant.
    retiring: HashMap<(String, String), (DeploymentPods, Option<Instant>)>,
    next_ip: u8,
    net: (u8, u8),
    published: HashMap<(String, String), Value>,
    /// How many evicted pods were replaced (names the replacements).
    replaced: u32,
}

impl IchorPods {
    pub fn new(runner: ProcessRunner) -> IchorPods {
        IchorPods {
            _proxy: runner.network.serve().map(AbortOnDrop),
            runner,
            deployments: HashMap::new(),
            retiring: HashMap::new(),
            next_ip: 10,
            // Pod addresses: a loopback /24 of this lab's own.
            net: (rand::random_range(16..=250), rand::random_range(1..=250)),
            published: HashMap::new(),
            replaced: 0,
        }
    }

    /// The next pod's (loopback, cluster) addresses; the cluster address
    /// is in `pod_cidr` (a /24 or wider IPv4 CIDR), else in 10.244.255.0/24.
    fn pod_ip(&mut self, pod_cidr: Option<&str>) -> (Ipv4Addr, Ipv4Addr) {
        let host = self.next_ip;
        self.next_ip = self.next_ip.checked_add(1).unwrap_or(10);
        let base = pod_cidr
            .and_then(|c| c.split('/').next())
            .and_then(|a| a.parse::<Ipv4Addr>().ok())
            .map(|a| a.octets())
            .unwrap_or([10, 244, 255, 0]);
        (
            Ipv4Addr::new(127, self.net.0, self.net.1, host),
            Ipv4Addr::new(base[0], base[1], base[2], host),
        )
    }

    /// Runs the pods of every Deployment of Ichor's image that could be
    /// scheduled (nodes Ready, or on the host network), stops those of
    /// Deployments that are gone, and publishes their EndpointSlices.
    pub async fn sync(&mut self, client: &kube::Client) -> Result<(), kube::Error> {
        let lp = ListParams::default();
        let nodes = Api::<Node>::all(client.clone()).list(&lp).await?.items;
        let nodes_ready = nodes.iter().any(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        // New pods go to the first node that takes pods (not cordoned), as
        // the scheduler would place them; the first node when all are.
        let placed = nodes
            .iter()
            .find(|n| {
                !n.spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
            })
            .or(nodes.first());
        let node_name = placed
            .and_then(|n| n.metadata.name.clone())
            .unwrap_or_default();
        let pod_cidr = placed
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.pod_cidr.clone());
        let mut seen = Vec::new();
        for d in Api::<Deployment>::all(client.clone())
            .list(&lp)
            .await?
            .items
        {
            if !runs_deployment(&d) {
                continue;
            }
            let key = (
                d.metadata.namespace.clone().unwrap_or_default(),
                d.metadata.name.clone().unwrap_or_default(),
            );
            let pod_spec = d.spec.template.spec.clone().unwrap_or_default();
            if !(nodes_ready || pod_spec.host_network == Some(true)) {
                // The simulator keeps its Pending pod for it, with the reason.
                continue;
            }
            seen.push(key.clone());
            self.sync_deployment(client, &d, &key, &node_name, pod_cidr.as_deref())
                .await?;
        }
        let gone: Vec<_> = self
            .deployments
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(old) = self.deployments.remove(&key) {
                delete_pods(client, &key.0, old).await;
            }
            if let Some((old, _)) = self.retiring.remove(&key) {
                delete_pods(client, &key.0, old).await;
            }
        }
        self.publish_endpoints(client).await?;
        let drained: Vec<_> = self
            .retiring
            .iter()
            .filter(|(_, (_, until))| until.is_some_and(|t| Instant::now() >= t))
            .map(|(k, _)| k.clone())
            .collect();
        for key in drained {
            if let Some((old, _)) = self.retiring.remove(&key) {
                delete_pods(client, &key.0, old).await;
            }
        }
        Ok(())
    }

    async fn sync_deployment(
        &mut self,
        client: &kube::Client,
        d: &Deployment,
        key: &(String, String),
        node_name: &str,
        pod_cidr: Option<&str>,
    ) -> Result<(), kube::Error> {
        let (ns, name) = key;
        let generation = d.metadata.generation.unwrap_or(1);
        let spec = d.spec.clone();
        let replicas = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
        let template = spec.template.clone();
        let pod_spec = template.spec.clone().unwrap_or_default();
        let container = pod_spec.containers[0].clone();
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);

        self.retire_older_generation(client, key, generation).await;
        if !self.deployments.contains_key(key) {
            // The simulator's placeholder pod goes: the real ones replace it.
            let _ = pods_api
                .delete(&format!("{name}-simulated"), &DeleteParams::default())
                .await;
            let mut pods = Vec::new();
            for i in 0..replicas {
                let pod_name = format!("{name}-g{generation}-{i}");
                pods.push(self.new_pod_process(pod_name, &container, node_name, pod_cidr));
            }
            self.deployments
                .insert(key.clone(), DeploymentPods { generation, pods });
        }
        self.replace_evicted(&pods_api, key, &container, node_name, pod_cidr)
            .await?;
        let runner = self.runner.clone();
        let state = self.deployments.get_mut(key).expect("inserted above");
        let labels: BTreeMap<String, String> = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let service_account = pod_spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        for p in &mut state.pods {
            if pods_api.get_opt(&p.name).await?.is_none() {
                let node = p.node.clone();
                create_pod_object(&pods_api, ns, &pod_spec, &labels, &node, p).await?;
            }
            p.back_off_if_exited();
            let volumes = runner
                .state_dir
                .join(format!("pod-{ns}-{}-volumes", p.name));
            let mounts = mounts(&pod_spec, &container, &volumes);
            if p.child.is_some() {
                // A changed Secret reaches a running pod (a rotated certificate).
                if p.volumes_synced.elapsed() >= VOLUME_SYNC {
                    p.volumes_synced = Instant::now();
                    for m in &mounts {
                        if let Err(e) = project_volume(client, ns, m).await {
                            tracing::warn!("lab kubelet: pod {ns}/{}: {e}", p.name);
                        }
                    }
                }
            } else if Instant::now() >= p.next_start {
                let pod = PodRun {
                    ns,
                    service_account: &service_account,
                    container: &container,
                    mounts: &mounts,
                };
                start_pod_process(client, &runner, &pod, p).await;
            }
            p.ready = p.child.is_some() && probe_ready(&container, p).await;
            write_pod_status(&pods_api, ns, &container, p).await;
        }
        let ready = i32::try_from(state.pods.iter().filter(|p| p.ready).count()).unwrap_or(0);
        if usize::try_from(ready).unwrap_or(0) >= replicas
            && let Some((_, until)) = self.retiring.get_mut(key)
            && until.is_none()
        {
            // Out of the endpoints now, stopped once calls in flight are done.
            *until = Some(Instant::now() + DRAIN);
        }
        let replicas = i32::try_from(replicas).unwrap_or(0);
        write_deployment_status(client, d, key, replicas, ready).await
    }

    /// A pod being deleted (an eviction during a drain): its process stops
    /// and the pod object goes, as its kubelet does after the grace period,
    /// and a replacement starts on `node_name`, as the Deployment's
    /// ReplicaSet and the scheduler would make it (the drained node is
    /// cordoned, so it is not the one).
    async fn replace_evicted(
        &mut self,
        pods_api: &Api<Pod>,
        key: &(String, String),
        container: &Container,
        node_name: &str,
        pod_cidr: Option<&str>,
    ) -> Result<(), kube::Error> {
        let mut evicted = Vec::new();
        for (i, p) in self.deployments[key].pods.iter().enumerate() {
            if pods_api
                .get_opt(&p.name)
                .await?
                .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
            {
                evicted.push(i);
            }
        }
        for i in evicted {
            self.replaced += 1;
            let name = format!("{}-r{}", key.1, self.replaced);
            let replacement = self.new_pod_process(name, container, node_name, pod_cidr);
            let state = self.deployments.get_mut(key).expect("present");
            let mut old = std::mem::replace(&mut state.pods[i], replacement);
            if let Some(mut child) = old.child.take() {
                let _ = child.kill().await;
            }
            match pods_api
                .delete(&old.name, &DeleteParams::default().grace_period(0))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The template changed (an upgrade): new pods, as a rolling update
    /// would; the old ones serve until the new ones are Ready.
    async fn retire_older_generation(
        &mut self,
        client: &kube::Client,
        key: &(String, String),
        generation: i64,
    ) {
        if self
            .deployments
            .get(key)
            .is_some_and(|p| p.generation != generation)
            && let Some(old) = self.deployments.remove(key)
            && let Some((older, _)) = self.retiring.insert(key.clone(), (old, None))
        {
            delete_pods(client, &key.0, older).await;
        }
    }

    /// A pod not yet started: an address from the node's pod CIDR, and a
    /// free port on its loopback address for every declared container port.
    fn new_pod_process(
        &mut self,
        name: String,
        container: &Container,
        node_name: &str,
        pod_cidr: Option<&str>,
    ) -> PodProcess {
        let (ip, pod_ip) = self.pod_ip(pod_cidr);
        let declared: Vec<u16> = container
            .ports
            .iter()
            .flatten()
            .filter_map(|p| u16::try_from(p.container_port).ok())
            .collect();
        let ports: BTreeMap<u16, u16> = declared
            .iter()
            .copied()
            .zip(free_ports(ip, declared.len()))
            .collect();
        for (declared, mapped) in &ports {
            self.runner.network.route(
                SocketAddr::from((pod_ip, *declared)),
                SocketAddr::from((ip, *mapped)),
            );
        }
        PodProcess {
            name,
            node: node_name.to_string(),
            pod_ip,
            ip,
            ports,
            child: None,
            started_at: None,
            restarts: 0,
            next_start: Instant::now(),
            last_exit: None,
            ready: false,
            last_status: Value::Null,
            volumes_synced: Instant::now(),
        }
    }

    /// One EndpointSlice per Service that selects Ichor's running pods, with
    /// each pod's address and the port the lab mapped for the targetPort.
    async fn publish_endpoints(&mut self, client: &kube::Client) -> Result<(), kube::Error> {
        let namespaces: std::collections::BTreeSet<String> =
            self.deployments.keys().map(|(ns, _)| ns.clone()).collect();
        for ns in namespaces {
            let services = Api::<Service>::namespaced(client.clone(), &ns)
                .list(&ListParams::default())
                .await?
                .items;
            let pods = Api::<Pod>::namespaced(client.clone(), &ns);
            for svc in services {
                let Some(spec) = svc.spec.clone() else {
                    continue;
                };
                let Some(selector) = spec.selector.clone().filter(|s| !s.is_empty()) else {
                    continue;
                };
                let svc_name = svc.metadata.name.clone().unwrap_or_default();
                let (endpoints, ports) = self
                    .selected_endpoints(&pods, &ns, &spec, &selector)
                    .await?;
                let slice = json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{svc_name}-lab"), "namespace": ns,
                        "labels": {"kubernetes.io/service-name": svc_name,
                            "endpointslice.kubernetes.io/managed-by": MANAGER}},
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                    "ports": ports,
                });
                let key = (ns.clone(), svc_name.clone());
                if self.published.get(&key) == Some(&slice) {
                    continue;
                }
                if apply_endpoints(client, &ns, &svc_name, &slice).await {
                    self.published.insert(key, slice);
                }
            }
        }
        Ok(())
    }

    /// The endpoints of the serving pods in `ns` that `selector` selects, and
    /// the Service's ports those pods have (taken from the first such pod).
    async fn selected_endpoints(
        &self,
        pods: &Api<Pod>,
        ns: &str,
        spec: &ServiceSpec,
        selector: &BTreeMap<String, String>,
    ) -> Result<(Vec<Value>, Vec<Value>), kube::Error> {
        let mut endpoints = Vec::new();
        let mut ports: Vec<Value> = Vec::new();
        let serving = self.deployments.iter().chain(
            self.retiring
                .iter()
                .filter(|(_, (_, until))| until.is_none())
                .map(|(k, (pods, _))| (k, pods)),
        );
        for ((d_ns, _), state) in serving {
            if *d_ns != ns {
                continue;
            }
            for p in &state.pods {
                let Some(pod) = pods.get_opt(&p.name).await? else {
                    continue;
                };
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                    continue;
                }
                let Some(container) = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .cloned()
                else {
                    continue;
                };
                endpoints.push(json!({"addresses": [p.pod_ip.to_string()],
                    "conditions": {"ready": p.ready, "serving": p.ready, "terminating": false},
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": p.name}}));
                if ports.is_empty() {
                    ports = service_ports(spec, &container, p);
                }
            }
        }
        Ok((endpoints, ports))
    }
}

/// The Service's ports whose targetPort names a port the pod's container
/// declares (and the lab mapped).
fn service_ports(spec: &ServiceSpec, container: &Container, p: &PodProcess) -> Vec<Value> {
    let mut ports = Vec::new();
    for sp in spec.ports.iter().flatten() {
        let target = sp
            .target_port
            .as_ref()
            .map(|t| serde_json::to_value(t).expect("port serialises"))
            .unwrap_or(json!(sp.port));
        if let Some(declared) =
            container_port(container, &target).filter(|cp| p.ports.contains_key(cp))
        {
            ports.push(json!({"name": sp.name.clone().unwrap_or_default(),
                "port": declared, "protocol": "TCP"}));
        }
    }
    ports
}

/// The core/v1 Endpoints with the ready endpoints of `slice`, for an API
/// server that resolves Services through those.
fn legacy_endpoints(slice: &Value, ns: &str, svc_name: &str) -> Value {
    let ready: Vec<Value> = slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["conditions"]["ready"] == true)
        .map(|e| json!({"ip": e["addresses"][0], "targetRef": e["targetRef"]}))
        .collect();
    let subsets = if ready.is_empty() {
        json!([])
    } else {
        json!([{"addresses": ready, "ports": slice["ports"]}])
    };
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": svc_name, "namespace": ns}, "subsets": subsets})
}

/// Applies the Service's Endpoints and EndpointSlice (failures are logged);
/// true when the EndpointSlice was applied.
async fn apply_endpoints(client: &kube::Client, ns: &str, svc_name: &str, slice: &Value) -> bool {
    let legacy = legacy_endpoints(slice, ns, svc_name);
    if let Err(e) = Api::<Endpoints>::namespaced(client.clone(), ns)
        .patch(
            svc_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&legacy),
        )
        .await
    {
        tracing::warn!(error = %ichor_api::error_text::chain(&e), "lab kubelet: Endpoints of Service {ns}/{svc_name}");
    }
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    match api
        .patch(
            &format!("{svc_name}-lab"),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(slice),
        )
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %ichor_api::error_text::chain(&e), "lab kubelet: EndpointSlice of Service {ns}/{svc_name}");
            false
        }
    }
}

impl PodProcess {
    /// An exited process: the kubelet's back-off, then a restart.
    fn back_off_if_exited(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            let ran = self.started_at.map(|t| t.elapsed()).unwrap_or_default();
            if ran >= BACKOFF_RESET {
                self.restarts = 0;
            }
            self.child = None;
            self.ready = false;
            self.restarts += 1;
            self.last_exit = Some(status.to_string());
            let exp = u32::try_from(self.restarts - 1).unwrap_or(0).min(5);
            self.next_start = Instant::now() + (BACKOFF_FIRST * 2u32.pow(exp)).min(BACKOFF_CAP);
        }
    }
}

/// Creates the Pod object of `p` from the Deployment's template (one that
/// already exists is left alone).
async fn create_pod_object(
    pods_api: &Api<Pod>,
    ns: &str,
    pod_spec: &PodSpec,
    labels: &BTreeMap<String, String>,
    node_name: &str,
    p: &mut PodProcess,
) -> Result<(), kube::Error> {
    let mut spec = serde_json::to_value(pod_spec).expect("pod spec serialises");
    spec["nodeName"] = json!(node_name);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": ns, "labels": labels,
            "annotations": {"ichor.maesh.dev/simulated": "a lab pod: its container is the local ichor binary under the pod's ServiceAccount token"}},
        "spec": spec,
    }))
    .expect("pod from template");
    match pods_api.create(&PostParams::default(), &pod).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => return Err(e),
    }
    p.last_status = Value::Null;
    Ok(())
}

/// What a pod's process is started from.
struct PodRun<'a> {
    ns: &'a str,
    service_account: &'a str,
    container: &'a Container,
    mounts: &'a [Mount],
}

/// Starts the pod's process; a failure is logged and retried after the
/// first back-off.
async fn start_pod_process(
    client: &kube::Client,
    runner: &ProcessRunner,
    pod: &PodRun<'_>,
    p: &mut PodProcess,
) {
    match start_process(client, runner, pod, p).await {
        Ok(child) => {
            p.child = Some(child);
            p.started_at = Some(Instant::now());
        }
        Err(e) => {
            tracing::warn!("lab kubelet: starting pod {}/{}: {e}", pod.ns, p.name);
            p.last_exit = Some(e);
            p.next_start = Instant::now() + BACKOFF_FIRST;
        }
    }
}

/// Writes the pod's status when it changed since the last write (a failure
/// is logged; the next tick writes it again).
async fn write_pod_status(
    pods_api: &Api<Pod>,
    ns: &str,
    container: &Container,
    p: &mut PodProcess,
) {
    let status = pod_status(container, p);
    if status != p.last_status {
        match pods_api
            .patch_status(
                &p.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
        {
            Ok(_) => p.last_status = status,
            Err(e) => {
                tracing::debug!(error = %ichor_api::error_text::chain(&e), "lab kubelet: pod {ns}/{} status", p.name)
            }
        }
    }
}

/// Writes the Deployment's status when its replica counts or observed
/// generation differ from `ready` of `replicas`.
async fn write_deployment_status(
    client: &kube::Client,
    d: &Deployment,
    key: &(String, String),
    replicas: i32,
    ready: i32,
) -> Result<(), kube::Error> {
    let (ns, name) = key;
    let generation = d.metadata.generation.unwrap_or(1);
    let current = d.status.clone().unwrap_or_default();
    if current.ready_replicas.unwrap_or(0) != ready
        || current.replicas != Some(replicas)
        || current.observed_generation != Some(generation)
    {
        let available = if ready >= replicas { "True" } else { "False" };
        let now = now();
        Api::<Deployment>::namespaced(client.clone(), ns)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "replicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
                    "updatedReplicas": replicas, "observedGeneration": generation,
                    "unavailableReplicas": replicas - ready,
                    "conditions": [{"type": "Available", "status": available, "reason": "MinimumReplicasAvailable",
                        "lastUpdateTime": now, "lastTransitionTime": now}]}})),
            )
            .await?;
    }
    Ok(())
}

async fn delete_pods(client: &kube::Client, ns: &str, old: DeploymentPods) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // The process is stopped: as a kubelet does then, the pod object goes
    // at once (a graceful delete of a scheduled pod waits for its kubelet).
    let stopped = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for mut p in old.pods {
        if let Some(mut c) = p.child.take() {
            let _ = c.kill().await;
        }
        let _ = api.delete(&p.name, &stopped).await;
    }
}

async fn start_process(
    client: &kube::Client,
    runner: &ProcessRunner,
    pod: &PodRun<'_>,
    p: &PodProcess,
) -> Result<tokio::process::Child, String> {
    let PodRun {
        ns,
        service_account,
        container,
        mounts,
    } = *pod;
    // As the kubelet: no container without its volumes.
    for m in mounts {
        project_volume(client, ns, m).await?;
    }
    let kubeconfig = runner
        .state_dir
        .join(format!("pod-{ns}-{}.kubeconfig", p.name));
    token_kubeconfig(client, runner, ns, service_account, &kubeconfig).await?;
    let log_path = runner.state_dir.join(format!("pod-{ns}-{}.log", p.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
    let std_cmd = {
        let mut c = ichor_testenv::command_dying_with_parent(&runner.ichor);
        c.args(command_line(container, p.ip, &p.ports, mounts));
        for e in container.env.iter().flatten() {
            if let Some(v) = &e.value {
                c.env(&e.name, v);
            }
            // The downward API's node name, as the kubelet fills it in.
            let field = e.value_from.as_ref().and_then(|f| f.field_ref.as_ref());
            if field.is_some_and(|f| f.field_path == "spec.nodeName") {
                c.env(&e.name, &p.node);
            }
        }
        c.env("KUBECONFIG", &kubeconfig)
            .env("ICHOR_HELM", &runner.helm)
            .env("ICHOR_CILIUM_CHART", &runner.cilium_chart)
            .env("NO_COLOR", "1")
            .envs(runner.ichor_log.iter().map(|f| ("ICHOR_LOG", f)))
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2);
        c
    };
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd.kill_on_drop(true);
    cmd.spawn()
        .map_err(|e| format!("starting {}: {e}", runner.ichor.display()))
}

/// The container's readiness probe (an HTTP GET), asked of the process;
/// `scheme: HTTPS` as the kubelet asks it: over TLS without verifying the
/// certificate (a probe checks the process, not its identity).
async fn probe_ready(container: &Container, p: &PodProcess) -> bool {
    let Some(get) = container
        .readiness_probe
        .as_ref()
        .and_then(|r| r.http_get.as_ref())
    else {
        return true;
    };
    let port = serde_json::to_value(&get.port).expect("port serialises");
    let Some(mapped) = container_port(container, &port).and_then(|cp| p.ports.get(&cp)) else {
        return false;
    };
    let path = get.path.clone().unwrap_or_else(|| "/".into());
    let tls = get
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    http_ok((p.ip, *mapped).into(), &path, tls).await
}

async fn http_ok(addr: std::net::SocketAddr, path: &str, tls: bool) -> bool {
    let ask = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        if tls {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let stream = unverified_tls().connect(name, tcp).await.ok()?;
            status_is_200(stream, addr, path).await
        } else {
            status_is_200(tcp, addr, path).await
        }
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Sends a GET and reads the status line: whether it says 200.
async fn status_is_200<S>(mut s: S, addr: SocketAddr, path: &str) -> Option<bool>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 64];
    while head.len() < 12 {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head).to_string();
    Some(line.starts_with("HTTP/1.0 200") || line.starts_with("HTTP/1.1 200"))
}

/// A TLS client that takes any certificate, as the kubelet's HTTPS probes
/// do; the handshake's signatures are still checked.
pub fn unverified_tls() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A local port that reaches a Service of the lab as a client in the
/// cluster would (or `kubectl port-forward svc/…`): each connection is
/// sent to a ready endpoint of the Service, read from its Endpoints at that
/// moment, through the lab's pod network (the same CONNECT proxy the API
/// server calls webhooks through). Stops when dropped.
pub struct ServiceForward {
    pub addr: SocketAddr,
    _task: AbortOnDrop,
}

impl ServiceForward {
    /// Listens on a free loopback port for `namespace/service`'s port named
    /// `port` (the Service's port name, as its Endpoints carry it). `socket`
    /// is the pod network's ([`NETWORK_SOCKET`] in the lab's state folder).
    pub async fn start(
        client: kube::Client,
        socket: &Path,
        namespace: &str,
        service: &str,
        port: &str,
    ) -> std::io::Result<ServiceForward> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = ForwardTarget {
            client,
            socket: socket.to_path_buf(),
            namespace: namespace.to_string(),
            service: service.to_string(),
            port: port.to_string(),
        };
        let target = Arc::new(target);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Err(e) = target.forward(conn).await {
                        tracing::debug!(
                            "lab: forwarding to Service {}/{}: {e}",
                            target.namespace,
                            target.service
                        );
                    }
                });
            }
        });
        Ok(ServiceForward {
            addr,
            _task: AbortOnDrop(task),
        })
    }
}

struct ForwardTarget {
    client: kube::Client,
    socket: PathBuf,
    namespace: String,
    service: String,
    port: String,
}

impl ForwardTarget {
    /// A ready endpoint's address and the port named `self.port`.
    async fn endpoint(&self) -> std::io::Result<SocketAddr> {
        let endpoints = Api::<Endpoints>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(&self.service)
            .await
            .map_err(std::io::Error::other)?;
        endpoints
            .and_then(|e| ready_endpoint(&e, &self.port))
            .ok_or_else(|| {
                std::io::Error::other(format!(
                    "Service {}/{} has no ready endpoint with a port named {}",
                    self.namespace, self.service, self.port
                ))
            })
    }

    async fn forward(&self, mut conn: tokio::net::TcpStream) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let target = self.endpoint().await?;
        let mut upstream = tokio::net::UnixStream::connect(&self.socket).await?;
        upstream
            .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 8192 || upstream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other("the pod network closed the tunnel"));
            }
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(std::io::Error::other(format!(
                "the pod network refused {target}: {}",
                String::from_utf8_lossy(&head).trim()
            )));
        }
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        Ok(())
    }
}

/// The first ready address of `endpoints` with the port named `port`.
fn ready_endpoint(endpoints: &Endpoints, port: &str) -> Option<SocketAddr> {
    endpoints.subsets.iter().flatten().find_map(|subset| {
        let number = subset
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == port)
            .and_then(|p| u16::try_from(p.port).ok())?;
        let ip = subset
            .addresses
            .iter()
            .flatten()
            .find_map(|a| a.ip.parse::<std::net::IpAddr>().ok())?;
        Some(SocketAddr::new(ip, number))
    })
}

fn pod_status(container: &Container, p: &PodProcess) -> Value {
    let ready = if p.ready { "True" } else { "False" };
    let state = match (&p.child, &p.last_exit) {
        (Some(_), _) => json!({"running": {"startedAt": now()}}),
        (None, Some(why)) => {
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off restarting failed container {}: {why}", container.name)}})
        }
        (None, None) => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    // `startedAt` would change every tick: compare without it.
    let state = match state.get("running") {
        Some(_) => json!({"running": {}}),
        None => state,
    };
    json!({
        "phase": if p.child.is_some() || p.restarts > 0 { "Running" } else { "Pending" },
        "podIP": p.pod_ip.to_string(), "podIPs": [{"ip": p.pod_ip.to_string()}],
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready},
            {"type": "ContainersReady", "status": ready}],
        "containerStatuses": [{"name": container.name, "image": container.image.clone().unwrap_or_default(),
            "imageID": "", "ready": p.ready, "restartCount": p.restarts, "state": state}]
    })
}

/// Aborts a task when dropped (the pod network dies with the lab).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `n` distinct free ports on `ip`. Every listener is held until all are
/// picked: a port released and picked again would map two of a pod's
/// declared ports to one (its webhook port answered by its metrics server).
fn free_ports(ip: Ipv4Addr, n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((ip, 0)).expect("a free port on the pod's loopback address"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound listener's address").port())
        .collect()
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_ports_are_mapped_to_the_pods_address_and_nothing_else() {
        let container: Container = serde_json::from_value(json!({
            "name": "controller", "image": "ghcr.io/maeshinshin/ichor-controller:v0.1.0",
            "command": ["/ichor"],
            "args": ["controller", "--http-addr", "0.0.0.0:8080", "--webhook-addr", "0.0.0.0:9443",
                "--resync", "5m", "--other", "10.0.0.1:7000"]
        }))
        .unwrap();
        let ports = BTreeMap::from([(8080, 31000), (9443, 31001)]);
        let ip = Ipv4Addr::new(127, 9, 9, 10);
        assert_eq!(
            command_line(&container, ip, &ports, &[]),
            [
                "controller",
                "--http-addr",
                "127.9.9.10:31000",
                "--webhook-addr",
                "127.9.9.10:31001",
                "--resync",
                "5m",
                "--other",
                "10.0.0.1:7000"
            ]
        );
    }

    #[test]
    fn the_uis_secret_volume_is_projected_and_its_paths_rewritten() {
        let pod: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "ui", "image": "ghcr.io/maeshinshin/ichor-ui:v0.1.0",
                "args": ["ui", "--listen", "0.0.0.0:8443", "--tls-cert", "/etc/ichor-ui/tls/tls.crt",
                    "--tls-key", "/etc/ichor-ui/tls/tls.key", "--tls-ca", "/etc/ichor-ui/ca/ca.crt",
                    "--other", "/etc/ichor-ui/tlsx"],
                "volumeMounts": [{"name": "tls", "mountPath": "/etc/ichor-ui/tls"},
                    {"name": "ca", "mountPath": "/etc/ichor-ui/ca/"}]}],
            "volumes": [{"name": "tls", "secret": {"secretName": "ui-cert"}},
                {"name": "ca", "configMap": {"name": "ui-ca", "items": [{"key": "bundle", "path": "ca.crt"}]}}]
        }))
        .unwrap();
        let container = pod.containers[0].clone();
        let m = mounts(&pod, &container, Path::new("/lab/vol"));
        assert_eq!(
            m.iter().map(|m| &m.source).collect::<Vec<_>>(),
            [
                &VolumeSource::Secret {
                    name: "ui-cert".into(),
                    items: vec![]
                },
                &VolumeSource::ConfigMap {
                    name: "ui-ca".into(),
                    items: vec![("bundle".into(), "ca.crt".into())]
                }
            ]
        );
        let ports = BTreeMap::from([(8443, 31000)]);
        let line = command_line(&container, Ipv4Addr::new(127, 9, 9, 10), &ports, &m);
        assert_eq!(
            line,
            [
                "ui",
                "--listen",
                "127.9.9.10:31000",
                "--tls-cert",
                "/lab/vol/tls/tls.crt",
                "--tls-key",
                "/lab/vol/tls/tls.key",
                "--tls-ca",
                "/lab/vol/ca/ca.crt",
                "--other",
                "/etc/ichor-ui/tlsx"
            ]
        );
        let data = BTreeMap::from([
            ("bundle".to_string(), b"ca".to_vec()),
            ("other".to_string(), b"x".to_vec()),
        ]);
        assert_eq!(
            volume_files(data, &[("bundle".into(), "ca.crt".into())]),
            BTreeMap::from([("ca.crt".to_string(), b"ca".to_vec())])
        );
    }

    #[test]
    fn a_volume_is_swapped_whole_and_unchanged_files_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("tls");
        let first = BTreeMap::from([
            ("tls.crt".to_string(), b"cert-1".to_vec()),
            ("tls.key".to_string(), b"key-1".to_vec()),
        ]);
        atomic_write(&v, &first).unwrap();
        assert_eq!(std::fs::read(v.join("tls.crt")).unwrap(), b"cert-1");
        let data_before = std::fs::read_link(v.join("..data")).unwrap();
        atomic_write(&v, &first).unwrap();
        assert_eq!(std::fs::read_link(v.join("..data")).unwrap(), data_before);

        let second = BTreeMap::from([("tls.crt".to_string(), b"cert-2".to_vec())]);
        atomic_write(&v, &second).unwrap();
        assert_eq!(std::fs::read(v.join("tls.crt")).unwrap(), b"cert-2");
        assert!(!v.join("tls.key").exists(), "a key the Secret lost is gone");
        assert!(!v.join(&data_before).exists(), "the old folder is gone");
    }

    #[test]
    fn a_service_is_reached_at_a_ready_address_and_its_named_port() {
        let e: Endpoints = serde_json::from_value(json!({
            "subsets": [{"addresses": [{"ip": "10.244.1.12"}],
                "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}]}]
        }))
        .unwrap();
        assert_eq!(
            ready_endpoint(&e, "https"),
            Some("10.244.1.12:8443".parse().unwrap())
        );
        assert_eq!(ready_endpoint(&e, "metrics"), None);
        assert_eq!(ready_endpoint(&Endpoints::default(), "https"), None);
    }

    /// A pod's declared ports map to distinct ports of its address, however
    /// many it declares.
    #[test]
    fn a_pods_ports_never_share_a_mapped_port() {
        let ports = free_ports(Ipv4Addr::LOCALHOST, 300);
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 300, "{ports:?}");
    }

    #[test]
    fn a_broken_tag_is_not_run() {
        let c = |image: &str| -> Container {
            serde_json::from_value(json!({"name": "c", "image": image})).unwrap()
        };
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-controller:v0.1.0")));
        assert!(!is_ichors(&c(
            "ghcr.io/maeshinshin/ichor-controller:broken"
        )));
        assert!(!is_ichors(&c("quay.io/cilium/operator-generic:v1.18.5")));
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-ui:v0.1.0")));
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-ui@sha256:0123")));
        assert!(!is_ichors(&c("ghcr.io/maeshinshin/ichor-ui:broken")));
        assert!(!is_ichors(&c("ghcr.io/maeshinshin/ichor-uix:v0.1.0")));
    }
}
