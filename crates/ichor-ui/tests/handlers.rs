//! Every route of the UI in process (`Router::oneshot`), against the real
//! kube-apiserver of ichor-testenv: TokenReview and SubjectAccessReview are
//! the API server's answers, the reflector caches watch it, and the actions'
//! writes are read back from it.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt as _;
use ichor_api::{IchorInstallation, TalosMachine, TalosOperation};
use ichor_testenv::TestEnv;
use ichor_ui::{AppState, Cache, Settings, server};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tower::ServiceExt as _;

const HOST: &str = "ui.test:8443";
const ORIGIN: &str = "https://ui.test:8443";

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    origin: Option<&str>,
    body: &str,
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, HOST);
    if let Some(t) = token {
        req = req.header(header::COOKIE, format!("{}={t}", server::SESSION_COOKIE));
    }
    if let Some(o) = origin {
        req = req.header(header::ORIGIN, o);
    }
    if !body.is_empty() {
        req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("the router answers");
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

fn location(a: &Answer) -> &str {
    a.headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn app(client: &kube::Client, settings: Settings, ns: &str) -> (Router, Cache) {
    let (cache, reflectors) = Cache::start(client);
    // The reflectors run for the whole test binary.
    std::mem::forget(reflectors);
    common::cached(&cache, ns, 2).await;
    let app = ichor_ui::router(AppState::new(client.clone(), cache.clone(), settings));
    (app, cache)
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

/// Covers: issue 15 items 1, 4 (sign-in by TokenReview into an HttpOnly, Secure, SameSite=Strict cookie; no anonymous access; security headers)
#[tokio::test]
async fn sign_in_with_a_service_account_token() {
    let env = TestEnv::shared();
    let lab = common::lab(env, "ui-signin").await;
    let (app, _) = app(&lab.client, Settings::default(), &lab.ns).await;

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
    // A cookie holding a bad token is no session either.
    let a = send(
        &app,
        Method::GET,
        "/clusters",
        Some("not-a-token"),
        None,
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);

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
    let cookie = ok.headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(cookie.starts_with(&format!("{}={}", server::SESSION_COOKIE, lab.viewer_token)));
    for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(flag), "{cookie} lacks {flag}");
    }
    let page = send(
        &app,
        Method::GET,
        "/clusters",
        Some(&lab.viewer_token),
        None,
        "",
    )
    .await;
    get_ok(&page, "/clusters");
    assert!(
        page.body
            .contains(&format!("system:serviceaccount:{}:viewer", lab.ns))
    );

    // Sign-out clears the cookie.
    let out = send(
        &app,
        Method::POST,
        "/signout",
        Some(&lab.viewer_token),
        Some(ORIGIN),
        "",
    )
    .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(
        out.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
}

/// Covers: issue 15 items 2, 3, 4 (every page; buttons follow the user's RBAC; a forged POST without the right gets 403; CSRF Origin check; actions write the objects)
#[tokio::test]
async fn pages_and_actions_follow_rbac() {
    let env = TestEnv::shared();
    let lab = common::lab(env, "ui-rbac").await;
    let (app, cache) = app(&lab.client, Settings::default(), &lab.ns).await;
    let ns = &lab.ns;
    let op = lab.operator_token.as_str();
    let viewer = lab.viewer_token.as_str();
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
    let mut shown = None;
    for _ in 0..100 {
        let a = send(&app, Method::GET, &op_url, Some(op), None, "").await;
        if a.status == StatusCode::OK {
            shown = Some(a);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let shown = shown.expect("the operation page appears once the cache has the operation");
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

/// Covers: issue 15 item 5, R5.3 settings.readOnly (no mutating route mounted; 405 for every non-GET/HEAD; no page carries an action)
#[tokio::test]
async fn read_only_mounts_no_action_and_answers_405() {
    let env = TestEnv::shared();
    let lab = common::lab(env, "ui-readonly").await;
    let settings = Settings {
        read_only: true,
        anonymous_read: false,
    };
    let (app, cache) = app(&lab.client, settings.clone(), &lab.ns).await;
    let ns = &lab.ns;
    let op = lab.operator_token.as_str();
    let machine_url = format!("/machines/{ns}/w-1");

    // 1. The action routes are not mounted: without the layers they are unknown paths.
    let bare = server::routes(AppState::new(lab.client.clone(), cache.clone(), settings));
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
    let rw = server::routes(AppState::new(
        lab.client.clone(),
        cache.clone(),
        Settings::default(),
    ));
    let a = send(
        &rw,
        Method::POST,
        &format!("/machines/{ns}/nope/release"),
        Some(op),
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
    // Sign-in still works: it writes no object.
    let a = send(
        &app,
        Method::POST,
        "/signin",
        None,
        Some(ORIGIN),
        &format!("token={op}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);

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

/// Covers: issue 15 item 4 (anonymous read-only on loopback for the lab only)
#[tokio::test]
async fn the_labs_anonymous_view_reads_and_never_acts() {
    let env = TestEnv::shared();
    let lab = common::lab(env, "ui-anon").await;
    let settings = Settings {
        read_only: false,
        anonymous_read: true,
    };
    let (app, _) = app(&lab.client, settings, &lab.ns).await;
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
    let lab = common::lab(env, "ui-helm").await;
    let (app, cache) = app(&lab.client, Settings::default(), &lab.ns).await;
    let op = lab.operator_token.as_str();
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
    for _ in 0..100 {
        if cache.inventory().installation.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
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
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    assert!(a.body.contains("helm upgrade ichor"));
}
