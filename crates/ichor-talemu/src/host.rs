//! The emulated host: the services Talos runs on a node (how each runs and
//! under which process id), what a boot, an etcd start or a kubelet restart
//! leaves in the node's record ([`Journal`]), the static pods a control
//! plane runs, and fixed, plausible figures for what an emulator cannot
//! measure (memory, process sizes, volumes).

use std::time::SystemTime;

use crate::derive::ConfigFacts;
use crate::journal::{HEALTHY, Journal, ServiceEvents, ServiceState, klog_time, rfc3339_nanos};

/// How Talos runs a service.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Runner {
    /// Inside machined.
    Goroutine,
    /// A process machined starts.
    Process {
        executable: &'static str,
        args: &'static str,
    },
    /// A container in containerd's `system` namespace.
    Container { executable: &'static str },
}

/// A service of a configured Talos node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServiceDef {
    pub id: &'static str,
    pub runner: Runner,
    /// Talos checks its health (a service without a check shows `?`).
    pub health_check: bool,
    pub control_plane_only: bool,
    pub pid: i32,
}

/// The services of a configured Talos v1.13 node, sorted by id.
pub(crate) const SERVICES: &[ServiceDef] = &[
    ServiceDef {
        id: "apid",
        runner: Runner::Container {
            executable: "/apid",
        },
        health_check: true,
        control_plane_only: false,
        pid: 1531,
    },
    ServiceDef {
        id: "auditd",
        runner: Runner::Goroutine,
        health_check: false,
        control_plane_only: false,
        pid: 1,
    },
    ServiceDef {
        id: "containerd",
        runner: Runner::Process {
            executable: "/bin/containerd",
            args: "--address /system/run/containerd/containerd.sock --state /system/run/containerd --root /system/var/lib/containerd",
        },
        health_check: true,
        control_plane_only: false,
        pid: 1102,
    },
    ServiceDef {
        id: "cri",
        runner: Runner::Process {
            executable: "/bin/containerd",
            args: "--address /run/containerd/containerd.sock --config /etc/cri/containerd.toml",
        },
        health_check: true,
        control_plane_only: false,
        pid: 1298,
    },
    ServiceDef {
        id: "dashboard",
        runner: Runner::Process {
            executable: "/sbin/dashboard",
            args: "",
        },
        health_check: false,
        control_plane_only: false,
        pid: 1305,
    },
    ServiceDef {
        id: "etcd",
        runner: Runner::Container {
            executable: "/usr/local/bin/etcd",
        },
        health_check: true,
        control_plane_only: true,
        pid: 1754,
    },
    ServiceDef {
        id: "kubelet",
        runner: Runner::Container {
            executable: "/usr/local/bin/kubelet",
        },
        health_check: true,
        control_plane_only: false,
        pid: 1689,
    },
    ServiceDef {
        id: "machined",
        runner: Runner::Goroutine,
        health_check: false,
        control_plane_only: false,
        pid: 1,
    },
    ServiceDef {
        id: "syslogd",
        runner: Runner::Goroutine,
        health_check: false,
        control_plane_only: false,
        pid: 1,
    },
    ServiceDef {
        id: "trustd",
        runner: Runner::Container {
            executable: "/trustd",
        },
        health_check: true,
        control_plane_only: true,
        pid: 1542,
    },
    ServiceDef {
        id: "udevd",
        runner: Runner::Process {
            executable: "/sbin/udevd",
            args: "--resolve-names=never",
        },
        health_check: true,
        control_plane_only: false,
        pid: 1009,
    },
];

/// A service's definition.
pub(crate) fn service(id: &str) -> Option<&'static ServiceDef> {
    SERVICES.iter().find(|s| s.id == id)
}

/// The etcd image Talos v1.13 runs unless the config names one.
pub(crate) const DEFAULT_ETCD_IMAGE: &str = "registry.k8s.io/etcd:v3.6.12";
/// The pod sandbox image of the CRI.
pub(crate) const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// The Linux version line of the emulated kernel.
pub(crate) const KERNEL: &str = "6.12.57-talos";

