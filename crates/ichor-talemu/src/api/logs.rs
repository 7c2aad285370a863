//! The kernel log and the services' logs (`talosctl dmesg`, `talosctl logs
//! <service>`): the node's record of this boot ([`crate::journal`]). To
//! many nodes at once they stream as apid proxies them: every node's
//! messages, each naming its node.

use futures::StreamExt as _;
use tonic::{Request, Response, Status};

use ichor_talos_client::proto::common;

use super::{ADMIN, BoxStream, NodeApi, OPERATOR, READER, caller, not_in_maintenance};
use crate::wire::machine as wire;

/// containerd's namespace of Talos's own services.
const SYSTEM_NAMESPACE: &str = "system";

fn data(bytes: Vec<u8>, node: &Option<String>) -> common::Data {
    common::Data {
        metadata: node.as_ref().map(|n| common::Metadata {
            hostname: n.clone(),
            ..Default::default()
        }),
        bytes,
    }
}

/// The messages as a stream; with `follow` it stays open for more, as
/// Talos's does (the record only grows when the node is written to).
fn stream_of(messages: Vec<common::Data>, follow: bool) -> BoxStream<common::Data> {
    let now = futures::stream::iter(messages.into_iter().map(Ok));
    if follow {
        Box::pin(now.chain(futures::stream::pending()))
    } else {
        Box::pin(now)
    }
}

impl NodeApi {
    pub(super) async fn dmesg_answer(
        &self,
        request: Request<wire::DmesgRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR])?;
        let targets = self.stream_targets(request.metadata()).await?;
        let req = request.into_inner();
        let mut messages = Vec::new();
        for (i, name) in targets {
            let node = self.node(i);
            if node.in_maintenance() {
                return Err(not_in_maintenance("Dmesg"));
            }
            // `--tail` with `--follow`: only what comes from now on.
            if req.follow && req.tail {
                continue;
            }
            let lines = node.lock().journal.dmesg();
            messages.extend(
                lines
                    .into_iter()
                    .map(|l| data(format!("{l}\n").into_bytes(), &name)),
            );
        }
        Ok(Response::new(stream_of(messages, req.follow)))
    }

    pub(super) async fn logs_answer(
        &self,
        request: Request<wire::LogsRequest>,
    ) -> Result<Response<BoxStream<common::Data>>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR])?;
        let targets = self.stream_targets(request.metadata()).await?;
        let req = request.into_inner();
        if req.namespace != SYSTEM_NAMESPACE && req.id != "kubelet" {
            return Err(Status::unimplemented(format!(
                "not emulated by the lab: the logs of Kubernetes containers ({} in containerd namespace {:?}); no container runs in the lab",
                req.id, req.namespace
            )));
        }
        let mut messages = Vec::new();
        for (i, name) in targets {
            let node = self.node(i);
            if node.in_maintenance() {
                return Err(not_in_maintenance("Logs"));
            }
            let mut lines = node.lock().journal.log(&req.id);
            if req.tail_lines >= 0 {
                let keep = usize::try_from(req.tail_lines).unwrap_or(0);
                let skip = lines.len().saturating_sub(keep);
                lines.drain(..skip);
            }
            if !lines.is_empty() {
                let mut text = lines.join("\n");
                text.push('\n');
                messages.push(data(text.into_bytes(), &name));
            }
        }
        Ok(Response::new(stream_of(messages, req.follow)))
    }

    pub(super) async fn logs_containers_answer(
        &self,
        request: Request<()>,
    ) -> Result<Response<wire::LogsContainersResponse>, Status> {
        Self::authorize(&caller(&request), &[ADMIN, OPERATOR, READER])?;
        let messages = self
            .unary(request.metadata(), |node| {
                if node.in_maintenance() {
                    return Err(not_in_maintenance("LogsContainers"));
                }
                Ok(wire::LogsContainer {
                    metadata: None,
                    ids: node.lock().journal.log_ids(),
                })
            })
            .await?;
        Ok(Response::new(wire::LogsContainersResponse { messages }))
    }
}
