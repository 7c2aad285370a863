//! The lab's pod network: an HTTP CONNECT proxy from `podIP:containerPort`
//! to where the pod's process listens.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The lab's pod network: `podIP:containerPort` → where the process listens.
/// Served as an HTTP CONNECT proxy on a Unix socket, which the API server
/// uses for its `cluster` egress (webhook calls).
#[derive(Debug, Clone)]
pub struct PodNetwork {
    socket: PathBuf,
    routes: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
    listener: Arc<Mutex<Option<std::os::unix::net::UnixListener>>>,
}

impl PodNetwork {
    /// Binds the proxy's socket at `socket` (before the API server starts:
    /// its egress configuration names it); [`PodNetwork::serve`] answers on it.
    pub fn bind(socket: &Path) -> std::io::Result<PodNetwork> {
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)?;
        listener.set_nonblocking(true)?;
        Ok(PodNetwork {
            socket: socket.to_path_buf(),
            routes: Arc::default(),
            listener: Arc::new(Mutex::new(Some(listener))),
        })
    }

    /// Where the proxy listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub(super) fn route(&self, pod: SocketAddr, process: SocketAddr) {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod, process);
    }

    /// Answers CONNECT requests until the returned task is aborted; a
    /// target that is no pod's address and port is refused (502).
    pub fn serve(&self) -> Option<tokio::task::JoinHandle<()>> {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        let listener = tokio::net::UnixListener::from_std(listener).ok()?;
        let routes = self.routes.clone();
        Some(tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let routes = routes.clone();
                tokio::spawn(async move {
                    if let Err(e) = tunnel(conn, routes).await {
                        tracing::debug!(error = %ichor_api::error_text::chain(&e), "lab pod network");
                    }
                });
            }
        }))
    }
}

async fn tunnel(
    mut conn: tokio::net::UnixStream,
    routes: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || conn.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let target = head
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("CONNECT "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse::<SocketAddr>().ok());
    let process = target.and_then(|t| {
        routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&t)
            .copied()
    });
    let Some(process) = process else {
        conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await?;
        return Ok(());
    };
    let mut upstream = tokio::net::TcpStream::connect(process).await?;
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}
