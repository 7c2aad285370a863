//! The lab's kubelet for Ichor's pods: which Deployments it runs, their pods
//! (placed, replaced when evicted, rolled over when the template changes)
//! and each pod's sync (its object, volumes, process, readiness, status).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use super::probe::probe_ready;
use super::process::{PodRun, start_pod_process};
use super::status::{write_deployment_status, write_pod_status};
use super::volumes::{Mount, mounts, project_volume};
use super::{AbortOnDrop, ProcessRunner, runs_deployment};

/// The kubelet's restart back-off: first delay and cap.
pub(super) const BACKOFF_FIRST: Duration = Duration::from_secs(10);
const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// A process that ran this long without exiting starts its back-off afresh.
const BACKOFF_RESET: Duration = Duration::from_secs(600);
/// How long a replaced pod stays up after leaving the endpoints.
const DRAIN: Duration = Duration::from_secs(3);
/// How often a running pod's volumes are written again from their Secrets
/// (the kubelet's sync period is a minute; the lab's tests wait less).
const VOLUME_SYNC: Duration = Duration::from_secs(2);

/// One pod and its process.
pub(super) struct PodProcess {
    pub(super) name: String,
    /// The Node it was placed on (`spec.nodeName`, and the downward API's).
    pub(super) node: String,
    /// The pod's address in the cluster (from its node's pod CIDR).
    pub(super) pod_ip: Ipv4Addr,
    /// The loopback address its process listens on.
    pub(super) ip: Ipv4Addr,
    /// containerPort → the free port the lab gave it on `ip`.
    pub(super) ports: BTreeMap<u16, u16>,
    pub(super) child: Option<tokio::process::Child>,
    pub(super) started_at: Option<Instant>,
    pub(super) restarts: i32,
    pub(super) next_start: Instant,
    pub(super) last_exit: Option<String>,
    pub(super) ready: bool,
    pub(super) last_status: Value,
    /// When its volumes were last written from their Secrets and ConfigMaps.
    pub(super) volumes_synced: Instant,
}

/// The pods of one Deployment, at one template generation.
pub(super) struct DeploymentPods {
    pub(super) generation: i64,
    pub(super) pods: Vec<PodProcess>,
}

/// The lab's kubelet for Ichor's pods; [`IchorPods::sync`] runs once a tick.
pub struct IchorPods {
    runner: ProcessRunner,
    _proxy: Option<AbortOnDrop>,
    pub(super) deployments: HashMap<(String, String), DeploymentPods>,
    /// The pods of a Deployment's previous template, serving until the new
    /// ones are Ready, then drained (out of the endpoints) until the instant.
    pub(super) retiring: HashMap<(String, String), (DeploymentPods, Option<Instant>)>,
    next_ip: u8,
    net: (u8, u8),
    pub(super) published: HashMap<(String, String), Value>,
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
            let placement = Placement {
                node: &node_name,
                pod_cidr: pod_cidr.as_deref(),
            };
            self.sync_deployment(client, &d, &key, placement).await?;
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

    /// One Deployment's tick: its pods at the template's generation (the
    /// older ones retiring), each pod synced, then its status.
    async fn sync_deployment(
        &mut self,
        client: &kube::Client,
        d: &Deployment,
        key: &(String, String),
        placement: Placement<'_>,
    ) -> Result<(), kube::Error> {
        let generation = d.metadata.generation.unwrap_or(1);
        let replicas = usize::try_from(d.spec.replicas.unwrap_or(1)).unwrap_or(0);
        let template = Template::of(&key.0, d);
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), &key.0);

        self.retire_older_generation(client, key, generation).await;
        if !self.deployments.contains_key(key) {
            let pods = (0..replicas)
                .map(|i| format!("{}-g{generation}-{i}", key.1))
                .collect();
            self.start_generation(
                &pods_api,
                key,
                generation,
                pods,
                &template.container,
                placement,
            )
            .await;
        }
        self.replace_evicted(&pods_api, key, &template.container, placement)
            .await?;
        let runner = self.runner.clone();
        let state = self.deployments.get_mut(key).expect("inserted above");
        for p in &mut state.pods {
            sync_pod(client, &runner, &pods_api, &template, p).await?;
        }
        let ready = i32::try_from(state.pods.iter().filter(|p| p.ready).count()).unwrap_or(0);
        if usize::try_from(ready).unwrap_or(0) >= replicas {
            self.drain_retiring(key);
        }
        let replicas = i32::try_from(replicas).unwrap_or(0);
        write_deployment_status(client, d, key, replicas, ready).await
    }

    /// The pods of a Deployment the lab has none of yet (or of a new
    /// template), named `pods`; the simulator's placeholder pod goes, as
    /// the real ones replace it.
    async fn start_generation(
        &mut self,
        pods_api: &Api<Pod>,
        key: &(String, String),
        generation: i64,
        pods: Vec<String>,
        container: &Container,
        placement: Placement<'_>,
    ) {
        let _ = pods_api
            .delete(&format!("{}-simulated", key.1), &DeleteParams::default())
            .await;
        let pods = pods
            .into_iter()
            .map(|name| self.new_pod_process(name, container, placement))
            .collect();
        self.deployments
            .insert(key.clone(), DeploymentPods { generation, pods });
    }

    /// The new pods are Ready: the retiring ones leave the endpoints now,
    /// and stop once calls in flight are done.
    fn drain_retiring(&mut self, key: &(String, String)) {
        if let Some((_, until)) = self.retiring.get_mut(key)
            && until.is_none()
        {
            *until = Some(Instant::now() + DRAIN);
        }
    }

    /// A pod being deleted (an eviction during a drain): its process stops
    /// and the pod object goes, as its kubelet does after the grace period,
    /// and a replacement starts by `placement`, as the Deployment's
    /// ReplicaSet and the scheduler would make it (the drained node is
    /// cordoned, so it is not the one).
    async fn replace_evicted(
        &mut self,
        pods_api: &Api<Pod>,
        key: &(String, String),
        container: &Container,
        placement: Placement<'_>,
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
            let replacement = self.new_pod_process(name, container, placement);
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
        placement: Placement<'_>,
    ) -> PodProcess {
        let (ip, pod_ip) = self.pod_ip(placement.pod_cidr);
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
            node: placement.node.to_string(),
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
}

