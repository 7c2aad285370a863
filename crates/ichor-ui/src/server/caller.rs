//! Who sent a request: the session cookie of its listener (set, found,
//! cleared), its peer address, and the signed-in user its session holds
//! (reviewed again every [`REVIEW_TTL`]).

use super::*;

/// Marks a request that came in on the deprecated plain-HTTP listener
/// ([`crate::tls::serve`] adds it): its session cookie has the name a
/// browser keeps over http ([`session::PLAINTEXT_COOKIE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plaintext;

/// The session cookie's name for a request on HTTPS (`plaintext` false) or plain HTTP.
pub fn cookie_name(plaintext: bool) -> &'static str {
    if plaintext {
        session::PLAINTEXT_COOKIE
    } else {
        session::COOKIE
    }
}

/// The value of cookie `name` in the Cookie header (an empty one is none).
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    CookieJar::from_headers(headers)
        .get(name)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
}

/// The session cookie with `value`, living `max_age`: host-only (no
/// Domain), Path=/, Secure, HttpOnly, SameSite=Strict.
fn session_cookie_with(plaintext: bool, value: String, max_age: Duration) -> String {
    Cookie::build((cookie_name(plaintext), value))
        .path("/")
        .max_age(cookie::time::Duration::try_from(max_age).unwrap_or(cookie::time::Duration::ZERO))
        .http_only(true)
        .secure(true)
        .same_site(SameSite::Strict)
        .build()
        .to_string()
}

/// The Set-Cookie value that starts session `id`: it ends with the
/// session's absolute expiry at the latest.
pub fn session_cookie(plaintext: bool, id: &str) -> String {
    session_cookie_with(plaintext, id.to_owned(), session::ABSOLUTE_TIMEOUT)
}

/// The Set-Cookie value that drops the session cookie.
pub fn cleared_cookie(plaintext: bool) -> String {
    session_cookie_with(plaintext, String::new(), Duration::ZERO)
}

/// Who sent a request: the session cookie of its listener, its peer address.
#[derive(Debug, Clone)]
pub struct Caller {
    pub session_id: Option<String>,
    pub address: Option<IpAddr>,
    pub plaintext: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Infallible> {
        let plaintext = parts.extensions.get::<Plaintext>().is_some();
        Ok(Caller {
            session_id: cookie(&parts.headers, cookie_name(plaintext)),
            address: parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
            plaintext,
        })
    }
}

/// A signed-in user: their session and token.
pub(super) struct SignedIn {
    pub(super) key: session::Key,
    pub(super) user: User,
    pub(super) token: String,
}

/// Who is asking.
pub(super) enum Who {
    User(SignedIn),
    Anonymous,
}

/// Sends to the sign-in page, dropping a session cookie that no longer works.
fn to_signin(caller: &Caller) -> Response {
    let mut res = Redirect::to("/signin").into_response();
    if caller.session_id.is_some() {
        set_cookie(&mut res, &cleared_cookie(caller.plaintext));
    }
    res
}

pub(super) fn set_cookie(res: &mut Response, value: &str) {
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(value).expect("a cookie of visible ASCII is a header value"),
    );
}

impl AppState {
    /// The request's viewer, or the answer that sends them to sign in.
    pub(super) async fn who(&self, caller: &Caller) -> Result<Who, Response> {
        if let Some(id) = &caller.session_id {
            let now = Instant::now();
            let found = lock(&self.shared.sessions).touch(id, now).map(|(key, s)| {
                let stale = now.saturating_duration_since(s.reviewed) >= REVIEW_TTL;
                (key, s.user.clone(), s.token.clone(), stale)
            });
            if let Some((key, user, token, stale)) = found
                && (!stale || self.still_valid(&key, &user, &token).await?)
            {
                return Ok(Who::User(SignedIn { key, user, token }));
            }
        }
        if self.settings.anonymous_read {
            return Ok(Who::Anonymous);
        }
        Err(to_signin(caller))
    }

    /// Asks the API server again whether the session's token is `user`'s;
    /// ends the session when it is not (expired, revoked, another user).
    async fn still_valid(
        &self,
        key: &session::Key,
        user: &User,
        token: &str,
    ) -> Result<bool, Response> {
        let answer = auth::review_token(&self.client, token)
            .await
            .map_err(|e| api_failure(&e))?;
        let mut sessions = lock(&self.shared.sessions);
        if answer.as_ref() == Some(user) {
            if let Some(s) = sessions.get_mut(key) {
                s.reviewed = Instant::now();
            }
            Ok(true)
        } else {
            sessions.remove(key);
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-ichor_session=abc; ichor_session=def; b=2"),
        );
        assert_eq!(cookie(&h, cookie_name(false)).as_deref(), Some("abc"));
        assert_eq!(cookie(&h, cookie_name(true)).as_deref(), Some("def"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("__Host-ichor_session="),
        );
        assert_eq!(cookie(&h, cookie_name(false)), None);
    }

    /// Covers: R18.3 (the cookie is `__Host-` prefixed, Secure, HttpOnly, SameSite=Strict, Path=/, no Domain, and carries the session id only)
    #[test]
    fn the_session_cookie_is_host_only_and_carries_an_id() {
        let id = session::new_id().unwrap();
        let c = session_cookie(false, &id);
        assert!(c.starts_with(&format!("__Host-ichor_session={id};")), "{c}");
        for flag in ["; Path=/;", "; HttpOnly", "; Secure", "; SameSite=Strict"] {
            assert!(c.contains(flag), "{c} lacks {flag}");
        }
        assert!(!c.to_ascii_lowercase().contains("domain"), "{c}");
        // The cookie's Max-Age attribute is the session's absolute expiry: a
        // check of the attribute written, no clock involved.
        assert!(c.contains(&format!("Max-Age={}", session::ABSOLUTE_TIMEOUT.as_secs())));
        // Plain HTTP: browsers refuse a __Host- cookie there; the old name, still Secure.
        let p = session_cookie(true, &id);
        assert!(p.starts_with(&format!("ichor_session={id};")), "{p}");
        assert!(p.contains("; Secure"), "{p}");
        assert!(cleared_cookie(false).starts_with("__Host-ichor_session=;"));
        assert!(cleared_cookie(false).contains("Max-Age=0"));
        assert!(cleared_cookie(true).starts_with("ichor_session=;"));
    }
}
