//! Bad input at the webhook's entry: a TalosMachine with a hostile
//! `spec.address` is refused with one clear error naming the object, the
//! field and what to write instead.

use ichor_controller::webhook::{AdmissionReview, review_machine};
use serde_json::json;

fn review(address: &str) -> AdmissionReview {
    serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "object": {
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "w-1", "namespace": "ichor-system"},
            "spec": {"clusterRef": {"name": "base"}, "role": "worker", "address": address}
        }}
    }))
    .unwrap()
}

/// Covers: bad input (hostile spec.address — URL, user info, path, spaces, newline, control character, bad port, bad IPv6 brackets, overlong, empty, mistyped IPv4)
#[test]
fn hostile_address_url_userinfo_path_spaces_newline_control_port_brackets_overlong_empty_bad_ipv4_is_refused()
 {
    let long = "a".repeat(300);
    let hostile = [
        "https://10.5.0.2:50000",
        "admin@10.5.0.2",
        "10.5.0.2/metrics",
        "10.5.0.2 10.5.0.3",
        "10.5.0.2\nX-Injected: 1",
        "10.5.0.2\u{7}",
        "10.5.0.2:99999",
        "10.5.0.2:",
        "[fd00::2",
        "[nope]:50000",
        long.as_str(),
        "",
        "10.0.0.300",
        "-node.lab",
    ];
    for address in hostile {
        let answer = review_machine(review(address))
            .response
            .expect("a response");
        assert!(!answer.allowed, "{address:?} was allowed");
        let message = answer.status.expect("a refusal says why").message;
        assert!(
            message.contains("spec.address") && message.contains("TalosMachine w-1"),
            "{address:?}: {message}"
        );
        assert!(
            message.contains("for example 10.5.0.2"),
            "{address:?}: {message}"
        );
        // One error: the address is named once, escaped.
        assert_eq!(message.matches("spec.address").count(), 1, "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
    for fine in [
        "10.5.0.2",
        "10.5.0.2:50000",
        "fd00::2",
        "[fd00::2]:50000",
        "node-1.lab",
        "node-1",
    ] {
        let answer = review_machine(review(fine)).response.expect("a response");
        assert!(answer.allowed, "{fine:?}: {:?}", answer.status);
    }
}
