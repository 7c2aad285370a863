//! Who the user is (TokenReview) and what they may read and do
//! (SubjectAccessReview), both answered by the Kubernetes API server with
//! the UI's own client; and the clients the UI writes with, which carry the
//! user's own token ([`UserClients`]).

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// A user the API server vouched for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What can go wrong asking the API server.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The TokenReview or SubjectAccessReview request itself failed.
    #[error(
        "the Kubernetes API refused or failed the UI's {what}; check that the UI's ServiceAccount may create tokenreviews and subjectaccessreviews (system:auth-delegator)"
    )]
    Api {
        what: &'static str,
        source: kube::Error,
    },
}

/// The token's user, or None when the API server does not accept the token.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<Option<User>, AuthError> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: None,
        },
        ..TokenReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| AuthError::Api {
            what: "TokenReview",
            source,
        })?;
    let Some(status) = answer.status else {
        return Ok(None);
    };
    if status.authenticated != Some(true) {
        return Ok(None);
    }
    let UserInfo {
        username,
        uid,
        groups,
        extra,
    } = status.user.unwrap_or_default();
    Ok(username.map(|username| User {
        username,
        uid,
        groups: groups.unwrap_or_default(),
        extra: extra.unwrap_or_default(),
    }))
}

/// One thing to ask about: `verb` on `resource` of Ichor's group, in
/// `namespace` (None: in every namespace at once), on `name` (None: any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl Access<'_> {
    /// Where, as a message says it.
    pub fn scope(&self) -> String {
        match self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in every namespace".into(),
        }
    }
}

/// Whether `user` may do `access`, as the API server's authorizers answer.
pub async fn may(
    client: &kube::Client,
    user: &User,
    access: Access<'_>,
) -> Result<bool, AuthError> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: user.uid.clone(),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(ichor_api::GROUP.into()),
                version: Some(ichor_api::VERSION.into()),
                resource: Some(access.resource.into()),
                verb: Some(access.verb.into()),
                // An empty namespace asks about every namespace at once.
                namespace: Some(access.namespace.unwrap_or_default().into()),
                name: access.name.map(Into::into),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| AuthError::Api {
            what: "SubjectAccessReview",
            source,
        })?;
    Ok(answer
        .status
        .is_some_and(|s| s.allowed && s.denied != Some(true)))
}

/// What can go wrong building a client for a signed-in user.
#[derive(Debug, thiserror::Error)]
#[error("cannot build a Kubernetes client with the signed-in user's token for the UI's API server")]
pub struct UserClientError(#[source] kube::Error);

/// Builds the clients the UI writes with: the API server's URL and CA (and
/// TLS and proxy settings) of the UI's own client configuration, with the
/// signed-in user's bearer token as the only credential, so the API
/// server's RBAC and audit log see the user (as Kubernetes Dashboard and
/// Headlamp do). Not impersonation: the UI's own identity is not used.
#[derive(Clone)]
pub struct UserClients {
    base: kube::Config,
}

impl std::fmt::Debug for UserClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserClients")
            .field("cluster_url", &self.base.cluster_url)
            .finish_non_exhaustive()
    }
}

impl UserClients {
    /// From the UI's own configuration, with every credential of it dropped
    /// (token, client certificate, exec plugin, impersonation, extra headers).
    pub fn from_config(config: &kube::Config) -> UserClients {
        let mut base = config.clone();
        base.auth_info = kube::config::AuthInfo::default();
        base.headers = Vec::new();
        UserClients { base }
    }

    /// A client that authenticates as the holder of `token`, and only so.
    pub fn client(&self, token: &str) -> Result<kube::Client, UserClientError> {
        let mut config = self.base.clone();
        config.auth_info.token = Some(token.to_owned().into());
        kube::Client::try_from(config).map_err(UserClientError)
    }
}
