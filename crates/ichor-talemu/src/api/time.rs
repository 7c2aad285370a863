//! TimeService (`talosctl time`): the node's clock (the lab's host's) and
//! the NTP server its config names (Talos's default when none), which the
//! lab does not ask: its time is given as the node's.

use tonic::{Request, Response, Status};

use super::{ADMIN, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::node::Node;
use crate::wire::time as wire;
use crate::wire::time::time_service_server::TimeService;

/// Talos's NTP server when the config names none.
const DEFAULT_NTP_SERVER: &str = "time.cloudflare.com";

fn time_of(node: &Node, server: Option<&str>) -> Result<wire::Time, Status> {
    if node.in_maintenance() {
        return Err(not_in_maintenance("Time"));
    }
    let server = match server {
        Some(s) => s.to_string(),
        None => {
            let config = node.lock().active.clone().unwrap_or_default();
            crate::derive::time_servers(&config)
                .into_iter()
                .next()
                .unwrap_or_else(|| DEFAULT_NTP_SERVER.to_string())
        }
    };
    let now = prost_types::Timestamp::from(std::time::SystemTime::now());
    Ok(wire::Time {
        metadata: None,
        server,
        localtime: Some(now),
        remotetime: Some(now),
    })
}

#[tonic::async_trait]
impl TimeService for NodeApi {
    async fn time(&self, request: Request<()>) -> Result<Response<wire::TimeResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| time_of(node, None))
            .await?;
        Ok(Response::new(wire::TimeResponse { messages }))
    }

    async fn time_check(
        &self,
        request: Request<wire::TimeRequest>,
    ) -> Result<Response<wire::TimeResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let md = request.metadata().clone();
        let server = request.into_inner().server;
        let messages = self.unary(&md, |node| time_of(node, Some(&server))).await?;
        Ok(Response::new(wire::TimeResponse { messages }))
    }
}