/// The image a service's container runs.
pub(crate) fn service_image(id: &str, facts: &ConfigFacts, config: &[u8]) -> String {
    match id {
        "etcd" => {
            crate::derive::etcd_image(config).unwrap_or_else(|| DEFAULT_ETCD_IMAGE.to_string())
        }
        "kubelet" => facts.kubelet_image.clone(),
        other => format!("talos/{other}"),
    }
}

/// The static pods a control plane runs once etcd runs: (component, image).
pub(crate) fn static_pods(facts: &ConfigFacts) -> Vec<(&'static str, String)> {
    vec![
        ("kube-apiserver", facts.apiserver_image.clone()),
        (
            "kube-controller-manager",
            facts.controller_manager_image.clone(),
        ),
        ("kube-scheduler", facts.scheduler_image.clone()),
    ]
}

/// The process id of a static pod's container and of its sandbox.
pub(crate) fn static_pod_pids(component: &str) -> (u32, u32) {
    match component {
        "kube-apiserver" => (2105, 2042),
        "kube-controller-manager" => (2131, 2046),
        _ => (2157, 2051),
    }
}

/// A short, stable hex digest (FNV-1a) of `text`.
pub(crate) fn digest(text: &str) -> String {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{h:016x}")
}

/// What the node boots into.
pub(crate) struct Boot<'a> {
    pub talos_version: &'a str,
    pub boot_id: &'a str,
    /// The active config and its facts (`None`: maintenance mode).
    pub configured: Option<(&'a [u8], &'a ConfigFacts)>,
    /// etcd holds the cluster's data (it was bootstrapped and this node's
    /// member has started).
    pub etcd_runs: bool,
    /// The member id of this node's etcd member.
    pub member_id: u64,
}

/// The record of a boot: the kernel's first lines, machined's, and every
/// service starting (in maintenance mode: only the maintenance service).
pub(crate) fn record_boot(j: &mut Journal, boot: &Boot<'_>) {
    j.kernel(format!(
        "Linux version {KERNEL} (emulated by the lab's ichor-talemu)"
    ));
    j.kernel(
        "Command line: talos.platform=metal console=ttyS0 init_on_alloc=1 slab_nomerge pti=on",
    );
    j.talos(format!("booting Talos {}", boot.talos_version));
    j.talos(format!("boot id {}", boot.boot_id));
    match boot.configured {
        None => {
            j.talos("machine config is not found, entering the maintenance service");
            j.service(
                "machined",
                ServiceState::Running,
                "Service started as goroutine",
            );
            j.talos("maintenance service started: apply a machine config with talosctl apply-config --insecure");
        }
        Some((config, facts)) => {
            j.talos("loaded the machine config from the STATE partition");
            record_services_start(j, config, facts, boot.etcd_runs, boot.member_id);
            j.talos("boot sequence: done");
        }
    }
}

/// Every service of a configured node starts: etcd only runs when the
/// cluster was bootstrapped (it waits in `Preparing` until then).
pub(crate) fn record_services_start(
    j: &mut Journal,
    config: &[u8],
    facts: &ConfigFacts,
    etcd_runs: bool,
    member_id: u64,
) {
    let control_plane = facts.machine_type.is_control_plane();
    for s in SERVICES {
        if s.control_plane_only && !control_plane {
            continue;
        }
        match s.id {
            "etcd" => {
                j.service(
                    "etcd",
                    ServiceState::Waiting,
                    "Waiting for service \"cri\" to be \"up\"",
                );
                j.service("etcd", ServiceState::Preparing, "Running pre state");
                if etcd_runs {
                    record_etcd_start(j, config, member_id, false);
                }
            }
            "kubelet" => record_kubelet_start(j, facts),
            _ => record_start(j, s, ""),
        }
    }
}

