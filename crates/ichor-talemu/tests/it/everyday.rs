//! The everyday talosctl commands an operator types, with the real
//! `talosctl` against emulated nodes: each answer comes from the node's
//! state, which the test changes through the Talos API first (a config
//! applied, etcd bootstrapped, a reboot, an upgrade), and what the lab does
//! not emulate says so by name.

use std::net::IpAddr;
use std::time::Duration;

use crate::common::talosctl::{Talosctl, insecure, line_with};
use ichor_talemu::{Disk, Emulator, EtcdAlarm, NodeSpec};

fn at(a: u8, b: u8) -> IpAddr {
    IpAddr::from([127, 0, a, b])
}

/// Writes `config` to `dir/name` and gives its path.
fn file(dir: &std::path::Path, name: &str, config: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, config).unwrap();
    path.to_str().unwrap().to_string()
}

/// Waits (bounded by a count) until node `i`'s boot id differs from `boot`.
async fn until_rebooted(emu: &Emulator, i: usize, boot: &str) {
    for _ in 0..100 {
        if emu.boot_id(i) != boot {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("node {i} did not come back from its reboot");
}

/// A control plane in maintenance mode (node 0) and a configured worker:
/// the control plane takes its config through the insecure API.
async fn fresh_control_plane_and_worker(dir: &std::path::Path) -> (Emulator, Talosctl) {
    let emu = Emulator::start(vec![
        NodeSpec::maintenance("cp-1").with_address(at(1, 10)),
        NodeSpec::new("w-1", crate::common::worker_v112()).with_address(at(1, 20)),
    ])
    .await
    .unwrap();
    let cp = file(dir, "cp.yaml", &crate::common::cp_v112());
    let run = insecure(&emu, 0, dir, &["apply-config", "--insecure", "-f", &cp]).await;
    assert!(run.ok, "{run}");
    let talosctl = Talosctl::admin(&emu, dir);
    (emu, talosctl)
}

/// `talosctl services` and `talosctl service etcd|kubelet`: etcd waits in
/// `Preparing` until the cluster is bootstrapped, then runs and passes its
/// health check (its log says it started a new cluster); the kubelet runs
/// from the start; a worker has no etcd.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn services_show_etcd_preparing_before_a_bootstrap_and_running_after() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, talosctl) = fresh_control_plane_and_worker(dir.path()).await;
    let cp = "127.0.1.10";

    let run = talosctl.on(cp, &["services"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["etcd"]).contains("Preparing"),
        "{run}"
    );
    let kubelet = line_with(&run.stdout, &["kubelet"]);
    assert!(
        kubelet.contains("Running") && kubelet.contains("OK"),
        "{run}"
    );
    for service in ["apid", "containerd", "cri", "machined", "trustd", "udevd"] {
        assert!(
            line_with(&run.stdout, &[service]).contains("Running"),
            "{run}"
        );
    }

    let run = talosctl.on(cp, &["service", "etcd"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["STATE"]).contains("Preparing"),
        "{run}"
    );
    assert!(line_with(&run.stdout, &["HEALTH"]).contains('?'), "{run}");
    assert!(run.stdout.contains("Running pre state"), "{run}");

    let run = talosctl.on(cp, &["etcd", "status"]).await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("not running"), "{run}");

    let run = talosctl.on(cp, &["bootstrap"]).await;
    assert!(run.ok, "{run}");

    let run = talosctl.on(cp, &["service", "etcd"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["STATE"]).contains("Running"),
        "{run}"
    );
    assert!(line_with(&run.stdout, &["HEALTH"]).contains("OK"), "{run}");
    assert!(run.stdout.contains("Started task etcd"), "{run}");
    let run = talosctl.on(cp, &["service", "kubelet"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["STATE"]).contains("Running"),
        "{run}"
    );
    let run = talosctl.on(cp, &["logs", "etcd"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("starting a new etcd cluster"), "{run}");

    let run = talosctl.on("127.0.1.20", &["services"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("etcd"), "{run}");
    assert!(
        line_with(&run.stdout, &["kubelet"]).contains("Running"),
        "{run}"
    );
    let run = talosctl.on("127.0.1.20", &["service", "etcd"]).await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("not registered"), "{run}");
}

/// The ID of `host`'s member in `talosctl etcd members`' table.
fn member_id(members: &str, host: &str) -> String {
    line_with(members, &[host])
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

/// `talosctl etcd status` and `etcd alarm list|disarm` on three control
/// planes agree with `etcd members`: each node's member id, one leader
/// (another after it forfeits its leadership), an alarm raised on one member
/// listed by every node until it is disarmed.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn etcd_status_and_alarms_agree_with_the_members() {
    let emu = Emulator::start(
        (1..=3u8)
            .map(|i| {
                NodeSpec::new(format!("cp-{i}"), crate::common::cp_v112())
                    .with_address(at(2, 10 + i))
            })
            .collect(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());
    let all = "127.0.2.11,127.0.2.12,127.0.2.13";

    let run = talosctl.on("127.0.2.11", &["etcd", "members"]).await;
    assert!(run.ok, "{run}");
    let ids: Vec<String> = ["cp-1", "cp-2", "cp-3"]
        .iter()
        .map(|h| member_id(&run.stdout, h))
        .collect();

    let status = |run: &crate::common::talosctl::Run, node: &str| -> (String, String) {
        let cols: Vec<String> = line_with(&run.stdout, &[node])
            .split_whitespace()
            .map(str::to_string)
            .collect();
        // NODE MEMBER "20 MB" "9.8 MB (48.00%)" LEADER …
        (cols[1].clone(), cols[7].clone())
    };
    let run = talosctl.on(all, &["etcd", "status"]).await;
    assert!(run.ok, "{run}");
    for (i, node) in ["127.0.2.11", "127.0.2.12", "127.0.2.13"]
        .iter()
        .enumerate()
    {
        let (member, leader) = status(&run, node);
        assert_eq!(member, ids[i], "{run}");
        assert_eq!(leader, ids[0], "{run}");
    }

    let run = talosctl
        .on("127.0.2.11", &["etcd", "forfeit-leadership"])
        .await;
    assert!(run.ok, "{run}");
    let run = talosctl.on(all, &["etcd", "status"]).await;
    assert!(run.ok, "{run}");
    for node in ["127.0.2.11", "127.0.2.12", "127.0.2.13"] {
        assert_eq!(status(&run, node).1, ids[1], "{run}");
    }

    let run = talosctl.on(all, &["etcd", "alarm", "list"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("NOSPACE"), "{run}");

    emu.raise_etcd_alarm(2, EtcdAlarm::NoSpace);
    let run = talosctl.on(all, &["etcd", "alarm", "list"]).await;
    assert!(run.ok, "{run}");
    for node in ["127.0.2.11", "127.0.2.12", "127.0.2.13"] {
        let line = line_with(&run.stdout, &[node]);
        assert!(line.contains(&ids[2]) && line.contains("NOSPACE"), "{run}");
    }
    let run = talosctl.on("127.0.2.13", &["etcd", "status"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("database space exceeded"), "{run}");

    let run = talosctl
        .on("127.0.2.12", &["etcd", "alarm", "disarm"])
        .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("NOSPACE"), "the disarmed alarm: {run}");
    let run = talosctl.on(all, &["etcd", "alarm", "list"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("NOSPACE"), "{run}");
}

/// `talosctl dmesg` and `talosctl logs machined|kubelet` tell what
/// happened to the node this boot: an apply (the kubelet restarting with the
/// new image), then, after a reboot, only the new boot; after an upgrade,
/// the boot of the new version.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn dmesg_and_logs_tell_what_happened_to_the_node() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(3, 10)),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());
    let cp = "127.0.3.10";

    let run = talosctl.on(cp, &["dmesg"]).await;
    assert!(run.ok, "{run}");
    assert!(
        run.stdout.contains("[talos] booting Talos v1.13.9"),
        "{run}"
    );
    assert!(!run.stdout.contains("apply config request"), "{run}");

    let changed = crate::common::edit(
        &crate::common::cp_v112(),
        "kubelet:v1.28.0",
        "kubelet:v1.28.4",
    );
    let changed = file(dir.path(), "changed.yaml", &changed);
    let run = talosctl
        .on(cp, &["apply-config", "--mode", "no-reboot", "-f", &changed])
        .await;
    assert!(run.ok, "{run}");

    let run = talosctl.on(cp, &["logs", "machined"]).await;
    assert!(run.ok, "{run}");
    assert!(
        run.stdout.contains("apply config request: mode no_reboot"),
        "{run}"
    );
    let run = talosctl.on(cp, &["logs", "kubelet"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["Kubelet version"]).contains("v1.28.0"),
        "{run}"
    );
    assert!(
        run.stdout
            .lines()
            .last()
            .is_some_and(|l| l.contains("Started kubelet")),
        "{run}"
    );
    assert!(
        run.stdout.contains("kubeletVersion=\"v1.28.4\""),
        "the restart with the new image: {run}"
    );
    let run = talosctl.on(cp, &["logs", "machined", "--tail", "3"]).await;
    assert!(run.ok, "{run}");
    assert_eq!(run.stdout.lines().count(), 3, "{run}");
    let run = talosctl.on(cp, &["dmesg"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("[talos] apply config request"), "{run}");
    assert!(
        run.stdout
            .contains("service[kubelet](Stopping): Service is being restarted"),
        "{run}"
    );

    let boot = emu.boot_id(0);
    let run = talosctl.on(cp, &["reboot", "--wait=false"]).await;
    assert!(run.ok, "{run}");
    until_rebooted(&emu, 0, &boot).await;
    let run = talosctl.on(cp, &["dmesg"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains(&emu.boot_id(0)), "the new boot: {run}");
    assert!(!run.stdout.contains(&boot), "not the old one: {run}");
    assert!(!run.stdout.contains("apply config request"), "{run}");

    let boot = emu.boot_id(0);
    let run = talosctl
        .on(
            cp,
            &[
                "upgrade",
                "--legacy",
                "-i",
                "ghcr.io/siderolabs/installer:v1.14.0",
                "--drain=false",
                "--wait=false",
            ],
        )
        .await;
    assert!(run.ok, "{run}");
    until_rebooted(&emu, 0, &boot).await;
    let run = talosctl.on(cp, &["logs", "machined"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("booting Talos v1.14.0"), "{run}");
}

/// `talosctl get members|addresses|links|routes`: the members are the
/// configured nodes of the cluster (a node that takes its config joins
/// them), and each node's link, addresses and routes are built around its
/// own address.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn members_addresses_links_and_routes_come_from_the_nodes() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(4, 10)),
        NodeSpec::maintenance("w-1").with_address(at(4, 20)),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());

    let run = talosctl.on("127.0.4.10", &["get", "members"]).await;
    assert!(run.ok, "{run}");
    let cp = line_with(&run.stdout, &["cp-1"]);
    assert!(
        cp.contains("controlplane") && cp.contains("127.0.4.10") && cp.contains("Talos (v1.13.9)"),
        "{run}"
    );
    assert!(!run.stdout.contains("w-1"), "{run}");

    let worker = file(dir.path(), "worker.yaml", &crate::common::worker_v112());
    let run = insecure(
        &emu,
        1,
        dir.path(),
        &["apply-config", "--insecure", "-f", &worker],
    )
    .await;
    assert!(run.ok, "{run}");
    let run = talosctl.on("127.0.4.10", &["get", "members"]).await;
    assert!(run.ok, "{run}");
    let w = line_with(&run.stdout, &["w-1"]);
    assert!(w.contains("worker") && w.contains("127.0.4.20"), "{run}");
    let run = talosctl
        .on("127.0.4.20", &["get", "members", "-o", "yaml"])
        .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("apiServerPort: 6443"), "{run}");

    let run = talosctl.on("127.0.4.20", &["get", "addresses"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["eth0/127.0.4.20/24"]).contains("127.0.4.20/24"),
        "{run}"
    );
    assert!(run.stdout.contains("lo/127.0.0.1/8"), "{run}");
    let run = talosctl.on("127.0.4.20", &["get", "links"]).await;
    assert!(run.ok, "{run}");
    let eth0 = line_with(&run.stdout, &["eth0"]);
    assert!(
        eth0.contains("ether") && eth0.contains("up") && eth0.contains("02:00:7f:00:04:14"),
        "{run}"
    );
    let run = talosctl.on("127.0.4.20", &["get", "routes"]).await;
    assert!(run.ok, "{run}");
    let default = line_with(&run.stdout, &["inet4/127.0.4.1//1024"]);
    assert!(
        default.contains("eth0") && default.contains("1024"),
        "{run}"
    );
    assert!(run.stdout.contains("127.0.4.0/24"), "{run}");
}

/// `talosctl processes`, `containers`, `containers -k` and `stats -k`: the
/// etcd container and process and the control plane's static pods appear
/// once etcd is bootstrapped, each static pod with the image of the node's
/// config, a new one after an apply that changes it.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn containers_and_processes_follow_the_bootstrap_and_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let (_emu, talosctl) = fresh_control_plane_and_worker(dir.path()).await;
    let cp = "127.0.1.10";

    let run = talosctl.on(cp, &["containers"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["apid"]).contains("RUNNING"),
        "{run}"
    );
    assert!(
        line_with(&run.stdout, &["kubelet"]).contains("ghcr.io/siderolabs/kubelet:v1.28.0"),
        "{run}"
    );
    assert!(!run.stdout.contains("etcd"), "{run}");
    let run = talosctl.on(cp, &["containers", "-k"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("kube-apiserver"), "{run}");
    let run = talosctl.on(cp, &["processes"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("/usr/local/bin/etcd"), "{run}");

    let run = talosctl.on(cp, &["bootstrap"]).await;
    assert!(run.ok, "{run}");

    let run = talosctl.on(cp, &["containers"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["etcd"]).contains("registry.k8s.io/etcd:v3.6.12"),
        "{run}"
    );
    let run = talosctl.on(cp, &["containers", "-k"]).await;
    assert!(run.ok, "{run}");
    let sandbox = line_with(
        &run.stdout,
        &["kube-system/kube-apiserver-cp-1", "SANDBOX_READY"],
    );
    assert!(sandbox.contains("registry.k8s.io/pause"), "{run}");
    let apiserver = line_with(
        &run.stdout,
        &["└─ kube-system/kube-apiserver-cp-1:kube-apiserver"],
    );
    assert!(
        apiserver.contains("registry.k8s.io/kube-apiserver:v1.28.0")
            && apiserver.contains("CONTAINER_RUNNING"),
        "{run}"
    );
    let run = talosctl.on(cp, &["stats", "-k"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("kube-scheduler-cp-1"), "{run}");
    let run = talosctl.on(cp, &["processes"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("/usr/local/bin/etcd"), "{run}");
    assert!(
        run.stdout.contains("/usr/local/bin/kube-apiserver"),
        "{run}"
    );

    let changed = crate::common::edit(
        &crate::common::cp_v112(),
        "kube-apiserver:v1.28.0",
        "kube-apiserver:v1.28.4",
    );
    let changed = file(dir.path(), "changed.yaml", &changed);
    let run = talosctl
        .on(cp, &["apply-config", "--mode", "no-reboot", "-f", &changed])
        .await;
    assert!(run.ok, "{run}");
    let run = talosctl.on(cp, &["containers", "-k"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &[":kube-apiserver:"]).contains("kube-apiserver:v1.28.4"),
        "{run}"
    );

    let run = talosctl.on("127.0.1.20", &["containers", "-k"]).await;
    assert!(run.ok, "{run}");
    assert!(
        !run.stdout.contains("kube-apiserver"),
        "a worker runs none: {run}"
    );
}

/// `talosctl time` names the NTP server the config names (after an apply
/// that changes it); `talosctl memory` shows the emulated machine's fixed
/// 4 GiB on every node.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn time_follows_the_config_and_memory_is_fixed() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(5, 10)),
        NodeSpec::new("w-1", crate::common::worker_v112()).with_address(at(5, 20)),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());

    let run = talosctl.on("127.0.5.10", &["time"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["127.0.5.10"]).contains("time.cloudflare.com"),
        "{run}"
    );

    let changed = crate::common::edit(
        &crate::common::cp_v112(),
        "machine:\n    type: controlplane\n",
        "machine:\n    type: controlplane\n    time:\n        servers:\n            - ntp.lab.example\n",
    );
    let changed = file(dir.path(), "time.yaml", &changed);
    let run = talosctl
        .on(
            "127.0.5.10",
            &["apply-config", "--mode", "no-reboot", "-f", &changed],
        )
        .await;
    assert!(run.ok, "{run}");
    let run = talosctl.on("127.0.5.10", &["time"]).await;
    assert!(run.ok, "{run}");
    assert!(
        line_with(&run.stdout, &["127.0.5.10"]).contains("ntp.lab.example"),
        "{run}"
    );
    let run = talosctl
        .on("127.0.5.10", &["time", "--check", "pool.ntp.example"])
        .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("pool.ntp.example"), "{run}");

    let run = talosctl.on("127.0.5.10,127.0.5.20", &["memory"]).await;
    assert!(run.ok, "{run}");
    for node in ["127.0.5.10", "127.0.5.20"] {
        let cols: Vec<&str> = line_with(&run.stdout, &[node]).split_whitespace().collect();
        assert_eq!(cols[1], "3933", "TOTAL in MiB: {run}");
    }
}

/// `talosctl get volumestatus` and `talosctl mounts`: the system disk's
/// volumes, EPHEMERAL with the rest of whichever disk the node has, mounted
/// on /var.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn volumes_and_mounts_follow_the_system_disk() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(6, 10)),
        NodeSpec::new("w-1", crate::common::worker_v112())
            .with_address(at(6, 20))
            .with_disks(vec![Disk::new("/dev/nvme0n1", 64_000_000_000)]),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());

    let run = talosctl.on("127.0.6.10", &["get", "volumestatus"]).await;
    assert!(run.ok, "{run}");
    let ephemeral = line_with(&run.stdout, &["EPHEMERAL"]);
    assert!(
        ephemeral.contains("/dev/vda4")
            && ephemeral.contains("ready")
            && ephemeral.contains("9.5 GB"),
        "{run}"
    );
    let run = talosctl.on("127.0.6.20", &["get", "volumestatus"]).await;
    assert!(run.ok, "{run}");
    let ephemeral = line_with(&run.stdout, &["EPHEMERAL"]);
    assert!(
        ephemeral.contains("/dev/nvme0n1p4") && ephemeral.contains("63 GB"),
        "{run}"
    );
    let run = talosctl.on("127.0.6.20", &["mounts"]).await;
    assert!(run.ok, "{run}");
    let var = line_with(&run.stdout, &["/dev/nvme0n1p4"]);
    assert!(
        var.trim_end().ends_with("/var") && var.contains("62.73"),
        "{run}"
    );
}

/// What the lab does not emulate answers `Unimplemented` with a message
/// naming the method, never an empty error.
/// Covers: R9.3
#[tokio::test(flavor = "multi_thread")]
async fn what_the_lab_does_not_emulate_says_so() {
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(at(7, 10)),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let talosctl = Talosctl::admin(&emu, dir.path());
    for (args, method) in [
        (&["list", "/"][..], "machine.MachineService/List"),
        (&["usage", "/var"][..], "machine.MachineService/DiskUsage"),
        (&["netstat"][..], "machine.MachineService/Netstat"),
        (
            &["service", "etcd", "restart"][..],
            "machine.MachineService/ServiceRestart",
        ),
        (&["health"][..], "cluster.ClusterService/HealthCheck"),
        (
            &[
                "logs",
                "-k",
                "kube-system/kube-apiserver-cp-1:kube-apiserver",
            ][..],
            "Kubernetes containers",
        ),
    ] {
        let run = talosctl.on("127.0.7.10", args).await;
        assert!(!run.ok, "{args:?}: {run}");
        assert!(
            run.stderr.contains("not emulated by the lab") && run.stderr.contains(method),
            "{args:?}: {run}"
        );
    }
}
