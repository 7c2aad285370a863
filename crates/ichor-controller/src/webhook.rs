//! Admission webhooks for TalosCluster, served over HTTPS (axum + rustls)
//! with the serving certificate from a Secret.
//!
//! TalosClusters are checked by `ichor_api::validation::talos_cluster` (the
//! one validator: what the CEL rules say, again in words, and what CEL
//! cannot say); TalosMachine patches here, since parsing one needs
//! `ichor-talos`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::routing::post;
use ichor_api::endpoint::{Endpoint, TALOS_API_PORT};
use ichor_api::error_text::chain;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result, WebhookCertError};

pub mod access;

/// The path the ValidatingWebhookConfiguration calls for TalosClusters.
pub const VALIDATE_TALOSCLUSTER_PATH: &str = "/validate-ichor-maesh-dev-v1alpha1-taloscluster";
/// The path the ValidatingWebhookConfiguration calls for TalosMachines.
pub const VALIDATE_TALOSMACHINE_PATH: &str = "/validate-ichor-maesh-dev-v1alpha1-talosmachine";
/// The path the ValidatingWebhookConfiguration calls for TalosOperations.
pub const VALIDATE_TALOSOPERATION_PATH: &str = "/validate-ichor-maesh-dev-v1alpha1-talosoperation";

/// An `admission.k8s.io/v1` AdmissionReview (the fields Ichor reads and writes).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

/// The request part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Who the API server authenticated (a TalosOperation's health checks
    /// are asked about as this user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<k8s_openapi::api::authentication::v1::UserInfo>,
}

/// The response part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResponseStatus>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResponseStatus {
    pub code: u16,
    pub message: String,
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// Checks a TalosMachine's patches: each must parse as a Talos config patch
/// (a strategic merge patch or an RFC 6902 list), so a bad patch is refused
/// when written instead of failing every render later.
pub fn validate_talosmachine(new: &Value) -> Vec<String> {
    let name = at(new, &["metadata", "name"])
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let mut problems: Vec<String> = at(new, &["spec", "address"])
        .and_then(Value::as_str)
        .and_then(|a| address_problem(a).map(|why| format!("spec.address {a:?} of TalosMachine {name} {why}; write the node's IP address or host name, optionally with :port (for example 10.5.0.2, node-1.lab or [fd00::2]:50000)")))
        .into_iter()
        .collect();
    let Some(patches) = at(new, &["spec", "patches"]).and_then(Value::as_array) else {
        return problems;
    };
    problems.extend(patches
        .iter()
        .filter_map(|p| {
            let pname = p.get("name").and_then(Value::as_str).unwrap_or("<unnamed>");
            let text = p.get("inline").and_then(Value::as_str).unwrap_or_default();
            let origin = format!("patch {pname:?} of TalosMachine {name}");
            ichor_talos::patch::ConfigPatch::parse(text, &origin)
                .err()
                .map(|e| format!("spec.patches[{pname}] is not a Talos config patch: {}; write a strategic merge patch (YAML documents) or an RFC 6902 list of operations", chain(&e)))
        }));
    problems
}

/// Why `address` is not something Ichor can dial a Talos API on (an IP
/// address or a DNS host name, optionally `:port`; an IPv6 address with a
/// port in brackets), or `None` when it is: what [`Endpoint::parse`] says
/// is wrong with it. The controller turns it into `host:port` and dials it:
/// anything else (a scheme, a path, user info, spaces, control characters)
/// would be a different request than the operator meant.
pub fn address_problem(address: &str) -> Option<String> {
    Endpoint::parse(address, TALOS_API_PORT)
        .err()
        .map(|e| e.problem.to_string())
}

/// Answers one AdmissionReview for a TalosCluster: the cluster's own rules,
/// then its `spec.backup` (cron, time zone, age keys, retention age) and
/// its `spec.maintenanceWindows` (cron, time zone, duration, blackout dates).
pub fn review(req: AdmissionReview) -> AdmissionReview {
    review_with(req, |old, new| {
        let mut problems = ichor_api::validation::talos_cluster(old, new);
        problems.extend(ichor_backup::spec_check::problems_in_cluster(new));
        problems.extend(ichor_reconcile::operation::window::problems_in(
            new.get("spec"),
        ));
        problems
    })
}

