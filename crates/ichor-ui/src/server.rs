//! The routes, the sessions, the security headers and read-only enforcement.
//!
//! - Sign-in: a bearer token, checked by TokenReview, starts a server-side
//!   session ([`crate::session`]); the cookie carries only its random id
//!   (`__Host-ichor_session`: HttpOnly, Secure, SameSite=Strict, Path=/).
//!   The token stays in memory and is reviewed again every [`REVIEW_TTL`];
//!   sign-out removes the session. Sign-in attempts are rate-limited
//!   ([`crate::limit`]).
//! - Every page shows only the objects the user may `list` (or, for one
//!   object's page, `get`), asked by SubjectAccessReview per kind: once for
//!   every namespace, else per namespace that holds objects.
//! - Every POST must carry an `Origin` equal to the server's own (CSRF).
//! - Each action is checked by a SubjectAccessReview for the signed-in user,
//!   then made with a client that carries the user's own token
//!   ([`UserClients`]): the API server's RBAC and audit log see the user.
//! - Read-only: no action route is mounted, [`read_only_layer`] answers 405
//!   to every method but GET and HEAD (sign-in and sign-out excepted: they
//!   write no object), and every page gets no permission, so none carries an action.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Form, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum_extra::extract::CookieJar;
use axum_extra::extract::cookie::{Cookie, SameSite};
use ichor_api::{
    ClusterRef, OperationKind, OperationTarget, TalosMachine, TalosOperation, TalosOperationSpec,
};
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::auth::{self, Access, User, UserClients};
use crate::html::{self, Viewer};
use crate::limit::{self, SignInLimiter};
use crate::session::{self, Sessions, TtlCache};
use crate::store::Cache;
use crate::view::{
    self, CANCEL_ANNOTATION, Inventory, MachineQuery, Permissions, ReadGrants, Readable,
};

/// How long a TokenReview or SubjectAccessReview answer is reused.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// The most SubjectAccessReview answers remembered.
pub const MAX_REVIEWS: usize = 20_000;
/// How many SubjectAccessReviews one page asks at once.
const REVIEWS_AT_ONCE: usize = 8;
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

/// What the server remembers and allows at most; [`Limits::default`] is
/// the constants of [`session`], [`limit`] and [`MAX_REVIEWS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_sessions: usize,
    pub max_reviews: usize,
    pub signin_per_client: limit::Rate,
    pub signin_global: limit::Rate,
    pub max_clients: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: session::MAX_SESSIONS,
            max_reviews: MAX_REVIEWS,
            signin_per_client: limit::PER_CLIENT,
            signin_global: limit::GLOBAL,
            max_clients: limit::MAX_CLIENTS,
        }
    }
}

/// What every handler reads.
#[derive(Clone)]
pub struct AppState {
    client: kube::Client,
    users: UserClients,
    cache: Cache,
    settings: Settings,
    shared: Arc<Shared>,
}

/// The server's memory: sessions, review answers, sign-in buckets.
struct Shared {
    sessions: Mutex<Sessions>,
    decisions: Mutex<TtlCache<Decision, bool>>,
    signins: Mutex<SignInLimiter>,
}

impl Shared {
    fn new(limits: Limits) -> Shared {
        Shared {
            sessions: Mutex::new(Sessions::with_max(limits.max_sessions)),
            decisions: Mutex::new(TtlCache::new(REVIEW_TTL, limits.max_reviews)),
            signins: Mutex::new(SignInLimiter::new(
                limits.signin_per_client,
                limits.signin_global,
                limits.max_clients,
            )),
        }
    }
}

/// One remembered SubjectAccessReview: a session's user, an [`Access`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Decision {
    session: session::Key,
    verb: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Decision {
    fn of(session: session::Key, a: Access<'_>) -> Decision {
        Decision {
            session,
            verb: a.verb.into(),
            resource: a.resource.into(),
            namespace: a.namespace.map(Into::into),
            name: a.name.map(Into::into),
        }
    }
}

