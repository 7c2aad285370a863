//! The real `talosctl` (built by tools/testbin.sh) against the emulator: if
//! talosctl accepts what the emulator says, the emulator tells the truth about
//! the wire format, and our client's tests against it mean something.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_talemu::{ClientCertSpec, Emulator, NodeSpec, WriteAction};
use ichor_testenv::Tool;

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok={}\n--- stdout\n{}\n--- stderr\n{}",
            self.ok, self.stdout, self.stderr
        )
    }
}

/// A talosconfig for the emulator in a temp dir, with a client certificate
/// issued by rcgen: Ed25519, O=<roles>, EKU ClientAuth only.
fn talosconfig(emu: &Emulator, dir: &Path, spec: &ClientCertSpec) -> PathBuf {
    let path = dir.join(format!(
        "talosconfig-{}",
        spec.roles.join("-").replace(':', "_")
    ));
    std::fs::write(&path, emu.talosconfig("talemu", spec).unwrap()).unwrap();
    path
}

/// Runs `talosctl --talosconfig F -n <node 0's address> -e <node 0's endpoint> ARGS…`, bounded.
async fn talosctl(emu: &Emulator, config: &Path, args: &[&str]) -> Run {
    let node = emu.nodes()[0].address.to_string();
    talosctl_n(emu, config, &node, args).await
}

/// Runs `talosctl --talosconfig F -n NODES -e <node 0's endpoint> ARGS…`, bounded.
async fn talosctl_n(emu: &Emulator, config: &Path, node: &str, args: &[&str]) -> Run {
    let endpoint = emu.endpoint(0);
    let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
    cmd.arg("--talosconfig")
        .arg(config)
        .args(["-n", node, "-e", &endpoint])
        .args(args)
        .env_remove("TALOSCONFIG")
        .env("HOME", config.parent().unwrap())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("talosctl answered within 60s")
        .expect("talosctl runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn setup() -> (Emulator, tempfile::TempDir, PathBuf) {
    let emu = Emulator::start(vec![NodeSpec::new("cp-1", crate::common::cp_v112())])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let admin = talosconfig(&emu, dir.path(), &ClientCertSpec::admin());
    (emu, dir, admin)
}

/// `talosctl version` prints the emulated node's version.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_version() {
    let (emu, _dir, admin) = setup().await;
    let run = talosctl(&emu, &admin, &["version"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("Server:"), "{run}");
    assert!(run.stdout.contains("NODE:        127.0.0.1"), "{run}");
    assert!(run.stdout.contains("Tag:         v1.13.9"), "{run}");
    assert!(run.stdout.contains("Enabled:     RBAC"), "{run}");
}

/// `talosctl get machineconfig -o yaml` returns the exact config the node holds.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_get_machineconfig_yaml() {
    let (emu, _dir, admin) = setup().await;
    let run = talosctl(&emu, &admin, &["get", "machineconfig", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(
        run.stdout.contains("type: MachineConfigs.config.talos.dev"),
        "{run}"
    );
    assert!(run.stdout.contains("id: v1alpha1"), "{run}");
    assert!(run.stdout.contains("talos.dev/yaml-spec"), "{run}");
    // Every line of the config is in the spec block scalar.
    let config = String::from_utf8(crate::common::cp_v112()).unwrap();
    for line in config.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            run.stdout.contains(line.trim_start()),
            "missing {line:?}\n{run}"
        );
    }
}

