//! The routes, the session, the security headers and read-only enforcement.
//!
//! - Sign-in: a bearer token, checked by TokenReview, kept in an HttpOnly,
//!   Secure, SameSite=Strict cookie. Every request's token is reviewed again
//!   (answers are remembered for [`REVIEW_TTL`]).
//! - Every POST must carry an `Origin` equal to the server's own (CSRF).
//! - Each action is checked by a SubjectAccessReview for the signed-in user,
//!   then done with the UI's own client; a page renders only the buttons the
//!   user may use.
//! - Read-only: no action route is mounted, [`read_only_layer`] answers 405
//!   to every method but GET and HEAD (sign-in and sign-out excepted: they
//!   write no object), and every page gets no permission, so none carries an action.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use ichor_api::{
    ClusterRef, OperationKind, OperationTarget, TalosMachine, TalosOperation, TalosOperationSpec,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::auth::{self, Access, User};
use crate::html::{self, Viewer};
use crate::store::Cache;
use crate::view::{self, CANCEL_ANNOTATION, MachineQuery, Permissions};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "ichor_session";
/// How long a TokenReview or SubjectAccessReview answer is reused.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// The field manager of the UI's writes.
pub const FIELD_MANAGER: &str = "ichor-ui";

/// The Content-Security-Policy of every answer: this server's files only, no
/// inline code, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// How the server runs.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `settings.readOnly`: nothing is written, no action is offered.
    pub read_only: bool,
    /// The lab's anonymous read-only view: a request without a session may
    /// read (never act). Only allowed when every listener is on loopback
    /// (the caller checks).
    pub anonymous_read: bool,
}

/// What every handler reads.
#[derive(Clone)]
pub struct AppState {
    client: kube::Client,
    cache: Cache,
    settings: Settings,
    reviews: Arc<Mutex<Reviews>>,
}

#[derive(Default)]
struct Reviews {
    users: HashMap<[u8; 32], (Instant, Option<User>)>,
    permissions: HashMap<([u8; 32], String), (Instant, Permissions)>,
}

impl AppState {
    /// The state of a server reading `cache` and writing (when allowed) with `client`.
    pub fn new(client: kube::Client, cache: Cache, settings: Settings) -> AppState {
        AppState {
            client,
            cache,
            settings,
            reviews: Arc::default(),
        }
    }
}

/// The routes alone, without the layers. In read-only mode the action
/// routes are not mounted at all.
pub fn routes(state: AppState) -> Router {
    let mut app = Router::new()
        .route("/", get(|| async { Redirect::to("/clusters") }))
        .route("/healthz", get(|| async { "ok" }))
        .route(html::HTMX_PATH, get(htmx))
        .route(html::CSS_PATH, get(css))
        .route("/signin", get(signin_page).post(signin))
        .route("/signout", post(signout))
        .route("/clusters", get(clusters_page))
        .route("/clusters/{ns}/{name}", get(cluster_page))
        .route("/machines", get(machines_page))
        .route("/machines/{ns}/{name}", get(machine_page))
        .route("/operations", get(operations_page))
        .route("/operations/{ns}/{name}", get(operation_page));
    if !state.settings.read_only {
        app = app
            .route("/machines/{ns}/{name}/release", post(release_hold))
            .route("/machines/{ns}/{name}/hold", post(take_hold))
            .route("/clusters/{ns}/{name}/operations", post(start_operation))
            .route("/operations/{ns}/{name}/cancel", post(cancel_operation));
    }
    app.with_state(state)
}

/// The server: [`routes`] behind the Origin check, the read-only layer and
/// the security headers.
pub fn router(state: AppState) -> Router {
    let read_only = state.settings.read_only;
    routes(state)
        .layer(middleware::from_fn(origin_check))
        .layer(middleware::from_fn(move |req, next| {
            read_only_layer(read_only, req, next)
        }))
        .layer(middleware::from_fn(security_headers))
}