/// Answers one AdmissionReview for a TalosOperation: on create, its
/// `spec.healthChecks` (each expression compiled by the controller's own
/// evaluator, refused when it does not parse or calls a function the
/// evaluator and cel-go disagree on; timeouts; names unique) and its
/// `spec.maintenanceWindows` (as the cluster's). The spec is immutable, so
/// an update (an annotation, the finalizer) is not judged again: a rule
/// added later must not keep an old operation's finalizer on.
pub fn review_operation(req: AdmissionReview) -> AdmissionReview {
    review_with(req, |old, new| {
        if old.is_some() {
            return Vec::new();
        }
        operation_problems(new)
    })
}

/// [`review_operation`], then, on create, whether the creator may read
/// what each health check reads ([`access::problems`], asking the API
/// server through `client`; without one, an operation with checks is
/// refused).
pub async fn review_operation_access(
    client: Option<&kube::Client>,
    req: AdmissionReview,
) -> AdmissionReview {
    let request = req.request.clone();
    let mut out = review_operation(req);
    let Some(request) = request else { return out };
    let (Some(response), Some(new)) = (out.response.as_mut(), request.object.as_ref()) else {
        return out;
    };
    if !response.allowed || request.operation != "CREATE" || request.old_object.is_some() {
        return out;
    }
    let problems = access::problems(client, request.user_info.as_ref(), new).await;
    if !problems.is_empty() {
        response.allowed = false;
        response.status = Some(ResponseStatus {
            code: 403,
            message: problems.join("; "),
        });
    }
    out
}

/// What is wrong with a new TalosOperation's health checks and windows.
pub fn operation_problems(new: &Value) -> Vec<String> {
    let spec = new.get("spec");
    let mut problems = Vec::new();
    if let Some(list) = spec.and_then(|s| s.get("healthChecks")) {
        // A list of another shape is the schema's to refuse.
        if let Ok(checks) =
            serde_json::from_value::<Vec<ichor_api::operation::HealthCheck>>(list.clone())
            && let Err(e) = ichor_gate::compile_checks(&checks)
        {
            problems.push(chain(&e));
        }
    }
    problems.extend(ichor_reconcile::operation::window::problems_in(spec));
    problems
}

/// Answers one AdmissionReview for a TalosMachine.
pub fn review_machine(req: AdmissionReview) -> AdmissionReview {
    review_with(req, |_, new| validate_talosmachine(new))
}

fn review_with(
    req: AdmissionReview,
    validate: impl Fn(Option<&Value>, &Value) -> Vec<String>,
) -> AdmissionReview {
    let Some(request) = req.request else {
        return AdmissionReview {
            api_version: req.api_version,
            kind: req.kind,
            request: None,
            response: Some(AdmissionResponse {
                uid: String::new(),
                allowed: false,
                status: Some(ResponseStatus {
                    code: 400,
                    message: "the AdmissionReview has no request".into(),
                }),
            }),
        };
    };
    let problems = match (request.operation.as_str(), &request.object) {
        // A defect reached by one object refuses that object and leaves the
        // server answering every other request.
        ("CREATE" | "UPDATE", Some(obj)) => std::panic::catch_unwind(
            std::panic::AssertUnwindSafe(|| validate(request.old_object.as_ref(), obj)),
        )
        .unwrap_or_else(|payload| {
            vec![format!(
                "the webhook stopped on a defect in Ichor while judging this object ({}); report it with the controller's version",
                crate::pipeline::panic_text(payload.as_ref())
            )]
        }),
        _ => Vec::new(),
    };
    let response = if problems.is_empty() {
        AdmissionResponse {
            uid: request.uid,
            allowed: true,
            status: None,
        }
    } else {
        AdmissionResponse {
            uid: request.uid,
            allowed: false,
            status: Some(ResponseStatus {
                code: 422,
                message: problems.join("; "),
            }),
        }
    };
    AdmissionReview {
        api_version: "admission.k8s.io/v1".into(),
        kind: "AdmissionReview".into(),
        request: None,
        response: Some(response),
    }
}

/// The largest AdmissionReview read: it carries the object and its old
/// version, each up to the API server's request limit (3 MiB), so axum's
/// default of 2 MiB would refuse updates of large TalosMachines.
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

/// The webhook routes, without an API client: a TalosOperation with health
/// checks is refused (nothing to ask whether its creator may read them).
pub fn router() -> Router {
    router_with(None)
}