/// `talosctl get kubeprismconfigs` (table and YAML) and other resources Ichor reads.
/// Covers: R1.3b
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_get_kubeprism_and_friends() {
    let (emu, _dir, admin) = setup().await;
    let run = talosctl(&emu, &admin, &["get", "kubeprismconfigs"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("KubePrismConfig"), "{run}");
    assert!(run.stdout.contains("k8s-loadbalancer-config"), "{run}");
    assert!(run.stdout.contains("7445"), "{run}");

    let run = talosctl(&emu, &admin, &["get", "kubeprismconfig", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("port: 7445"), "{run}");
    assert!(run.stdout.contains("host: 127.0.0.1"), "{run}");

    let run = talosctl(&emu, &admin, &["get", "kubeprismstatuses", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("healthy: true"), "{run}");

    let run = talosctl(&emu, &admin, &["get", "machinetype", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("spec: controlplane"), "{run}");

    let run = talosctl(
        &emu,
        &admin,
        &["get", "bootstrapmanifestsconfigs", "-o", "yaml"],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("cniName: flannel"), "{run}");
    assert!(run.stdout.contains("proxyEnabled: true"), "{run}");

    let run = talosctl(&emu, &admin, &["get", "nodename"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("cp-1"), "{run}");

    let run = talosctl(&emu, &admin, &["get", "version", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("version: v1.13.9"), "{run}");
}

/// `talosctl get manifests`: the real talosctl decodes the bootstrap
/// manifests the emulated control plane renders (the resource a
/// kubernetes-upgrade's last step reads), kube-proxy's DaemonSet at the
/// config's proxy image among them.
/// Covers: kubernetes-upgrade, ADR 0014 (the emulator serves Manifests as Talos does)
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_get_manifests() {
    let (emu, _dir, admin) = setup().await;
    let run = talosctl(&emu, &admin, &["get", "manifests"]).await;
    assert!(run.ok, "{run}");
    assert!(
        run.stdout.contains("10-kube-proxy") && run.stdout.contains("11-core-dns"),
        "{run}"
    );
    let proxy = emu
        .admin_client(0)
        .unwrap()
        .component_image(
            "",
            ichor_talos_client::resources::KubernetesComponent::KubeProxy,
        )
        .await
        .unwrap()
        .expect("kube-proxy enabled");
    let run = talosctl(
        &emu,
        &admin,
        &["get", "manifest", "10-kube-proxy", "-o", "yaml"],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stdout.contains("kind: DaemonSet") && run.stdout.contains(&format!("image: {proxy}")),
        "{run}"
    );
}

/// `apply-config --dry-run` shows the diff and writes nothing; `--mode no-reboot`
/// applies; `--mode try` applies for a while; `reboot --wait=false` reboots.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_apply_config_and_reboot() {
    let (emu, dir, admin) = setup().await;
    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7446");
    let file = dir.path().join("changed.yaml");
    std::fs::write(&file, &changed).unwrap();
    let file = file.to_str().unwrap();

    let run = talosctl(&emu, &admin, &["apply-config", "--dry-run", "-f", file]).await;
    assert!(run.ok, "{run}");
    assert!(run.stderr.contains("Dry run summary:"), "{run}");
    assert!(run.stderr.contains("+            port: 7446"), "{run}");
    assert!(emu.writes().is_empty(), "a dry run writes nothing");

    let run = talosctl(
        &emu,
        &admin,
        &["apply-config", "--mode", "no-reboot", "-f", file],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("Applied configuration without a reboot"),
        "{run}"
    );
    assert_eq!(emu.active_config(0).unwrap(), changed);
    assert_eq!(emu.persistent_config(0).unwrap(), changed);
    let run = talosctl(&emu, &admin, &["get", "kubeprismconfig", "-o", "yaml"]).await;
    assert!(run.stdout.contains("port: 7446"), "{run}");

    let tried = crate::common::edit(&changed, "port: 7446", "port: 7447");
    let tried_file = dir.path().join("tried.yaml");
    std::fs::write(&tried_file, &tried).unwrap();
    let run = talosctl(
        &emu,
        &admin,
        &[
            "apply-config",
            "--mode",
            "try",
            "--timeout",
            "1m",
            "-f",
            tried_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("will be automatically reverted back in 1m0s"),
        "{run}"
    );
    assert_eq!(emu.active_config(0).unwrap(), tried);
    assert_eq!(emu.persistent_config(0).unwrap(), changed);

    let boot = emu.boot_id(0);
    let run = talosctl(&emu, &admin, &["reboot", "--wait=false"]).await;
    assert!(run.ok, "{run}");
    let writes = emu.writes();
    assert!(
        matches!(writes.last().unwrap().action, WriteAction::Reboot { .. }),
        "{writes:?}"
    );
    for _ in 0..50 {
        if emu.boot_id(0) != boot {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(emu.boot_id(0), boot, "the reboot changed the boot id");
    // After the reboot, the persisted config is active again (the try is gone).
    assert_eq!(emu.active_config(0).unwrap(), changed);
}

/// The write log's modes and rollbacks, in order (no config bytes).
fn write_names(emu: &Emulator) -> Vec<String> {
    emu.writes()
        .iter()
        .map(|w| match &w.action {
            WriteAction::ApplyConfiguration { mode, .. } => format!("apply {mode}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// Waits (bounded) until node 0's active config is `want`.
async fn active_becomes(emu: &Emulator, want: &[u8], within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if emu.active_config(0).unwrap() == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Talos's try mode, driven by the real talosctl: `apply-config --mode try
/// --timeout 2s` runs the config until its timer puts back the config that
/// was active when the try came (machined's `RollbackToConfigAfter`); a
/// no-reboot apply of the same config within the timeout confirms it (any
/// apply but a try cancels machined's timer), so nothing is put back; a
/// second try before the first was confirmed reverts to the first try's
/// config, as machined's does.
/// Covers: R16.3a
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_try_reverts_on_its_timer_unless_confirmed() {
    let (emu, dir, admin) = setup().await;
    let base = crate::common::cp_v112();
    let tried = crate::common::edit(&base, "port: 7445", "port: 7446");
    let file = dir.path().join("tried.yaml");
    std::fs::write(&file, &tried).unwrap();
    let file = file.to_str().unwrap();
    let try_args = [
        "apply-config",
        "--mode",
        "try",
        "--timeout",
        "2s",
        "-f",
        file,
    ];

    // Unconfirmed: reverted by the timer.
    let run = talosctl(&emu, &admin, &try_args).await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("will be automatically reverted back in 2s"),
        "{run}"
    );
    assert_eq!(emu.active_config(0).unwrap(), tried);
    assert_eq!(emu.persistent_config(0).unwrap(), base);
    assert!(
        active_becomes(&emu, &base, Duration::from_secs(10)).await,
        "the try is reverted after its timeout"
    );
    assert_eq!(write_names(&emu), ["apply try", "TryRollback"]);

    // Confirmed by a no-reboot apply of the same config within the timeout.
    let run = talosctl(&emu, &admin, &try_args).await;
    assert!(run.ok, "{run}");
    let run = talosctl(
        &emu,
        &admin,
        &["apply-config", "--mode", "no-reboot", "-f", file],
    )
    .await;
    assert!(run.ok, "{run}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(emu.active_config(0).unwrap(), tried, "confirmed: kept");
    assert_eq!(emu.persistent_config(0).unwrap(), tried);
    assert_eq!(
        write_names(&emu),
        ["apply try", "TryRollback", "apply try", "apply no_reboot"]
    );

    // A try over an unconfirmed try: the timer puts back the first try's config.
    let first = crate::common::edit(&tried, "port: 7446", "port: 7447");
    let second = crate::common::edit(&tried, "port: 7446", "port: 7448");
    for (name, config, timeout) in [("first", &first, "1m"), ("second", &second, "2s")] {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, config).unwrap();
        let run = talosctl(
            &emu,
            &admin,
            &[
                "apply-config",
                "--mode",
                "try",
                "--timeout",
                timeout,
                "-f",
                path.to_str().unwrap(),
            ],
        )
        .await;
        assert!(run.ok, "{run}");
    }
    assert!(
        active_becomes(&emu, &first, Duration::from_secs(10)).await,
        "the second try reverts to the first try's config"
    );
    assert_eq!(emu.persistent_config(0).unwrap(), tried);
}

/// A reader talosconfig can read versions but not the sensitive machine config.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_reader_cannot_read_machineconfig() {
    let (emu, dir, _admin) = setup().await;
    let reader = talosconfig(&emu, dir.path(), &ClientCertSpec::with_roles(["os:reader"]));
    let run = talosctl(&emu, &reader, &["version"]).await;
    assert!(run.ok, "{run}");
    let run = talosctl(&emu, &reader, &["get", "machineconfig"]).await;
    assert!(!run.ok, "{run}");
    assert!(
        run.stderr.contains("PermissionDenied") || run.stderr.contains("not authorized"),
        "{run}"
    );
}

/// Several nodes through one control-plane endpoint: `-n a,b` fans out
/// (one-to-many, answers tagged with the node), `get` goes node by node, and
/// an unknown node is reported by name.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_through_a_control_plane() {
    let cp: IpAddr = "127.0.0.51".parse().unwrap();
    let w: IpAddr = "127.0.0.52".parse().unwrap();
    let emu = Emulator::start(vec![
        NodeSpec::new("cp-1", crate::common::cp_v112()).with_address(cp),
        NodeSpec::new("w-1", crate::common::worker_v112())
            .with_address(w)
            .with_version("v1.13.8"),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let admin = talosconfig(&emu, dir.path(), &ClientCertSpec::admin());

    let run = talosctl_n(&emu, &admin, "127.0.0.51,127.0.0.52", &["version"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("NODE:        127.0.0.51"), "{run}");
    assert!(run.stdout.contains("NODE:        127.0.0.52"), "{run}");
    assert!(run.stdout.contains("Tag:         v1.13.8"), "{run}");

    let run = talosctl_n(
        &emu,
        &admin,
        "127.0.0.51,127.0.0.52",
        &["get", "machinetype"],
    )
    .await;
    assert!(run.ok, "{run}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("127.0.0.51") && l.contains("machine-type")),
        "{run}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("127.0.0.52") && l.contains("machine-type")),
        "{run}"
    );

    let run = talosctl_n(
        &emu,
        &admin,
        "127.0.0.52",
        &["get", "machinetype", "-o", "yaml"],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("spec: worker"), "{run}");

    let run = talosctl_n(&emu, &admin, "127.0.0.51,10.9.9.9", &["version"]).await;
    assert!(run.stdout.contains("NODE:        127.0.0.51"), "{run}");
    assert!(run.stderr.contains("10.9.9.9"), "{run}");
    assert!(run.stderr.contains("connection refused"), "{run}");
}

/// Runs talosctl with no talosconfig context (maintenance mode: `--insecure`,
/// the node's endpoint given as `-n`).
async fn talosctl_insecure(emu: &Emulator, dir: &Path, args: &[&str]) -> Run {
    let endpoint = emu.endpoint(0);
    let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
    cmd.args(["-n", &endpoint])
        .args(args)
        .env_remove("TALOSCONFIG")
        .env("HOME", dir)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("talosctl answered within 60s")
        .expect("talosctl runs");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A node in maintenance mode takes its first config from `talosctl
/// apply-config --insecure`, then wants mutual TLS like a configured node.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_maintenance_apply() {
    let emu = Emulator::start(vec![NodeSpec::maintenance("fresh")])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cp.yaml");
    std::fs::write(&file, crate::common::cp_v112()).unwrap();

    let run = talosctl_insecure(&emu, dir.path(), &["version", "--insecure"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("Tag:         v1.13.9"), "{run}");

    let run = talosctl_insecure(
        &emu,
        dir.path(),
        &["apply-config", "--insecure", "-f", file.to_str().unwrap()],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("Applied configuration without a reboot"),
        "{run}"
    );
    assert_eq!(emu.active_config(0).unwrap(), crate::common::cp_v112());

    let admin = talosconfig(&emu, dir.path(), &ClientCertSpec::admin());
    let run = talosctl(&emu, &admin, &["get", "machinetype", "-o", "yaml"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("spec: controlplane"), "{run}");
}

/// `talosctl get -w` (COSI Watch): the current resource, then the change an
/// apply makes.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_watch_sees_an_apply() {
    use tokio::io::AsyncBufReadExt;

    let (emu, dir, admin) = setup().await;
    let mut child = tokio::process::Command::new(Tool::Talosctl.path())
        .arg("--talosconfig")
        .arg(&admin)
        .args(["-n", "127.0.0.1", "-e", &emu.endpoint(0)])
        .args(["get", "kubeprismconfigs", "-w", "-o", "yaml"])
        .env_remove("TALOSCONFIG")
        .env("HOME", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let mut read_until = async |needle: &str, seen: &mut String| {
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(needle) {
                    return;
                }
            }
            panic!("talosctl ended before {needle:?}:\n{seen}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} within 30s:\n{seen}"));
    };
    read_until("port: 7445", &mut seen).await;
    assert!(seen.contains("event: created"), "{seen}");

    let changed = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7452");
    emu.admin_client(0)
        .unwrap()
        .apply_configuration(
            "",
            &ichor_talos_client::ApplyRequest::new(
                changed,
                ichor_talos_client::ApplyMode::NoReboot,
            ),
        )
        .await
        .unwrap();
    read_until("port: 7452", &mut seen).await;
    assert!(seen.contains("event: updated"), "{seen}");
    child.kill().await.unwrap();
}

/// `apply-config --mode staged` persists only; `--mode auto` with a change
/// that v1.13 cannot apply live resolves to a reboot, as Talos says.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_apply_staged_and_auto() {
    let (emu, dir, admin) = setup().await;
    let staged = crate::common::edit(&crate::common::cp_v112(), "port: 7445", "port: 7453");
    let staged_file = dir.path().join("staged.yaml");
    std::fs::write(&staged_file, &staged).unwrap();
    let run = talosctl(
        &emu,
        &admin,
        &[
            "apply-config",
            "--mode",
            "staged",
            "-f",
            staged_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("Staged configuration to be applied after the next reboot"),
        "{run}"
    );
    assert_eq!(emu.active_config(0).unwrap(), crate::common::cp_v112());
    assert_eq!(emu.persistent_config(0).unwrap(), staged);

    let worker = crate::common::edit(&staged, "type: controlplane", "type: worker");
    let worker_file = dir.path().join("worker.yaml");
    std::fs::write(&worker_file, &worker).unwrap();
    let run = talosctl(
        &emu,
        &admin,
        &[
            "apply-config",
            "--dry-run",
            "--mode",
            "auto",
            "-f",
            worker_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(
        run.stderr
            .contains("Applied configuration with a reboot (skipped in dry-run)"),
        "{run}"
    );
    let run = talosctl(
        &emu,
        &admin,
        &[
            "apply-config",
            "--mode",
            "no-reboot",
            "-f",
            worker_file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(!run.ok, "{run}");
    assert!(
        run.stderr.contains("can't be applied in immediate mode"),
        "{run}"
    );
    assert_eq!(emu.writes().len(), 1, "only the staged apply wrote");
}

const INSTALLER_V114: &str = "ghcr.io/siderolabs/installer:v1.14.0";

/// Waits (bounded by a count, not a clock) until node `i`'s boot id differs from `boot`.
async fn until_rebooted(emu: &Emulator, i: usize, boot: &str) {
    for _ in 0..100 {
        if emu.boot_id(i) != boot {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("node {i} did not come back from its reboot");
}

fn upgrade_actions(emu: &Emulator) -> Vec<(String, WriteAction)> {
    emu.writes()
        .into_iter()
        .map(|w| (w.node, w.action))
        .collect()
}

/// The real `talosctl upgrade` (v1.13.9, the LifecycleService path, run with
/// `--drain=false --wait=false` (the legacy path too) because the emulator has no Kubernetes node to
/// drain and no event stream to follow) pulls the installer, writes it with
/// `LifecycleService.Upgrade` and reboots; the node comes back, when the test
/// lets it, with a new boot id and the target version.
/// Covers: the emulator's upgrade API (ADR 0014): the emulator speaks it as Talos does
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_upgrade_through_the_lifecycle_service() {
    let (emu, _dir, admin) = setup().await;
    let held = emu.hold_reboots(0);
    let boot = emu.boot_id(0);
    let run = talosctl(
        &emu,
        &admin,
        &[
            "upgrade",
            "--image",
            INSTALLER_V114,
            "--drain=false",
            "--wait=false",
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    let node = emu.nodes()[0].hostname.clone();
    assert_eq!(
        upgrade_actions(&emu)
            .into_iter()
            .map(|(n, a)| {
                assert_eq!(n, node);
                match a {
                    WriteAction::Reboot { .. } => "reboot".to_string(),
                    other => format!("{other:?}"),
                }
            })
            .collect::<Vec<_>>(),
        vec![
            format!("ImagePull {{ image: {INSTALLER_V114:?} }}"),
            format!("Upgrade {{ image: {INSTALLER_V114:?}, legacy: false }}"),
            "reboot".to_string(),
        ]
    );
    // Held by the test: still down, still the old boot.
    held.reached().await;
    assert_eq!(emu.boot_id(0), boot);
    assert!(!talosctl(&emu, &admin, &["version"]).await.ok);
    held.open();
    until_rebooted(&emu, 0, &boot).await;
    let run = talosctl(&emu, &admin, &["version"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("Tag:         v1.14.0"), "{run}");
    // talosctl reads the boot id as it does when it waits for a reboot.
    let run = talosctl(&emu, &admin, &["read", "/proc/sys/kernel/random/boot_id"]).await;
    assert!(run.ok, "{run}");
    assert_eq!(run.stdout.trim(), emu.boot_id(0));
    assert_ne!(run.stdout.trim(), boot);
}

/// The fallback boot slot fault: the node reboots (new boot id) but comes
/// back on its old version.
/// Covers: the emulator's upgrade API (ADR 0014): fallback boot slot
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_upgrade_falls_back_to_the_old_slot() {
    let (emu, _dir, admin) = setup().await;
    emu.set_upgrade_fallback(0, true);
    let boot = emu.boot_id(0);
    let run = talosctl(
        &emu,
        &admin,
        &[
            "upgrade",
            "-i",
            INSTALLER_V114,
            "--drain=false",
            "--wait=false",
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    until_rebooted(&emu, 0, &boot).await;
    let run = talosctl(&emu, &admin, &["version"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("Tag:         v1.13.9"), "{run}");
    assert_eq!(emu.talos_version(0), "v1.13.9");
}

/// Without the installer pulled first, `LifecycleService.Upgrade` fails as
/// Talos's does; an operator certificate may pull but not upgrade.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_upgrade_needs_admin_and_the_image() {
    let (emu, dir, _admin) = setup().await;
    let operator = talosconfig(
        &emu,
        dir.path(),
        &ClientCertSpec::with_roles(["os:operator"]),
    );
    let run = talosctl(
        &emu,
        &operator,
        &[
            "upgrade",
            "-i",
            INSTALLER_V114,
            "--drain=false",
            "--wait=false",
        ],
    )
    .await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("PermissionDenied"), "{run}");
    // The pull went through (operator may pull); the upgrade did not.
    let actions = upgrade_actions(&emu);
    assert!(
        actions
            .iter()
            .all(|(_, a)| matches!(a, WriteAction::ImagePull { .. })),
        "{actions:?}"
    );
    assert_eq!(emu.talos_version(0), "v1.13.9");
}

fn three_control_planes() -> Vec<NodeSpec> {
    (1..=3u8)
        .map(|i| {
            NodeSpec::new(format!("cp-{i}"), crate::common::cp_v112())
                .with_address(IpAddr::from([127, 0, 0, i]))
        })
        .collect()
}

/// `talosctl etcd members` lists one member per control plane; the
/// unhealthy-member fault shows as a member without a name (not started), and
/// the legacy `MachineService.Upgrade` (`talosctl upgrade --legacy`) refuses
/// then, as Talos's etcd pre-check does, naming the member. Healthy, it
/// writes the slot and reboots by itself. `talosctl etcd forfeit-leadership`
/// is a write in the log.
/// Covers: the emulator's upgrade API (ADR 0014): EtcdMemberList, unhealthy member, legacy Upgrade, EtcdForfeitLeadership
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_etcd_members_forfeit_and_legacy_upgrade() {
    let emu = Emulator::start(three_control_planes()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let admin = talosconfig(&emu, dir.path(), &ClientCertSpec::admin());

    let run = talosctl(&emu, &admin, &["etcd", "members"]).await;
    assert!(run.ok, "{run}");
    for host in ["cp-1", "cp-2", "cp-3"] {
        assert!(run.stdout.contains(host), "{run}");
    }

    emu.set_etcd_unhealthy(2, true);
    let run = talosctl(&emu, &admin, &["etcd", "members"]).await;
    assert!(run.ok, "{run}");
    assert!(!run.stdout.contains("cp-3"), "{run}");
    let run = talosctl_n(
        &emu,
        &admin,
        "127.0.0.2",
        &[
            "upgrade",
            "--legacy",
            "-i",
            INSTALLER_V114,
            "--drain=false",
            "--wait=false",
        ],
    )
    .await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("is not started"), "{run}");
    assert!(emu.writes().is_empty(), "{:?}", emu.writes());

    emu.set_etcd_unhealthy(2, false);
    let run = talosctl_n(&emu, &admin, "127.0.0.2", &["etcd", "forfeit-leadership"]).await;
    assert!(run.ok, "{run}");
    let boot = emu.boot_id(1);
    let run = talosctl_n(
        &emu,
        &admin,
        "127.0.0.2",
        &[
            "upgrade",
            "--legacy",
            "-i",
            INSTALLER_V114,
            "--drain=false",
            "--wait=false",
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    let actions = upgrade_actions(&emu);
    assert_eq!(actions.len(), 3, "{actions:?}");
    assert_eq!(
        actions[0],
        ("cp-2".to_string(), WriteAction::EtcdForfeitLeadership)
    );
    assert_eq!(
        actions[1],
        (
            "cp-2".to_string(),
            WriteAction::Upgrade {
                image: INSTALLER_V114.to_string(),
                legacy: true
            }
        )
    );
    assert!(matches!(actions[2], (ref n, WriteAction::Reboot { .. }) if n == "cp-2"));
    until_rebooted(&emu, 1, &boot).await;
    assert_eq!(emu.talos_version(1), "v1.14.0");
    assert_eq!(emu.talos_version(0), "v1.13.9");
}