/// A poisoned lock only means a handler panicked mid-update; the maps stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl AppState {
    /// The state of a server that reads `cache`, asks the API server with
    /// the UI's own `client` (TokenReview, SubjectAccessReview) and writes
    /// (when allowed) with clients from `users`, which carry the user's token.
    pub fn new(
        client: kube::Client,
        users: UserClients,
        cache: Cache,
        settings: Settings,
    ) -> AppState {
        AppState {
            client,
            users,
            cache,
            settings,
            shared: Arc::new(Shared::new(Limits::default())),
        }
    }

    /// The same server with other bounds (and empty memory).
    pub fn with_limits(mut self, limits: Limits) -> AppState {
        self.shared = Arc::new(Shared::new(limits));
        self
    }

    /// How many sessions the server keeps now.
    pub fn session_count(&self) -> usize {
        lock(&self.shared.sessions).len()
    }

    /// How many SubjectAccessReview answers the server remembers now.
    pub fn remembered_reviews(&self) -> usize {
        lock(&self.shared.decisions).len()
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

/// Marks a request that came in on the deprecated plain-HTTP listener
/// ([`crate::tls::serve`] adds it): its session cookie has the name a
/// browser keeps over http ([`session::PLAINTEXT_COOKIE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plaintext;

/// The session cookie's name for a request on HTTPS (`plaintext` false) or plain HTTP.
pub fn cookie_name(plaintext: bool) -> &'static str {
    if plaintext {
        session::PLAINTEXT_COOKIE
    } else {
        session::COOKIE
    }
}

/// The value of cookie `name` in the Cookie header (an empty one is none).
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    CookieJar::from_headers(headers)
        .get(name)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
}

/// The session cookie with `value`, living `max_age`: host-only (no
/// Domain), Path=/, Secure, HttpOnly, SameSite=Strict.
fn session_cookie_with(plaintext: bool, value: String, max_age: Duration) -> String {
    Cookie::build((cookie_name(plaintext), value))
        .path("/")
        .max_age(cookie::time::Duration::try_from(max_age).unwrap_or(cookie::time::Duration::ZERO))
        .http_only(true)
        .secure(true)
        .same_site(SameSite::Strict)
        .build()
        .to_string()
}

/// The Set-Cookie value that starts session `id`: it ends with the
/// session's absolute expiry at the latest.
pub fn session_cookie(plaintext: bool, id: &str) -> String {
    session_cookie_with(plaintext, id.to_owned(), session::ABSOLUTE_TIMEOUT)
}

/// The Set-Cookie value that drops the session cookie.
pub fn cleared_cookie(plaintext: bool) -> String {
    session_cookie_with(plaintext, String::new(), Duration::ZERO)
}

/// Who sent a request: the session cookie of its listener, its peer address.
#[derive(Debug, Clone)]
pub struct Caller {
    pub session_id: Option<String>,
    pub address: Option<IpAddr>,
    pub plaintext: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Infallible> {
        let plaintext = parts.extensions.get::<Plaintext>().is_some();
        Ok(Caller {
            session_id: cookie(&parts.headers, cookie_name(plaintext)),
            address: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
            plaintext,
        })
    }
}

/// A signed-in user: their session and token.
struct SignedIn {
    key: session::Key,
    user: User,
    token: String,
}

/// Who is asking.
enum Who {
    User(SignedIn),
    Anonymous,
}