/// A service starts as its runner does, then passes its health check.
fn record_start(j: &mut Journal, s: &ServiceDef, image: &str) {
    match s.runner {
        Runner::Goroutine => j.service(s.id, ServiceState::Running, "Service started as goroutine"),
        Runner::Process { executable, args } => {
            let argv: Vec<String> = std::iter::once(executable)
                .chain(args.split_whitespace())
                .map(|a| format!("{a:?}"))
                .collect();
            j.service(
                s.id,
                ServiceState::Running,
                format!(
                    "Process Process([{}]) started with PID {}",
                    argv.join(" "),
                    s.pid
                ),
            );
        }
        Runner::Container { .. } => {
            j.service(s.id, ServiceState::Preparing, "Running pre state");
            j.service(s.id, ServiceState::Preparing, "Creating service runner");
            let what = if image.is_empty() {
                String::new()
            } else {
                format!(" ({image})")
            };
            j.service(
                s.id,
                ServiceState::Running,
                format!(
                    "Started task {} (PID {}) for container {}{what}",
                    s.id, s.pid, s.id
                ),
            );
        }
    }
    if s.health_check {
        j.service(s.id, ServiceState::Running, HEALTHY);
    }
}

/// The kubelet starts with the image its config names.
pub(crate) fn record_kubelet_start(j: &mut Journal, facts: &ConfigFacts) {
    let Some(s) = service("kubelet") else {
        return;
    };
    record_start(j, s, &facts.kubelet_image);
    let now = SystemTime::now();
    let version = facts
        .kubelet_image
        .rsplit_once(':')
        .map_or("", |(_, tag)| tag);
    j.output(
        "kubelet",
        format!(
            "I{} {:>7} server.go:530] \"Kubelet version\" kubeletVersion=\"{version}\" image=\"{}\"",
            klog_time(now),
            s.pid,
            facts.kubelet_image
        ),
    );
    j.output(
        "kubelet",
        format!(
            "I{} {:>7} kubelet.go:2418] \"Started kubelet\"",
            klog_time(now),
            s.pid
        ),
    );
}

/// The kubelet restarts because its config changed (a new image).
pub(crate) fn record_kubelet_restart(j: &mut Journal, facts: &ConfigFacts) {
    j.service(
        "kubelet",
        ServiceState::Stopping,
        "Service is being restarted: the kubelet's config changed",
    );
    j.service(
        "kubelet",
        ServiceState::Finished,
        "Service finished successfully",
    );
    record_kubelet_start(j, facts);
}

/// etcd starts: a new cluster on the node that bootstrapped it, a member
/// joining on the others.
pub(crate) fn record_etcd_start(j: &mut Journal, config: &[u8], member_id: u64, bootstrap: bool) {
    let Some(s) = service("etcd") else {
        return;
    };
    let image = crate::derive::etcd_image(config).unwrap_or_else(|| DEFAULT_ETCD_IMAGE.to_string());
    j.service("etcd", ServiceState::Preparing, "Creating service runner");
    j.service(
        "etcd",
        ServiceState::Running,
        format!(
            "Started task etcd (PID {}) for container etcd ({image})",
            s.pid
        ),
    );
    let ts = rfc3339_nanos(SystemTime::now());
    let what = if bootstrap {
        "starting a new etcd cluster from this member (bootstrap)"
    } else {
        "starting the member of the existing etcd cluster"
    };
    j.output(
        "etcd",
        format!("{{\"level\":\"info\",\"ts\":\"{ts}\",\"msg\":\"{what}\",\"local-member-id\":\"{member_id:x}\"}}"),
    );
    j.output(
        "etcd",
        format!("{{\"level\":\"info\",\"ts\":\"{ts}\",\"msg\":\"serving client traffic securely\",\"address\":\"[::]:2379\"}}"),
    );
    j.service("etcd", ServiceState::Running, HEALTHY);
}