/// Sets the security headers on every answer.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::STRICT_TRANSPORT_SECURITY,
        HeaderValue::from_static("max-age=31536000; includeSubDomains"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// Paths a read-only server still accepts a POST on: they start or end a
/// session and write no object.
const SESSION_PATHS: [&str; 2] = ["/signin", "/signout"];

/// Read-only: 405 for every method but GET and HEAD, whatever the route.
pub async fn read_only_layer(read_only: bool, req: Request, next: Next) -> Response {
    let safe = req.method() == Method::GET || req.method() == Method::HEAD;
    let session = req.method() == Method::POST && SESSION_PATHS.contains(&req.uri().path());
    if read_only && !safe && !session {
        let mut res = (
            StatusCode::METHOD_NOT_ALLOWED,
            Html(
                html::message(
                    "Read-only",
                    "This Ichor UI runs read-only (settings.readOnly): it changes nothing.",
                )
                .into_string(),
            ),
        )
            .into_response();
        res.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return res;
    }
    next.run(req).await
}

/// Whether an Origin header names the host the request was sent to.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    !host.is_empty() && rest.eq_ignore_ascii_case(host)
}

/// Whether a POST comes from this server's own pages: its Origin names the
/// host it was sent to; or the browser serialised the Origin as `null` (Chromium
/// does so for a form POST from a page served with a certificate it does not
/// trust, such as the self-signed one) and its own `Sec-Fetch-Site`, which no
/// page can set, says `same-origin`.
pub fn post_allowed(origin: &str, sec_fetch_site: &str, host: &str) -> bool {
    same_origin(origin, host) || (origin == "null" && sec_fetch_site == "same-origin")
}

/// CSRF: a request that is not GET or HEAD must come from this server's pages ([`post_allowed`]).
pub async fn origin_check(req: Request, next: Next) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let header_str = |name| {
            req.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .unwrap_or("")
        };
        let host = header_str(header::HOST).to_owned();
        let host = if host.is_empty() {
            req.uri()
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_default()
        } else {
            host
        };
        let origin = header_str(header::ORIGIN);
        let fetch_site = header_str(header::HeaderName::from_static("sec-fetch-site"));
        if !post_allowed(origin, fetch_site, &host) {
            return page(
                StatusCode::FORBIDDEN,
                "Refused",
                &format!(
                    "This request did not come from an Ichor page (its Origin {origin:?} is not this server, {host}), so it was refused."
                ),
            );
        }
    }
    next.run(req).await
}

fn page(status: StatusCode, title: &str, text: &str) -> Response {
    (status, Html(html::message(title, text).into_string())).into_response()
}

async fn htmx() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        html::HTMX_JS,
    )
        .into_response()
}

async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        html::CSS,
    )
        .into_response()
}

/// The session token from the Cookie header.
pub fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.to_owned())
        .filter(|v| !v.is_empty())
}

fn token_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Who is asking.
enum Who {
    User { user: User, token: String },
    Anonymous,
}

impl AppState {
    async fn user_of(&self, token: &str) -> Result<Option<User>, Response> {
        let key = token_key(token);
        if let Some((at, user)) = self.reviews.lock().expect("reviews lock").users.get(&key)
            && at.elapsed() < REVIEW_TTL
        {
            return Ok(user.clone());
        }
        let user = auth::review_token(&self.client, token).await.map_err(|e| {
            page(
                StatusCode::BAD_GATEWAY,
                "Kubernetes API error",
                &e.to_string(),
            )
        })?;
        self.reviews
            .lock()
            .expect("reviews lock")
            .users
            .insert(key, (Instant::now(), user.clone()));
        Ok(user)
    }

    /// The request's viewer, or the answer that sends them to sign in.
    async fn who(&self, headers: &HeaderMap) -> Result<Who, Response> {
        if let Some(token) = session_token(headers)
            && let Some(user) = self.user_of(&token).await?
        {
            return Ok(Who::User { user, token });
        }
        if self.settings.anonymous_read {
            return Ok(Who::Anonymous);
        }
        Err(Redirect::to("/signin").into_response())
    }

