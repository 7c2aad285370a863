//! The TalosCluster controller end to end: the CNI hand-over against a
//! Cilium release record written by ichor-cilium (the stand-in chart, real
//! helm v4 for the render) on the test control plane, and the
//! IchorInstallation singleton.

use crate::common::*;
use ichor_api::conditions::{self, reasons, types};
use ichor_api::{DetectedCni, INSTALLATION_NAME, IchorInstallation, Manager, TalosCluster};
use ichor_testenv::TestEnv;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn cluster(ns: &str, name: &str, tunnel: &str) -> TalosCluster {
    serde_json::from_value(json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": ns, "annotations": {"ichor.maesh.dev/adopted": "true"}},
        "spec": {"endpoint": "https://10.0.0.10:6443", "talosVersion": "v1.12.1", "kubernetesVersion": "v1.34.1",
            "secretsRef": {"name": "bundle"},
            "cni": {"preset": "cilium", "tunnel": tunnel, "kubeProxy": "replaced"}}
    }))
    .unwrap()
}

fn handover(c: &TalosCluster) -> Option<(String, String, String)> {
    c.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::CNI_HANDOVER))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn detected(c: &TalosCluster) -> Option<DetectedCni> {
    c.status
        .as_ref()
        .and_then(|s| s.cni.as_ref())
        .and_then(|c| c.detected)
}

/// R1.5e: the release `cilium` deployed (record in the storage
/// namespace) at the effective-values hash of the TalosCluster and its
/// DaemonSet Ready → `CNIHandover=True`, and no Job is created because the
/// hash matches. Before that: WaitingForRelease, then WaitingForDaemonSet.
/// `status.cni.detected` is cilium from the moment the release is deployed.
/// A cluster whose values hash differs stays `CNIHandover=False` with
/// WaitingForRelease, naming both hashes (the ichor-cni Job is not part of this test).
/// Covers: R1.5e, R2.2, R1.4d
#[tokio::test]
async fn handover_is_set_when_the_record_matches_and_no_job_is_created() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("handover").await;
    let rel = env.namespace("handover-kube").await;
    crds(&client).await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, "adopted", "vxlan"))
        .await
        .unwrap();
    let running = start(client.clone(), config(&ns, &rel));

    wait_for("CNIHandover=False WaitingForRelease", || async {
        clusters.get("adopted").await.is_ok_and(|c| {
            handover(&c).is_some_and(|(s, r, _)| s == "False" && r == reasons::WAITING_FOR_RELEASE)
        })
    })
    .await;
    let c = clusters.get("adopted").await.unwrap();
    assert_eq!(detected(&c), Some(DetectedCni::None));

    // Seed Ichor's release the way the CLI does: the effective values of the
    // object as written (no Nodes, no TalosMachines: a node count of 0).
    seed_cilium(&client, &c, 0, &ns, &rel).await;

    wait_for(
        "CNIHandover=False WaitingForDaemonSet and detected cilium",
        || async {
            clusters.get("adopted").await.is_ok_and(|c| {
                handover(&c).is_some_and(|(_, r, _)| r == reasons::WAITING_FOR_DAEMON_SET)
                    && detected(&c) == Some(DetectedCni::Cilium)
            })
        },
    )
    .await;

    mark_daemonset_ready(&client, &rel).await;
    wait_for("CNIHandover=True", || async {
        clusters.get("adopted").await.is_ok_and(|c| {
            handover(&c).is_some_and(|(s, r, _)| s == "True" && r == reasons::HANDED_OVER)
        })
    })
    .await;

    // Another cluster whose effective values differ (geneve): not handed over.
    clusters
        .create(&PostParams::default(), &cluster(&ns, "other", "geneve"))
        .await
        .unwrap();
    wait_for("the other cluster to wait for its release", || async {
        clusters.get("other").await.is_ok_and(|c| {
            handover(&c).is_some_and(|(s, r, m)| {
                s == "False"
                    && r == reasons::WAITING_FOR_RELEASE
                    && m.contains("ichor cni helm apply")
            })
        })
    })
    .await;

    let jobs = Api::<Job>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        jobs.items.is_empty(),
        "the controller created a Job: {:?}",
        jobs.items
            .iter()
            .map(|j| j.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    running.stop().await.unwrap();
    let c = clusters.get("adopted").await.unwrap();
    assert_eq!(
        c.metadata.generation,
        Some(1),
        "the controller never writes spec"
    );
}

