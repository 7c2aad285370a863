//! A pod's readiness probe, asked of its process as the kubelet asks it.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use super::container_port;
use super::kubelet::PodProcess;
use super::tls::unverified_tls;

/// The container's readiness probe (an HTTP GET), asked of the process;
/// `scheme: HTTPS` as the kubelet asks it: over TLS without verifying the
/// certificate (a probe checks the process, not its identity).
pub(super) async fn probe_ready(container: &Container, p: &PodProcess) -> bool {
    let Some(get) = container
        .readiness_probe
        .as_ref()
        .and_then(|r| r.http_get.as_ref())
    else {
        return true;
    };
    let port = serde_json::to_value(&get.port).expect("port serialises");
    let Some(mapped) = container_port(container, &port).and_then(|cp| p.ports.get(&cp)) else {
        return false;
    };
    let path = get.path.clone().unwrap_or_else(|| "/".into());
    let tls = get
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    http_ok((p.ip, *mapped).into(), &path, tls).await
}

async fn http_ok(addr: std::net::SocketAddr, path: &str, tls: bool) -> bool {
    let ask = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        if tls {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let stream = unverified_tls().connect(name, tcp).await.ok()?;
            status_is_200(stream, addr, path).await
        } else {
            status_is_200(tcp, addr, path).await
        }
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// Sends a GET and reads the status line: whether it says 200.
async fn status_is_200<S>(mut s: S, addr: SocketAddr, path: &str) -> Option<bool>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 64];
    while head.len() < 12 {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head).to_string();
    Some(line.starts_with("HTTP/1.0 200") || line.starts_with("HTTP/1.1 200"))
}