    /// What the viewer may do in `namespace`: nothing when read-only or anonymous.
    async fn permissions(&self, who: &Who, namespace: &str) -> Result<Permissions, Response> {
        let Who::User { user, token } = who else {
            return Ok(Permissions::default());
        };
        if self.settings.read_only {
            return Ok(Permissions::default());
        }
        let key = (token_key(token), namespace.to_owned());
        if let Some((at, p)) = self
            .reviews
            .lock()
            .expect("reviews lock")
            .permissions
            .get(&key)
            && at.elapsed() < REVIEW_TTL
        {
            return Ok(*p);
        }
        let p = auth::permissions(&self.client, user, namespace)
            .await
            .map_err(|e| {
                page(
                    StatusCode::BAD_GATEWAY,
                    "Kubernetes API error",
                    &e.to_string(),
                )
            })?;
        self.reviews
            .lock()
            .expect("reviews lock")
            .permissions
            .insert(key, (Instant::now(), p));
        Ok(p)
    }

    fn viewer(&self, who: &Who) -> Viewer {
        Viewer {
            user: match who {
                Who::User { user, .. } => Some(user.username.clone()),
                Who::Anonymous => None,
            },
            read_only: self.settings.read_only,
        }
    }
}

fn ok_html(markup: maud::Markup) -> Response {
    Html(markup.into_string()).into_response()
}

fn not_found(what: &str) -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Not found",
        &format!("There is no {what}."),
    )
}

async fn signin_page() -> Response {
    ok_html(html::signin(None))
}

/// Reads an `application/x-www-form-urlencoded` body into pairs (repeated keys kept).
pub fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(b) => {
                            out.push(b);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn form_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Whether `token` looks like a bearer token (a JWT, a bootstrap or static
/// token): the characters of base64url, base64 and `.`, so it is also a
/// cookie value as it is.
pub fn is_bearer_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 16 * 1024
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

async fn signin(State(state): State<AppState>, body: Bytes) -> Response {
    let pairs = form_pairs(&body);
    let token = form_value(&pairs, "token").unwrap_or("").trim().to_owned();
    if !is_bearer_token(&token) {
        return (
            StatusCode::UNAUTHORIZED,
            Html(
                html::signin(Some("Paste a token: it is empty or not a bearer token."))
                    .into_string(),
            ),
        )
            .into_response();
    }
    match state.user_of(&token).await {
        Ok(Some(_)) => {
            let cookie =
                format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; Secure; SameSite=Strict");
            let mut res = Redirect::to("/clusters").into_response();
            res.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&cookie).expect("a token of visible ASCII is a header value"),
            );
            res
        }
        Ok(None) => (
            StatusCode::UNAUTHORIZED,
            Html(
                html::signin(Some(
                    "The Kubernetes API server did not accept this token (TokenReview): it is expired, revoked or not a token of this cluster.",
                ))
                .into_string(),
            ),
        )
            .into_response(),
        Err(res) => res,
    }
}

async fn signout() -> Response {
    let mut res = Redirect::to("/signin").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "ichor_session=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0",
        ),
    );
    res
}

async fn clusters_page(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let page = view::clusters_page(&state.cache.inventory());
    Ok(ok_html(html::clusters(&page, &state.viewer(&who))))
}

async fn cluster_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let perms = state.permissions(&who, &ns).await?;
    Ok(
        match view::cluster_page(&state.cache.inventory(), &ns, &name, perms) {
            Some(p) => ok_html(html::cluster(&p, &state.viewer(&who))),
            None => not_found(&format!("TalosCluster {ns}/{name}")),
        },
    )
}

async fn machines_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<MachineQuery>,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let page = view::machines_page(&state.cache.inventory(), query);
    Ok(ok_html(html::machines(&page, &state.viewer(&who))))
}

async fn machine_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let perms = state.permissions(&who, &ns).await?;
    Ok(
        match view::machine_page(&state.cache.inventory(), &ns, &name, perms) {
            Some(p) => ok_html(html::machine(&p, &state.viewer(&who))),
            None => not_found(&format!("TalosMachine {ns}/{name}")),
        },
    )
}