/// The webhook routes; `client` asks the API server whether a
/// TalosOperation's creator may read what its health checks read.
pub fn router_with(client: Option<kube::Client>) -> Router {
    Router::new()
        .route(
            VALIDATE_TALOSCLUSTER_PATH,
            post(|Json(r): Json<AdmissionReview>| async move { Json(review(r)) }),
        )
        .route(
            VALIDATE_TALOSMACHINE_PATH,
            post(|Json(r): Json<AdmissionReview>| async move { Json(review_machine(r)) }),
        )
        .route(
            VALIDATE_TALOSOPERATION_PATH,
            post(move |Json(r): Json<AdmissionReview>| async move {
                Json(review_operation_access(client.as_ref(), r).await)
            }),
        )
        .route(
            crate::changed_by::MUTATE_CHANGED_BY_PATH,
            post(crate::changed_by::handle),
        )
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REVIEW_BYTES))
}

/// The serving TLS configuration from a `kubernetes.io/tls` Secret.
pub async fn load_tls(
    client: &kube::Client,
    namespace: &str,
    secret: &str,
) -> Result<Arc<rustls::ServerConfig>> {
    let bad = |source: WebhookCertError| Error::WebhookCert {
        namespace: namespace.into(),
        secret: secret.into(),
        source: Box::new(source),
    };
    let s = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret)
        .await
        .map_err(Error::kube(format!("reading Secret {namespace}/{secret}")))?
        .ok_or_else(|| bad(WebhookCertError::NoSecret))?;
    let data = s.data.unwrap_or_default();
    let crt = data
        .get("tls.crt")
        .ok_or_else(|| bad(WebhookCertError::NoKey("tls.crt")))?;
    let key = data
        .get("tls.key")
        .ok_or_else(|| bad(WebhookCertError::NoKey("tls.key")))?;
    server_config(&crt.0, &key.0).map_err(bad)
}

/// A rustls server configuration from PEM certificate chain and key.
pub fn server_config(
    crt_pem: &[u8],
    key_pem: &[u8],
) -> std::result::Result<Arc<rustls::ServerConfig>, WebhookCertError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(WebhookCertError::CertificatePem)?;
    if certs.is_empty() {
        return Err(WebhookCertError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(WebhookCertError::KeyPem)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(WebhookCertError::Versions)?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(WebhookCertError::Identity)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Binds `addr` for the webhook server: done before the server starts, so
/// a port already taken stops the controller at once instead of leaving it
/// running with webhooks nobody answers.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let serve_error = |source: std::io::Error| Error::Serve {
        what: "webhook",
        addr: addr.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(serve_error)?;
    listener.set_nonblocking(true).map_err(serve_error)?;
    Ok(listener)
}

/// Serves [`router_with`] `client` over HTTPS until `shutdown`.
pub async fn serve(
    client: kube::Client,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_with(
        client,
        bind(addr)?,
        axum_server::tls_rustls::RustlsConfig::from_config(tls),
        shutdown,
    )
    .await
}

async fn serve_with(
    client: kube::Client,
    listener: std::net::TcpListener,
    tls: axum_server::tls_rustls::RustlsConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "(unknown)".to_string(), |a| a.to_string());
    let serve_error = |source: std::io::Error| Error::Serve {
        what: "webhook",
        addr: addr.clone(),
        source,
    };
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        h.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
    });
    axum_server::from_tcp_rustls(listener, tls)
        .map_err(serve_error)?
        .handle(handle)
        .serve(router_with(Some(client)).into_make_service())
        .await
        .map_err(serve_error)
}