/// An error and each of its causes, for a page.
fn explain(e: &(dyn std::error::Error + 'static)) -> String {
    ichor_api::error_text::chain(e)
}

fn api_failure(e: &(dyn std::error::Error + 'static)) -> Response {
    page(StatusCode::BAD_GATEWAY, "Kubernetes API error", &explain(e))
}

/// Sends to the sign-in page, dropping a session cookie that no longer works.
fn to_signin(caller: &Caller) -> Response {
    let mut res = Redirect::to("/signin").into_response();
    if caller.session_id.is_some() {
        set_cookie(&mut res, &cleared_cookie(caller.plaintext));
    }
    res
}

fn set_cookie(res: &mut Response, value: &str) {
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(value).expect("a cookie of visible ASCII is a header value"),
    );
}

/// The kinds a page is about.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Cluster,
    Machine,
    Operation,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Cluster => "talosclusters",
            Kind::Machine => "talosmachines",
            Kind::Operation => "talosoperations",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "TalosCluster",
            Kind::Machine => "TalosMachine",
            Kind::Operation => "TalosOperation",
        }
    }

    fn exists(self, inv: &Inventory, ns: &str, name: &str) -> bool {
        fn has<K: kube::Resource>(items: &[Arc<K>], ns: &str, name: &str) -> bool {
            items
                .iter()
                .any(|o| o.namespace().as_deref() == Some(ns) && o.name_any() == name)
        }
        match self {
            Kind::Cluster => has(&inv.clusters, ns, name),
            Kind::Machine => has(&inv.machines, ns, name),
            Kind::Operation => has(&inv.operations, ns, name),
        }
    }

    fn readable(self, grants: &mut ReadGrants) -> &mut Readable {
        match self {
            Kind::Cluster => &mut grants.clusters,
            Kind::Machine => &mut grants.machines,
            Kind::Operation => &mut grants.operations,
        }
    }
}

/// One object's page: what its viewer may see of the inventory and do.
struct Detail {
    who: Who,
    inventory: Inventory,
    perms: Permissions,
}

impl AppState {
    /// The request's viewer, or the answer that sends them to sign in.
    async fn who(&self, caller: &Caller) -> Result<Who, Response> {
        if let Some(id) = &caller.session_id {
            let now = Instant::now();
            let found = lock(&self.shared.sessions).touch(id, now).map(|(key, s)| {
                let stale = now.saturating_duration_since(s.reviewed) >= REVIEW_TTL;
                (key, s.user.clone(), s.token.clone(), stale)
            });
            if let Some((key, user, token, stale)) = found
                && (!stale || self.still_valid(&key, &user, &token).await?)
            {
                return Ok(Who::User(SignedIn { key, user, token }));
            }
        }
        if self.settings.anonymous_read {
            return Ok(Who::Anonymous);
        }
        Err(to_signin(caller))
    }

    /// Asks the API server again whether the session's token is `user`'s;
    /// ends the session when it is not (expired, revoked, another user).
    async fn still_valid(
        &self,
        key: &session::Key,
        user: &User,
        token: &str,
    ) -> Result<bool, Response> {
        let answer = auth::review_token(&self.client, token)
            .await
            .map_err(|e| api_failure(&e))?;
        let mut sessions = lock(&self.shared.sessions);
        if answer.as_ref() == Some(user) {
            if let Some(s) = sessions.get_mut(key) {
                s.reviewed = Instant::now();
            }
            Ok(true)
        } else {
            sessions.remove(key);
            Ok(false)
        }
    }

    /// Whether the signed-in user may do `access` (remembered for [`REVIEW_TTL`]).
    async fn decide(&self, who: &SignedIn, access: Access<'_>) -> Result<bool, Response> {
        let key = Decision::of(who.key, access);
        if let Some(answer) = lock(&self.shared.decisions).get(&key, Instant::now()) {
            return Ok(answer);
        }
        let answer = auth::may(&self.client, &who.user, access)
            .await
            .map_err(|e| api_failure(&e))?;
        lock(&self.shared.decisions).insert(key, answer, Instant::now());
        Ok(answer)
    }

    /// Where the user may list `resource`: everywhere, or which of `namespaces`.
    async fn readable(
        &self,
        who: &SignedIn,
        resource: &'static str,
        namespaces: &BTreeSet<String>,
    ) -> Result<Readable, Response> {
        fn list<'a>(resource: &'a str, namespace: Option<&'a str>) -> Access<'a> {
            Access {
                verb: "list",
                resource,
                namespace,
                name: None,
            }
        }
        if self.decide(who, list(resource, None)).await? {
            return Ok(Readable::Everywhere);
        }
        let namespaces: Vec<&String> = namespaces.iter().collect();
        let mut allowed = BTreeSet::new();
        for chunk in namespaces.chunks(REVIEWS_AT_ONCE) {
            let asks = chunk
                .iter()
                .map(|ns| self.decide(who, list(resource, Some(ns.as_str()))));
            let answers = futures::future::try_join_all(asks).await?;
            for (ns, ok) in chunk.iter().zip(answers) {
                if ok {
                    allowed.insert((*ns).clone());
                }
            }
        }
        Ok(Readable::In(allowed))
    }

