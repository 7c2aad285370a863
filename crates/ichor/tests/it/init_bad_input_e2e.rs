//! `ichor init` refuses bad input with one clear error each and writes
//! nothing: the real `ichor` binary against emulated Talos nodes in
//! maintenance mode (the insecure API, port 50000, each on its own loopback
//! address). "Nothing written" is read from the emulator's write log (no
//! apply, no bootstrap on any node) and from the output directory (absent).
//!
//! Covers: R10.1 (bad input)

use std::path::Path;
use std::process::{Command, Output};

use ichor_talemu::{Emulator, NodeSpec};

fn fixture(rel: &str) -> Vec<u8> {
    ichor_testenv::fixtures::talos_bytes(rel)
}

/// A fresh control plane (.181), an already configured node (.182), a fresh
/// node on Talos v1.11 (.183); nothing listens on .184.
async fn nodes() -> Emulator {
    let at = |last: u8| std::net::IpAddr::from([127, 0, 0, last]);
    Emulator::start(vec![
        NodeSpec::maintenance("fresh-cp")
            .with_address(at(181))
            .with_port(50000),
        NodeSpec::new("configured", fixture("stability-v1.12/base-worker.yaml"))
            .with_address(at(182))
            .with_port(50000),
        NodeSpec::maintenance("old")
            .with_version("v1.11.5")
            .with_address(at(183))
            .with_port(50000),
    ])
    .await
    .unwrap()
}

fn init(out: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ichor"));
    cmd.arg("init")
        .args(args)
        .arg("--output-dir")
        .arg(out)
        .arg("--yes")
        .env("HOME", out.parent().unwrap())
        .env_remove("KUBECONFIG");
    tokio::task::block_in_place(|| cmd.output().expect("ichor runs"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A well-formed fingerprint no node presents (32 zero bytes).
const WRONG_FINGERPRINT: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

struct Case {
    what: &'static str,
    args: Vec<String>,
    says: &'static str,
}

#[tokio::test(flavor = "multi_thread")]
async fn each_bad_input_is_one_clear_refusal_and_nothing_is_written() {
    let emu = nodes().await;
    let dir = tempfile::tempdir().unwrap();
    let bad_patch = dir.path().join("bad.yaml");
    std::fs::write(&bad_patch, "machine: [\n").unwrap();
    let base = |rest: &[&str]| {
        let mut v: Vec<String> = vec![
            "lab".into(),
            "--endpoint".into(),
            "https://127.0.0.181:6443".into(),
            "--control-plane".into(),
            "127.0.0.181".into(),
        ];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    };
    let cases = vec![
        Case {
            what: "a node already configured",
            args: base(&["--worker", "127.0.0.182"]),
            says: "node 127.0.0.182 is not in maintenance mode",
        },
        Case {
            what: "an unreachable node",
            args: base(&["--worker", "127.0.0.184"]),
            says: "node 127.0.0.184 is unreachable",
        },
        Case {
            what: "a duplicated IP",
            args: base(&["--worker", "127.0.0.181"]),
            says: "node 127.0.0.181 is given twice",
        },
        Case {
            what: "a patch that does not parse",
            args: base(&["--config-patch", &format!("@{}", bad_patch.display())]),
            says: "--config-patch",
        },
        Case {
            what: "an endpoint that is not a URL",
            args: vec![
                "lab".into(),
                "--endpoint".into(),
                "127.0.0.181:6443".into(),
                "--control-plane".into(),
                "127.0.0.181".into(),
            ],
            says: "--endpoint \"127.0.0.181:6443\" is not a URL of the Kubernetes API",
        },
        Case {
            what: "a node that presents another certificate than --cert-fingerprint gives",
            args: base(&[
                "--cert-fingerprint",
                &format!("127.0.0.181={WRONG_FINGERPRINT}"),
            ]),
            says: "node 127.0.0.181 presents maintenance certificate fingerprint",
        },
        Case {
            what: "a Talos below the floor",
            args: base(&["--worker", "127.0.0.183"]),
            says: "node 127.0.0.183 runs Talos v1.11.5; ichor init needs Talos v1.12 or later",
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let out = dir.path().join(format!("out-{i}"));
        let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let o = init(&out, &args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{}: {err}", case.what);
        assert!(err.contains(case.says), "{}: {err}", case.what);
        assert!(
            err.contains("ichor init refused; nothing was written"),
            "{}: {err}",
            case.what
        );
        assert!(
            err.matches('\n').count() < 12,
            "{}: one clear error, not a wall: {err}",
            case.what
        );
        assert!(
            !out.exists(),
            "{}: the output directory was written",
            case.what
        );
        assert!(emu.writes().is_empty(), "{}: a node was written", case.what);
    }

    // All of them at once: every refusal named in one run.
    let out = dir.path().join("out-all");
    let o = init(
        &out,
        &[
            "lab",
            "--endpoint",
            "127.0.0.181:6443",
            "--control-plane",
            "127.0.0.181",
            "--worker",
            "127.0.0.182,127.0.0.183,127.0.0.184,127.0.0.181",
            "--config-patch",
            &format!("@{}", bad_patch.display()),
            "--cert-fingerprint",
            &format!("127.0.0.181={WRONG_FINGERPRINT}"),
        ],
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    for case in &cases {
        assert!(err.contains(case.says), "{}: {err}", case.what);
    }
    assert!(!out.exists());
    assert!(emu.writes().is_empty());
}

/// What is already in the output directory is judged before anything is
/// written: a `secrets.yaml` init did not write (it would become the
/// cluster's PKI) and a directory other users may write to are refused,
/// each saying what to do.
///
/// Covers: R10.1, R18.1
#[tokio::test(flavor = "multi_thread")]
async fn a_planted_bundle_or_a_shared_output_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    // Its own address: the other test of this file holds .181 to .183.
    let emu = Emulator::start(vec![
        NodeSpec::maintenance("fresh-cp")
            .with_address(std::net::IpAddr::from([127, 0, 0, 185]))
            .with_port(50000),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "lab",
        "--endpoint",
        "https://127.0.0.185:6443",
        "--control-plane",
        "127.0.0.185",
    ];

    let planted = dir.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    let bundle = ichor_talos::secrets::SecretsBundle::generate().unwrap();
    std::fs::write(planted.join("secrets.yaml"), bundle.to_yaml().unwrap()).unwrap();
    let o = init(&planted, &args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("ichor init refused; nothing was written"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "pass --with-secrets {}",
            planted.join("secrets.yaml").display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&planted).unwrap().count(), 1, "{err}");

    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = init(&shared, &args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("may be written by other users"), "{err}");
    assert!(err.contains("chmod go-w"), "{err}");
    assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0, "{err}");
    assert!(emu.writes().is_empty(), "a node was written");
}
