//! Ichor's own pods, run for real: the lab's kubelet for the images it can
//! run because they are ours.
//!
//! For every Deployment whose container runs one of Ichor's images (the
//! controller, whether `ichor adopt` or `helm install` put it there, and the
//! UI, `ichor ui`, from the chart or `install-ui.yaml`: both images carry
//! the `ichor` binary), each replica is a pod object and a local process of
//! the `ichor` binary:
//!
//! - with the container's command and args from the Deployment (the image's
//!   entrypoint is `ichor`, so a command's first word is replaced by the local
//!   binary);
//! - under a token of the pod's ServiceAccount from the TokenRequest API,
//!   written into a kubeconfig the process finds through `KUBECONFIG` (the
//!   in-cluster configuration reads fixed paths this lab cannot provide), so
//!   the RBAC the manifest grants is exactly the RBAC the process has;
//! - with its Secret and ConfigMap volumes written into the lab's state
//!   folder as the kubelet's atomic writer does (a `..data` link swapped in
//!   one rename, so a rotated certificate and its key change together, and
//!   kept current while the pod runs); an argument under a `mountPath` is
//!   rewritten to the projection, and no process starts without its volumes;
//! - Running and Ready from the process's own readiness probe (`/readyz` on
//!   the probe's port; over TLS without verifying the certificate when the
//!   probe says `scheme: HTTPS`, as the kubelet does), restarted with the
//!   kubelet's back-off (10 s doubling to 5 min) when it exits, shown as
//!   CrashLoopBackOff meanwhile.
//!
//! Addresses and ports. A pod gets a podIP from its node's pod CIDR, as a
//! CNI would give it, and the EndpointSlices (and Endpoints) of the Services
//! that select it carry that podIP and the declared `containerPort` — what
//! a real cluster shows. The process cannot listen there (no pod network
//! namespace, and the API server refuses loopback addresses in endpoints),
//! so the lab maps each declared containerPort to a free port on a loopback
//! address of the pod's own: an argument `HOST:PORT` whose PORT is a
//! declared containerPort becomes `LOOPBACK:MAPPED`. The lab's pod network
//! ([`PodNetwork`]) is the one place that knows the mapping: the test
//! control plane's API server sends its traffic to the cluster (webhook
//! calls) through it, as an HTTP CONNECT egress proxy (the API server's
//! `cluster` egress selection), and it joins `podIP:containerPort` to the
//! process. The API server resolves a webhook Service through its endpoints
//! (`--enable-aggregator-routing`); TLS still verifies
//! `<service>.<namespace>.svc`.
//!
//! A test reaches a Service the way a client in the cluster would through
//! [`ServiceForward`]: a local port whose connections go, by the Service's
//! Endpoints, through the same pod network.
//!
//! The ichor-cni Job runs under its ServiceAccount's token the same way
//! ([`token_kubeconfig`]).

//! One concern a file: [`network`] (the CONNECT proxy), [`kubelet`] (the
//! pods of a Deployment and their life), [`process`] (a pod's command line,
//! token and start), [`volumes`], [`probe`] (readiness) and [`tls`] (its
//! HTTPS client), [`status`] (what the pods and Deployments report),
//! [`endpoints`] (the Services' EndpointSlices), [`forward`]
//! ([`ServiceForward`]).

mod endpoints;
mod forward;
mod kubelet;
mod network;
mod probe;
mod process;
mod status;
mod tls;
mod volumes;

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use serde_json::Value;

pub use forward::ServiceForward;
pub use kubelet::IchorPods;
pub use network::PodNetwork;
pub use process::{StartError, TokenError, command_line, token_kubeconfig};
pub use tls::unverified_tls;
pub use volumes::{Mount, VolumeError, VolumeSource, atomic_write, mounts};

/// The image repository the lab runs as the local `ichor` binary.
pub const ICHOR_IMAGE: &str = "ghcr.io/maeshinshin/ichor-controller";
/// The UI's image (`ichor ui`): it carries the same `ichor` binary, so the
/// lab runs it the same way.
pub const ICHOR_UI_IMAGE: &str = "ghcr.io/maeshinshin/ichor-ui";
/// The file name of the pod network's socket in the lab's state directory.
pub const NETWORK_SOCKET: &str = "pod-network.sock";

/// What the lab needs to run Ichor's processes: the binary standing in for
/// the image, what the image carries (helm, the Cilium chart), and how to
/// reach the API server with a token.
#[derive(Debug, Clone)]
pub struct ProcessRunner {
    pub ichor: PathBuf,
    pub helm: PathBuf,
    pub cilium_chart: PathBuf,
    /// The API server's URL and CA (PEM), for the tokens' kubeconfigs.
    pub server: String,
    pub ca_pem: String,
    /// Where kubeconfigs and logs go.
    pub state_dir: PathBuf,
    /// The pod network the API server reaches the pods through.
    pub network: PodNetwork,
    /// `ICHOR_LOG` for every process (see `LabOptions::ichor_log`).
    pub ichor_log: Option<String>,
}

/// Whether the lab runs this container as the local `ichor` binary: one of
/// Ichor's images (the controller's or the UI's), with a tag it can pull.
pub fn is_ichors(container: &Container) -> bool {
    container.image.as_deref().is_some_and(|i| {
        is_ichor_image(i) && i.rsplit(':').next() != Some(crate::simulator::BROKEN_TAG)
    })
}

/// Whether `image` names one of Ichor's repositories (any tag or digest).
pub fn is_ichor_image(image: &str) -> bool {
    [ICHOR_IMAGE, ICHOR_UI_IMAGE].iter().any(|repo| {
        image
            .strip_prefix(repo)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([':', '@']))
    })
}

/// Whether every container of the Deployment is Ichor's (a pod the lab runs).
pub fn runs_deployment(d: &Deployment) -> bool {
    d.spec
        .template
        .spec
        .as_ref()
        .is_some_and(|p| !p.containers.is_empty() && p.containers.iter().all(is_ichors))
}
/// The container port a probe or a Service's targetPort names (a number, or
/// a port name of the container).
fn container_port(container: &Container, port: &Value) -> Option<u16> {
    match port {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
        _ => None,
    }
}
/// Aborts a task when dropped (the pod network dies with the lab).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_broken_tag_is_not_run() {
        let c = |image: &str| -> Container {
            serde_json::from_value(json!({"name": "c", "image": image})).unwrap()
        };
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-controller:v0.1.0")));
        assert!(!is_ichors(&c(
            "ghcr.io/maeshinshin/ichor-controller:broken"
        )));
        assert!(!is_ichors(&c("quay.io/cilium/operator-generic:v1.18.5")));
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-ui:v0.1.0")));
        assert!(is_ichors(&c("ghcr.io/maeshinshin/ichor-ui@sha256:0123")));
        assert!(!is_ichors(&c("ghcr.io/maeshinshin/ichor-ui:broken")));
        assert!(!is_ichors(&c("ghcr.io/maeshinshin/ichor-uix:v0.1.0")));
    }
}