async fn operations_page(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let rows = view::operations_page(&state.cache.inventory());
    Ok(ok_html(html::operations(&rows, &state.viewer(&who))))
}

async fn operation_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let who = state.who(&headers).await?;
    let perms = state.permissions(&who, &ns).await?;
    Ok(
        match view::operation_page(&state.cache.inventory(), &ns, &name, perms) {
            Some(p) => ok_html(html::operation(&p, &state.viewer(&who))),
            None => not_found(&format!("TalosOperation {ns}/{name}")),
        },
    )
}

/// The signed-in user, after a SubjectAccessReview says they may do `access`.
/// Anonymous viewers and refused users get the page that says so; the
/// review is asked afresh (not from the page's remembered answers).
async fn authorise(
    state: &AppState,
    headers: &HeaderMap,
    access: Access<'_>,
) -> Result<User, Response> {
    let user = match state.who(headers).await? {
        Who::User { user, .. } => user,
        Who::Anonymous => {
            return Err(page(
                StatusCode::UNAUTHORIZED,
                "Sign in first",
                "Actions need a signed-in user.",
            ));
        }
    };
    let allowed = auth::may(&state.client, &user, access).await.map_err(|e| {
        page(
            StatusCode::BAD_GATEWAY,
            "Kubernetes API error",
            &e.to_string(),
        )
    })?;
    if !allowed {
        return Err(page(
            StatusCode::FORBIDDEN,
            "Not allowed",
            &format!(
                "{} may not {} {} in namespace {}: ask for that RBAC permission.",
                user.username, access.verb, access.resource, access.namespace
            ),
        ));
    }
    Ok(user)
}

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn api_error(what: &str, e: kube::Error) -> Response {
    let status = match &e {
        kube::Error::Api(s) if s.code == 404 => StatusCode::NOT_FOUND,
        kube::Error::Api(s) if s.code == 409 || s.code == 422 => StatusCode::CONFLICT,
        _ => StatusCode::BAD_GATEWAY,
    };
    page(status, "The change was not made", &format!("{what}: {e}"))
}

async fn set_hold(
    state: AppState,
    headers: HeaderMap,
    ns: String,
    name: String,
    hold: bool,
) -> Response {
    let access = Access {
        verb: "patch",
        resource: "talosmachines",
        namespace: &ns,
        name: Some(&name),
    };
    if let Err(r) = authorise(&state, &headers, access).await {
        return r;
    }
    let api: Api<TalosMachine> = Api::namespaced(state.client.clone(), &ns);
    let patch = json!({ "spec": { "hold": hold } });
    match api
        .patch(&name, &write_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Redirect::to(&format!("/machines/{ns}/{name}")).into_response(),
        Err(e) => api_error(
            &format!(
                "{} the hold of TalosMachine {ns}/{name}",
                if hold { "taking" } else { "releasing" }
            ),
            e,
        ),
    }
}

async fn release_hold(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, headers, ns, name, false).await
}

async fn take_hold(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, headers, ns, name, true).await
}