    /// What the viewer may read of the kinds, asked for the namespaces
    /// given per kind (clusters, machines, operations).
    async fn read_grants(
        &self,
        who: &Who,
        [clusters, machines, operations]: &[BTreeSet<String>; 3],
    ) -> Result<ReadGrants, Response> {
        let Who::User(u) = who else {
            return Ok(ReadGrants::everything());
        };
        let (clusters, machines, operations) = futures::try_join!(
            self.readable(u, Kind::Cluster.resource(), clusters),
            self.readable(u, Kind::Machine.resource(), machines),
            self.readable(u, Kind::Operation.resource(), operations),
        )?;
        Ok(ReadGrants {
            clusters,
            machines,
            operations,
        })
    }

    /// A list page's inventory: the cache, filtered by what the viewer may
    /// list; and whether that hides every object there is.
    async fn list_page(&self, caller: &Caller) -> Result<(Who, Inventory, bool), Response> {
        let who = self.who(caller).await?;
        let inv = self.cache.inventory();
        let grants = self.read_grants(&who, &view::namespaces(&inv)).await?;
        let any =
            !(inv.clusters.is_empty() && inv.machines.is_empty() && inv.operations.is_empty());
        Ok((
            who,
            view::visible(&inv, &grants),
            any && grants.reads_nothing(),
        ))
    }

    /// One object's page. An object the cache does not hold costs no review
    /// (a made-up URL asks the API server nothing); one the viewer may
    /// neither list in its namespace nor get by name is answered as missing.
    async fn detail(
        &self,
        caller: &Caller,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Detail, Response> {
        let who = self.who(caller).await?;
        let inv = self.cache.inventory();
        if !kind.exists(&inv, ns, name) {
            return Err(not_found(kind, ns, name));
        }
        let here = BTreeSet::from([ns.to_owned()]);
        let mut grants = self
            .read_grants(&who, &[here.clone(), here.clone(), here])
            .await?;
        if !kind.readable(&mut grants).allows(ns) {
            let by_name = match &who {
                Who::User(u) => {
                    let get = Access {
                        verb: "get",
                        resource: kind.resource(),
                        namespace: Some(ns),
                        name: Some(name),
                    };
                    self.decide(u, get).await?
                }
                Who::Anonymous => false,
            };
            if !by_name {
                return Err(not_found(kind, ns, name));
            }
            // The page shows this one object of its kind.
            let readable = kind.readable(&mut grants);
            *readable = std::mem::take(readable).with(ns);
        }
        let perms = self.permissions(&who, ns).await?;
        Ok(Detail {
            inventory: view::visible(&inv, &grants),
            who,
            perms,
        })
    }

    /// What the viewer may do in `namespace`: nothing when read-only or anonymous.
    async fn permissions(&self, who: &Who, namespace: &str) -> Result<Permissions, Response> {
        let Who::User(u) = who else {
            return Ok(Permissions::default());
        };
        if self.settings.read_only {
            return Ok(Permissions::default());
        }
        let ask = |verb, resource| Access {
            verb,
            resource,
            namespace: Some(namespace),
            name: None,
        };
        let (patch_machines, create_operations, patch_operations) = futures::try_join!(
            self.decide(u, ask("patch", "talosmachines")),
            self.decide(u, ask("create", "talosoperations")),
            self.decide(u, ask("patch", "talosoperations")),
        )?;
        Ok(Permissions {
            patch_machines,
            create_operations,
            patch_operations,
        })
    }

    fn viewer(&self, who: &Who, reads_nothing: bool) -> Viewer {
        Viewer {
            user: match who {
                Who::User(u) => Some(u.user.username.clone()),
                Who::Anonymous => None,
            },
            read_only: self.settings.read_only,
            reads_nothing,
        }
    }
}

fn ok_html(markup: maud::Markup) -> Response {
    Html(markup.into_string()).into_response()
}

fn not_found(kind: Kind, ns: &str, name: &str) -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Not found",
        &format!("There is no {} {ns}/{name} that you may read.", kind.name()),
    )
}

