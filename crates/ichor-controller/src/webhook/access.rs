//! Whether the creator of a TalosOperation may read what its health checks
//! read: the controller evaluates each check with its own rights and shows
//! a failing check's value in the operation's status, so a check on an
//! object its creator may not read would read it for them. The webhook asks
//! the API server (a SubjectAccessReview carrying the admission request's
//! user) and refuses each check the creator may not read.
//!
//! Pure: [`questions`] (what to ask) and [`refusals`] (answers into
//! refusals); the I/O (discovery, the reviews) in [`problems`].

use std::collections::BTreeMap;

use futures::future::join_all;

use ichor_api::error_text::chain;
use ichor_api::operation::{HealthCheck, HealthCheckTarget};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

/// What discovery says of a target's `apiVersion`/`kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Served: its resource (plural) and whether it is namespaced.
    Served { resource: String, namespaced: bool },
    /// The API server serves no such kind.
    Unknown,
    /// Discovery itself failed (why, in words).
    Failed(String),
}

/// One question for the API server: may the creator `verb` this resource?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The check it is asked for, as messages name it
    /// (`spec.healthChecks[0] (api-up)`).
    pub check: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// Unset: cluster-scoped, or every namespace.
    pub namespace: Option<String>,
    /// The one object a `get` reads, when the check names it.
    pub name: Option<String>,
    pub verb: &'static str,
}

/// The API server's answer to one [`Question`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Allowed,
    Denied,
    /// The review could not be made (why, in words).
    Failed(String),
}

/// A target's API group and version (`apps/v1` → `apps`, `v1`; `v1` → the
/// core group).
pub fn group_version(target: &HealthCheckTarget) -> (String, String) {
    match target.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), target.api_version.clone()),
    }
}

fn label(index: usize, check: &HealthCheck) -> String {
    format!("spec.healthChecks[{index}] ({})", check.name)
}

/// What to ask for each check, given what discovery said of each target's
/// kind (keyed by `(apiVersion, kind)`), and the refusals that need no
/// question (an unknown kind, a discovery that failed). A check reads one
/// object by name (`get`) or lists them (`get` and `list`: by a label
/// selector, or every object of the kind).
pub fn questions(
    checks: &[HealthCheck],
    kinds: &BTreeMap<(String, String), Kind>,
) -> (Vec<Question>, Vec<String>) {
    let mut asks = Vec::new();
    let mut refused = Vec::new();
    for (index, check) in checks.iter().enumerate() {
        let t = &check.target;
        let what = format!("{} {}", t.api_version, t.kind);
        let kind = kinds
            .get(&(t.api_version.clone(), t.kind.clone()))
            .cloned()
            .unwrap_or(Kind::Unknown);
        let (resource, namespaced) = match kind {
            Kind::Served {
                resource,
                namespaced,
            } => (resource, namespaced),
            Kind::Unknown => {
                refused.push(format!(
                    "{}: the API server serves no kind {what}; write the apiVersion and kind of an object it serves",
                    label(index, check)
                ));
                continue;
            }
            Kind::Failed(why) => {
                refused.push(format!(
                    "{}: could not look up kind {what} to check that you may read it ({why}); refused until it can be checked",
                    label(index, check)
                ));
                continue;
            }
        };
        let (group, version) = group_version(t);
        let namespace = t.namespace.clone().filter(|_| namespaced);
        let verbs: &[&'static str] = if t.name.is_some() {
            &["get"]
        } else {
            &["get", "list"]
        };
        for verb in verbs {
            asks.push(Question {
                check: label(index, check),
                group: group.clone(),
                version: version.clone(),
                resource: resource.clone(),
                namespace: namespace.clone(),
                name: t.name.clone(),
                verb,
            });
        }
    }
    (asks, refused)
}

/// `configmaps in namespace web`, `apps/deployments in every namespace`.
fn resource_text(q: &Question) -> String {
    let resource = if q.group.is_empty() {
        q.resource.clone()
    } else {
        format!("{}/{}", q.group, q.resource)
    };
    let object = match (&q.name, q.verb) {
        (Some(name), "get") => format!("{resource} {name:?}"),
        _ => resource,
    };
    match &q.namespace {
        Some(ns) => format!("{object} in namespace {ns}"),
        None => format!("{object} in every namespace (or cluster-wide)"),
    }
}

