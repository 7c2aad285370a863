//! `ichor init`'s guards against what it did not make, against an emulated
//! Talos node in maintenance mode: a `secrets.yaml` planted in the output
//! directory is refused and an interrupted init's own one is reused; a
//! wrong `--cert-fingerprint` refuses the node before anything is written
//! and the right one lets init apply. Init runs until the Kubernetes API
//! wait, which fails here (nothing answers at the endpoint): everything
//! before it (files, apply, bootstrap, kubeconfig) is what these tests read.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_adopt::init::InitRequest;
use ichor_adopt_run::init::{self, InitOptions, SECRETS_FILE};
use ichor_adopt_run::{AdoptError, Operator};
use ichor_helm::render::{ChartRef, Renderer};
use ichor_talemu::{Emulator, EmulatorOptions, NodeSpec, WriteAction};
use ichor_talos::secrets::SecretsBundle;
use ichor_testenv::Tool;

/// One fresh control plane on a free loopback port; a configured node
/// serves its config's CA, as a real one does.
async fn node() -> Emulator {
    Emulator::start_with(
        vec![
            NodeSpec::maintenance("cp-1")
                .with_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
                .with_port(0),
        ],
        EmulatorOptions {
            serve_config_ca: true,
            ..EmulatorOptions::default()
        },
    )
    .await
    .unwrap()
}

fn options(emu: &Emulator, out: &Path) -> InitOptions {
    InitOptions {
        request: InitRequest {
            cluster: "lab".into(),
            // Nothing answers there: init stops at the Kubernetes API wait.
            endpoint: "https://127.0.0.1:9".into(),
            control_planes: vec!["127.0.0.1".into()],
            secrets_source: "generated".into(),
            ..Default::default()
        },
        output_dir: out.to_path_buf(),
        with_secrets: None,
        cert_fingerprints: Vec::new(),
        talos_port: emu.nodes()[0].listen.port(),
        kube_api_timeout: Duration::from_secs(1),
        webhook_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(200),
        helm: Renderer::new(Tool::Helm3.path()),
        cilium_chart: ChartRef::path(ichor_testenv::tools::require_cilium_chart()),
        version: "v0.1.0".into(),
        controller_image: None,
    }
}

#[derive(Default)]
struct Said(Mutex<Vec<String>>);

impl Operator for Said {
    fn say(&self, line: &str) {
        self.0.lock().unwrap().push(line.to_string());
    }

    fn consent(&self, _plan: &ichor_adopt::plan::Plan) -> bool {
        false
    }
}

/// Runs init with consent; returns what it said and how it ended.
async fn run(opts: &InitOptions) -> (String, Result<(), AdoptError>) {
    let said = Arc::new(Said::default());
    let result = init::run(opts, said.clone(), |_| true).await.map(|_| ());
    let text = said.0.lock().unwrap().join("\n");
    (text, result)
}

fn applies(emu: &Emulator) -> usize {
    emu.writes()
        .iter()
        .filter(|w| matches!(w.action, WriteAction::ApplyConfiguration { .. }))
        .count()
}

