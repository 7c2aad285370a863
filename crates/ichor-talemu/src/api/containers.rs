//! The containers of a node (`talosctl containers`, `containers -k`,
//! `stats`): in containerd's `system` namespace the services Talos runs as
//! containers (apid, trustd, etcd, the kubelet) while they run; in the CRI's
//! `k8s.io` the static pods a control plane runs once etcd was
//! bootstrapped, each a sandbox and its container, with the images of the
//! node's config. No container runs in the lab: these are what a node
//! would show.

use tonic::{Request, Response, Status};

use super::{ADMIN, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::host::{self, PAUSE_IMAGE, Runner};
use crate::journal::ServiceState;
use crate::node::Node;
use crate::wire::machine as wire;

/// containerd's namespace of Talos's own services, and the CRI's.
const SYSTEM: &str = "system";
const K8S: &str = "k8s.io";

/// One container: its id, the pod it belongs to, image, pid, status, name,
/// and the memory it uses (bytes).
struct Ctr {
    id: String,
    pod_id: String,
    image: String,
    pid: u32,
    status: &'static str,
    name: String,
    memory: u64,
}

fn containers_of(node: &Node, namespace: &str) -> Vec<Ctr> {
    let st = node.lock();
    let (Some(facts), Some(config)) = (node.facts_of(&st), st.active.clone()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match namespace {
        SYSTEM => {
            for s in st.journal.services() {
                let Some(def) = host::service(&s.id) else {
                    continue;
                };
                if !matches!(def.runner, Runner::Container { .. })
                    || s.state() != Some(ServiceState::Running)
                {
                    continue;
                }
                out.push(Ctr {
                    id: s.id.clone(),
                    pod_id: s.id.clone(),
                    image: host::service_image(&s.id, &facts, &config),
                    pid: def.pid as u32,
                    status: "RUNNING",
                    name: s.id.clone(),
                    memory: if s.id == "etcd" {
                        190_840_832
                    } else {
                        41_943_040
                    },
                });
            }
        }
        K8S if node.static_pods_run(&st) => {
            let nodename = facts
                .hostname
                .clone()
                .unwrap_or_else(|| node.spec.hostname.clone());
            for (component, image) in host::static_pods(&facts) {
                let (pid, sandbox_pid) = host::static_pod_pids(component);
                let pod = format!("kube-system/{component}-{nodename}");
                out.push(Ctr {
                    id: pod.clone(),
                    pod_id: pod.clone(),
                    image: PAUSE_IMAGE.into(),
                    pid: sandbox_pid,
                    status: "SANDBOX_READY",
                    name: format!("{component}-{nodename}"),
                    memory: 360_448,
                });
                out.push(Ctr {
                    // The container's id changes with its image, as a new
                    // container replaces the old when the manifest changes.
                    id: format!("{pod}:{component}:{}", &host::digest(&image)[..12]),
                    pod_id: pod,
                    image,
                    pid,
                    status: "CONTAINER_RUNNING",
                    name: component.to_string(),
                    memory: if component == "kube-apiserver" {
                        373_293_056
                    } else {
                        77_594_624
                    },
                });
            }
        }
        _ => {}
    }
    out
}

impl NodeApi {
    pub(super) async fn containers_answer(
        &self,
        request: Request<wire::ContainersRequest>,
    ) -> Result<Response<wire::ContainersResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let md = request.metadata().clone();
        let namespace = request.into_inner().namespace;
        let messages = self
            .unary(&md, |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("Containers"));
                }
                let containers = containers_of(node, &namespace)
                    .into_iter()
                    .map(|c| wire::ContainerInfo {
                        namespace: namespace.clone(),
                        internal_id: host::digest(&c.id),
                        uid: if namespace == K8S {
                            host::digest(&c.pod_id)
                        } else {
                            String::new()
                        },
                        id: c.id,
                        image: c.image,
                        pid: c.pid,
                        status: c.status.to_string(),
                        pod_id: c.pod_id,
                        name: c.name,
                        network_namespace: String::new(),
                    })
                    .collect();
                Ok(wire::Container {
                    metadata: None,
                    containers,
                })
            })
            .await?;
        Ok(Response::new(wire::ContainersResponse { messages }))
    }

    pub(super) async fn stats_answer(
        &self,
        request: Request<wire::StatsRequest>,
    ) -> Result<Response<wire::StatsResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let md = request.metadata().clone();
        let namespace = request.into_inner().namespace;
        let messages = self
            .unary(&md, |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("Stats"));
                }
                let stats = containers_of(node, &namespace)
                    .into_iter()
                    .map(|c| wire::Stat {
                        namespace: namespace.clone(),
                        memory_usage: c.memory,
                        // CPU time in nanoseconds: a few seconds each.
                        cpu_usage: c.memory / 16,
                        id: c.id,
                        pod_id: c.pod_id,
                        name: c.name,
                    })
                    .collect();
                Ok(wire::Stats {
                    metadata: None,
                    stats,
                })
            })
            .await?;
        Ok(Response::new(wire::StatsResponse { messages }))
    }
}
