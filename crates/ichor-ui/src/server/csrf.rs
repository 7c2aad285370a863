//! CSRF: a request that is not GET or HEAD must come from this server's
//! own pages (its Origin, or Chromium's `null` with `Sec-Fetch-Site`).

use super::*;

/// Whether an Origin header names the host the request was sent to.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
    else {
        return false;
    };
    !host.is_empty() && rest.eq_ignore_ascii_case(host)
}

/// Whether a POST comes from this server's own pages: its Origin names the
/// host it was sent to; or the browser serialised the Origin as `null` (Chromium
/// does so for a form POST from a page served with a certificate it does not
/// trust, such as the self-signed one) and its own `Sec-Fetch-Site`, which no
/// page can set, says `same-origin`.
pub fn post_allowed(origin: &str, sec_fetch_site: &str, host: &str) -> bool {
    same_origin(origin, host) || (origin == "null" && sec_fetch_site == "same-origin")
}

/// CSRF: a request that is not GET or HEAD must come from this server's pages ([`post_allowed`]).
pub async fn origin_check(req: Request, next: Next) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let header_str = |name| {
            req.headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .unwrap_or("")
        };
        let host = header_str(header::HOST).to_owned();
        let host = if host.is_empty() {
            req.uri()
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_default()
        } else {
            host
        };
        let origin = header_str(header::ORIGIN);
        let fetch_site = header_str(header::HeaderName::from_static("sec-fetch-site"));
        if !post_allowed(origin, fetch_site, &host) {
            return page(
                StatusCode::FORBIDDEN,
                "Refused",
                &format!(
                    "This request did not come from an Ichor page (its Origin {origin:?} is not this server, {host}), so it was refused."
                ),
            );
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: the UI's sign-in and actions, docs/ui.md (every POST checks Origin)
    #[test]
    fn posts_must_come_from_this_server() {
        let host = "ui.example:8443";
        assert!(post_allowed("https://ui.example:8443", "", host));
        assert!(post_allowed("https://UI.example:8443", "same-origin", host));
        assert!(
            !post_allowed("https://ui.example", "", host),
            "another port is another origin"
        );
        assert!(!post_allowed("https://evil.example", "cross-site", host));
        assert!(!post_allowed("", "", host));
        assert!(!post_allowed("null", "", host));
        assert!(!post_allowed("null", "cross-site", host));
        assert!(!post_allowed("null", "same-site", host));
        assert!(post_allowed("null", "same-origin", host));
        assert!(!post_allowed("https://ui.example:8443", "", ""));
        assert!(!post_allowed("ftp://ui.example:8443", "", host));
    }
}