async fn signin_page() -> Response {
    ok_html(html::signin(None))
}

/// A form body's fields in order, repeated keys kept (a multi-select).
type FormPairs = Vec<(String, String)>;

fn form_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Whether `token` looks like a bearer token (a JWT, a bootstrap or static
/// token): the characters of base64url, base64 and `.`.
pub fn is_bearer_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 16 * 1024
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

fn signin_refused(status: StatusCode, message: &str) -> Response {
    (status, Html(html::signin(Some(message)).into_string())).into_response()
}

/// The answer to a sign-in attempt beyond the rate limit.
fn too_many_attempts(wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut res = signin_refused(
        StatusCode::TOO_MANY_REQUESTS,
        &format!(
            "Too many sign-in attempts from your address or from everyone: nothing was checked. Try again in {secs} s."
        ),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

async fn signin(
    State(state): State<AppState>,
    caller: Caller,
    Form(pairs): Form<FormPairs>,
) -> Response {
    // First: every attempt past this point costs the API server a TokenReview.
    if let Err(wait) = lock(&state.shared.signins).attempt(caller.address, Instant::now()) {
        return too_many_attempts(wait);
    }
    let token = form_value(&pairs, "token").unwrap_or("").trim().to_owned();
    if !is_bearer_token(&token) {
        return signin_refused(
            StatusCode::UNAUTHORIZED,
            "Paste a token: it is empty or not a bearer token.",
        );
    }
    let user = match auth::review_token(&state.client, &token).await {
        Ok(Some(user)) => user,
        Ok(None) => {
            return signin_refused(
                StatusCode::UNAUTHORIZED,
                "The Kubernetes API server did not accept this token (TokenReview): it is expired, revoked or not a token of this cluster.",
            );
        }
        Err(e) => return api_failure(&e),
    };
    let id = match session::new_id() {
        Ok(id) => id,
        Err(e) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No session",
                &explain(&e),
            );
        }
    };
    {
        let mut sessions = lock(&state.shared.sessions);
        // A new id at each sign-in: a session id planted before sign-in is worth nothing.
        if let Some(old) = &caller.session_id {
            sessions.remove_id(old);
        }
        sessions.insert(&id, token, user, Instant::now());
    }
    let mut res = Redirect::to("/clusters").into_response();
    set_cookie(&mut res, &session_cookie(caller.plaintext, &id));
    res
}

async fn signout(State(state): State<AppState>, caller: Caller) -> Response {
    if let Some(id) = &caller.session_id {
        lock(&state.shared.sessions).remove_id(id);
    }
    let mut res = Redirect::to("/signin").into_response();
    set_cookie(&mut res, &cleared_cookie(caller.plaintext));
    res
}

async fn clusters_page(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let page = view::clusters_page(&inv);
    Ok(ok_html(html::clusters(
        &page,
        &state.viewer(&who, reads_nothing),
    )))
}

async fn cluster_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Cluster, &ns, &name).await?;
    Ok(
        match view::cluster_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::cluster(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Cluster, &ns, &name),
        },
    )
}

async fn machines_page(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<MachineQuery>,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let page = view::machines_page(&inv, query);
    Ok(ok_html(html::machines(
        &page,
        &state.viewer(&who, reads_nothing),
    )))
}

async fn machine_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Machine, &ns, &name).await?;
    Ok(
        match view::machine_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::machine(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Machine, &ns, &name),
        },
    )
}