/// Deployed by Helm and the singleton absent: the controller creates it
/// once with manager helm; a second start finds it and leaves it as it is.
/// Covers: R5.2
#[tokio::test]
async fn helm_deployment_creates_the_installation_once() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("inst-helm").await;
    crds(&client).await;
    let api = Api::<IchorInstallation>::namespaced(client.clone(), &ns);
    let mut cfg = config(&ns, &ns);
    cfg.deployed_by = ichor_controller::DeployedBy::Helm;
    cfg.version = "v0.1.0".into();
    let created = ichor_controller::installation::ensure(&client, &cfg)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(created.spec.deployment.manager, Manager::Helm);
    assert_eq!(created.spec.version, "v0.1.0");

    // Through the whole controller, a second time: the same object.
    let running = start(client.clone(), cfg.clone());
    let again = ichor_controller::installation::ensure(&client, &cfg)
        .await
        .unwrap()
        .unwrap();
    running.stop().await.unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.uid, created.metadata.uid);
    assert_eq!(list.items[0].spec, created.spec);
    let st = list.items[0].status.clone().unwrap();
    assert_eq!(st.installed_version.as_deref(), Some("v0.1.0"));
    assert!(conditions::is_true(&st.conditions, types::READY));
    assert_eq!(again.metadata.uid, created.metadata.uid);
}

/// Not deployed by Helm and no IchorInstallation: nothing is created and the
/// controller reconciles as usual.
/// Covers: R4.3f
#[tokio::test]
async fn installer_deployment_tolerates_no_installation() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("inst-none").await;
    crds(&client).await;
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, "c", "vxlan"))
        .await
        .unwrap();
    let running = start(client.clone(), config(&ns, &ns));
    wait_for("the cluster's status", || async {
        clusters.get("c").await.is_ok_and(|c| {
            c.status.as_ref().is_some_and(|s| {
                s.observed_generation == Some(1)
                    && conditions::find(&s.conditions, types::READY).is_some()
            })
        })
    })
    .await;
    running.stop().await.unwrap();
    let api = Api::<IchorInstallation>::namespaced(client.clone(), &ns);
    assert!(api.get_opt(INSTALLATION_NAME).await.unwrap().is_none());
}

/// Leader election: one holder at a time; a released Lease is taken at once.
#[tokio::test]
async fn one_leader_at_a_time() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease").await;
    let settings = |id: &str| ichor_controller::LeaderElection {
        lease_name: "ichor-controller".into(),
        identity: id.into(),
        lease_duration: std::time::Duration::from_secs(15),
        renew_deadline: std::time::Duration::from_secs(10),
        renew_interval: std::time::Duration::from_millis(500),
    };
    let a = ichor_controller::leader::Elector::new(client.clone(), &ns, settings("a"));
    let b = ichor_controller::leader::Elector::new(client.clone(), &ns, settings("b"));
    let held = a.acquire().await.unwrap();
    assert!(
        !b.try_acquire().await.unwrap(),
        "b must not lead while a does"
    );
    held.release().await;
    assert!(b.try_acquire().await.unwrap(), "b takes a released Lease");
    assert!(!a.try_acquire().await.unwrap());
}

