//! What Talos tells of the machine itself (`talosctl memory`, `processes`,
//! `mounts`): the processes of the services and static pods that run (the
//! node's record says which), its system disk's volumes, and fixed,
//! plausible figures for what the lab cannot measure.

use tonic::{Request, Response, Status};

use super::{ADMIN, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::host::{self, MEM_TOTAL_KB, MIB, Runner};
use crate::journal::ServiceState;
use crate::node::{Node, NodeState};
use crate::wire::machine as wire;

/// A 4 GiB machine a quarter of which is in use (kB, as `/proc/meminfo`).
fn meminfo() -> wire::MemInfo {
    wire::MemInfo {
        memtotal: MEM_TOTAL_KB,
        memfree: 2_231_904,
        memavailable: 3_012_456,
        buffers: 4_212,
        cached: 842_160,
        active: 612_088,
        inactive: 701_424,
        activeanon: 455_712,
        inactiveanon: 11_844,
        activefile: 156_376,
        inactivefile: 689_580,
        anonpages: 463_100,
        mapped: 301_352,
        shmem: 11_932,
        slab: 112_488,
        sreclaimable: 51_316,
        sunreclaim: 61_172,
        kernelstack: 8_464,
        pagetables: 6_836,
        commitlimit: 2_014_188,
        committedas: 2_411_024,
        vmalloctotal: 34_359_738_367,
        vmallocused: 24_812,
        hugepagesize: 2_048,
        directmap4k: 169_836,
        directmap2m: 4_024_320,
        ..Default::default()
    }
}

/// One process: pid, parent, executable, arguments, threads, resident MB.
struct Proc {
    pid: i32,
    ppid: i32,
    executable: String,
    args: String,
    threads: i32,
    rss_mb: u64,
}

/// The processes of a configured node: init (machined), then every
/// service that runs as a process or container, then the static pods.
fn processes(node: &Node, st: &NodeState) -> Vec<Proc> {
    let mut out = vec![Proc {
        pid: 1,
        ppid: 0,
        executable: "/sbin/init".into(),
        args: String::new(),
        threads: 14,
        rss_mb: 96,
    }];
    // Not `node.hostname()`: the caller holds the node's lock.
    let hostname = node
        .facts_of(st)
        .and_then(|f| f.hostname)
        .unwrap_or_else(|| node.spec.hostname.clone());
    for s in st.journal.services() {
        if s.state() != Some(ServiceState::Running) {
            continue;
        }
        let Some(def) = host::service(&s.id) else {
            continue;
        };
        let (executable, args, ppid) = match def.runner {
            Runner::Goroutine => continue,
            Runner::Process { executable, args } => (executable.to_string(), args.to_string(), 1),
            Runner::Container { executable } => {
                let args = match def.id {
                    "etcd" => format!(
                        "--name={hostname} --data-dir=/var/lib/etcd --listen-client-urls=https://0.0.0.0:2379 --listen-peer-urls=https://0.0.0.0:2380"
                    ),
                    "kubelet" => "--config=/etc/kubernetes/kubelet.yaml --kubeconfig=/etc/kubernetes/kubeconfig-kubelet --hostname-override=".to_string() + &hostname,
                    _ => String::new(),
                };
                (executable.to_string(), args, 1102)
            }
        };
        let rss_mb = match def.id {
            "etcd" => 182,
            "kubelet" => 121,
            "containerd" | "cri" => 64,
            _ => 38,
        };
        out.push(Proc {
            pid: def.pid,
            ppid,
            executable,
            args,
            threads: 12,
            rss_mb,
        });
    }
    if node.static_pods_run(st)
        && let Some(facts) = node.facts_of(st)
    {
        for (component, _) in host::static_pods(&facts) {
            let (pid, _) = host::static_pod_pids(component);
            out.push(Proc {
                pid: pid as i32,
                ppid: 1298,
                executable: format!("/usr/local/bin/{component}"),
                args: String::new(),
                threads: 10,
                rss_mb: if component == "kube-apiserver" {
                    356
                } else {
                    74
                },
            });
        }
    }
    out
}

/// The mounts of a node: its root image, the memory file systems, and the
/// system disk's STATE and EPHEMERAL volumes.
fn mounts(node: &Node) -> Vec<wire::MountStat> {
    let mut out = vec![
        wire::MountStat {
            filesystem: "/dev/loop0".into(),
            size: 78 * MIB,
            available: 0,
            mounted_on: "/".into(),
        },
        wire::MountStat {
            filesystem: "devtmpfs".into(),
            size: 1_964 * MIB,
            available: 1_964 * MIB,
            mounted_on: "/dev".into(),
        },
        wire::MountStat {
            filesystem: "tmpfs".into(),
            size: 1_967 * MIB,
            available: 1_966 * MIB,
            mounted_on: "/run".into(),
        },
        wire::MountStat {
            filesystem: "tmpfs".into(),
            size: 1_967 * MIB,
            available: 1_967 * MIB,
            mounted_on: "/system".into(),
        },
    ];
    if let Some(disk) = node.spec.disks.first() {
        for (_, _, path, size, _, mount) in host::system_volumes(&disk.dev_path, disk.size) {
            if mount.is_empty() {
                continue;
            }
            out.push(wire::MountStat {
                filesystem: path,
                size,
                // A tenth of each volume in use.
                available: size - size / 10,
                mounted_on: mount.into(),
            });
        }
    }
    out
}

impl NodeApi {
    pub(super) async fn memory_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::MemoryResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("Memory"));
                }
                Ok(wire::Memory {
                    metadata: None,
                    meminfo: Some(meminfo()),
                })
            })
            .await?;
        Ok(Response::new(wire::MemoryResponse { messages }))
    }

    pub(super) async fn processes_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::ProcessesResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("Processes"));
                }
                let st = node.lock();
                let processes = processes(node, &st)
                    .into_iter()
                    .map(|p| {
                        let command = p
                            .executable
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .chars()
                            .take(15)
                            .collect();
                        let args = if p.args.is_empty() {
                            p.executable.clone()
                        } else {
                            format!("{} {}", p.executable, p.args)
                        };
                        wire::ProcessInfo {
                            pid: p.pid,
                            ppid: p.ppid,
                            state: "S".into(),
                            threads: p.threads,
                            cpu_time: 1.5 * f64::from(p.threads),
                            virtual_memory: p.rss_mb * MIB * 9,
                            resident_memory: p.rss_mb * MIB,
                            command,
                            executable: p.executable,
                            args,
                            label: String::new(),
                        }
                    })
                    .collect();
                Ok(wire::Process {
                    metadata: None,
                    processes,
                })
            })
            .await?;
        Ok(Response::new(wire::ProcessesResponse { messages }))
    }

    pub(super) async fn mounts_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::MountsResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("Mounts"));
                }
                Ok(wire::Mounts {
                    metadata: None,
                    stats: mounts(node),
                })
            })
            .await?;
        Ok(Response::new(wire::MountsResponse { messages }))
    }
}
