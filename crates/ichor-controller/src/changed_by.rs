//! The mutating admission webhook that stamps who changed a TalosCluster's
//! or TalosMachine's spec (`ichor.maesh.dev/changed-by`; the decision is
//! `ichor_reconcile::history::actor`, docs/adr/0022-config-history.md).
//!
//! It never refuses: an object it cannot judge is let through unstamped, so
//! a defect here cannot block writes (the validating webhooks refuse what
//! is invalid).

use std::sync::OnceLock;

use axum::Json;
use chrono::{SecondsFormat, Utc};
use ichor_reconcile::history::actor;
use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The path the MutatingWebhookConfiguration calls for both kinds.
pub use ichor_api::history::CHANGED_BY_WEBHOOK_PATH as MUTATE_CHANGED_BY_PATH;

/// An `admission.k8s.io/v1` AdmissionReview, with the fields a mutating
/// webhook reads (the user) and writes (the patch).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MutatingReview {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<MutatingRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<MutatingResponse>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MutatingRequest {
    pub uid: String,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
}

/// Who the API server authenticated for the request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MutatingResponse {
    pub uid: String,
    pub allowed: bool,
    /// A JSON patch (base64 in the review, as the API requires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<ByteString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
}

/// The user this controller is authenticated as, learnt once at start: its
/// own write that carries out a rollback keeps the requester's name.
static CONTROLLER_USER: OnceLock<String> = OnceLock::new();

/// Asks the API server who this process is (a SelfSubjectReview, which
/// every authenticated user may create). Unknown, the controller's writes
/// are stamped as any writer's, so a rollback asked for in the UI names the
/// controller: worse, never wrong, and said in the log.
pub async fn learn_controller_user(client: &kube::Client) {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api = kube::Api::<SelfSubjectReview>::all(client.clone());
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await;
    let user = review.map(|r| r.status.and_then(|s| s.user_info).and_then(|u| u.username));
    match user {
        Ok(Some(user)) => {
            let _ = CONTROLLER_USER.set(user);
        }
        Ok(None) => tracing::warn!(
            "the API server's SelfSubjectReview named no user; a rollback asked for in the UI will name the controller"
        ),
        Err(e) => tracing::warn!(
            error = %ichor_api::error_text::chain(&e),
            "asking the API server who the controller is; a rollback asked for in the UI will name the controller"
        ),
    }
}

/// Answers one review: allowed always, with the stamp's patch when the
/// request creates the object or changes its spec, or touches the stamp.
pub fn review_changed_by(review: MutatingReview, now: chrono::DateTime<Utc>) -> MutatingReview {
    review_changed_by_as(review, now, CONTROLLER_USER.get().map(String::as_str))
}

/// [`review_changed_by`] with the controller's own user given.
pub fn review_changed_by_as(
    review: MutatingReview,
    now: chrono::DateTime<Utc>,
    controller: Option<&str>,
) -> MutatingReview {
    let (uid, patch) = match review.request {
        Some(request) => {
            let patch = match (request.operation.as_str(), &request.object) {
                ("CREATE" | "UPDATE", Some(new)) => {
                    let at = now.to_rfc3339_opts(SecondsFormat::Secs, true);
                    let old = request.old_object.as_ref();
                    let user = &request.user_info.username;
                    let stamp = actor::stamp(old, new, user, &at, controller);
                    actor::patch(&stamp, new)
                }
                _ => None,
            };
            (request.uid, patch)
        }
        None => (String::new(), None),
    };
    let patch = patch.map(|p| ByteString(serde_json::to_vec(&p).expect("a patch serialises")));
    MutatingReview {
        api_version: "admission.k8s.io/v1".into(),
        kind: "AdmissionReview".into(),
        request: None,
        response: Some(MutatingResponse {
            uid,
            allowed: true,
            patch_type: patch.as_ref().map(|_| "JSONPatch".to_owned()),
            patch,
        }),
    }
}

/// The axum handler.
pub async fn handle(Json(review): Json<MutatingReview>) -> Json<MutatingReview> {
    Json(review_changed_by(review, Utc::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::history::{CHANGED_BY_ANNOTATION, ChangedBy};
    use serde_json::json;

    fn review(operation: &str, user: &str, old: Option<Value>, new: Value) -> MutatingReview {
        serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "operation": operation,
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": new,
                "oldObject": old,
            }
        }))
        .unwrap()
    }

    /// Covers: R16.4
    #[test]
    fn a_spec_change_is_answered_with_a_json_patch_naming_the_user() {
        let old = json!({"metadata": {"name": "w1"}, "spec": {"hold": true}});
        let new = json!({"metadata": {"name": "w1", "annotations": {CHANGED_BY_ANNOTATION: "{\"user\":\"forged\",\"at\":\"x\"}"}}, "spec": {"hold": false}});
        let now = "2026-12-02T08:00:00Z".parse().unwrap();
        let answer = review_changed_by(
            review("UPDATE", "system:serviceaccount:a:b", Some(old), new),
            now,
        );
        let wire = serde_json::to_value(&answer).unwrap();
        let response = &wire["response"];
        assert_eq!(response["uid"], "u1");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let ByteString(bytes) = answer.response.unwrap().patch.unwrap();
        let patch: Value = serde_json::from_slice(&bytes).unwrap();
        let by: ChangedBy = serde_json::from_str(patch[0]["value"].as_str().unwrap()).unwrap();
        assert_eq!(by.user, "system:serviceaccount:a:b");
        assert_eq!(by.at, "2026-12-02T08:00:00Z");
        assert!(response["patch"].is_string(), "base64 on the wire");
    }

    #[test]
    fn a_status_only_update_gets_no_patch_and_a_delete_is_allowed() {
        let m = json!({"metadata": {"name": "w1"}, "spec": {"hold": true}});
        let now = Utc::now();
        let answer = review_changed_by(review("UPDATE", "u", Some(m.clone()), m.clone()), now);
        let r = answer.response.unwrap();
        assert!(r.allowed && r.patch.is_none() && r.patch_type.is_none());
        let answer = review_changed_by(review("DELETE", "u", Some(m), Value::Null), now);
        assert!(answer.response.unwrap().allowed);
    }
}
