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
//!
//! One concern a module: [`layers`] (security headers, read-only),
//! [`csrf`], [`caller`] (the session cookie and who is asking), [`access`]
//! (what they may read and do), [`forms`], [`signin`], [`pages`] and
//! [`actions`].

mod access;
mod actions;
mod caller;
mod csrf;
mod forms;
mod layers;
mod pages;
mod signin;

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

pub use actions::ichor_kind_refusal;
pub use caller::{Caller, Plaintext, cleared_cookie, cookie, cookie_name, session_cookie};
pub use csrf::{origin_check, post_allowed, same_origin};
pub use layers::{read_only_layer, security_headers};
pub use signin::is_bearer_token;

use access::{Decision, Kind, not_found};
use actions::{
    cancel_operation, release_hold, remove_machine, roll_back, start_operation, take_hold,
};
use caller::{SignedIn, Who, set_cookie};
use forms::{FormPairs, form_value};
use pages::{
    cluster_page, clusters_page, css, history_page, htmx, machine_page, machines_page,
    operation_page, operations_page,
};
use signin::{signin, signin_page, signout};

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
        .route("/machines/{ns}/{name}/history", get(history_page))
        .route("/operations", get(operations_page))
        .route("/operations/{ns}/{name}", get(operation_page));
    if !state.settings.read_only {
        app = app
            .route("/machines/{ns}/{name}/release", post(release_hold))
            .route("/machines/{ns}/{name}/hold", post(take_hold))
            .route("/machines/{ns}/{name}/remove", post(remove_machine))
            .route("/machines/{ns}/{name}/history/rollback", post(roll_back))
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

fn page(status: StatusCode, title: &str, text: &str) -> Response {
    (status, Html(html::message(title, text).into_string())).into_response()
}

/// An error and each of its causes, for a page.
fn explain(e: &(dyn std::error::Error + 'static)) -> String {
    ichor_api::error_text::chain(e)
}

fn api_failure(e: &(dyn std::error::Error + 'static)) -> Response {
    page(StatusCode::BAD_GATEWAY, "Kubernetes API error", &explain(e))
}

fn ok_html(markup: maud::Markup) -> Response {
    Html(markup.into_string()).into_response()
}
