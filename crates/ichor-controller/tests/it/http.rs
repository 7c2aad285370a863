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
