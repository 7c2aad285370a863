//! The layers every answer passes: the security headers, and read-only
//! enforcement (405 for every write but sign-in and sign-out).

use super::*;

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
