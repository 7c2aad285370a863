//! Maintenance mode and the way out of it, as `ichor init` walks it: the real
//! `talosctl` reads a fresh node's disks over the insecure API, applies its
//! first config, then (with the config's own Talos API CA, as a real node
//! serves it) bootstraps etcd and fetches the admin kubeconfig.
//!
//! Covers: the lab's side of `ichor init` (the emulator's maintenance mode,
//! Bootstrap, Kubeconfig), R10.1 (what init's inspection reads), R10.3
//! (bootstrap answers "already bootstrapped" and writes once)

use std::path::Path;
use std::time::Duration;

use ichor_talemu::{
    ClientCertSpec, Disk, Emulator, EmulatorOptions, NodeSpec, Pki, WriteAction, derive,
};
use ichor_talos_client::{ApplyMode, ApplyRequest, ClientOptions, TalosClient};
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

/// Runs talosctl with `HOME` in `dir` (no ambient talosconfig), bounded.
async fn talosctl(dir: &Path, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(Tool::Talosctl.path());
    cmd.args(args)
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

fn quick() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

/// Two fresh nodes (a control plane to be, a worker to be) that serve their
/// config's Talos API CA once configured, as real nodes do.
async fn fresh_pair() -> Emulator {
    Emulator::start_with(
        vec![
            NodeSpec::maintenance("cp-1")
                .with_address([127, 0, 0, 161].into())
                .with_disks(vec![
                    Disk::new("/dev/vda", 10_737_418_240),
                    Disk::new("/dev/vdb", 53_687_091_200),
                ]),
            NodeSpec::maintenance("w-1").with_address([127, 0, 0, 162].into()),
        ],
        EmulatorOptions {
            serve_config_ca: true,
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap()
}

/// Runs talosctl with a talosconfig.
async fn talosctl_with(config: &Path, dir: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--talosconfig", config.to_str().unwrap()];
    all.extend_from_slice(args);
    talosctl(dir, &all).await
}

/// A talosconfig signed by the CA the fixture configs carry (`machine.ca`),
/// naming node `i` as endpoint and node.
fn fixture_talosconfig(emu: &Emulator, i: usize, dir: &Path) -> std::path::PathBuf {
    let ca = derive::os_ca(&crate::common::cp_v112()).expect("the fixture holds machine.ca");
    let pki = Pki::from_pem(&ca.cert_pem, &ca.key_pem).unwrap();
    let cert = pki.client_cert(&ClientCertSpec::admin()).unwrap();
    let text = ichor_talemu::talosconfig::render(
        "fixture",
        &[emu.endpoint(i)],
        &[emu.nodes()[i].address.to_string()],
        pki.ca_pem(),
        &cert,
    )
    .unwrap();
    let path = dir.join(format!("talosconfig-{i}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `talosctl get disks --insecure` lists a fresh node's disks (a reader
/// call, so it works before any config), and `talosctl get machinestatus
/// --insecure` says MAINTENANCE; nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_reads_disks_and_stage_in_maintenance() {
    // talosctl's `get --insecure` dials the node on Talos's port, 50000.
    let emu = Emulator::start_with(
        vec![
            NodeSpec::maintenance("fresh")
                .with_address([127, 0, 0, 163].into())
                .with_port(50000)
                .with_disks(vec![
                    Disk::new("/dev/vda", 10_737_418_240),
                    Disk::new("/dev/vdb", 53_687_091_200),
                ]),
        ],
        EmulatorOptions::default(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let node = emu.nodes()[0].address.to_string();
    let run = talosctl(
        dir.path(),
        &["-e", &node, "-n", &node, "get", "disks", "--insecure"],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("vda"), "{run}");
    assert!(run.stdout.contains("vdb"), "{run}");
    assert!(run.stdout.contains("54 GB"), "{run}");
    let run = talosctl(
        dir.path(),
        &[
            "-e",
            &node,
            "-n",
            &node,
            "get",
            "machinestatus",
            "--insecure",
            "-o",
            "yaml",
        ],
    )
    .await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("stage: maintenance"), "{run}");
    assert!(emu.writes().is_empty());

    // Ichor's client reads the same over the insecure API.
    let c = TalosClient::maintenance(&emu.endpoint(0), quick()).unwrap();
    let disks = c.disks("").await.unwrap();
    let paths: Vec<&str> = disks.iter().map(|(_, d)| d.dev_path.as_str()).collect();
    assert_eq!(paths, ["/dev/vda", "/dev/vdb"]);
    assert_eq!(c.machine_status("").await.unwrap().stage, 3);
}

/// The whole way in with the real talosctl: `apply-config --insecure` on
/// both nodes, then with the config's own CA `bootstrap` (once; a second
/// time is "already bootstrapped", AlreadyExists, and writes nothing),
/// `bootstrap` on a worker is refused, and `kubeconfig` hands out an admin
/// kubeconfig for the config's cluster, signed by its Kubernetes CA.
#[tokio::test(flavor = "multi_thread")]
async fn talosctl_apply_bootstrap_kubeconfig() {
    let emu = fresh_pair().await;
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("cp.yaml");
    let worker = dir.path().join("worker.yaml");
    std::fs::write(&cp, crate::common::cp_v112()).unwrap();
    std::fs::write(&worker, crate::common::worker_v112()).unwrap();
    for (i, file) in [(0, &cp), (1, &worker)] {
        let run = talosctl(
            dir.path(),
            &[
                "-n",
                &emu.endpoint(i),
                "apply-config",
                "--insecure",
                "-f",
                file.to_str().unwrap(),
            ],
        )
        .await;
        assert!(run.ok, "{run}");
    }
    // Configured: the insecure API is gone.
    let run = talosctl(
        dir.path(),
        &[
            "-e",
            &emu.endpoint(0),
            "-n",
            &emu.endpoint(0),
            "get",
            "disks",
            "--insecure",
        ],
    )
    .await;
    assert!(!run.ok, "{run}");

    let cp_config = fixture_talosconfig(&emu, 0, dir.path());
    let run = talosctl_with(&cp_config, dir.path(), &["bootstrap"]).await;
    assert!(run.ok, "{run}");
    assert!(emu.bootstrapped(0));
    let run = talosctl_with(&cp_config, dir.path(), &["bootstrap"]).await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("AlreadyExists"), "{run}");
    assert!(
        run.stderr.contains("etcd data directory is not empty"),
        "{run}"
    );
    let run = talosctl_with(&cp_config, dir.path(), &["etcd", "members"]).await;
    assert!(run.ok, "{run}");
    assert!(run.stdout.contains("cp-1"), "{run}");

    let worker_config = fixture_talosconfig(&emu, 1, dir.path());
    let run = talosctl(
        dir.path(),
        &[
            "--talosconfig",
            worker_config.to_str().unwrap(),
            "bootstrap",
        ],
    )
    .await;
    assert!(!run.ok, "{run}");
    assert!(run.stderr.contains("Unimplemented"), "{run}");

    let out = dir.path().join("kubeconfig");
    let run = talosctl_with(
        &cp_config,
        dir.path(),
        &["kubeconfig", "--force", out.to_str().unwrap()],
    )
    .await;
    assert!(run.ok, "{run}");
    let kubeconfig = std::fs::read_to_string(&out).unwrap();
    assert_kubeconfig_of_fixture(&kubeconfig);

    let bootstraps = emu
        .writes()
        .iter()
        .filter(|w| w.action == WriteAction::Bootstrap)
        .count();
    assert_eq!(bootstraps, 1, "one bootstrap, however often asked");
}

/// The kubeconfig names the fixture's cluster and endpoint, trusts its
/// Kubernetes CA and carries an `O=system:masters` client certificate
/// issued by that CA.
fn assert_kubeconfig_of_fixture(kubeconfig: &str) {
    use base64::Engine as _;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(kubeconfig).unwrap();
    let facts = derive::facts(&crate::common::cp_v112(), false).unwrap();
    let ca = derive::kubernetes_ca(&crate::common::cp_v112()).unwrap();
    let cluster = &doc["clusters"][0];
    assert_eq!(cluster["name"].as_str(), Some(facts.cluster_name.as_str()));
    assert_eq!(
        cluster["cluster"]["server"].as_str(),
        facts.control_plane_endpoint.as_deref()
    );
    let b64 = |v: &serde_yaml_ng::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    assert_eq!(
        b64(&cluster["cluster"]["certificate-authority-data"]),
        ca.cert_pem.as_bytes()
    );
    let user = format!("admin@{}", facts.cluster_name);
    assert_eq!(doc["current-context"].as_str(), Some(user.as_str()));
    let crt = b64(&doc["users"][0]["user"]["client-certificate-data"]);
    let (_, pem) = x509_parser::pem::parse_x509_pem(&crt).unwrap();
    let cert = pem.parse_x509().unwrap();
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
    let ca_cert = ca_pem.parse_x509().unwrap();
    assert_eq!(cert.issuer(), ca_cert.subject());
    let orgs: Vec<&str> = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    assert_eq!(orgs, ["system:masters"]);
}

/// Ichor's client over the same path: bootstrap says `true` once, `false`
/// ("already bootstrapped") after; the kubeconfig comes out of its archive;
/// a maintenance-mode caller may not bootstrap (it is only `os:reader`).
#[tokio::test(flavor = "multi_thread")]
async fn client_bootstrap_and_kubeconfig() {
    let emu = fresh_pair().await;
    let insecure = TalosClient::maintenance(&emu.endpoint(0), quick()).unwrap();
    let err = insecure.bootstrap("").await.unwrap_err();
    assert!(err.is_permission_denied(), "{err}");
    insecure
        .apply_configuration(
            "",
            &ApplyRequest::new(crate::common::cp_v114(), ApplyMode::Auto),
        )
        .await
        .unwrap();
    let ca = derive::os_ca(&crate::common::cp_v114()).unwrap();
    let pki = Pki::from_pem(&ca.cert_pem, &ca.key_pem).unwrap();
    let cert = pki.client_cert(&ClientCertSpec::admin()).unwrap();
    let identity =
        ichor_talos_client::ClientIdentity::from_pem(pki.ca_pem(), cert.cert_pem, cert.key_pem);
    let admin = TalosClient::new(&emu.endpoint(0), &identity, quick()).unwrap();
    assert!(
        admin.etcd_members("").await.is_err(),
        "no etcd before bootstrap"
    );
    assert!(admin.bootstrap("").await.unwrap());
    assert!(!admin.bootstrap("").await.unwrap());
    assert_eq!(admin.etcd_members("").await.unwrap().len(), 1);
    let kubeconfig = admin.kubeconfig("").await.unwrap();
    let text = String::from_utf8(kubeconfig).unwrap();
    let kube_ca = derive::kubernetes_ca(&crate::common::cp_v114()).unwrap();
    use base64::Engine as _;
    assert!(
        text.contains(
            &base64::engine::general_purpose::STANDARD.encode(kube_ca.cert_pem.as_bytes())
        ),
        "the v1.14 shape's KubeAPIServerCAConfig is the kubeconfig's CA"
    );
}
