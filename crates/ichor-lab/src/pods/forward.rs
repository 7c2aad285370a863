//! [`ServiceForward`]: a local port that reaches a Service of the lab
//! through its Endpoints and the pod network.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Endpoints;
use kube::api::Api;

use super::AbortOnDrop;

/// A local port that reaches a Service of the lab as a client in the
/// cluster would (or `kubectl port-forward svc/…`): each connection is
/// sent to a ready endpoint of the Service, read from its Endpoints at that
/// moment, through the lab's pod network (the same CONNECT proxy the API
/// server calls webhooks through). Stops when dropped.
pub struct ServiceForward {
    pub addr: SocketAddr,
    _task: AbortOnDrop,
}

impl ServiceForward {
    /// Listens on a free loopback port for `namespace/service`'s port named
    /// `port` (the Service's port name, as its Endpoints carry it). `socket`
    /// is the pod network's ([`NETWORK_SOCKET`] in the lab's state folder).
    pub async fn start(
        client: kube::Client,
        socket: &Path,
        namespace: &str,
        service: &str,
        port: &str,
    ) -> std::io::Result<ServiceForward> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = ForwardTarget {
            client,
            socket: socket.to_path_buf(),
            namespace: namespace.to_string(),
            service: service.to_string(),
            port: port.to_string(),
        };
        let target = Arc::new(target);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Err(e) = target.forward(conn).await {
                        tracing::debug!(
                            "lab: forwarding to Service {}/{}: {e}",
                            target.namespace,
                            target.service
                        );
                    }
                });
            }
        });
        Ok(ServiceForward {
            addr,
            _task: AbortOnDrop(task),
        })
    }
}

struct ForwardTarget {
    client: kube::Client,
    socket: PathBuf,
    namespace: String,
    service: String,
    port: String,
}

impl ForwardTarget {
    /// A ready endpoint's address and the port named `self.port`.
    async fn endpoint(&self) -> std::io::Result<SocketAddr> {
        let endpoints = Api::<Endpoints>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(&self.service)
            .await
            .map_err(std::io::Error::other)?;
        endpoints
            .and_then(|e| ready_endpoint(&e, &self.port))
            .ok_or_else(|| {
                std::io::Error::other(format!(
                    "Service {}/{} has no ready endpoint with a port named {}",
                    self.namespace, self.service, self.port
                ))
            })
    }

    async fn forward(&self, mut conn: tokio::net::TcpStream) -> std::io::Result<()> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let target = self.endpoint().await?;
        let mut upstream = tokio::net::UnixStream::connect(&self.socket).await?;
        upstream
            .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 8192 || upstream.read(&mut byte).await? == 0 {
                return Err(std::io::Error::other("the pod network closed the tunnel"));
            }
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 200") {
            return Err(std::io::Error::other(format!(
                "the pod network refused {target}: {}",
                String::from_utf8_lossy(&head).trim()
            )));
        }
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
        Ok(())
    }
}

/// The first ready address of `endpoints` with the port named `port`.
fn ready_endpoint(endpoints: &Endpoints, port: &str) -> Option<SocketAddr> {
    endpoints.subsets.iter().flatten().find_map(|subset| {
        let number = subset
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == port)
            .and_then(|p| u16::try_from(p.port).ok())?;
        let ip = subset
            .addresses
            .iter()
            .flatten()
            .find_map(|a| a.ip.parse::<std::net::IpAddr>().ok())?;
        Some(SocketAddr::new(ip, number))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_service_is_reached_at_a_ready_address_and_its_named_port() {
        let e: Endpoints = serde_json::from_value(json!({
            "subsets": [{"addresses": [{"ip": "10.244.1.12"}],
                "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}]}]
        }))
        .unwrap();
        assert_eq!(
            ready_endpoint(&e, "https"),
            Some("10.244.1.12:8443".parse().unwrap())
        );
        assert_eq!(ready_endpoint(&e, "metrics"), None);
        assert_eq!(ready_endpoint(&Endpoints::default(), "https"), None);
    }
}
