//! Health and metrics routes, in process (no socket).

use std::sync::Arc;

use http_body_util::BodyExt as _;
use ichor_controller::{Metrics, http::router};
use tower::ServiceExt as _;

async fn get(m: &Arc<Metrics>, path: &str) -> (u16, String) {
    let req = http::Request::builder()
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = router(Arc::clone(m)).oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let m = Arc::new(Metrics::default());
    assert_eq!(get(&m, "/healthz").await.0, 200);
    let (status, body) = get(&m, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("starting"), "{body}");
    m.set_ready(true);
    m.reconciled("talosmachine");
    assert_eq!(get(&m, "/readyz").await.0, 200);
    let (status, body) = get(&m, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("ichor_reconciles_total{controller=\"talosmachine\"} 1"),
        "{body}"
    );
}

/// The real `promtool check metrics` (Prometheus's own lint: names, units,
/// `_total` on counters, help text) passes on what `/metrics` serves, with
/// every family the controller counts holding a sample.
/// Covers: R17.4
#[tokio::test]
async fn the_metrics_pass_promtool_check_metrics() {
    let m = Arc::new(Metrics::default());
    m.set_leader(true);
    m.reconciled("talosmachine");
    m.reconcile_took("TalosMachine", std::time::Duration::from_millis(20));
    m.failed("talosmachine", "talos");
    m.applied_to("ns/m", "applied", 1_796_000_000);
    m.applied_to("ns/m", "failed", 1_796_000_100);
    m.operation_phase("reboot", None, "Running");
    m.operation_finished("reboot", "Failed");
    m.operation_step("reboot", "Draining", std::time::Duration::from_secs(3));
    m.backup_finished("ns/c", "succeeded");
    m.backup_succeeded(
        "ns/c",
        ichor_controller::metrics::LastBackup {
            finished_seconds: 1_796_000_000,
            size_bytes: 1024,
            duration_seconds: 2.5,
        },
    );
    let (status, body) = get(&m, "/metrics").await;
    assert_eq!(status, 200);
    let mut child = std::process::Command::new(ichor_testenv::Tool::Promtool.path())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\non:\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
