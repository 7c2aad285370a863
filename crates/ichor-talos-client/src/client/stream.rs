//! What the calls do with a server's messages: the first message of a
//! one-to-many answer (with the error a node put in its metadata), the
//! bytes of a `common.Data` stream, and a COSI watch's events.

use std::collections::VecDeque;

use futures::Stream;

use crate::error::{Error, status_message};
use crate::proto::common;
use crate::proto::cosi::resource as cosi;

use super::TalosClient;
use super::cosi::{CosiResource, WatchEvent, WatchEventType};

impl TalosClient {
    pub(crate) fn first<M>(
        &self,
        node: &str,
        call: &str,
        messages: Vec<M>,
        metadata: impl Fn(&M) -> Option<&crate::proto::common::Metadata>,
    ) -> Result<M, Error> {
        let first = messages
            .into_iter()
            .next()
            .ok_or_else(|| Error::EmptyResponse {
                node: self.node_label(node),
                call: call.to_string(),
            })?;
        if let Some(md) = metadata(&first)
            && !md.error.is_empty()
        {
            return Err(Error::NodeReported {
                node: self.node_label(node),
                call: call.to_string(),
                message: md.error.clone(),
            });
        }
        Ok(first)
    }
}

/// The bytes of a `common.Data` stream (a file `Read`, the kubeconfig
/// archive), gathered to its end.
pub(super) async fn data_bytes(
    response: impl Future<
        Output = Result<tonic::Response<tonic::Streaming<common::Data>>, tonic::Status>,
    >,
) -> Result<tonic::Response<Vec<u8>>, tonic::Status> {
    let mut stream = response.await?.into_inner();
    let mut bytes = Vec::new();
    while let Some(m) = stream.message().await? {
        bytes.extend_from_slice(&m.bytes);
    }
    Ok(tonic::Response::new(bytes))
}

/// The events of a COSI watch, once its setup is done: each message's
/// events in order; a failure of the stream is an error naming `node` and
/// `call`, the stream's end ends them.
pub(super) fn watch_events(
    stream: tonic::Streaming<cosi::WatchResponse>,
    node: String,
    call: String,
) -> impl Stream<Item = Result<WatchEvent, Error>> + Send + 'static {
    futures::stream::unfold(
        (stream, node, call, VecDeque::new()),
        |(mut stream, node, call, mut pending)| async move {
            loop {
                if let Some(ev) = pending.pop_front() {
                    return Some((Ok(ev), (stream, node, call, pending)));
                }
                match stream.message().await {
                    Ok(Some(resp)) => {
                        pending.extend(resp.event.into_iter().map(convert_event));
                    }
                    Ok(None) => return None,
                    Err(status) => {
                        let err = Error::Status {
                            node: node.clone(),
                            call: call.clone(),
                            code: status.code(),
                            message: status_message(&status),
                        };
                        return Some((Err(err), (stream, node, call, pending)));
                    }
                }
            }
        },
    )
}

fn convert_event(e: cosi::Event) -> WatchEvent {
    let event_type = match cosi::EventType::try_from(e.event_type) {
        Ok(cosi::EventType::Created) => WatchEventType::Created,
        Ok(cosi::EventType::Updated) => WatchEventType::Updated,
        Ok(cosi::EventType::Destroyed) => WatchEventType::Destroyed,
        Ok(cosi::EventType::Bootstrapped) => WatchEventType::Bootstrapped,
        Ok(cosi::EventType::Errored) => WatchEventType::Errored,
        Ok(cosi::EventType::Noop) | Err(_) => WatchEventType::Noop,
    };
    WatchEvent {
        event_type,
        resource: e.resource.map(CosiResource::from_proto),
        old: e.old.map(CosiResource::from_proto),
        error: e.error,
    }
}
