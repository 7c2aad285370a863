//! The COSI State service (`talosctl get`, `--watch`): the node's resources
//! ([`crate::resources`]), read after what the node knows of the others is
//! brought up to date.

use futures::Stream;
use tonic::{Request, Response, Status};

use ichor_talos_client::proto::cosi::resource as cosi;
use ichor_talos_client::proto::cosi::resource::state_server::State;

use super::{BoxStream, NodeApi, caller};
use crate::node::Node;

fn not_found(r#type: &str, id: &str) -> Status {
    Status::not_found(format!("resource {type}/{id} doesn't exist"))
}

#[tonic::async_trait]
impl State for NodeApi {
    async fn get(
        &self,
        request: Request<cosi::GetRequest>,
    ) -> Result<Response<cosi::GetResponse>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let node = self.node(i);
        let mut st = node.lock();
        node.sync(&mut st);
        let key = (req.namespace.clone(), req.r#type.clone(), req.id.clone());
        let stored = st
            .store
            .get(&key)
            .ok_or_else(|| not_found(&req.r#type, &req.id))?;
        Ok(Response::new(cosi::GetResponse {
            resource: Some(stored.to_proto()),
        }))
    }

    type ListStream = BoxStream<cosi::ListResponse>;

    async fn list(
        &self,
        request: Request<cosi::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let items: Vec<Result<cosi::ListResponse, Status>> = {
            let node = self.node(i);
            let mut st = node.lock();
            node.sync(&mut st);
            st.store
                .iter()
                .filter(|((ns, t, _), _)| *ns == req.namespace && *t == req.r#type)
                .map(|(_, s)| {
                    Ok(cosi::ListResponse {
                        resource: Some(s.to_proto()),
                    })
                })
                .collect()
        };
        Ok(Response::new(Box::pin(futures::stream::iter(items))))
    }

    type WatchStream = BoxStream<cosi::WatchResponse>;

    async fn watch(
        &self,
        request: Request<cosi::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = caller(&request);
        let md = request.metadata().clone();
        let req = request.into_inner();
        let i = self
            .cosi_target(&md, &caller, &req.namespace, &req.r#type)
            .await?;
        let options = req.options.clone().unwrap_or_default();
        if req.id.is_some() && (options.bootstrap_contents || !options.label_query.is_empty()) {
            return Err(Status::unimplemented(
                "bootstrap contents and label queries are not supported for single resource watch",
            ));
        }
        let node = self.node(i);
        // Bring the node up to date first, so the changes that makes are not
        // sent twice; then subscribe before reading the current state, so no
        // change is lost.
        {
            let mut st = node.lock();
            node.sync(&mut st);
        }
        let events = node.events.subscribe();
        let initial = initial_watch_events(&node, &req, options.bootstrap_contents);
        let live = live_watch_events(events, req.namespace, req.r#type, req.id);
        let stream =
            futures::StreamExt::chain(futures::stream::iter(initial.into_iter().map(Ok)), live);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// One watch event for `resource` (none for a bootstrapped marker).
fn watch_event(
    resource: Option<cosi::Resource>,
    event_type: cosi::EventType,
) -> cosi::WatchResponse {
    cosi::WatchResponse {
        event: vec![cosi::Event {
            resource,
            event_type: event_type as i32,
            old: None,
            error: None,
            bookmark: None,
        }],
    }
}

/// What a watch sends first: an empty response, then the watched resource
/// (a tombstone when it does not exist), or with bootstrap contents every
/// resource of the type and (API version 1 on) a bootstrapped marker.
fn initial_watch_events(
    node: &Node,
    req: &cosi::WatchRequest,
    bootstrap_contents: bool,
) -> Vec<cosi::WatchResponse> {
    let mut initial: Vec<cosi::WatchResponse> = vec![cosi::WatchResponse { event: Vec::new() }];
    let mut st = node.lock();
    node.sync(&mut st);
    match &req.id {
        Some(id) => {
            let key = (req.namespace.clone(), req.r#type.clone(), id.clone());
            match st.store.get(&key) {
                Some(s) => initial.push(watch_event(Some(s.to_proto()), cosi::EventType::Created)),
                None => {
                    let tombstone = cosi::Resource {
                        metadata: Some(cosi::Metadata {
                            namespace: req.namespace.clone(),
                            r#type: req.r#type.clone(),
                            id: id.clone(),
                            version: "undefined".to_string(),
                            phase: "running".to_string(),
                            ..Default::default()
                        }),
                        spec: None,
                    };
                    initial.push(watch_event(Some(tombstone), cosi::EventType::Destroyed));
                }
            }
        }
        None if bootstrap_contents => {
            for ((ns, t, _), s) in &st.store {
                if *ns == req.namespace && *t == req.r#type {
                    initial.push(watch_event(Some(s.to_proto()), cosi::EventType::Created));
                }
            }
            if req.api_version >= 1 {
                initial.push(watch_event(None, cosi::EventType::Bootstrapped));
            }
        }
        None => {}
    }
    initial
}

/// The node's changes to resources of `ns`/`ty` (and `id`, when given), as
/// they happen; a lagging watcher skips what it missed.
fn live_watch_events(
    mut events: tokio::sync::broadcast::Receiver<cosi::Event>,
    ns: String,
    ty: String,
    id: Option<String>,
) -> impl Stream<Item = Result<cosi::WatchResponse, Status>> + Send + 'static {
    async_stream_events(move |tx| async move {
        loop {
            match events.recv().await {
                Ok(ev) => {
                    let Some(md) = ev.resource.as_ref().and_then(|r| r.metadata.as_ref()) else {
                        continue;
                    };
                    if md.namespace != ns || md.r#type != ty {
                        continue;
                    }
                    if id.as_ref().is_some_and(|id| *id != md.id) {
                        continue;
                    }
                    if tx
                        .send(Ok(cosi::WatchResponse { event: vec![ev] }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// A stream fed by a task through a channel (the task ends when the stream is dropped).
fn async_stream_events<F, Fut>(
    f: F,
) -> impl Stream<Item = Result<cosi::WatchResponse, Status>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<cosi::WatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
