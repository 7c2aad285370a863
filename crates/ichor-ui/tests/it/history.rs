//! A machine's history page against the real API server: the revisions from
//! status, no secret value, and the rollback offered and made only for a
//! user whose SubjectAccessReview allows `update` on that TalosMachine.

use axum::http::{Method, StatusCode};
use ichor_api::TalosMachine;
use ichor_api::history::ROLLBACK_ANNOTATION;
use ichor_testenv::TestEnv;
use ichor_testenv::wait;
use ichor_ui::Settings;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::POLL;
use crate::handlers::{ORIGIN, SETTLE, app, audited_user, location, send, sign_in};

/// Two revisions of w-1, the second naming a secret-bearing path (the path
/// only: status never holds a value).
fn revisions() -> serde_json::Value {
    json!([
        {"number": 1, "time": "2026-12-02T08:00:00Z", "configHashAfter": format!("sha256:{}", "a".repeat(64)),
         "applyMode": "NoReboot", "reason": "Drift", "machineGeneration": 1, "clusterGeneration": 1,
         "changedBy": {"user": "system:serviceaccount:team:first", "at": "2026-12-02T07:59:00Z"},
         "changedPaths": ["machine.nodeLabels.zone"], "outcome": "Applied"},
        {"number": 2, "time": "2026-12-02T09:00:00Z", "configHashBefore": format!("sha256:{}", "a".repeat(64)),
         "configHashAfter": format!("sha256:{}", "b".repeat(64)),
         "applyMode": "NoReboot", "reason": "Drift", "machineGeneration": 2, "clusterGeneration": 1,
         "changedBy": {"user": "system:serviceaccount:team:second", "at": "2026-12-02T08:59:00Z"},
         "changedPaths": ["machine.network.interfaces[wg0].wireguard.privateKey"], "outcome": "Applied"}
    ])
}

/// Covers: R16.8, R12.2 (the history page lists the revisions with who and why and no secret value; rollback is offered to and made by a user with update on that TalosMachine only, with their own token; anyone else gets no button and 403)
#[tokio::test]
async fn history_offers_rollback_only_to_users_who_may_update_the_machine() {
    let env = TestEnv::shared();
    let lab = crate::common::lab(env, "ui-history").await;
    let ns = &lab.ns;
    let updater = crate::common::token(&lab.client, ns, "updater").await;
    crate::common::grant(
        &lab.client,
        ns,
        "updater",
        json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "resourceNames": ["w-1"], "verbs": ["update"]}
        ]),
    )
    .await;
    crate::common::authorized(env, &updater, "update", "talosmachines", ns, Some("w-1")).await;
    let machines = Api::<TalosMachine>::namespaced(lab.client.clone(), ns);
    machines
        .patch_status(
            "w-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"revisions": revisions()}})),
        )
        .await
        .unwrap();
    let (app, _cache) = app(env, &lab.client, Settings::default(), ns).await;
    let op = sign_in(&app, &lab.operator_token).await;
    let updater = sign_in(&app, &updater).await;
    let machine_url = format!("/machines/{ns}/w-1");
    let history_url = format!("{machine_url}/history");

    // The machine page links its history.
    let page = send(&app, Method::GET, &machine_url, Some(&op), None, "").await;
    assert!(
        page.body.contains(&format!("href=\"{history_url}\"")),
        "{}",
        page.body
    );

    // The operator may patch w-1 but not update it: the page, no button.
    let page = wait::until(
        "the history page to list revision 2",
        SETTLE,
        POLL,
        || async {
            let page = send(&app, Method::GET, &history_url, Some(&op), None, "").await;
            page.body.contains("id=\"revision-2\"").then_some(page)
        },
    )
    .await
    .unwrap();
    assert_eq!(page.status, StatusCode::OK);
    for shown in [
        "system:serviceaccount:team:first",
        "system:serviceaccount:team:second",
        "machine.nodeLabels.zone",
        "machine.network.interfaces[wg0].wireguard.privateKey",
        "no-reboot",
        "drift",
    ] {
        assert!(page.body.contains(shown), "{shown}: {}", page.body);
    }
    assert!(
        !page.body.contains("SECRETMARKER"),
        "a secret value reached the page"
    );
    assert!(!page.body.contains("id=\"rollback-"), "{}", page.body);
    let forged = send(
        &app,
        Method::POST,
        &format!("{history_url}/rollback"),
        Some(&op),
        Some(ORIGIN),
        "revision=1",
    )
    .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    assert!(
        forged.body.contains("may not update talosmachines"),
        "{}",
        forged.body
    );
    let annotations = |m: TalosMachine| m.metadata.annotations.unwrap_or_default();
    assert!(!annotations(machines.get("w-1").await.unwrap()).contains_key(ROLLBACK_ANNOTATION));

    // The updater sees the button on the older revision only, and asks.
    let page = send(&app, Method::GET, &history_url, Some(&updater), None, "").await;
    assert!(page.body.contains("id=\"rollback-1\""), "{}", page.body);
    assert!(!page.body.contains("id=\"rollback-2\""), "{}", page.body);
    assert!(!page.body.contains("SECRETMARKER"));
    let unknown = send(
        &app,
        Method::POST,
        &format!("{history_url}/rollback"),
        Some(&updater),
        Some(ORIGIN),
        "revision=9",
    )
    .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST, "{}", unknown.body);
    let a = send(
        &app,
        Method::POST,
        &format!("{history_url}/rollback"),
        Some(&updater),
        Some(ORIGIN),
        "revision=1",
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(location(&a), history_url);
    let m = machines.get("w-1").await.unwrap();
    assert_eq!(
        annotations(m).get(ROLLBACK_ANNOTATION).map(String::as_str),
        Some("1")
    );
    let users = audited_user(env, "update", "talosmachines", ns, "w-1").await;
    assert_eq!(users, [format!("system:serviceaccount:{ns}:updater")]);
    wait::until(
        "the history page to show the request",
        SETTLE,
        POLL,
        || async {
            let page = send(&app, Method::GET, &history_url, Some(&updater), None, "").await;
            page.body
                .contains("id=\"rollback-requested\"")
                .then_some(())
        },
    )
    .await
    .unwrap();
}