/// The etcd member stops answering (a fault a test injects), or answers again.
pub(crate) fn record_etcd_fault(j: &mut Journal, config: &[u8], member_id: u64, failing: bool) {
    if failing {
        j.service(
            "etcd",
            ServiceState::Failed,
            "Failed running service: the etcd member has not started",
        );
        j.service("etcd", ServiceState::Preparing, "Running pre state");
    } else {
        record_etcd_start(j, config, member_id, false);
    }
}

/// A service's health, as Talos reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Health {
    /// Not checked (yet): a service without a check, or one not running.
    pub unknown: bool,
    pub healthy: bool,
    pub last_message: String,
    pub last_change: Option<SystemTime>,
}

/// The health of a service from its state changes: healthy once a running
/// service passed its check, failing when it failed, unknown otherwise.
pub(crate) fn health(s: &ServiceEvents) -> Health {
    let checked = service(&s.id).is_some_and(|d| d.health_check);
    let unknown = Health {
        unknown: true,
        healthy: false,
        last_message: String::new(),
        last_change: None,
    };
    let Some((at, state, msg)) = s.events.last() else {
        return unknown;
    };
    match state {
        ServiceState::Running if checked && msg == HEALTHY => Health {
            unknown: false,
            healthy: true,
            last_message: String::new(),
            last_change: Some(*at),
        },
        ServiceState::Failed => Health {
            unknown: false,
            healthy: false,
            last_message: msg.clone(),
            last_change: Some(*at),
        },
        _ => unknown,
    }
}

/// The memory of every emulated node, in kB as `/proc/meminfo` counts it:
/// a 4 GiB machine, a quarter of it in use.
pub(crate) const MEM_TOTAL_KB: u64 = 4_028_380;

/// The kinds of volumes Talos makes on its system disk, with the size each
/// takes (the EPHEMERAL one gets the rest).
pub(crate) const SYSTEM_PARTITIONS: &[(&str, u64, &str)] = &[
    ("EFI", 1_101 * MIB, "vfat"),
    ("META", MIB, ""),
    ("STATE", 100 * MIB, "xfs"),
];

pub(crate) const MIB: u64 = 1024 * 1024;

/// The volumes of a node's system disk: (label, partition number, device
/// path, size, filesystem, mount point), EPHEMERAL last with the rest of
/// the disk (less the partition table's overhead).
pub(crate) fn system_volumes(
    disk_path: &str,
    disk_size: u64,
) -> Vec<(&'static str, u32, String, u64, &'static str, &'static str)> {
    let part = |n: u32| {
        let sep = if disk_path.ends_with(|c: char| c.is_ascii_digit()) {
            "p"
        } else {
            ""
        };
        format!("{disk_path}{sep}{n}")
    };
    let mut out = Vec::new();
    let mut used = 10 * MIB;
    for (i, (label, size, fs)) in SYSTEM_PARTITIONS.iter().enumerate() {
        let mount = match *label {
            "STATE" => "/system/state",
            _ => "",
        };
        out.push((*label, i as u32 + 1, part(i as u32 + 1), *size, *fs, mount));
        used += size;
    }
    out.push((
        "EPHEMERAL",
        SYSTEM_PARTITIONS.len() as u32 + 1,
        part(SYSTEM_PARTITIONS.len() as u32 + 1),
        disk_size.saturating_sub(used),
        "xfs",
        "/var",
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ephemeral_takes_the_rest_of_the_system_disk() {
        let v = system_volumes("/dev/vda", 10 * 1024 * MIB);
        assert_eq!(v.last().unwrap().0, "EPHEMERAL");
        assert_eq!(v.last().unwrap().2, "/dev/vda4");
        let total: u64 = v.iter().map(|x| x.3).sum();
        assert_eq!(total + 10 * MIB, 10 * 1024 * MIB);
        assert_eq!(
            system_volumes("/dev/nvme0n1", 20 * 1024 * MIB)[3].2,
            "/dev/nvme0n1p4"
        );
    }

    #[test]
    fn services_are_sorted_by_id() {
        let ids: Vec<&str> = SERVICES.iter().map(|s| s.id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted);
    }
}