/// Two controllers with leader election on one Lease: only the holder
/// reconciles; when it stops it hands the Lease back and the other one takes
/// over and reconciles what comes next.
#[tokio::test]
async fn the_second_replica_takes_over_when_the_leader_stops() {
    use k8s_openapi::api::coordination::v1::Lease;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("leaders").await;
    crds(&client).await;
    let with_identity = |id: &str| {
        let mut c = config(&ns, &ns);
        c.leader_election = Some(ichor_controller::LeaderElection {
            lease_name: "ichor-controller".into(),
            identity: id.into(),
            lease_duration: std::time::Duration::from_secs(15),
            renew_deadline: std::time::Duration::from_secs(10),
            renew_interval: std::time::Duration::from_millis(500),
        });
        c
    };
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let holder = || async {
        leases
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity))
    };
    let a = start(client.clone(), with_identity("replica-a"));
    wait_for("replica-a to lead", || async {
        holder().await.as_deref() == Some("replica-a")
    })
    .await;
    let b = start(client.clone(), with_identity("replica-b"));

    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, "first", "vxlan"))
        .await
        .unwrap();
    wait_for("the leader to reconcile the first cluster", || async {
        clusters
            .get("first")
            .await
            .is_ok_and(|c| c.status.is_some())
    })
    .await;
    assert_eq!(holder().await.as_deref(), Some("replica-a"));

    a.stop().await.unwrap();
    wait_for("replica-b to take the Lease", || async {
        holder().await.as_deref() == Some("replica-b")
    })
    .await;
    clusters
        .create(&PostParams::default(), &cluster(&ns, "second", "vxlan"))
        .await
        .unwrap();
    wait_for("the new leader to reconcile the second cluster", || async {
        clusters
            .get("second")
            .await
            .is_ok_and(|c| c.status.is_some())
    })
    .await;
    b.stop().await.unwrap();
    assert_eq!(
        holder().await,
        None,
        "a stopped leader hands the Lease back"
    );
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The controller serves `/healthz`, `/readyz` and `/metrics` on its HTTP
/// address; the metrics count its reconciles and say it leads.
#[tokio::test]
async fn health_and_metrics_are_served() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("metrics").await;
    crds(&client).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cfg = config(&ns, &ns);
    cfg.http_addr = Some(addr);
    let clusters = Api::<TalosCluster>::namespaced(client.clone(), &ns);
    clusters
        .create(&PostParams::default(), &cluster(&ns, "m", "vxlan"))
        .await
        .unwrap();
    let running = start(client.clone(), cfg);
    wait_for("the cluster's status", || async {
        clusters.get("m").await.is_ok_and(|c| c.status.is_some())
    })
    .await;
    wait_for("the HTTP server", || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let metrics = http_get(addr, "/metrics").await;
    assert!(
        metrics.contains("ichor_reconciles_total{controller=\"taloscluster\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("ichor_leader 1"), "{metrics}");
    running.stop().await.unwrap();
}

/// A leader whose Lease is taken (its renewal finds another holder) stops
/// with an error that says so, rather than acting as a second leader.
#[tokio::test]
async fn a_leader_that_loses_its_lease_stops() {
    use k8s_openapi::api::coordination::v1::Lease;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease-lost").await;
    crds(&client).await;
    let mut cfg = config(&ns, &ns);
    cfg.leader_election = Some(ichor_controller::LeaderElection {
        lease_name: "ichor-controller".into(),
        identity: "victim".into(),
        lease_duration: std::time::Duration::from_secs(15),
        renew_deadline: std::time::Duration::from_secs(10),
        renew_interval: std::time::Duration::from_millis(300),
    });
    let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(ichor_controller::run_with(
        client.clone(),
        cfg,
        async move {
            let _ = rx.await;
        },
    ));
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    wait_for("the victim to lead", || async {
        leases
            .get_opt("ichor-controller")
            .await
            .unwrap()
            .is_some_and(|l| l.spec.and_then(|s| s.holder_identity).as_deref() == Some("victim"))
    })
    .await;
    // Another replica takes the Lease (as after a partition).
    wait_for("the thief to take the Lease", || async {
        let mut l = leases.get("ichor-controller").await.unwrap();
        let spec = l.spec.as_mut().unwrap();
        spec.holder_identity = Some("thief".into());
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        spec.lease_duration_seconds = Some(3600);
        leases
            .replace("ichor-controller", &PostParams::default(), &l)
            .await
            .is_ok()
    })
    .await;
    let result = tokio::time::timeout(WAIT, task)
        .await
        .expect("the controller stops")
        .unwrap();
    let err = result.unwrap_err();
    assert!(
        matches!(err, ichor_controller::Error::LostLeadership { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("another replica holds the Lease"),
        "{err}"
    );
}

/// A TCP forwarder to the API server that can be frozen: bytes stop moving
/// both ways (connections stay open), as on a hanging connection.
struct FreezableProxy {
    url: String,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezableProxy {
    async fn start(upstream: &str) -> Self {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let upstream = upstream.trim_start_matches("https://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                    ),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    let flag = flag.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            while flag.load(Ordering::SeqCst) {
                                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                            }
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while flag.load(Ordering::SeqCst) {
                                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        FreezableProxy { url, frozen, task }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Fencing: the leader's connection to the API server hangs (the lab froze
/// it; Ichor's elector does the rest). The leader stops leading — its
/// `lost` fires, which makes `run_with` drop every reconcile and so every
/// write — before the other replica, which reaches the API server, takes
/// the Lease. Wall clocks play no part: the challenger times the Lease by
/// its own clock from when it saw the record change.
/// Covers: R18.4
#[tokio::test]
async fn a_leader_whose_connection_hangs_stops_before_another_takes_over() {
    use ichor_controller::leader::Elector;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lease-frozen").await;
    let proxy = FreezableProxy::start(env.server_url()).await;
    let mut through_proxy = env.kube_config().await.unwrap();
    through_proxy.cluster_url = proxy.url.parse().unwrap();
    let leader_client = kube::Client::try_from(through_proxy).unwrap();
    let settings = |id: &str| ichor_controller::LeaderElection {
        lease_name: "ichor-controller".into(),
        identity: id.into(),
        lease_duration: std::time::Duration::from_secs(4),
        renew_deadline: std::time::Duration::from_secs(2),
        renew_interval: std::time::Duration::from_millis(200),
    };
    let a = Elector::new(leader_client, &ns, settings("a"));
    let b = Elector::new(client.clone(), &ns, settings("b"));
    let mut held = a.acquire().await.unwrap();
    assert!(
        !b.try_acquire().await.unwrap(),
        "b must wait while a renews"
    );
    // Let a renew a few times through the proxy, then freeze it.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    proxy.freeze();
    let challenger = tokio::spawn(async move {
        let held = b.acquire().await.unwrap();
        (std::time::Instant::now(), held)
    });
    let lost = tokio::time::timeout(WAIT, held.lost())
        .await
        .expect("the leader gives up");
    let lost_at = std::time::Instant::now();
    let (taken_at, _b) = tokio::time::timeout(WAIT, challenger)
        .await
        .expect("the other replica takes over")
        .unwrap();
    assert!(
        matches!(lost, ichor_controller::Error::LostLeadership { .. }),
        "{lost}"
    );
    assert!(
        lost_at < taken_at,
        "the old leader stopped {:?} after the new one took over",
        lost_at - taken_at
    );
}