/// Serves [`router_with`] the client on `listener` (from [`bind`]) with the certificate in
/// `namespace/secret`, reloading it when the Secret changes.
pub async fn serve_from_secret(
    client: kube::Client,
    namespace: String,
    secret: String,
    listener: std::net::TcpListener,
    reload: std::time::Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let first = load_tls(&client, &namespace, &secret).await?;
    let config = axum_server::tls_rustls::RustlsConfig::from_config(first);
    let reloader = config.clone();
    let server_client = client.clone();
    let watcher = tokio::spawn(async move {
        let api = Api::<Secret>::namespaced(client.clone(), &namespace);
        let mut seen = api
            .get_opt(&secret)
            .await
            .ok()
            .flatten()
            .and_then(|s| s.metadata.resource_version);
        loop {
            tokio::time::sleep(reload).await;
            let rv = match api.get_opt(&secret).await {
                Ok(s) => s.and_then(|s| s.metadata.resource_version),
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "reading the webhook certificate Secret {namespace}/{secret}; keeping the current certificate");
                    continue;
                }
            };
            if rv == seen {
                continue;
            }
            match load_tls(&client, &namespace, &secret).await {
                Ok(tls) => {
                    reloader.reload_from_config(tls);
                    tracing::info!(
                        "the webhook serving certificate changed (Secret {namespace}/{secret}); serving the new one"
                    );
                    seen = rv;
                }
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "keeping the current webhook certificate")
                }
            }
        }
    });
    let r = serve_with(server_client, listener, config, shutdown).await;
    watcher.abort();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A webhook port already taken is an error when the controller starts
    /// (it exits and says where), not a server that never answers while the
    /// pod runs on.
    #[test]
    fn a_taken_webhook_port_is_an_error_at_start() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr).unwrap_err();
        assert!(
            matches!(&err, Error::Serve { what: "webhook", addr: a, .. } if *a == addr.to_string()),
            "{err}"
        );
        drop(taken);
        assert!(bind(addr).is_ok(), "the port once freed");
    }

    /// Covers: bad input (spec.address: the CRD's doc, the webhook and the
    /// controller agree that a port is optional and 50000 is the default)
    #[test]
    fn spec_address_doc_webhook_and_controller_agree_on_the_port() {
        let crd = serde_json::to_value(ichor_api::crds::all()).unwrap();
        let doc = crd
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["spec"]["names"]["kind"] == "TalosMachine")
            .map(|c| {
                c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    ["properties"]["address"]["description"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .unwrap();
        assert!(
            doc.contains("optionally with :port") && doc.contains("50000"),
            "{doc}"
        );
        let port = ichor_api::endpoint::TALOS_API_PORT;
        assert_eq!(port, ichor_talos_client::APID_PORT);
        assert_eq!(port, 50000);
        for (address, dialled) in [
            ("10.5.0.2", "10.5.0.2:50000"),
            ("10.5.0.2:50001", "10.5.0.2:50001"),
            ("node-1.lab", "node-1.lab:50000"),
            ("node-1.lab:50001", "node-1.lab:50001"),
            ("fd00::2", "[fd00::2]:50000"),
            ("[fd00::2]", "[fd00::2]:50000"),
            ("[fd00::2]:50001", "[fd00::2]:50001"),
        ] {
            assert_eq!(address_problem(address), None, "{address}");
            assert_eq!(crate::machine::endpoint(address, port), dialled);
        }
        // The doc's own examples pass the webhook.
        for example in ["10.5.0.2", "node-1.lab:50001", "[fd00::2]:50000"] {
            assert!(doc.contains(example), "{doc}");
            assert_eq!(address_problem(example), None, "{example}");
        }
        for bad in [
            "10.5.0.2:0",
            "10.5.0.2:65536",
            "10.5.0.2:http",
            "fd00::2:50000:1]",
        ] {
            assert!(address_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_machine_patch_that_does_not_parse_is_refused() {
        let m = |inline: &str| json!({"metadata": {"name": "w-1"}, "spec": {"patches": [{"name": "p1", "inline": inline}]}});
        assert!(validate_talosmachine(&m("machine:\n  nodeLabels:\n    a: b\n")).is_empty());
        let p = validate_talosmachine(&m("machine: [unclosed"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("spec.patches[p1]") && p[0].contains("w-1"),
            "{}",
            p[0]
        );
    }

    fn request(uid: &str, object: Value) -> AdmissionReview {
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "UPDATE", "object": object}
        }))
        .unwrap()
    }

    /// Covers: R18.1
    #[test]
    fn a_validator_that_panics_refuses_its_object_and_the_next_review_is_answered() {
        let poisoned = review_with(request("u-1", json!({"spec": {}})), |_, _| {
            let cut: &str = "abc";
            let begin = cut.len() * 2;
            vec![cut[begin..1].to_owned()]
        });
        let response = poisoned.response.unwrap();
        assert!(!response.allowed);
        let message = response.status.unwrap().message;
        assert!(message.contains("defect in Ichor"), "{message}");
        let next = review_machine(request(
            "u-2",
            json!({"metadata": {"name": "w-1"}, "spec": {"hold": true}}),
        ));
        let response = next.response.unwrap();
        assert_eq!((response.uid.as_str(), response.allowed), ("u-2", true));
    }

    /// Covers: R18.1
    #[tokio::test]
    async fn a_review_larger_than_two_mib_is_read() {
        use tower::ServiceExt as _;
        let big = "x".repeat(3 * 1024 * 1024);
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-3", "operation": "UPDATE",
                "object": {"metadata": {"name": "w-1", "annotations": {"big": big}}, "spec": {}}}
        }))
        .unwrap();
        let response = router()
            .oneshot(
                axum::http::Request::post(VALIDATE_TALOSMACHINE_PATH)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::OK);
    }
}

