//! Sign-in (a bearer token checked by TokenReview, rate-limited) and
//! sign-out.

use super::*;

pub(super) async fn signin_page() -> Response {
    ok_html(html::signin(None))
}

/// Whether `token` looks like a bearer token (a JWT, a bootstrap or static
/// token): the characters of base64url, base64 and `.`.
pub fn is_bearer_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 16 * 1024
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
}

fn signin_refused(status: StatusCode, message: &str) -> Response {
    (status, Html(html::signin(Some(message)).into_string())).into_response()
}

/// The answer to a sign-in attempt beyond the rate limit.
fn too_many_attempts(wait: Duration) -> Response {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut res = signin_refused(
        StatusCode::TOO_MANY_REQUESTS,
        &format!(
            "Too many sign-in attempts from your address or from everyone: nothing was checked. Try again in {secs} s."
        ),
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res
}

pub(super) async fn signin(
    State(state): State<AppState>,
    caller: Caller,
    Form(pairs): Form<FormPairs>,
) -> Response {
    // First: every attempt past this point costs the API server a TokenReview.
    if let Err(wait) = lock(&state.shared.signins).attempt(caller.address, Instant::now()) {
        return too_many_attempts(wait);
    }
    let token = form_value(&pairs, "token").unwrap_or("").trim().to_owned();
    if !is_bearer_token(&token) {
        return signin_refused(
            StatusCode::UNAUTHORIZED,
            "Paste a token: it is empty or not a bearer token.",
        );
    }
    let user = match auth::review_token(&state.client, &token).await {
        Ok(Some(user)) => user,
        Ok(None) => {
            return signin_refused(
                StatusCode::UNAUTHORIZED,
                "The Kubernetes API server did not accept this token (TokenReview): it is expired, revoked or not a token of this cluster.",
            );
        }
        Err(e) => return api_failure(&e),
    };
    let id = match session::new_id() {
        Ok(id) => id,
        Err(e) => {
            return page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "No session",
                &explain(&e),
            );
        }
    };
    {
        let mut sessions = lock(&state.shared.sessions);
        // A new id at each sign-in: a session id planted before sign-in is worth nothing.
        if let Some(old) = &caller.session_id {
            sessions.remove_id(old);
        }
        sessions.insert(&id, token, user, Instant::now());
    }
    let mut res = Redirect::to("/clusters").into_response();
    set_cookie(&mut res, &session_cookie(caller.plaintext, &id));
    res
}

pub(super) async fn signout(State(state): State<AppState>, caller: Caller) -> Response {
    if let Some(id) = &caller.session_id {
        lock(&state.shared.sessions).remove_id(id);
    }
    let mut res = Redirect::to("/signin").into_response();
    set_cookie(&mut res, &cleared_cookie(caller.plaintext));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_recognised() {
        assert!(is_bearer_token(
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"
        ));
        assert!(is_bearer_token("abcdef.0123456789abcdef"));
        for bad in ["", "a b", "a;b=c", "a,b", "\"quoted\"", "tok\r\nX: y"] {
            assert!(!is_bearer_token(bad), "{bad:?}");
        }
    }
}