/// Where new pods go: the node the scheduler would pick, and its pod CIDR
/// (their addresses).
#[derive(Debug, Clone, Copy)]
struct Placement<'a> {
    node: &'a str,
    pod_cidr: Option<&'a str>,
}

/// What every pod of a Deployment's template is made from.
struct Template<'a> {
    ns: &'a str,
    pod_spec: PodSpec,
    /// The pod's one container the lab runs (the first).
    container: Container,
    labels: BTreeMap<String, String>,
    service_account: String,
}

impl<'a> Template<'a> {
    fn of(ns: &'a str, d: &Deployment) -> Template<'a> {
        let template = &d.spec.template;
        let pod_spec = template.spec.clone().unwrap_or_default();
        Template {
            ns,
            container: pod_spec.containers[0].clone(),
            labels: template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            service_account: pod_spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod_spec,
        }
    }
}

/// One pod's tick: its object, its process (started again after the
/// back-off), its volumes kept current, its readiness and its status.
async fn sync_pod(
    client: &kube::Client,
    runner: &ProcessRunner,
    pods_api: &Api<Pod>,
    t: &Template<'_>,
    p: &mut PodProcess,
) -> Result<(), kube::Error> {
    let ns = t.ns;
    if pods_api.get_opt(&p.name).await?.is_none() {
        let node = p.node.clone();
        create_pod_object(pods_api, ns, &t.pod_spec, &t.labels, &node, p).await?;
    }
    p.back_off_if_exited();
    let volumes = runner
        .state_dir
        .join(format!("pod-{ns}-{}-volumes", p.name));
    let mounts = mounts(&t.pod_spec, &t.container, &volumes);
    if p.child.is_some() {
        resync_volumes(client, ns, &mounts, p).await;
    } else if Instant::now() >= p.next_start {
        let pod = PodRun {
            ns,
            service_account: &t.service_account,
            container: &t.container,
            mounts: &mounts,
        };
        start_pod_process(client, runner, &pod, p).await;
    }
    p.ready = p.child.is_some() && probe_ready(&t.container, p).await;
    write_pod_status(pods_api, ns, &t.container, p).await;
    Ok(())
}

/// A changed Secret reaches a running pod (a rotated certificate), every
/// [`VOLUME_SYNC`]; a failure is logged and the pod keeps its files.
async fn resync_volumes(client: &kube::Client, ns: &str, mounts: &[Mount], p: &mut PodProcess) {
    if p.volumes_synced.elapsed() < VOLUME_SYNC {
        return;
    }
    p.volumes_synced = Instant::now();
    for m in mounts {
        if let Err(e) = project_volume(client, ns, m).await {
            let why = ichor_api::error_text::chain(&e);
            tracing::warn!("lab kubelet: pod {ns}/{}: {why}", p.name);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's declared ports map to distinct ports of its address, however
    /// many it declares.
    #[test]
    fn a_pods_ports_never_share_a_mapped_port() {
        let ports = free_ports(Ipv4Addr::LOCALHOST, 300);
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 300, "{ports:?}");
    }
}