fn stopped_at_the_kubernetes_api(result: &Result<(), AdoptError>, text: &str) {
    let err = result.as_ref().unwrap_err().to_string();
    assert!(
        err.contains("the Kubernetes API did not answer"),
        "{err}\n{text}"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A `secrets.yaml` already in the output directory that init did not
/// write is refused, with the flag that uses it on purpose, and nothing is
/// written; an init stopped part-way reuses its own bundle on the rerun and
/// applies nothing twice.
///
/// Covers: R10.3, R10.1
#[tokio::test(flavor = "multi_thread")]
async fn a_planted_bundle_is_refused_and_an_interrupted_inits_own_is_reused() {
    let emu = node().await;
    let dir = tempfile::tempdir().unwrap();

    let planted_dir = dir.path().join("planted");
    std::fs::create_dir(&planted_dir).unwrap();
    let planted = planted_dir.join(SECRETS_FILE);
    std::fs::write(
        &planted,
        SecretsBundle::generate().unwrap().to_yaml().unwrap(),
    )
    .unwrap();
    let (text, result) = run(&options(&emu, &planted_dir)).await;
    let Err(AdoptError::Refused(refusals)) = &result else {
        panic!("a planted bundle is refused: {result:?}\n{text}");
    };
    let message = refusals[0].message.clone();
    assert!(
        message.contains(&planted.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains(&format!("pass --with-secrets {}", planted.display())),
        "{message}"
    );
    assert!(emu.writes().is_empty(), "nothing is written to the node");
    assert_eq!(
        std::fs::read_dir(&planted_dir).unwrap().count(),
        1,
        "nothing is written beside it"
    );

    let out = dir.path().join("out");
    let opts = options(&emu, &out);
    let (text, result) = run(&opts).await;
    stopped_at_the_kubernetes_api(&result, &text);
    assert!(text.contains("secrets bundle: generated"), "{text}");
    assert_eq!(applies(&emu), 1, "{text}");
    assert_eq!(mode(&out), 0o700);
    for file in [SECRETS_FILE, "talosconfig", "kubeconfig", "init-plan.json"] {
        assert_eq!(mode(&out.join(file)), 0o600, "{file}");
    }
    let bundle = std::fs::read(out.join(SECRETS_FILE)).unwrap();

    let (text, result) = run(&opts).await;
    stopped_at_the_kubernetes_api(&result, &text);
    assert!(
        text.contains(&format!(
            "secrets bundle: {} (from an earlier run)",
            out.join(SECRETS_FILE).display()
        )),
        "{text}"
    );
    assert!(text.contains("127.0.0.1 already has its config"), "{text}");
    assert_eq!(applies(&emu), 1, "a rerun applies nothing twice");
    assert_eq!(std::fs::read(out.join(SECRETS_FILE)).unwrap(), bundle);

    // Another bundle swapped in after the fact is not this init's own.
    std::fs::write(
        out.join(SECRETS_FILE),
        SecretsBundle::generate().unwrap().to_yaml().unwrap(),
    )
    .unwrap();
    let (text, result) = run(&opts).await;
    assert!(
        matches!(&result, Err(AdoptError::Refused(r)) if r.iter().any(|r| r.message.contains("is not a bundle an earlier run of this init wrote"))),
        "{result:?}\n{text}"
    );
}

/// The plan shows the node's maintenance certificate fingerprint; a wrong
/// `--cert-fingerprint` refuses the node (naming both fingerprints) with
/// nothing written, the right one lets init apply its config.
///
/// Covers: R10.1
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_fingerprint_refuses_the_node_and_the_right_one_proceeds() {
    let emu = node().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let presented =
        ichor_talos_client::server_fingerprint(&emu.endpoint(0), Duration::from_secs(5))
            .await
            .unwrap();
    let wrong = ichor_talos_client::CertFingerprint::of_public_key_info(b"another key");

    let mut opts = options(&emu, &out);
    opts.cert_fingerprints = vec![format!("127.0.0.1={wrong}")];
    let (text, result) = run(&opts).await;
    let Err(AdoptError::Refused(refusals)) = &result else {
        panic!("a wrong fingerprint is refused: {result:?}\n{text}");
    };
    let message = &refusals[0].message;
    assert!(
        message.contains(&format!(
            "node 127.0.0.1 presents maintenance certificate fingerprint {presented}, not the {wrong} --cert-fingerprint gives"
        )),
        "{message}"
    );
    assert!(emu.writes().is_empty(), "nothing is written to the node");
    assert!(!out.exists(), "nothing is written to the output directory");

    opts.cert_fingerprints = vec![format!("127.0.0.1={presented}")];
    let (plan, _, _) = init::plan(&opts).await.unwrap();
    assert_eq!(
        plan.nodes[0].cert_fingerprint.as_deref(),
        Some(presented.to_string().as_str())
    );
    assert!(
        plan.text()
            .contains(&format!("certificate fingerprint {presented}"))
    );
    let (text, result) = run(&opts).await;
    stopped_at_the_kubernetes_api(&result, &text);
    assert!(text.contains("applied the config of 127.0.0.1"), "{text}");
    assert_eq!(applies(&emu), 1);
}