/// The one endpoint parser (`ichor_api::endpoint`) against the two it
/// replaces: the webhook's check of `spec.address` and the controller's
/// dial address.
#[cfg(test)]
mod endpoint_parity {
    use ichor_api::endpoint::{Endpoint, TALOS_API_PORT};
    use proptest::prelude::*;

    use super::address_problem;
    use crate::machine::endpoint;

    /// The dial address before the one parser.
    fn old_endpoint(address: &str, port: u16) -> String {
        let a = address.trim();
        let has_port = if let Some(rest) = a.strip_prefix('[') {
            rest.contains("]:")
        } else {
            a.matches(':').count() == 1
        };
        if has_port {
            a.to_owned()
        } else if a.starts_with('[') && a.ends_with(']') {
            // An IPv6 address in brackets without a port: brackets once.
            format!("{a}:{port}")
        } else if a.contains(':') {
            format!("[{a}]:{port}")
        } else {
            format!("{a}:{port}")
        }
    }

    /// The webhook's check before the one parser.
    fn old_address_problem(address: &str) -> Option<String> {
        const MAX: usize = 253 + 8;
        if address.is_empty() {
            return Some("is empty".into());
        }
        if address.len() > MAX {
            return Some(format!("is {} bytes long, over {MAX}", address.len()));
        }
        if let Some(c) = address
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Some(format!("holds the character {c:?}"));
        }
        if address.contains("://") || address.contains(['/', '@', '?', '#', '%', '\\']) {
            return Some("is a URL, a path or holds user info, not a host".into());
        }
        let (host, port) = if let Some(rest) = address.strip_prefix('[') {
            let Some((ip, after)) = rest.split_once(']') else {
                return Some("opens a [ without closing it".into());
            };
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Some("has no IPv6 address between [ and ]".into());
            }
            match after.strip_prefix(':') {
                Some(p) => (None, Some(p)),
                None if after.is_empty() => (None, None),
                None => return Some("has text after ]".into()),
            }
        } else if address.parse::<std::net::Ipv6Addr>().is_ok() {
            (None, None)
        } else {
            match address.split_once(':') {
                Some((h, p)) => (Some(h), Some(p)),
                None => (Some(address), None),
            }
        };
        if let Some(p) = port
            && !p.parse::<u16>().is_ok_and(|p| p > 0)
        {
            return Some(format!("has port {p:?}, not a number from 1 to 65535"));
        }
        let host = host?;
        if host.parse::<std::net::Ipv4Addr>().is_ok() {
            return None;
        }
        let labels_ok = host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
        // An all-digit last label is a mistyped IPv4 address (10.0.0.300), not a name.
        let numeric_tail = host
            .rsplit('.')
            .next()
            .is_some_and(|l| l.chars().all(|c| c.is_ascii_digit()));
        if !labels_ok || numeric_tail || host.len() > 253 {
            return Some("is neither an IP address nor a DNS host name".into());
        }
        None
    }

    /// Addresses near every rule: hosts, IPv4 and IPv6 (bare, bracketed,
    /// with a port), ports with zeros, out of range, words.
    fn address() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[a-zA-Z0-9.:\\[\\]/@ _-]{0,24}",
            "[a-z0-9-]{1,8}(\\.[a-z0-9-]{1,8}){0,3}(:[0-9+]{0,6})?",
            any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
            any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
            (any::<std::net::Ipv6Addr>(), "[0-9]{0,6}").prop_map(|(ip, p)| format!("[{ip}]:{p}")),
            (any::<std::net::Ipv4Addr>(), prop::option::of("[0-9]{0,6}"))
                .prop_map(|(ip, p)| p.map_or(ip.to_string(), |p| format!("{ip}:{p}"))),
            "[0-9]{1,3}(\\.[0-9]{1,3}){0,4}(:[0-9]{1,5})?",
        ]
    }

    /// Written with a port of its own, as written (`:0080`, `:+80`).
    fn port_as_written(address: &str) -> Option<&str> {
        let after = match address.strip_prefix('[') {
            Some(rest) => rest.split_once(']')?.1,
            None if address.parse::<std::net::Ipv6Addr>().is_ok() => return None,
            None => address,
        };
        after.split_once(':').map(|(_, p)| p)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The webhook refuses what the parser refuses, with the same
        /// words; the controller dials what it accepts as the parser shows
        /// it (a port written `0080` or `+80` dialled as 80, as the Talos
        /// client read it before).
        #[test]
        fn the_one_parser_reads_an_address_as_the_webhook_and_the_dial_did(
            address in address(),
            port in prop_oneof![Just(TALOS_API_PORT), 1u16..],
        ) {
            let parsed = Endpoint::parse(&address, port);
            prop_assert_eq!(
                parsed.as_ref().err().map(|e| e.problem.to_string()),
                old_address_problem(&address),
                "{:?}", address
            );
            prop_assert_eq!(address_problem(&address), old_address_problem(&address));
            if let Ok(e) = parsed {
                let dialled = old_endpoint(&address, port);
                prop_assert_eq!(endpoint(&address, port), e.to_string());
                let canonical = port_as_written(&address)
                    .is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n.to_string() == p));
                if canonical {
                    prop_assert_eq!(e.to_string(), dialled, "{:?}", address);
                } else {
                    let dial = Endpoint::parse(&dialled, port).expect("the dial address reads");
                    prop_assert_eq!(e, dial, "{:?}", address);
                }
            }
        }
    }
}

