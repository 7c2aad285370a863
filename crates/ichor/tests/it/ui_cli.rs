//! `ichor ui` as the real binary against the real API server: it serves
//! HTTPS (self-signed, with a warning), the deprecated plain-HTTP port only
//! when asked (with a warning), the lab's anonymous read-only view only on
//! loopback, and pages from its reflector caches.

use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use ichor_testenv::{TestEnv, install, wait};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// Covers: R12.1 (`ichor ui`; TLS by default with a self-signed certificate and a warning; plaintext opt-in, deprecated), R4.3f
#[tokio::test]
async fn ichor_ui_serves_pages_from_the_api_server() {
    let env = TestEnv::shared();
    let client = env.client().await;
    install::crds(&client, ichor_api::crds::all())
        .await
        .unwrap();

    // Anonymous reading is for loopback only.
    let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args([
            "ui",
            "--listen",
            "0.0.0.0:0",
            "--lab-anonymous-read",
            "--kubeconfig",
        ])
        .arg(env.kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("anonymous access is for the local lab only"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let (https, plain) = (free_port(), free_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .arg("ui")
        .arg("--listen")
        .arg(format!("127.0.0.1:{https}"))
        .arg("--plaintext-listen")
        .arg(format!("127.0.0.1:{plain}"))
        .arg("--lab-anonymous-read")
        .arg("--read-only")
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ichor ui starts");
    let (bound, every) = (Duration::from_secs(60), Duration::from_millis(100));
    let page = wait::until(
        "ichor ui to answer on its plain-HTTP port",
        bound,
        every,
        || http_get(plain, "/clusters"),
    )
    .await
    .unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    // No IchorInstallation: the page still renders (R4.3f).
    assert!(page.contains("No IchorInstallation"), "{page}");
    assert!(page.contains("read-only"), "{page}");
    assert!(
        page.to_lowercase()
            .contains("content-security-policy: default-src 'none'")
    );
    // The HTTPS port is open too.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", https))
            .await
            .is_ok()
    );
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("self-signed"), "{said}");
    assert!(said.contains("deprecated"), "{said}");
}
