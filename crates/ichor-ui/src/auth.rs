//! Who the user is (TokenReview) and what they may do (SubjectAccessReview),
//! both answered by the Kubernetes API server with the UI's own client.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::view::Permissions;

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
        "the Kubernetes API refused or failed the {what}: {source}; check that the UI's ServiceAccount may create tokenreviews and subjectaccessreviews (system:auth-delegator)"
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

/// One thing to ask about: `verb` on `resource` of Ichor's group, in `namespace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub namespace: &'a str,
    pub name: Option<&'a str>,
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
                namespace: Some(access.namespace.into()),
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

/// The actions `user` may take in `namespace` (one review per action).
pub async fn permissions(
    client: &kube::Client,
    user: &User,
    namespace: &str,
) -> Result<Permissions, AuthError> {
    let ask = |verb, resource| Access {
        verb,
        resource,
        namespace,
        name: None,
    };
    let (patch_machines, create_operations, patch_operations) = futures::try_join!(
        may(client, user, ask("patch", "talosmachines")),
        may(client, user, ask("create", "talosoperations")),
        may(client, user, ask("patch", "talosoperations")),
    )?;
    Ok(Permissions {
        patch_machines,
        create_operations,
        patch_operations,
    })
}
