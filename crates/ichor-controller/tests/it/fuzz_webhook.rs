//! Property-based fuzzing of the admission webhooks in process (R8.4,
//! R18.1): whatever body the API server (or anyone reaching the port) posts,
//! the router answers without panicking, and a review that decodes gets a
//! response. `PROPTEST_CASES` sets the number of cases (256 by
//! default, what CI runs); `make fuzz FUZZ_CASES=N` runs them longer.

use http_body_util::BodyExt as _;
use ichor_controller::webhook::{
    self, AdmissionReview, VALIDATE_TALOSCLUSTER_PATH, VALIDATE_TALOSMACHINE_PATH,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>().prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
        prop_oneof![
            Just("cilium"),
            Just("none"),
            Just("vxlan"),
            Just("10.5.0.2"),
            Just("http://x/"),
            Just("machine:\n  nodeLabels: {a: b}\n"),
            Just("- op: add\n  path: /x\n"),
            Just("["),
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        let key = prop_oneof![
            prop_oneof![
                Just("spec"),
                Just("metadata"),
                Just("name"),
                Just("cni"),
                Just("values"),
                Just("patches"),
                Just("inline"),
                Just("address"),
                Just("network"),
                Just("preset"),
                Just("tunnel"),
                Just("kubeProxy"),
                Just("hold"),
                Just("endpoint"),
            ]
            .prop_map(str::to_owned),
            "[a-zA-Z.]{1,10}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An AdmissionReview around an arbitrary object (and old object).
fn review_body() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("")],
        json_value(),
        prop::option::of(json_value()),
    )
        .prop_map(|(op, object, old)| {
            serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u-1", "operation": op, "object": object, "oldObject": old}
            }))
            .expect("serialises")
        })
}

fn post(path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .expect("request");
        let resp = webhook::router().oneshot(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, bytes.to_vec())
    })
}

fn check(path: &str, body: Vec<u8>) -> Result<(), TestCaseError> {
    let decoded = serde_json::from_slice::<AdmissionReview>(&body).ok();
    let (status, answer) = post(path, body);
    match decoded {
        Some(sent) => {
            prop_assert_eq!(status, 200);
            let review: AdmissionReview = serde_json::from_slice(&answer)
                .map_err(|e| TestCaseError::fail(format!("the answer is not a review: {e}")))?;
            let response = review.response.expect("a response");
            // The answer names the request it answers; a review without a
            // request is refused.
            match sent.request {
                Some(request) => prop_assert_eq!(response.uid, request.uid),
                None => prop_assert!(!response.allowed),
            }
            if !response.allowed {
                let status = response.status.expect("a refusal says why");
                prop_assert!(!status.message.is_empty());
            }
        }
        None => prop_assert!((400..500).contains(&status), "status {}", status),
    }
    Ok(())
}

proptest! {
    /// Covers: R8.4 (fuzzing: webhook admission review body, structured)
    #[test]
    fn webhook_answers_every_structured_review(body in review_body(), machine in any::<bool>()) {
        let path = if machine { VALIDATE_TALOSMACHINE_PATH } else { VALIDATE_TALOSCLUSTER_PATH };
        check(path, body)?;
    }

    /// Covers: R8.4 (fuzzing: webhook admission review body, arbitrary bytes)
    #[test]
    fn webhook_answers_every_body(body in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        any::<String>().prop_map(String::into_bytes),
        json_value().prop_map(|v| serde_json::to_vec(&v).expect("serialises")),
    ], machine in any::<bool>()) {
        let path = if machine { VALIDATE_TALOSMACHINE_PATH } else { VALIDATE_TALOSCLUSTER_PATH };
        check(path, body)?;
    }

    /// The address check itself: never panics, and what it accepts the
    /// controller turns into one `host:port`.
    /// Covers: R8.4 (fuzzing: spec.address)
    #[test]
    fn address_check_never_panics(address in prop_oneof![
        any::<String>(),
        "[a-z0-9.:\\[\\]-]{0,40}",
        any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
        any::<std::net::Ipv6Addr>().prop_map(|ip| format!("[{ip}]")),
        (any::<std::net::Ipv6Addr>(), any::<u16>()).prop_map(|(ip, p)| format!("[{ip}]:{p}")),
        (any::<std::net::Ipv4Addr>(), prop::option::of(any::<u16>()))
            .prop_map(|(ip, p)| p.map_or(ip.to_string(), |p| format!("{ip}:{p}"))),
    ]) {
        if webhook::address_problem(&address).is_none() {
            let ep = ichor_controller::machine::endpoint(&address, 50000);
            prop_assert!(ep.parse::<std::net::SocketAddr>().is_ok() || ep.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()), "{} -> {}", address, ep);
        }
    }
}