/// The refusals the answers give: each check its creator may not read
/// (once per check, naming the verb and the resource), and each whose
/// question could not be asked (refused: Ichor does not guess).
pub fn refusals(user: &str, asked: &[Question], answers: &[Answer]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut done: Vec<&str> = Vec::new();
    for (q, a) in asked.iter().zip(answers) {
        if done.contains(&q.check.as_str()) {
            continue;
        }
        let text = match a {
            Answer::Allowed => continue,
            Answer::Denied => format!(
                "{}: {user} may not {} {}, so a health check of theirs may not read it (the controller would show what it reads in the operation's status)",
                q.check,
                q.verb,
                resource_text(q)
            ),
            Answer::Failed(why) => format!(
                "{}: could not ask the API server whether {user} may {} {} ({why}); refused until it can be checked",
                q.check,
                q.verb,
                resource_text(q)
            ),
        };
        done.push(&q.check);
        out.push(text);
    }
    out
}

/// The request's user as a SubjectAccessReview spec asks about them.
fn review_for(user: &UserInfo, q: &Question) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some(q.group.clone()),
                version: Some(q.version.clone()),
                resource: Some(q.resource.clone()),
                namespace: q.namespace.clone(),
                name: q.name.clone().filter(|_| q.verb == "get"),
                verb: Some(q.verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn kind_of(client: &kube::Client, target: &HealthCheckTarget) -> Kind {
    let (group, version) = group_version(target);
    let gvk = GroupVersionKind::gvk(&group, &version, &target.kind);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, caps)) => Kind::Served {
            resource: ar.plural,
            namespaced: caps.scope == kube::discovery::Scope::Namespaced,
        },
        Err(kube::Error::Discovery(_)) => Kind::Unknown,
        // An unknown group or version: the API server has no such path.
        Err(kube::Error::Api(s)) if s.code == 404 => Kind::Unknown,
        Err(e) => Kind::Failed(chain(&e)),
    }
}

async fn ask(client: &kube::Client, user: &UserInfo, q: &Question) -> Answer {
    let reviews = Api::<SubjectAccessReview>::all(client.clone());
    match reviews
        .create(&PostParams::default(), &review_for(user, q))
        .await
    {
        Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => Answer::Allowed,
        Ok(_) => Answer::Denied,
        Err(e) => Answer::Failed(chain(&e)),
    }
}

/// How many SubjectAccessReviews one admission has in flight.
const REVIEWS_AT_ONCE: usize = 8;