async fn operations_page(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let rows = view::operations_page(&inv);
    Ok(ok_html(html::operations(
        &rows,
        &state.viewer(&who, reads_nothing),
    )))
}

async fn operation_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Operation, &ns, &name).await?;
    Ok(
        match view::operation_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::operation(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Operation, &ns, &name),
        },
    )
}

/// The signed-in user and a client that acts as them, after a
/// SubjectAccessReview says they may do `access`. Anonymous viewers and
/// refused users get the page that says so; the review is asked afresh
/// (not from the pages' remembered answers).
async fn authorise(
    state: &AppState,
    caller: &Caller,
    access: Access<'_>,
) -> Result<(User, kube::Client), Response> {
    let signed_in = match state.who(caller).await? {
        Who::User(u) => u,
        Who::Anonymous => {
            return Err(page(
                StatusCode::UNAUTHORIZED,
                "Sign in first",
                "Actions need a signed-in user.",
            ));
        }
    };
    let allowed = auth::may(&state.client, &signed_in.user, access)
        .await
        .map_err(|e| api_failure(&e))?;
    if !allowed {
        return Err(page(
            StatusCode::FORBIDDEN,
            "Not allowed",
            &format!(
                "{} may not {} {} {}: ask for that RBAC permission.",
                signed_in.user.username,
                access.verb,
                access.resource,
                access.scope()
            ),
        ));
    }
    let client = state
        .users
        .client(&signed_in.token)
        .map_err(|e| api_failure(&e))?;
    Ok((signed_in.user, client))
}

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn api_error(what: &str, e: kube::Error) -> Response {
    let status = match &e {
        kube::Error::Api(s) if s.code == 401 => StatusCode::UNAUTHORIZED,
        kube::Error::Api(s) if s.code == 403 => StatusCode::FORBIDDEN,
        kube::Error::Api(s) if s.code == 404 => StatusCode::NOT_FOUND,
        kube::Error::Api(s) if s.code == 409 || s.code == 422 => StatusCode::CONFLICT,
        _ => StatusCode::BAD_GATEWAY,
    };
    page(
        status,
        "The change was not made",
        &format!("{what}: {}", explain(&e)),
    )
}

async fn set_hold(
    state: AppState,
    caller: Caller,
    ns: String,
    name: String,
    hold: bool,
) -> Response {
    let access = Access {
        verb: "patch",
        resource: "talosmachines",
        namespace: Some(&ns),
        name: Some(&name),
    };
    let client = match authorise(&state, &caller, access).await {
        Ok((_, client)) => client,
        Err(r) => return r,
    };
    let api: Api<TalosMachine> = Api::namespaced(client, &ns);
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
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, caller, ns, name, false).await
}

async fn take_hold(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, caller, ns, name, true).await
}

/// Why the UI refuses an operation of kind ichor, whoever asks.
pub fn ichor_kind_refusal(helm_upgrade_command: Option<&str>) -> String {
    let mut text = format!(
        "Ichor upgrades itself through `ichor upgrade ichor` in the system namespace {}, not through the UI: a TalosOperation of kind ichor is refused here, and nothing was written.",
        ichor_api::SYSTEM_NAMESPACE
    );
    if let Some(cmd) = helm_upgrade_command {
        text.push_str(&format!(
            " This Ichor is managed by Helm, so Helm upgrades it: {cmd}"
        ));
    }
    text
}

