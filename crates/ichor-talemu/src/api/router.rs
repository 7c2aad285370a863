//! Which server answers a path, and the answer to everything the lab does
//! not emulate.
//!
//! MachineService's methods are served by two generated servers: the client
//! crate's (the methods Ichor calls) and the emulator's own (those only
//! talosctl calls); [`MachineRouter`] sends each path to the one that
//! serves it. A method or service neither serves would answer
//! `Unimplemented` with an empty message, which tells a user nothing;
//! [`NotEmulatedLayer`] gives every such answer the message
//! `not emulated by the lab: <service>/<method>`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use ichor_talos_client::proto::machine::machine_service_server::MachineServiceServer as ClientMachineServer;

use super::NodeApi;
use crate::wire::machine::machine_service_server::MachineServiceServer as EmulatedMachineServer;

/// The MachineService methods the emulator's own server answers.
const EMULATED_METHODS: &[&str] = &[
    "ServiceList",
    "EtcdAlarmList",
    "EtcdAlarmDisarm",
    "Dmesg",
    "Logs",
    "LogsContainers",
    "Memory",
    "Processes",
    "Mounts",
    "Containers",
    "Stats",
];

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send + 'static>>;

/// `/machine.MachineService/*`: each method to the server that serves it.
#[derive(Clone)]
pub(crate) struct MachineRouter {
    client: ClientMachineServer<NodeApi>,
    emulated: EmulatedMachineServer<NodeApi>,
}

impl MachineRouter {
    pub fn new(api: NodeApi) -> Self {
        MachineRouter {
            client: ClientMachineServer::new(api.clone())
                .max_decoding_message_size(ichor_talos_client::client::MAX_MESSAGE_SIZE),
            emulated: EmulatedMachineServer::new(api),
        }
    }
}

impl NamedService for MachineRouter {
    const NAME: &'static str = "machine.MachineService";
}

impl Service<http::Request<Body>> for MachineRouter {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let method = req.uri().path().rsplit('/').next().unwrap_or_default();
        if EMULATED_METHODS.contains(&method) {
            Box::pin(self.emulated.call(req))
        } else {
            Box::pin(self.client.call(req))
        }
    }
}

/// Names what the lab does not emulate in every empty `Unimplemented`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NotEmulatedLayer;

impl<S> tower::Layer<S> for NotEmulatedLayer {
    type Service = NotEmulated<S>;

    fn layer(&self, inner: S) -> NotEmulated<S> {
        NotEmulated { inner }
    }
}

/// The service [`NotEmulatedLayer`] wraps.
#[derive(Debug, Clone)]
pub(crate) struct NotEmulated<S> {
    inner: S,
}

/// The answer to `path` when the server's was an `Unimplemented` that says
/// nothing (an unknown service or method); any other answer as it was.
pub(crate) fn name_what_is_not_emulated(
    response: http::Response<Body>,
    path: &str,
) -> http::Response<Body> {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let unimplemented = header("grpc-status").as_deref() == Some("12");
    let silent = header("grpc-message").is_none_or(|m| m.trim().is_empty());
    if unimplemented && silent {
        tonic::Status::unimplemented(format!(
            "not emulated by the lab: {}",
            path.trim_start_matches('/')
        ))
        .into_http()
    } else {
        response
    }
}

impl<S, B> Service<http::Request<B>> for NotEmulated<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        let answer = self.inner.call(req);
        Box::pin(async move { Ok(name_what_is_not_emulated(answer.await?, &path)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: tonic::Status) -> http::Response<Body> {
        status.into_http()
    }

    fn message(r: &http::Response<Body>) -> Option<String> {
        r.headers()
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    #[test]
    fn an_empty_unimplemented_names_the_method() {
        let r = name_what_is_not_emulated(
            answer(tonic::Status::unimplemented("")),
            "/machine.MachineService/Copy",
        );
        assert_eq!(
            message(&r).as_deref(),
            Some("not%20emulated%20by%20the%20lab:%20machine.MachineService/Copy")
        );
    }

    #[test]
    fn other_answers_are_kept() {
        let said =
            tonic::Status::unimplemented("bootstrap is only supported on control plane nodes");
        let r = name_what_is_not_emulated(answer(said), "/machine.MachineService/Bootstrap");
        assert!(message(&r).unwrap().contains("control%20plane"));
        let r = name_what_is_not_emulated(
            answer(tonic::Status::not_found("")),
            "/machine.MachineService/Read",
        );
        assert_eq!(message(&r), None);
    }
}