#[cfg(test)]
mod operation_review {
    use super::*;
    use serde_json::json;

    fn op(health_checks: Value, windows: Value) -> Value {
        json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
            "metadata": {"name": "up", "namespace": "lab"},
            "spec": {
                "kind": "reboot", "target": {"clusterRef": {"name": "lab"}},
                "healthChecks": health_checks, "maintenanceWindows": windows
            }
        })
    }

    fn check(expression: &str) -> Value {
        json!([{"name": "api-up", "expression": expression,
            "target": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "web", "name": "api"}}])
    }

    /// Covers: R15.7
    #[test]
    fn a_check_that_does_not_compile_is_refused_naming_it() {
        let ok = op(
            check(
                "object.status.conditions.exists(c, c.type == 'Available' && c.status == 'True')",
            ),
            json!([]),
        );
        assert_eq!(operation_problems(&ok), Vec::<String>::new());
        let bad = operation_problems(&op(check("object.status.(("), json!([])));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].starts_with("spec.healthChecks[0] (api-up): expression: the CEL expression"),
            "{}",
            bad[0]
        );
    }

    /// A check on Secrets is refused at admission, naming it.
    /// Covers: R15.5
    #[test]
    fn a_check_on_secrets_is_refused() {
        let secret = json!([{"name": "peek", "expression": "object.data.token == 'x'",
            "target": {"apiVersion": "v1", "kind": "Secret", "namespace": "kube-system", "name": "bootstrap"}}]);
        let bad = operation_problems(&op(secret, json!([])));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].starts_with("spec.healthChecks[0] (peek): a health check may not read Secrets"),
            "{}",
            bad[0]
        );
    }

    /// Covers: R15.8
    #[test]
    fn a_window_that_cannot_be_read_is_refused_as_on_the_cluster() {
        let bad = operation_problems(&op(
            json!([]),
            json!([{"cron": "0 2 * * sat", "duration": "2h", "timeZone": "Mars/Olympus"}]),
        ));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].starts_with("spec.maintenanceWindows[0].timeZone \"Mars/Olympus\""),
            "{}",
            bad[0]
        );
    }

    /// An update (an annotation, the finalizer) of an operation whose spec
    /// a newer rule would refuse is let through: the spec cannot change.
    #[test]
    fn an_update_is_not_judged_again() {
        let bad = op(check("object.(("), json!([]));
        let review = |old: Option<Value>| AdmissionReview {
            api_version: "admission.k8s.io/v1".into(),
            kind: "AdmissionReview".into(),
            request: Some(AdmissionRequest {
                uid: "u".into(),
                operation: if old.is_some() { "UPDATE" } else { "CREATE" }.into(),
                object: Some(bad.clone()),
                old_object: old,
                user_info: None,
            }),
            response: None,
        };
        let created = review_operation(review(None)).response.unwrap();
        assert!(!created.allowed);
        let updated = review_operation(review(Some(bad.clone())))
            .response
            .unwrap();
        assert!(updated.allowed);
    }
}
