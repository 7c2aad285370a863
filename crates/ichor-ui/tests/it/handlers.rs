//! Every route of the UI in process (`Router::oneshot`), against the real
//! kube-apiserver of ichor-testenv: TokenReview and SubjectAccessReview are
//! the API server's answers, the reflector caches watch it, and the actions'
//! writes are read back from it (and from its audit log: who made them).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use ichor_api::{IchorInstallation, TalosMachine, TalosOperation};
use ichor_testenv::TestEnv;
use ichor_testenv::wait::{self, Seen};

use crate::common::POLL;
use ichor_ui::{AppState, Cache, Limits, Settings, UserClients, server, session};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tower::ServiceExt as _;

const HOST: &str = "ui.test:8443";
/// How long the cache, the audit log or a listener may take to catch up
/// (the bound only turns a hang into a failure).
pub(crate) const SETTLE: Duration = Duration::from_secs(10);
pub(crate) const ORIGIN: &str = "https://ui.test:8443";

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

/// One request; `session` is the session cookie's value (a session id).
pub(crate) async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    session: Option<&str>,
    origin: Option<&str>,
    body: &str,
) -> Answer {
    send_from(app, None, method, uri, session, origin, body).await
}

/// [`send`] from the peer `from` (what the listener would record).
async fn send_from(
    app: &Router,
    from: Option<SocketAddr>,
    method: Method,
    uri: &str,
    session: Option<&str>,
    origin: Option<&str>,
    body: &str,
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, HOST);
    if let Some(id) = session {
        req = req.header(header::COOKIE, format!("{}={id}", session::COOKIE));
    }
    if let Some(o) = origin {
        req = req.header(header::ORIGIN, o);
    }
    if !body.is_empty() {
        req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let mut req = req.body(Body::from(body.to_owned())).expect("request");
    if let Some(addr) = from {
        req.extensions_mut().insert(ConnectInfo(addr));
    }
    let res = app.clone().oneshot(req).await.expect("the router answers");
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

fn get_ok(a: &Answer, uri: &str) {
    assert_eq!(a.status, StatusCode::OK, "GET {uri}: {}", a.body);
}

pub(crate) fn location(a: &Answer) -> &str {
    a.headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn set_cookie(a: &Answer) -> String {
    a.headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The session id a successful sign-in set.
fn session_of(a: &Answer) -> String {
    let cookie = set_cookie(a);
    cookie
        .strip_prefix(&format!("{}=", session::COOKIE))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie in {cookie:?}"))
        .to_owned()
}

/// Signs in with `token` and returns the session id.
pub(crate) async fn sign_in(app: &Router, token: &str) -> String {
    let a = send(
        app,
        Method::POST,
        "/signin",
        None,
        Some(ORIGIN),
        &format!("token={token}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "sign-in: {}", a.body);
    session_of(&a)
}

/// The UI's state over `client`, writing to the test API server with the user's token.
async fn state(
    env: &TestEnv,
    client: &kube::Client,
    cache: &Cache,
    settings: Settings,
) -> AppState {
    let config = env.kube_config().await.expect("test kubeconfig");
    AppState::new(
        client.clone(),
        UserClients::from_config(&config),
        cache.clone(),
        settings,
    )
}

/// A cache over `client` that holds the `machines` machines of `ns`.
async fn cache(client: &kube::Client, ns: &str, machines: usize) -> Cache {
    let (cache, reflectors) = Cache::start(client);
    // The reflectors run for the whole test binary.
    std::mem::forget(reflectors);
    crate::common::cached(&cache, ns, machines).await;
    cache
}

pub(crate) async fn app(
    env: &TestEnv,
    client: &kube::Client,
    settings: Settings,
    ns: &str,
) -> (Router, Cache) {
    let cache = cache(client, ns, 2).await;
    let app = ichor_ui::router(state(env, client, &cache, settings).await);
    (app, cache)
}

/// Waits until the API server's audit log has a `verb` of `resource`
/// `ns/name` that succeeded, and returns who made it.
pub(crate) async fn audited_user(
    env: &TestEnv,
    verb: &str,
    resource: &str,
    ns: &str,
    name: &str,
) -> Vec<String> {
    let what = format!("the audit log to have a successful {verb} of {resource} {ns}/{name}");
    wait::until(what, SETTLE, POLL, || async {
        let users: Vec<String> = env
            .audit_events()
            .into_iter()
            .filter(|e| e.verb == verb)
            .filter(|e| {
                e.object_ref.as_ref().is_some_and(|o| {
                    o["resource"] == resource
                        && o["namespace"] == ns
                        && o["name"] == name
                        && o.get("subresource").is_none()
                })
            })
            .filter(|e| {
                e.response_status
                    .as_ref()
                    .is_some_and(|s| s["code"].as_u64().is_some_and(|c| c < 300))
            })
            .map(|e| e.user.username)
            .collect();
        (!users.is_empty()).then_some(users)
    })
    .await
    .unwrap()
}

fn assert_security_headers(a: &Answer) {
    let h = |n: header::HeaderName| {
        a.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(h(header::CONTENT_SECURITY_POLICY), server::CSP);
    assert!(server::CSP.contains("script-src 'self'"));
    assert!(server::CSP.contains("frame-ancestors 'none'"));
    assert!(!server::CSP.contains("unsafe-inline"));
    assert!(h(header::STRICT_TRANSPORT_SECURITY).starts_with("max-age="));
    assert_eq!(h(header::X_FRAME_OPTIONS), "DENY");
    assert_eq!(h(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
}

/// Covers: the UI's sign-in and security rules, docs/ui.md (sign-in by TokenReview into an HttpOnly, Secure, SameSite=Strict cookie; no anonymous access; security headers)
#[tokio::test]
async fn sign_in_with_a_service_account_token() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-signin").await;
    let (app, _) = app(env, &lab.client, Settings::default(), &lab.ns).await;

    // No session: every page sends to the sign-in page.
    for uri in ["/clusters", "/machines", "/operations", "/machines/x/y"] {
        let a = send(&app, Method::GET, uri, None, None, "").await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{uri}");
        assert_eq!(location(&a), "/signin");
        assert_security_headers(&a);
    }
    let a = send(&app, Method::GET, "/", None, None, "").await;
    assert_eq!(location(&a), "/clusters");
    let signin = send(&app, Method::GET, "/signin", None, None, "").await;
    get_ok(&signin, "/signin");
    assert!(signin.body.contains("name=\"token\""));
    assert_security_headers(&signin);
    let health = send(&app, Method::GET, "/healthz", None, None, "").await;
    get_ok(&health, "/healthz");

    // The static files, with their types.
    let js = send(&app, Method::GET, ichor_ui::html::HTMX_PATH, None, None, "").await;
    get_ok(&js, "htmx");
    assert!(
        js.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    assert_eq!(js.body, ichor_ui::html::HTMX_JS);
    let css = send(&app, Method::GET, ichor_ui::html::CSS_PATH, None, None, "").await;
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );

    // A token the API server does not know.
    let bad = send(
        &app,
        Method::POST,
        "/signin",
        None,
        Some(ORIGIN),
        "token=not-a-token",
    )
    .await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED, "{}", bad.body);
    assert!(bad.body.contains("did not accept this token"));
    assert!(bad.headers.get(header::SET_COOKIE).is_none());
    let empty = send(&app, Method::POST, "/signin", None, Some(ORIGIN), "token=").await;
    assert_eq!(empty.status, StatusCode::UNAUTHORIZED);
    // A cookie holding a made-up value is no session either, and is dropped.
    let a = send(
        &app,
        Method::GET,
        "/clusters",
        Some("not-a-session"),
        None,
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(set_cookie(&a).contains("Max-Age=0"), "{}", set_cookie(&a));

    // A real ServiceAccount token: a session cookie with the flags.
    let body = format!("token={}", lab.viewer_token);
    let no_origin = send(&app, Method::POST, "/signin", None, None, &body).await;
    assert_eq!(
        no_origin.status,
        StatusCode::FORBIDDEN,
        "sign-in needs the Origin check too"
    );
    let ok = send(&app, Method::POST, "/signin", None, Some(ORIGIN), &body).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);
    let cookie = set_cookie(&ok);
    assert!(
        cookie.starts_with(&format!("{}=", session::COOKIE)),
        "{cookie}"
    );
    for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    let id = session_of(&ok);
    let page = send(&app, Method::GET, "/clusters", Some(&id), None, "").await;
    get_ok(&page, "/clusters");
    assert!(
        page.body
            .contains(&format!("system:serviceaccount:{}:viewer", lab.ns))
    );

    // Sign-out clears the cookie.
    let out = send(&app, Method::POST, "/signout", Some(&id), Some(ORIGIN), "").await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(
        out.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
}

/// Covers: R18.3 (server-side sessions: the cookie is `__Host-ichor_session` with a random 256-bit id, never the token; the token in a cookie is no session; sign-out removes the session, so a copied cookie no longer works)
#[tokio::test]
async fn the_cookie_holds_a_session_id_that_sign_out_revokes() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-session").await;
    let (app, _) = app(env, &lab.client, Settings::default(), &lab.ns).await;
    let signed = send(
        &app,
        Method::POST,
        "/signin",
        None,
        Some(ORIGIN),
        &format!("token={}", lab.viewer_token),
    )
    .await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
    let cookie = set_cookie(&signed);
    assert!(
        !cookie.contains(&lab.viewer_token),
        "the token is in the cookie: {cookie}"
    );
    assert!(cookie.starts_with("__Host-ichor_session="), "{cookie}");
    assert!(!cookie.to_ascii_lowercase().contains("domain="), "{cookie}");
    let id = session_of(&signed);
    assert_eq!(id.len(), 64, "256 bits as hex: {id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");

    // The raw token as the cookie (what the UI set before) is no session,
    // under either name.
    let a = send(
        &app,
        Method::GET,
        "/clusters",
        Some(&lab.viewer_token),
        None,
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let legacy = Request::builder()
        .uri("/clusters")
        .header(header::HOST, HOST)
        .header(
            header::COOKIE,
            format!("ichor_session={}", lab.viewer_token),
        )
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(legacy).await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);

    // The session works; a copy of the cookie works until sign-out…
    let copy = id.clone();
    get_ok(
        &send(&app, Method::GET, "/machines", Some(&id), None, "").await,
        "/machines",
    );
    get_ok(
        &send(&app, Method::GET, "/machines", Some(&copy), None, "").await,
        "/machines",
    );
    let out = send(&app, Method::POST, "/signout", Some(&id), Some(ORIGIN), "").await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(set_cookie(&out).starts_with("__Host-ichor_session=;"));
    // …and not after: the server forgot it.
    let a = send(&app, Method::GET, "/machines", Some(&copy), None, "").await;
    assert_eq!(
        a.status,
        StatusCode::SEE_OTHER,
        "a copied cookie outlived sign-out"
    );
    assert_eq!(location(&a), "/signin");
    let a = send(
        &app,
        Method::POST,
        &format!("/machines/{}/w-1/hold", lab.ns),
        Some(&copy),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);

    // A new sign-in is a new id, and the old one stays dead.
    let again = sign_in(&app, &lab.viewer_token).await;
    assert_ne!(again, id);
    let a = send(&app, Method::GET, "/machines", Some(&copy), None, "").await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
}

/// Covers: R18.3 (every page shows only what the signed-in user may list or get: no RBAC, no machine and a page saying so; a Role in one namespace, that namespace; a cluster-wide list, every namespace; a get by name, that one object)
#[tokio::test]
async fn pages_show_only_what_the_user_may_read() {
    let env = TestEnv::shared();
    let a = crate::common::lab(env, "ui-read-a").await;
    let b = crate::common::lab(env, "ui-read-b").await;
    let client = &a.client;
    let cache = cache(client, &b.ns, 2).await;
    crate::common::cached(&cache, &a.ns, 2).await;
    let app = ichor_ui::router(state(env, client, &cache, Settings::default()).await);

    // Any pod's ServiceAccount token (no RBAC): signed in, sees nothing.
    let nobody = sign_in(&app, &a.nobody_token).await;
    for uri in ["/clusters", "/machines", "/operations"] {
        let page = send(&app, Method::GET, uri, Some(&nobody), None, "").await;
        get_ok(&page, uri);
        assert!(
            page.body.contains("You may read nothing here"),
            "{uri}: {}",
            page.body
        );
        for ns in [&a.ns, &b.ns] {
            assert!(
                !page.body.contains(&format!("/{ns}/")),
                "{uri} links into {ns}: {}",
                page.body
            );
        }
        assert!(!page.body.contains("10.5.0.9"), "{uri} shows an address");
    }
    for uri in [
        format!("/machines/{}/w-1", a.ns),
        format!("/clusters/{}/lab", a.ns),
    ] {
        let page = send(&app, Method::GET, &uri, Some(&nobody), None, "").await;
        assert_eq!(page.status, StatusCode::NOT_FOUND, "{uri}: {}", page.body);
        assert!(!page.body.contains("machine.nodeLabels.zone"));
    }

    // The viewer of namespace a: a's machines, not b's.
    let viewer = sign_in(&app, &a.viewer_token).await;
    let list = send(&app, Method::GET, "/machines", Some(&viewer), None, "").await;
    get_ok(&list, "/machines");
    assert!(
        list.body.contains(&format!("/machines/{}/w-1", a.ns)),
        "{}",
        list.body
    );
    assert!(!list.body.contains(b.ns.as_str()), "{}", list.body);
    assert!(!list.body.contains("You may read nothing"));
    let clusters = send(&app, Method::GET, "/clusters", Some(&viewer), None, "").await;
    assert!(clusters.body.contains(&format!("/clusters/{}/lab", a.ns)));
    assert!(!clusters.body.contains(b.ns.as_str()), "{}", clusters.body);
    let other = send(
        &app,
        Method::GET,
        &format!("/machines/{}/w-1", b.ns),
        Some(&viewer),
        None,
        "",
    )
    .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    get_ok(
        &send(
            &app,
            Method::GET,
            &format!("/machines/{}/w-1", a.ns),
            Some(&viewer),
            None,
            "",
        )
        .await,
        "a's machine",
    );

    // A cluster-wide list grant: both namespaces.
    let reader = crate::common::token(client, &a.ns, "reader").await;
    crate::common::grant_cluster_wide(
        client,
        &a.ns,
        "reader",
        json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosclusters", "talosmachines", "talosoperations"], "verbs": ["get", "list"]}]),
        None,
    )
    .await;
    crate::common::authorized(env, &reader, "list", "talosmachines", &b.ns, None).await;
    let reader = sign_in(&app, &reader).await;
    let list = send(&app, Method::GET, "/machines", Some(&reader), None, "").await;
    for ns in [&a.ns, &b.ns] {
        assert!(
            list.body.contains(&format!("/machines/{ns}/w-1")),
            "{ns}: {}",
            list.body
        );
    }

    // A get on one machine by name: its page, and no list.
    let one = crate::common::token(client, &a.ns, "one").await;
    crate::common::grant(
        client,
        &a.ns,
        "one",
        json!([{"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "resourceNames": ["w-1"], "verbs": ["get"]}]),
    )
    .await;
    crate::common::authorized(env, &one, "get", "talosmachines", &a.ns, Some("w-1")).await;
    let one = sign_in(&app, &one).await;
    let list = send(&app, Method::GET, "/machines", Some(&one), None, "").await;
    assert!(!list.body.contains("/w-1"), "{}", list.body);
    let page = send(
        &app,
        Method::GET,
        &format!("/machines/{}/w-1", a.ns),
        Some(&one),
        None,
        "",
    )
    .await;
    get_ok(&page, "the machine it may get");
    assert!(page.body.contains("machine.nodeLabels.zone"));
    let page = send(
        &app,
        Method::GET,
        &format!("/machines/{}/cp-1", a.ns),
        Some(&one),
        None,
        "",
    )
    .await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
}

/// Covers: R12.2, the UI's pages and sign-in, docs/ui.md (every page; buttons follow the user's RBAC; a forged POST without the right gets 403; CSRF Origin check; actions write the objects)
#[tokio::test]
async fn pages_and_actions_follow_rbac() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-rbac").await;
    let (app, cache) = app(env, &lab.client, Settings::default(), &lab.ns).await;
    let ns = &lab.ns;
    let op = sign_in(&app, &lab.operator_token).await;
    let op = op.as_str();
    let viewer = sign_in(&app, &lab.viewer_token).await;
    let viewer = viewer.as_str();
    let machine_url = format!("/machines/{ns}/w-1");

    // Every page, for both users.
    for token in [op, viewer] {
        for uri in [
            "/clusters".to_string(),
            format!("/clusters/{ns}/lab"),
            "/machines".into(),
            "/machines?held=yes&class=B&role=worker&q=w".into(),
            machine_url.clone(),
            "/operations".into(),
        ] {
            let a = send(&app, Method::GET, &uri, Some(token), None, "").await;
            get_ok(&a, &uri);
            assert_security_headers(&a);
        }
        for uri in [
            format!("/machines/{ns}/nope"),
            format!("/clusters/{ns}/nope"),
            format!("/operations/{ns}/nope"),
        ] {
            let a = send(&app, Method::GET, &uri, Some(token), None, "").await;
            assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
        }
    }

    // The machine page: drift with badges, the secret as a digest, the preview.
    let page = send(&app, Method::GET, &machine_url, Some(op), None, "").await;
    assert!(page.body.contains("machine.nodeLabels.zone"));
    assert!(page.body.contains("class B"));
    assert!(
        !page.body.contains("SECRETMARKER"),
        "a secret value reached the page"
    );
    assert!(page.body.contains("sha256:"));
    assert!(page.body.contains("What releasing the hold would do"));
    assert!(page.body.contains("no-reboot"));
    assert!(
        page.body.contains("id=\"release\""),
        "the operator may release"
    );
    // The machines page's filters count.
    let list = send(&app, Method::GET, "/machines?held=yes", Some(op), None, "").await;
    assert!(
        list.body.contains("w-1") && !list.body.contains(">cp-1<"),
        "{}",
        list.body
    );

    // The viewer sees no action and a forged POST is refused by the SAR.
    let vpage = send(&app, Method::GET, &machine_url, Some(viewer), None, "").await;
    assert!(!vpage.body.contains("id=\"release\""));
    assert!(!vpage.body.contains("method=\"post\" action=\"/machines"));
    let cluster_v = send(
        &app,
        Method::GET,
        &format!("/clusters/{ns}/lab"),
        Some(viewer),
        None,
        "",
    )
    .await;
    assert!(!cluster_v.body.contains("id=\"start\""));
    let forged = send(
        &app,
        Method::POST,
        &format!("{machine_url}/release"),
        Some(viewer),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    assert!(forged.body.contains("may not patch talosmachines"));
    let forged_op = send(
        &app,
        Method::POST,
        &format!("/clusters/{ns}/lab/operations"),
        Some(viewer),
        Some(ORIGIN),
        "kind=reboot",
    )
    .await;
    assert_eq!(forged_op.status, StatusCode::FORBIDDEN);
    let machines = Api::<TalosMachine>::namespaced(lab.client.clone(), ns);
    assert!(
        machines.get("w-1").await.unwrap().spec.hold,
        "the refused POST changed nothing"
    );

    // CSRF: the operator's POST without Origin, or from another origin, is refused.
    for origin in [None, Some("https://evil.test"), Some("null")] {
        let a = send(
            &app,
            Method::POST,
            &format!("{machine_url}/release"),
            Some(op),
            origin,
            "",
        )
        .await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "Origin {origin:?}");
    }
    assert!(machines.get("w-1").await.unwrap().spec.hold);
    // Without a session, an action is no action.
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/release"),
        None,
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(location(&a), "/signin");

    // The operator releases the hold, and takes it back.
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/release"),
        Some(op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(location(&a), machine_url);
    assert!(!machines.get("w-1").await.unwrap().spec.hold);
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/hold"),
        Some(op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert!(machines.get("w-1").await.unwrap().spec.hold);
    let missing = send(
        &app,
        Method::POST,
        &format!("/machines/{ns}/nope/release"),
        Some(op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // The operator starts a reboot of one machine and cancels it.
    let cluster_o = send(
        &app,
        Method::GET,
        &format!("/clusters/{ns}/lab"),
        Some(op),
        None,
        "",
    )
    .await;
    assert!(cluster_o.body.contains("id=\"start\""));
    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{ns}/lab/operations"),
        Some(op),
        Some(ORIGIN),
        "kind=reboot&version=&machines=w-1",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let op_url = location(&a).to_owned();
    let name = op_url.rsplit('/').next().unwrap().to_owned();
    assert!(name.starts_with("lab-reboot-"), "{op_url}");
    let ops = Api::<TalosOperation>::namespaced(lab.client.clone(), ns);
    let created = ops.get(&name).await.expect("the operation exists");
    assert_eq!(created.spec.kind, ichor_api::OperationKind::Reboot);
    assert_eq!(created.spec.target.machines, vec!["w-1".to_string()]);
    assert_eq!(created.spec.version, None);
    // The page of the new operation, once the cache has it.
    let shown = wait::until("the operation page", SETTLE, POLL, || async {
        let a = send(&app, Method::GET, &op_url, Some(op), None, "").await;
        if a.status == StatusCode::OK {
            Seen::Done(a)
        } else {
            Seen::not_yet(a.status)
        }
    })
    .await
    .unwrap();
    assert!(shown.body.contains("id=\"cancel\""), "{}", shown.body);
    let vshown = send(&app, Method::GET, &op_url, Some(viewer), None, "").await;
    assert!(!vshown.body.contains("id=\"cancel\""));
    let forged = send(
        &app,
        Method::POST,
        &format!("{op_url}/cancel"),
        Some(viewer),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let a = send(
        &app,
        Method::POST,
        &format!("{op_url}/cancel"),
        Some(op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let cancelled = ops.get(&name).await.unwrap();
    assert!(
        cancelled
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ichor_ui::view::CANCEL_ANNOTATION)
    );
    // An upgrade needs a version: the API server's CEL rule says so, and the UI passes it on.
    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{ns}/lab/operations"),
        Some(op),
        Some(ORIGIN),
        "kind=talos-upgrade",
    )
    .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    assert!(a.body.contains("spec.version is required"), "{}", a.body);
    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{ns}/lab/operations"),
        Some(op),
        Some(ORIGIN),
        "kind=format-disks",
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    drop(cache);
}

/// Covers: R12.3, R5.3 settings.readOnly (no mutating route mounted; 405 for every non-GET/HEAD; no page carries an action)
#[tokio::test]
async fn read_only_mounts_no_action_and_answers_405() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-readonly").await;
    let settings = Settings {
        read_only: true,
        anonymous_read: false,
    };
    let (app, cache) = app(env, &lab.client, settings.clone(), &lab.ns).await;
    let ns = &lab.ns;
    // Sign-in still works read-only: it writes no object.
    let op = sign_in(&app, &lab.operator_token).await;
    let op = op.as_str();
    let machine_url = format!("/machines/{ns}/w-1");

    // 1. The action routes are not mounted: without the layers they are unknown paths.
    let bare = server::routes(state(env, &lab.client, &cache, settings).await);
    let a = send(
        &bare,
        Method::POST,
        &format!("{machine_url}/release"),
        Some(op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let rw = server::routes(state(env, &lab.client, &cache, Settings::default()).await);
    let rw_session = sign_in(&rw, &lab.operator_token).await;
    let a = send(
        &rw,
        Method::POST,
        &format!("/machines/{ns}/nope/release"),
        Some(&rw_session),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::NOT_FOUND,
        "read-write mounts the route (the machine is missing)"
    );
    assert!(a.body.contains("releasing the hold"), "{}", a.body);

    // 2. The layer answers 405 to every non-GET/HEAD, whatever the path.
    for (method, uri) in [
        (Method::POST, format!("{machine_url}/release")),
        (Method::POST, format!("{machine_url}/hold")),
        (Method::POST, format!("/clusters/{ns}/lab/operations")),
        (Method::POST, format!("/operations/{ns}/x/cancel")),
        (Method::PUT, "/clusters".to_string()),
        (Method::DELETE, machine_url.clone()),
        (Method::PATCH, "/machines".to_string()),
    ] {
        let a = send(&app, method.clone(), &uri, Some(op), Some(ORIGIN), "").await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        assert_eq!(a.headers[header::ALLOW], "GET, HEAD");
        assert_security_headers(&a);
    }
    let machines = Api::<TalosMachine>::namespaced(lab.client.clone(), ns);
    assert!(machines.get("w-1").await.unwrap().spec.hold);
    let head = send(&app, Method::HEAD, "/clusters", Some(op), None, "").await;
    assert_eq!(head.status, StatusCode::OK);

    // 4. No page carries an action, even for a user who may act.
    for uri in [
        "/clusters".to_string(),
        format!("/clusters/{ns}/lab"),
        "/machines".into(),
        machine_url.clone(),
        "/operations".into(),
    ] {
        let a = send(&app, Method::GET, &uri, Some(op), None, "").await;
        get_ok(&a, &uri);
        assert!(a.body.contains("read-only"), "{uri} says it is read-only");
        let posts: Vec<&str> = a.body.split("method=\"post\"").skip(1).collect();
        assert!(
            posts.iter().all(|p| p.starts_with(" action=\"/signout\"")),
            "{uri} carries an action: {}",
            a.body
        );
    }
}

/// Covers: the UI's sign-in, docs/ui.md (anonymous read-only on loopback for the lab only)
#[tokio::test]
async fn the_labs_anonymous_view_reads_and_never_acts() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-anon").await;
    let settings = Settings {
        read_only: false,
        anonymous_read: true,
    };
    let (app, _) = app(env, &lab.client, settings, &lab.ns).await;
    let ns = &lab.ns;
    let page = send(
        &app,
        Method::GET,
        &format!("/machines/{ns}/w-1"),
        None,
        None,
        "",
    )
    .await;
    get_ok(&page, "machine page");
    assert!(page.body.contains("anonymous (lab, read-only)"));
    assert!(!page.body.contains("id=\"release\""));
    let a = send(
        &app,
        Method::POST,
        &format!("/machines/{ns}/w-1/release"),
        None,
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let listeners = ichor_ui::Listeners {
        https: "0.0.0.0:8443".parse().unwrap(),
        tls: None,
        plaintext: None,
    };
    assert!(ichor_ui::tls::check_anonymous(&listeners).is_err());
    let loopback = ichor_ui::Listeners {
        https: "127.0.0.1:8443".parse().unwrap(),
        tls: None,
        plaintext: Some("[::1]:8080".parse().unwrap()),
    };
    assert!(ichor_ui::tls::check_anonymous(&loopback).is_ok());
}

/// Covers: R4.3f (no IchorInstallation: the pages work), R4.6a (Helm-managed: the helm upgrade command, and a kind ichor operation is refused with it)
#[tokio::test]
async fn helm_managed_ichor_points_to_helm_upgrade() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-helm").await;
    let (app, cache) = app(env, &lab.client, Settings::default(), &lab.ns).await;
    let op = sign_in(&app, &lab.operator_token).await;
    let op = op.as_str();
    let insts =
        Api::<IchorInstallation>::namespaced(lab.client.clone(), ichor_api::SYSTEM_NAMESPACE);
    let present = insts.list(&ListParams::default()).await.unwrap().items;
    if present.is_empty() {
        // Without the IchorInstallation the page still renders (R4.3f).
        let a = send(&app, Method::GET, "/clusters", Some(op), None, "").await;
        get_ok(&a, "/clusters");
        assert!(a.body.contains("No IchorInstallation"));
        let ns_api = Api::<k8s_openapi::api::core::v1::Namespace>::all(lab.client.clone());
        let _ = ns_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ichor_api::SYSTEM_NAMESPACE}}))
                    .unwrap(),
            )
            .await;
        insts
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": "ichor"},
                    "spec": {"version": "v0.1.0", "deployment": {"manager": "helm"}}
                }))
                .unwrap(),
            )
            .await
            .expect("IchorInstallation");
    }
    wait::until(
        "the cache to have the IchorInstallation",
        SETTLE,
        POLL,
        || async { cache.inventory().installation.is_some() },
    )
    .await
    .unwrap();
    let a = send(&app, Method::GET, "/clusters", Some(op), None, "").await;
    assert!(
        a.body
            .contains("helm upgrade ichor oci://ghcr.io/maeshinshin/charts/ichor"),
        "{}",
        a.body
    );
    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{}/lab/operations", lab.ns),
        Some(op),
        Some(ORIGIN),
        "kind=ichor&version=v0.2.0",
    )
    .await;
    // Refused whoever manages Ichor (R18.3); on Helm with the command.
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert!(a.body.contains("helm upgrade ichor"));
}

/// Covers: R18.3 (a forged POST of kind ichor is refused with 400 and nothing is created: Ichor upgrades itself through `ichor upgrade ichor` in the system namespace)
#[tokio::test]
async fn a_forged_ichor_operation_is_refused() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-ichor-kind").await;
    let (app, _) = app(env, &lab.client, Settings::default(), &lab.ns).await;
    let op = sign_in(&app, &lab.operator_token).await;
    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{}/lab/operations", lab.ns),
        Some(&op),
        Some(ORIGIN),
        "kind=ichor&version=v0.2.0",
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert!(a.body.contains("ichor upgrade ichor"), "{}", a.body);
    assert!(a.body.contains("system namespace"), "{}", a.body);
    let ops = Api::<TalosOperation>::namespaced(lab.client.clone(), &lab.ns);
    assert!(
        ops.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a TalosOperation was created"
    );
}

/// Covers: R18.3 (writes are made with the signed-in user's own token: the UI's ServiceAccount holds no write verb, and the API server's audit log names the user as the author of the patch, the create and the cancel)
#[tokio::test]
async fn actions_are_made_with_the_users_own_token() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-as-user").await;
    let ns = &lab.ns;
    // The UI's own identity as the chart grants it: read, TokenReview and
    // SubjectAccessReview, and no write verb.
    let ui_token = crate::common::token(&lab.client, ns, "ichor-ui").await;
    crate::common::grant_cluster_wide(
        &lab.client,
        ns,
        "ichor-ui",
        ichor_adopt::install::ui_read_rules(),
        Some("system:auth-delegator"),
    )
    .await;
    crate::common::authorized(env, &ui_token, "list", "talosmachines", ns, None).await;
    let config = env.kube_config().await.unwrap();
    let users = UserClients::from_config(&config);
    let ui_client = users.client(&ui_token).unwrap();
    let cache = cache(&ui_client, ns, 2).await;
    let app = ichor_ui::router(AppState::new(
        ui_client,
        users,
        cache.clone(),
        Settings::default(),
    ));
    let ui_user = format!("system:serviceaccount:{ns}:ichor-ui");
    let operator = format!("system:serviceaccount:{ns}:operator");

    let op = sign_in(&app, &lab.operator_token).await;
    let machine_url = format!("/machines/{ns}/w-1");
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/release"),
        Some(&op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let machines = Api::<TalosMachine>::namespaced(lab.client.clone(), ns);
    assert!(!machines.get("w-1").await.unwrap().spec.hold, "released");
    let patched_by = audited_user(env, "patch", "talosmachines", ns, "w-1").await;
    assert_eq!(patched_by, vec![operator.clone()], "the patch's author");

    let a = send(
        &app,
        Method::POST,
        &format!("/clusters/{ns}/lab/operations"),
        Some(&op),
        Some(ORIGIN),
        "kind=reboot&machines=w-1",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let name = location(&a).rsplit('/').next().unwrap().to_owned();
    let creators: Vec<String> = env
        .audit_events()
        .into_iter()
        .filter(|e| e.verb == "create")
        .filter(|e| {
            e.object_ref.as_ref().is_some_and(|o| {
                o["resource"] == "talosoperations" && o["namespace"] == ns.as_str()
            })
        })
        .map(|e| e.user.username)
        .collect();
    assert!(creators.contains(&operator), "{creators:?}");
    assert!(!creators.contains(&ui_user), "{creators:?}");
    // The cancel, once the cache has the operation.
    wait::until("the cache to have the operation", SETTLE, POLL, || async {
        cache
            .inventory()
            .operations
            .iter()
            .any(|o| o.metadata.name.as_deref() == Some(&name))
    })
    .await
    .unwrap();
    let a = send(
        &app,
        Method::POST,
        &format!("/operations/{ns}/{name}/cancel"),
        Some(&op),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let cancelled_by = audited_user(env, "patch", "talosoperations", ns, &name).await;
    assert_eq!(cancelled_by, vec![operator.clone()]);

    // The UI's own identity may not write: had it written, it would have failed.
    for (verb, resource) in [
        ("patch", "talosmachines"),
        ("create", "talosoperations"),
        ("patch", "talosoperations"),
    ] {
        let may = k8s_openapi::api::authorization::v1::SubjectAccessReview {
            spec: k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec {
                user: Some(ui_user.clone()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(
                    k8s_openapi::api::authorization::v1::ResourceAttributes {
                        group: Some(ichor_api::GROUP.into()),
                        resource: Some(resource.into()),
                        verb: Some(verb.into()),
                        namespace: Some(ns.clone()),
                        ..Default::default()
                    },
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<k8s_openapi::api::authorization::v1::SubjectAccessReview>::all(
            lab.client.clone(),
        )
        .create(&PostParams::default(), &may)
        .await
        .unwrap();
        assert!(
            !answer.status.unwrap().allowed,
            "the UI's identity may {verb} {resource}"
        );
    }
    // The viewer may not patch: a forged POST is a 403 and the hold stays.
    let viewer = sign_in(&app, &lab.viewer_token).await;
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/hold"),
        Some(&viewer),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert!(!machines.get("w-1").await.unwrap().spec.hold);
}

/// Covers: R18.3 (a cookie value nobody was given costs no TokenReview and no entry; the session map stays at its bound, dropping the least recently used; the review cache stays at its bound)
#[tokio::test]
async fn sessions_and_review_answers_are_bounded() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-bounds").await;
    let cache = cache(&lab.client, &lab.ns, 2).await;
    let state = state(env, &lab.client, &cache, Settings::default())
        .await
        .with_limits(Limits {
            max_sessions: 3,
            max_reviews: 5,
            ..Limits::default()
        });
    let app = ichor_ui::router(state.clone());
    // Many made-up cookies: each is sent to sign in, none is kept.
    for _ in 0..50 {
        let id = session::new_id().unwrap();
        let a = send(&app, Method::GET, "/machines", Some(&id), None, "").await;
        assert_eq!(a.status, StatusCode::SEE_OTHER);
    }
    assert_eq!(state.session_count(), 0);
    assert_eq!(state.remembered_reviews(), 0);

    // More sign-ins than the bound: the map stays at the bound and the
    // least recently used session is the one gone.
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(sign_in(&app, &lab.viewer_token).await);
        // The first stays in use.
        get_ok(
            &send(&app, Method::GET, "/clusters", Some(&ids[0]), None, "").await,
            "first",
        );
        assert!(state.session_count() <= 3);
    }
    assert_eq!(state.session_count(), 3);
    for (i, id) in ids.iter().enumerate() {
        let a = send(&app, Method::GET, "/operations", Some(id), None, "").await;
        let kept = matches!(i, 0 | 3 | 4);
        assert_eq!(
            a.status == StatusCode::OK,
            kept,
            "session {i}: {}",
            a.status
        );
    }
    // Pages of many namespaces and objects: the answers stay at their bound.
    for uri in ["/clusters", "/machines", "/operations"] {
        get_ok(
            &send(&app, Method::GET, uri, Some(&ids[4]), None, "").await,
            uri,
        );
    }
    get_ok(
        &send(
            &app,
            Method::GET,
            &format!("/machines/{}/w-1", lab.ns),
            Some(&ids[4]),
            None,
            "",
        )
        .await,
        "machine",
    );
    assert!(
        state.remembered_reviews() <= 5,
        "{}",
        state.remembered_reviews()
    );
}

/// Covers: R18.3 (sign-in is rate-limited per client address and globally: the N+1th attempt in the window is 429 with Retry-After, and asks the API server nothing)
#[tokio::test]
async fn the_sign_in_after_the_limit_is_429() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-ratelimit").await;
    let cache = cache(&lab.client, &lab.ns, 2).await;
    let per_client = ichor_ui::limit::Rate {
        burst: 3,
        every: Duration::from_secs(60),
    };
    let state = state(env, &lab.client, &cache, Settings::default())
        .await
        .with_limits(Limits {
            signin_per_client: per_client,
            signin_global: ichor_ui::limit::Rate {
                burst: 5,
                every: Duration::from_secs(60),
            },
            ..Limits::default()
        });
    let app = ichor_ui::router(state.clone());
    let one: SocketAddr = "192.0.2.1:50000".parse().unwrap();
    let two: SocketAddr = "192.0.2.2:50000".parse().unwrap();
    let attempt = |from, token: &str| {
        let app = app.clone();
        let body = format!("token={token}");
        async move {
            send_from(
                &app,
                Some(from),
                Method::POST,
                "/signin",
                None,
                Some(ORIGIN),
                &body,
            )
            .await
        }
    };
    for _ in 0..3 {
        let a = attempt(one, "not-a-token").await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    }
    // The 4th from the same address: 429, even with a good token.
    let a = attempt(one, &lab.viewer_token).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    let wait: u64 = a.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    assert!(a.body.contains("Too many sign-in attempts"), "{}", a.body);
    assert!(a.headers.get(header::SET_COOKIE).is_none());
    assert_eq!(state.session_count(), 0);
    // Another address has its own bucket…
    let a = attempt(two, &lab.viewer_token).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    // …until the global one (5) is spent.
    let a = attempt(two, "not-a-token").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let a = attempt(two, "not-a-token").await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
}

/// One plain-HTTP request to `port`; the status and the head (lowercased).
async fn plain_http(port: u16, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tcp.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let head = raw
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}

/// Covers: R18.3 (on the deprecated plain-HTTP port a session still works:
/// its cookie keeps the name `ichor_session`, Secure as before, since
/// browsers refuse a `__Host-` cookie over http; HTTPS reads only the
/// `__Host-` name, so a cookie planted over http is no session there)
#[tokio::test]
async fn plaintext_sessions_keep_the_unprefixed_cookie_name() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-plain").await;
    let cache = cache(&lab.client, &lab.ns, 2).await;
    let app = ichor_ui::router(state(env, &lab.client, &cache, Settings::default()).await);
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (https, plain) = (free(), free());
    let listeners = ichor_ui::Listeners {
        https: format!("127.0.0.1:{https}").parse().unwrap(),
        tls: None,
        plaintext: Some(format!("127.0.0.1:{plain}").parse().unwrap()),
    };
    tokio::spawn(ichor_ui::tls::serve(app.clone(), listeners));
    let host = format!("127.0.0.1:{plain}");
    let healthz = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    wait::until("the plain-HTTP listener", SETTLE, POLL, || async {
        plain_http(plain, &healthz).await.0 == 200
    })
    .await
    .unwrap();
    let body = format!("token={}", lab.viewer_token);
    let (status, head) = plain_http(
        plain,
        &format!(
            "POST /signin HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("a session cookie")
        .to_owned();
    assert!(cookie.starts_with("ichor_session="), "{cookie}");
    assert!(
        cookie.contains("secure") && cookie.contains("httponly"),
        "{cookie}"
    );
    let id = cookie
        .strip_prefix("ichor_session=")
        .and_then(|r| r.split(';').next())
        .unwrap()
        .to_owned();
    let get = |name: &str| {
        format!(
            "GET /machines HTTP/1.1\r\nHost: {host}\r\nCookie: {name}={id}\r\nConnection: close\r\n\r\n"
        )
    };
    assert_eq!(plain_http(plain, &get("ichor_session")).await.0, 200);
    assert_eq!(plain_http(plain, &get(session::COOKIE)).await.0, 303);
    // The same session under the unprefixed name is no session on HTTPS
    // (in process, as the HTTPS listener hands requests to the same router).
    let a = {
        let req = Request::builder()
            .uri("/machines")
            .header(header::HOST, HOST)
            .header(header::COOKIE, format!("ichor_session={id}"))
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap().status()
    };
    assert_eq!(a, StatusCode::SEE_OTHER);
    let https_ok = send(&app, Method::GET, "/machines", Some(&id), None, "").await;
    get_ok(&https_ok, "the session under its HTTPS name");
}

/// Covers: R14.24 (Remove is offered only to a user a SubjectAccessReview allows delete on talosmachines; a forged POST without it gets 403 and nothing is deleted; the delete needs the confirmation and is made with the user's token; the page then shows the removal)
#[tokio::test]
async fn remove_is_offered_and_made_only_with_delete_on_talosmachines() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-remove").await;
    let ns = &lab.ns;
    let remover = crate::common::token(&lab.client, ns, "remover").await;
    crate::common::grant(
        &lab.client,
        ns,
        "remover",
        json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "verbs": ["delete"]}
        ]),
    )
    .await;
    let (app, _cache) = app(env, &lab.client, Settings::default(), ns).await;
    let op = sign_in(&app, &lab.operator_token).await;
    let remover = sign_in(&app, &remover).await;
    let machines = Api::<TalosMachine>::namespaced(lab.client.clone(), ns);
    // A finalizer stands for the controller's: the removal is seen under way.
    let keep = json!({"metadata": {"finalizers": ["test.ichor.maesh.dev/keep"]}});
    machines
        .patch(
            "w-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&keep),
        )
        .await
        .unwrap();
    let machine_url = format!("/machines/{ns}/w-1");

    // The operator may patch but not delete: no button, and a forged POST is refused.
    let page = send(&app, Method::GET, &machine_url, Some(&op), None, "").await;
    assert!(!page.body.contains("id=\"remove\""), "{}", page.body);
    let forged = send(
        &app,
        Method::POST,
        &format!("{machine_url}/remove"),
        Some(&op),
        Some(ORIGIN),
        "confirm=yes",
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    assert!(forged.body.contains("may not delete talosmachines"));
    assert!(
        machines
            .get("w-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );

    // The remover sees the button; without the confirmation nothing is written.
    let page = send(&app, Method::GET, &machine_url, Some(&remover), None, "").await;
    assert!(page.body.contains("id=\"remove\""), "{}", page.body);
    let unconfirmed = send(
        &app,
        Method::POST,
        &format!("{machine_url}/remove"),
        Some(&remover),
        Some(ORIGIN),
        "confirm=no",
    )
    .await;
    assert_eq!(unconfirmed.status, StatusCode::BAD_REQUEST);
    assert!(
        machines
            .get("w-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    let a = send(
        &app,
        Method::POST,
        &format!("{machine_url}/remove"),
        Some(&remover),
        Some(ORIGIN),
        "confirm=yes",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(location(&a), machine_url);
    assert!(
        machines
            .get("w-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let users = audited_user(env, "delete", "talosmachines", ns, "w-1").await;
    assert_eq!(users, [format!("system:serviceaccount:{ns}:remover")]);

    // Once the cache sees it, the page shows the removal and no more Remove.
    let what = "the machine page to show the removal";
    wait::until(what, SETTLE, POLL, || async {
        let page = send(&app, Method::GET, &machine_url, Some(&remover), None, "").await;
        (page.body.contains("id=\"membership\"") && !page.body.contains("id=\"remove\""))
            .then_some(())
    })
    .await
    .unwrap();

    let unkeep = json!({"metadata": {"finalizers": null}});
    let _ = machines
        .patch(
            "w-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&unkeep),
        )
        .await;
}