/// The checks of a new TalosOperation (`new`) that `user` may not read, or
/// could not be checked, as refusals. `None` for the client (a router
/// without one) refuses any operation with checks: nothing is let through
/// unasked.
pub async fn problems(
    client: Option<&kube::Client>,
    user: Option<&UserInfo>,
    new: &Value,
) -> Vec<String> {
    let Some(list) = new.get("spec").and_then(|s| s.get("healthChecks")) else {
        return Vec::new();
    };
    // A list of another shape is the schema's to refuse.
    let Ok(checks) = serde_json::from_value::<Vec<HealthCheck>>(list.clone()) else {
        return Vec::new();
    };
    if checks.is_empty() {
        return Vec::new();
    }
    let (Some(client), Some(user)) = (client, user) else {
        return vec![
            "spec.healthChecks: this webhook cannot ask the API server whether the operation's creator may read what its health checks read; refused until it can be checked".into(),
        ];
    };
    let mut kinds = BTreeMap::new();
    for c in &checks {
        let key = (c.target.api_version.clone(), c.target.kind.clone());
        if let std::collections::btree_map::Entry::Vacant(slot) = kinds.entry(key) {
            slot.insert(kind_of(client, &c.target).await);
        }
    }
    let (asked, mut refused) = questions(&checks, &kinds);
    // Several reviews at once (in order), so a long list of checks stays
    // well inside the webhook's timeout.
    let mut answers = Vec::with_capacity(asked.len());
    for batch in asked.chunks(REVIEWS_AT_ONCE) {
        answers.extend(join_all(batch.iter().map(|q| ask(client, user, q))).await);
    }
    let who = user.username.as_deref().unwrap_or("the requesting user");
    refused.extend(refusals(who, &asked, &answers));
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, target: HealthCheckTarget) -> HealthCheck {
        HealthCheck {
            name: name.into(),
            expression: "true".into(),
            target,
            timeout: None,
        }
    }

    fn target(
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> HealthCheckTarget {
        HealthCheckTarget {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            label_selector: None,
        }
    }

    fn served(resource: &str, namespaced: bool) -> Kind {
        Kind::Served {
            resource: resource.into(),
            namespaced,
        }
    }

    /// A named object is asked `get` (with its name); a selector `get` and
    /// `list`; a cluster-scoped kind without the namespace written.
    /// Covers: R15.5
    #[test]
    fn a_named_object_is_asked_get_a_selector_get_and_list() {
        let mut selected = target("apps/v1", "Deployment", Some("web"), None);
        selected.label_selector = Some("app=web".into());
        let checks = [
            check("cm", target("v1", "ConfigMap", Some("web"), Some("flags"))),
            check("deps", selected),
            check("nodes", target("v1", "Node", Some("ignored"), Some("n1"))),
        ];
        let kinds = BTreeMap::from([
            (
                ("v1".into(), "ConfigMap".into()),
                served("configmaps", true),
            ),
            (
                ("apps/v1".into(), "Deployment".into()),
                served("deployments", true),
            ),
            (("v1".into(), "Node".into()), served("nodes", false)),
        ]);
        let (asked, refused) = questions(&checks, &kinds);
        assert!(refused.is_empty(), "{refused:?}");
        let short: Vec<_> = asked
            .iter()
            .map(|q| {
                (
                    q.check.as_str(),
                    q.group.as_str(),
                    q.resource.as_str(),
                    q.namespace.as_deref(),
                    q.verb,
                )
            })
            .collect();
        assert_eq!(
            short,
            vec![
                (
                    "spec.healthChecks[0] (cm)",
                    "",
                    "configmaps",
                    Some("web"),
                    "get"
                ),
                (
                    "spec.healthChecks[1] (deps)",
                    "apps",
                    "deployments",
                    Some("web"),
                    "get"
                ),
                (
                    "spec.healthChecks[1] (deps)",
                    "apps",
                    "deployments",
                    Some("web"),
                    "list"
                ),
                ("spec.healthChecks[2] (nodes)", "", "nodes", None, "get"),
            ]
        );
        assert_eq!(asked[0].name.as_deref(), Some("flags"));
        let review = review_for(&UserInfo::default(), &asked[2]);
        let attrs = review.spec.resource_attributes.unwrap();
        assert_eq!(attrs.verb.as_deref(), Some("list"));
        assert_eq!(attrs.name, None);
    }

    /// An unknown kind is refused naming it; a failed discovery too (fail
    /// closed).
    /// Covers: R15.5
    #[test]
    fn an_unknown_kind_is_refused_naming_it() {
        let checks = [
            check(
                "w",
                target("example.com/v1", "Widget", Some("web"), Some("a")),
            ),
            check("g", target("example.com/v2", "Gadget", None, None)),
        ];
        let kinds = BTreeMap::from([(
            ("example.com/v2".into(), "Gadget".into()),
            Kind::Failed("connection refused".into()),
        )]);
        let (asked, refused) = questions(&checks, &kinds);
        assert!(asked.is_empty());
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(
            refused[0].starts_with(
                "spec.healthChecks[0] (w): the API server serves no kind example.com/v1 Widget"
            ),
            "{}",
            refused[0]
        );
        assert!(
            refused[1].starts_with(
                "spec.healthChecks[1] (g): could not look up kind example.com/v2 Gadget"
            ) && refused[1].contains("connection refused"),
            "{}",
            refused[1]
        );
    }

    /// A denied or failed answer refuses its check once, naming the user,
    /// the verb and the resource; allowed ones refuse nothing.
    /// Covers: R15.5
    #[test]
    fn answers_become_one_refusal_per_check() {
        let q = |check: &str, verb: &'static str| Question {
            check: check.into(),
            group: String::new(),
            version: "v1".into(),
            resource: "configmaps".into(),
            namespace: Some("web".into()),
            name: None,
            verb,
        };
        let asked = [q("a", "get"), q("a", "list"), q("b", "get"), q("c", "get")];
        let answers = [
            Answer::Denied,
            Answer::Denied,
            Answer::Allowed,
            Answer::Failed("timed out".into()),
        ];
        let out = refusals("alice", &asked, &answers);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(
            out[0].starts_with("a: alice may not get configmaps in namespace web"),
            "{}",
            out[0]
        );
        assert!(
            out[1].starts_with("c: could not ask the API server whether alice may get configmaps in namespace web (timed out)"),
            "{}",
            out[1]
        );
        assert!(refusals("alice", &asked[2..3], &answers[2..3]).is_empty());
    }
}