async fn start_operation(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, cluster)): Path<(String, String)>,
    Form(pairs): Form<FormPairs>,
) -> Response {
    let access = Access {
        verb: "create",
        resource: "talosoperations",
        namespace: Some(&ns),
        name: None,
    };
    let client = match authorise(&state, &caller, access).await {
        Ok((_, client)) => client,
        Err(r) => return r,
    };
    let kind = match form_value(&pairs, "kind").unwrap_or("").parse() {
        Ok(
            kind @ (OperationKind::Reboot
            | OperationKind::TalosUpgrade
            | OperationKind::KubernetesUpgrade),
        ) => kind,
        // The form never offers it; a forged POST must not start one.
        Ok(OperationKind::Ichor) => {
            let inventory = state.cache.inventory();
            let summary = view::ichor_summary(inventory.installation.as_deref());
            return page(
                StatusCode::BAD_REQUEST,
                "Not an operation of the UI",
                &ichor_kind_refusal(summary.helm_upgrade_command.as_deref()),
            );
        }
        Err(ichor_api::UnknownOperationKind(other)) => {
            return page(
                StatusCode::BAD_REQUEST,
                "Unknown operation",
                &format!(
                    "{other:?} is not an operation kind: use reboot, talos-upgrade or kubernetes-upgrade"
                ),
            );
        }
    };
    // The API takes versions with their v; people write them both ways.
    let version = form_value(&pairs, "version")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            if v.starts_with('v') {
                v.to_owned()
            } else {
                format!("v{v}")
            }
        });
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
            skip_backup: None,
            allow_downgrade: false,
        },
        status: None,
    };
    let api: Api<TalosOperation> = Api::namespaced(client, &ns);
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
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let access = Access {
        verb: "patch",
        resource: "talosoperations",
        namespace: Some(&ns),
        name: Some(&name),
    };
    let (user, client) = match authorise(&state, &caller, access).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let api: Api<TalosOperation> = Api::namespaced(client, &ns);
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

    /// Covers: the UI's sign-in and actions, docs/ui.md (every POST checks Origin)
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
        let pairs: FormPairs =
            serde_urlencoded::from_bytes(b"kind=reboot&machines=a&machines=b%2Dc&version=&x=1+2%")
                .unwrap();
        assert_eq!(
            pairs,
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
    fn bearer_tokens_are_recognised() {
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
            HeaderValue::from_static("a=1; __Host-ichor_session=abc; ichor_session=def; b=2"),
        );
        assert_eq!(cookie(&h, cookie_name(false)).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, cookie_name(true)).as_deref(), Some("def"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("__Host-ichor_session="),
        );
        assert_eq!(cookie(&h, cookie_name(false)), None);
    }

    /// Covers: R18.3 (the cookie is `__Host-` prefixed, Secure, HttpOnly, SameSite=Strict, Path=/, no Domain, and carries the session id only)
    #[test]
    fn the_session_cookie_is_host_only_and_carries_an_id() {
        let id = session::new_id().unwrap();
        let c = session_cookie(false, &id);
        assert!(c.starts_with(&format!("__Host-ichor_session={id};")), "{c}");
        for flag in ["; Path=/;", "; HttpOnly", "; Secure", "; SameSite=Strict"] {
            assert!(c.contains(flag), "{c} lacks {flag}");
        }
        assert!(!c.to_ascii_lowercase().contains("domain"), "{c}");
        assert!(c.contains(&format!("Max-Age={}", session::ABSOLUTE_TIMEOUT.as_secs())));
        // Plain HTTP: browsers refuse a __Host- cookie there; the old name, still Secure.
        let p = session_cookie(true, &id);
        assert!(p.starts_with(&format!("ichor_session={id};")), "{p}");
        assert!(p.contains("; Secure"), "{p}");
        assert!(cleared_cookie(false).starts_with("__Host-ichor_session=;"));
        assert!(cleared_cookie(false).contains("Max-Age=0"));
        assert!(cleared_cookie(true).starts_with("ichor_session=;"));
    }

    /// Covers: R18.3 (kind ichor is refused by the UI, pointing to `ichor upgrade ichor`)
    #[test]
    fn the_ichor_kind_refusal_points_to_ichor_upgrade_ichor() {
        let text = ichor_kind_refusal(None);
        assert!(text.contains("`ichor upgrade ichor`"), "{text}");
        assert!(text.contains(ichor_api::SYSTEM_NAMESPACE), "{text}");
        assert!(text.contains("nothing was written"), "{text}");
        let helm = ichor_kind_refusal(Some("helm upgrade ichor X"));
        assert!(
            helm.ends_with("Helm upgrades it: helm upgrade ichor X"),
            "{helm}"
        );
    }
}