async fn start_operation(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, cluster)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let access = Access {
        verb: "create",
        resource: "talosoperations",
        namespace: &ns,
        name: None,
    };
    if let Err(r) = authorise(&state, &headers, access).await {
        return r;
    }
    let pairs = form_pairs(&body);
    let kind = match form_value(&pairs, "kind").unwrap_or("") {
        "reboot" => OperationKind::Reboot,
        "talos-upgrade" => OperationKind::TalosUpgrade,
        "kubernetes-upgrade" => OperationKind::KubernetesUpgrade,
        "ichor" => OperationKind::Ichor,
        other => {
            return page(
                StatusCode::BAD_REQUEST,
                "Unknown operation",
                &format!(
                    "{other:?} is not an operation kind: use reboot, talos-upgrade or kubernetes-upgrade"
                ),
            );
        }
    };
    let inventory = state.cache.inventory();
    let summary = view::ichor_summary(inventory.installation.as_deref());
    if kind == OperationKind::Ichor
        && let Some(cmd) = summary.helm_upgrade_command
    {
        return page(
            StatusCode::CONFLICT,
            "Ichor is managed by Helm",
            &format!("Helm upgrades this Ichor, not a TalosOperation: {cmd}"),
        );
    }
    let version = form_value(&pairs, "version")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let machines: Vec<String> = pairs
        .iter()
        .filter(|(k, v)| k == "machines" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    let op = TalosOperation {
        metadata: ObjectMeta {
            generate_name: Some(format!("{cluster}-{}-", kind.as_str())),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        spec: TalosOperationSpec {
            kind,
            target: OperationTarget {
                cluster_ref: ClusterRef {
                    name: cluster.clone(),
                },
                machines,
            },
            version: if kind == OperationKind::Reboot {
                None
            } else {
                version
            },
            concurrency: None,
            installer_image: None,
            dry_run: false,
        },
        status: None,
    };
    let api: Api<TalosOperation> = Api::namespaced(state.client.clone(), &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&pp, &op).await {
        Ok(created) => Redirect::to(&format!(
            "/operations/{ns}/{}",
            created.metadata.name.unwrap_or_default()
        ))
        .into_response(),
        Err(e) => api_error(
            &format!(
                "creating a {} TalosOperation on cluster {ns}/{cluster}",
                kind.as_str()
            ),
            e,
        ),
    }
}

async fn cancel_operation(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let access = Access {
        verb: "patch",
        resource: "talosoperations",
        namespace: &ns,
        name: Some(&name),
    };
    let user = match authorise(&state, &headers, access).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let api: Api<TalosOperation> = Api::namespaced(state.client.clone(), &ns);
    let patch = json!({ "metadata": { "annotations": { CANCEL_ANNOTATION: format!("by {} from the UI", user.username) } } });
    match api
        .patch(&name, &write_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Redirect::to(&format!("/operations/{ns}/{name}")).into_response(),
        Err(e) => api_error(&format!("cancelling TalosOperation {ns}/{name}"), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: issue 15 item 4 (every POST checks Origin)
    #[test]
    fn posts_must_come_from_this_server() {
        let host = "ui.example:8443";
        assert!(post_allowed("https://ui.example:8443", "", host));
        assert!(post_allowed("https://UI.example:8443", "same-origin", host));
        assert!(
            !post_allowed("https://ui.example", "", host),
            "another port is another origin"
        );
        assert!(!post_allowed("https://evil.example", "cross-site", host));
        assert!(!post_allowed("", "", host));
        assert!(!post_allowed("null", "", host));
        assert!(!post_allowed("null", "cross-site", host));
        assert!(!post_allowed("null", "same-site", host));
        assert!(post_allowed("null", "same-origin", host));
        assert!(!post_allowed("https://ui.example:8443", "", ""));
        assert!(!post_allowed("ftp://ui.example:8443", "", host));
    }

    #[test]
    fn forms_decode_repeated_keys() {
        assert_eq!(
            form_pairs(b"kind=reboot&machines=a&machines=b%2Dc&version=&x=1+2%"),
            vec![
                ("kind".to_string(), "reboot".to_string()),
                ("machines".into(), "a".into()),
                ("machines".into(), "b-c".into()),
                ("version".into(), "".into()),
                ("x".into(), "1 2%".into()),
            ]
        );
    }

    #[test]
    fn bearer_tokens_are_cookie_values() {
        assert!(is_bearer_token(
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"
        ));
        assert!(is_bearer_token("abcdef.0123456789abcdef"));
        for bad in ["", "a b", "a;b=c", "a,b", "\"quoted\"", "tok\r\nX: y"] {
            assert!(!is_bearer_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; ichor_session=tok.en; b=2"),
        );
        assert_eq!(session_token(&h).as_deref(), Some("tok.en"));
        h.insert(header::COOKIE, HeaderValue::from_static("ichor_session="));
        assert_eq!(session_token(&h), None);
    }
}
