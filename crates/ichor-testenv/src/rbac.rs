//! Least privilege, measured: the grants of a set of RBAC objects (Roles,
//! ClusterRoles and their bindings, as a manifest or a rendered chart
//! carries them) set against the requests an identity really made (from the
//! API server's audit log), grant by grant.
//!
//! A grant is one (identity, scope, API group, resource[/subresource], verb,
//! names) — a rule listing three resources and four verbs is twelve grants,
//! so an unused verb on one resource shows even when its neighbours are used.
//! Pure functions; the end-to-end test feeds them the audit log.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use crate::AuditEvent;

/// Where a grant applies: everywhere (a ClusterRoleBinding) or in one
/// namespace (a RoleBinding, of a Role or a ClusterRole).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Cluster,
    Namespace(String),
}

/// One verb on one resource for one identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Grant {
    /// The user the API server sees (`system:serviceaccount:NS:NAME`).
    pub identity: String,
    pub scope: Scope,
    /// `""` for the core group; `*` for every group.
    pub api_group: String,
    /// `resource` or `resource/subresource`; `*` for every resource.
    pub resource: String,
    pub verb: String,
    /// Empty: every object; else only these names.
    pub names: Vec<String>,
    /// The role it comes from (`ClusterRole/NAME` or `Role/NS/NAME`).
    pub from: String,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() {
            "core"
        } else {
            &self.api_group
        };
        let scope = match &self.scope {
            Scope::Cluster => "cluster-wide".to_string(),
            Scope::Namespace(ns) => format!("in {ns}"),
        };
        let names = if self.names.is_empty() {
            String::new()
        } else {
            format!(" names {:?}", self.names)
        };
        write!(
            f,
            "{} may {} {}/{}{} {} (from {})",
            self.identity, self.verb, group, self.resource, names, scope, self.from
        )
    }
}

/// One request as the audit log recorded it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Request {
    pub identity: String,
    pub verb: String,
    pub api_group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// Empty for a cluster-scoped object or a request across namespaces.
    pub namespace: String,
    /// Empty for a list, a watch or a create without a name.
    pub name: String,
    /// The response code (403 when the API server refused it).
    pub code: u16,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() {
            "core"
        } else {
            &self.api_group
        };
        write!(
            f,
            "{} {} {}/{} ns={:?} name={:?} -> {}",
            self.identity, self.verb, group, self.resource, self.namespace, self.name, self.code
        )
    }
}

/// The requests of `events` made by one of `identities` on a resource (not
/// `/healthz` and the like, which RBAC for ServiceAccounts does not gate
/// beyond the default discovery roles).
pub fn requests(events: &[AuditEvent], identities: &[String]) -> Vec<Request> {
    let mut out = BTreeSet::new();
    for e in events {
        if !identities.contains(&e.user.username) {
            continue;
        }
        let Some(o) = &e.object_ref else { continue };
        let s = |k: &str| o[k].as_str().unwrap_or_default().to_string();
        let mut resource = s("resource");
        if resource.is_empty() {
            continue;
        }
        if let Some(sub) = o["subresource"].as_str().filter(|s| !s.is_empty()) {
            resource = format!("{resource}/{sub}");
        }
        let code = e
            .response_status
            .as_ref()
            .and_then(|r| r["code"].as_u64())
            .unwrap_or(0) as u16;
        out.insert(Request {
            identity: e.user.username.clone(),
            verb: e.verb.clone(),
            api_group: s("apiGroup"),
            resource,
            namespace: s("namespace"),
            name: s("name"),
            code,
        });
    }
    out.into_iter().collect()
}

/// The rules of Kubernetes's own ClusterRoles that Ichor's objects bind to.
pub fn builtin_cluster_role(name: &str) -> Option<Vec<Value>> {
    match name {
        "cluster-admin" => Some(vec![serde_json::json!({
            "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]
        })]),
        _ => None,
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn rule_grants(
    rules: &[Value],
    identity: &str,
    scope: &Scope,
    from: &str,
    out: &mut BTreeSet<Grant>,
) {
    for rule in rules {
        let names = strings(&rule["resourceNames"]);
        for api_group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.insert(Grant {
                        identity: identity.to_string(),
                        scope: scope.clone(),
                        api_group: api_group.clone(),
                        resource: resource.clone(),
                        verb,
                        names: names.clone(),
                        from: from.to_string(),
                    });
                }
            }
        }
    }
}

/// Every grant `objects` give to ServiceAccounts: each binding's subjects
/// get its role's rules, at the binding's scope. A binding to a role that is
/// neither in `objects` nor built in ([`builtin_cluster_role`]) grants
/// nothing (the API server would not find it either).
pub fn grants(objects: &[Value]) -> Vec<Grant> {
    let find = |kind: &str, name: &str, ns: Option<&str>| {
        objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"] == name
                    && ns.is_none_or(|ns| o["metadata"]["namespace"] == ns)
            })
            .map(|o| o["rules"].as_array().cloned().unwrap_or_default())
    };
    let mut out = BTreeSet::new();
    for binding in objects {
        let kind = binding["kind"].as_str().unwrap_or_default();
        let scope = match kind {
            "ClusterRoleBinding" => Scope::Cluster,
            "RoleBinding" => Scope::Namespace(
                binding["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            _ => continue,
        };
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let (rules, from) = match (role_kind, &scope) {
            ("ClusterRole", _) => (
                find("ClusterRole", role_name, None).or_else(|| builtin_cluster_role(role_name)),
                format!("ClusterRole/{role_name}"),
            ),
            ("Role", Scope::Namespace(ns)) => (
                find("Role", role_name, Some(ns)),
                format!("Role/{ns}/{role_name}"),
            ),
            _ => (None, String::new()),
        };
        let Some(rules) = rules else { continue };
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            if subject["kind"] != "ServiceAccount" {
                continue;
            }
            let identity = format!(
                "system:serviceaccount:{}:{}",
                subject["namespace"].as_str().unwrap_or_default(),
                subject["name"].as_str().unwrap_or_default()
            );
            rule_grants(&rules, &identity, &scope, &from, &mut out);
        }
    }
    out.into_iter().collect()
}

/// Whether `grant` allows `request`, as the API server's RBAC authoriser
/// decides: same identity, the group, resource and verb equal or `*`, the
/// namespace inside the grant's scope, and the name among the grant's names
/// when it lists any (a list, watch or create has no name to match, so a
/// named grant never allows it).
pub fn allows(grant: &Grant, request: &Request) -> bool {
    let any = |g: &str, r: &str| g == "*" || g == r;
    grant.identity == request.identity
        && any(&grant.api_group, &request.api_group)
        && any(&grant.resource, &request.resource)
        && any(&grant.verb, &request.verb)
        && match &grant.scope {
            Scope::Cluster => true,
            Scope::Namespace(ns) => *ns == request.namespace,
        }
        && (grant.names.is_empty() || grant.names.contains(&request.name))
}

/// What [`compare`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Requests no grant allows (the identity would be refused them).
    pub denied: Vec<Request>,
    /// Grants no request used.
    pub unused: Vec<Grant>,
}

/// Sets `requests` against `grants`: which requests no grant allows, and
/// which grants no request used.
pub fn compare(grants: &[Grant], requests: &[Request]) -> Comparison {
    Comparison {
        denied: requests
            .iter()
            .filter(|r| !grants.iter().any(|g| allows(g, r)))
            .cloned()
            .collect(),
        unused: grants
            .iter()
            .filter(|g| !requests.iter().any(|r| allows(g, r)))
            .cloned()
            .collect(),
    }
}

/// Grants with `*` for a group, a resource or a verb.
pub fn wildcards(grants: &[Grant]) -> Vec<&Grant> {
    grants
        .iter()
        .filter(|g| g.api_group == "*" || g.resource.contains('*') || g.verb == "*")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SA: &str = "system:serviceaccount:ichor-system:ichor-controller";

    fn objects(rules: Value) -> Vec<Value> {
        vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": rules}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
                "roleRef": {"kind": "ClusterRole", "name": "c"},
                "subjects": [{"kind": "ServiceAccount", "name": "ichor-controller", "namespace": "ichor-system"}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "ichor-system"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["bundle"], "verbs": ["get"]}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "ichor-system"},
                "roleRef": {"kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "ichor-controller", "namespace": "ichor-system"}]}),
        ]
    }

    fn request(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Request {
        Request {
            identity: SA.into(),
            verb: verb.into(),
            api_group: group.into(),
            resource: resource.into(),
            namespace: ns.into(),
            name: name.into(),
            code: 200,
        }
    }

    fn used() -> Vec<Request> {
        vec![
            request(
                "patch",
                "ichor.maesh.dev",
                "talosmachines/status",
                "ns",
                "m",
            ),
            request("watch", "ichor.maesh.dev", "talosmachines", "", ""),
            request("get", "", "secrets", "ichor-system", "bundle"),
        ]
    }

    #[test]
    fn a_role_with_exactly_the_requests_has_no_denied_and_no_unused_grant() {
        let g = grants(&objects(json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines/status"], "verbs": ["patch"]},
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "verbs": ["watch"]},
        ])));
        assert_eq!(g.len(), 3);
        assert_eq!(compare(&g, &used()), Comparison::default());
    }

    /// The comparison fails when a needed grant is taken away: the request it
    /// allowed shows as denied.
    #[test]
    fn a_trimmed_role_leaves_the_request_it_allowed_denied() {
        let g = grants(&objects(json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["talosmachines"], "verbs": ["watch"]},
        ])));
        let c = compare(&g, &used());
        assert_eq!(c.denied, vec![used()[0].clone()]);
        assert!(c.unused.is_empty());
    }

    #[test]
    fn unused_verbs_show_one_by_one_and_wildcards_are_found() {
        let g = grants(&objects(json!([
            {"apiGroups": ["ichor.maesh.dev"], "resources": ["*"], "verbs": ["watch", "patch", "delete"]},
        ])));
        let c = compare(&g, &used());
        assert!(c.denied.is_empty(), "{:?}", c.denied);
        let unused: Vec<String> = c.unused.iter().map(ToString::to_string).collect();
        assert_eq!(
            unused,
            vec![format!(
                "{SA} may delete ichor.maesh.dev/* cluster-wide (from ClusterRole/c)"
            )]
        );
        assert_eq!(wildcards(&g).len(), 3);
    }

    #[test]
    fn a_namespaced_or_named_grant_allows_nothing_outside_it() {
        let g = grants(&objects(json!([])));
        assert!(
            compare(
                &g,
                &[request("get", "", "secrets", "ichor-system", "bundle")]
            )
            .denied
            .is_empty()
        );
        for r in [
            request("get", "", "secrets", "kube-system", "bundle"),
            request("get", "", "secrets", "ichor-system", "other"),
            request("list", "", "secrets", "ichor-system", ""),
        ] {
            assert_eq!(compare(&g, std::slice::from_ref(&r)).denied, vec![r]);
        }
    }

    #[test]
    fn a_binding_to_cluster_admin_is_every_verb_on_everything() {
        let objects = vec![
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "cni"},
            "roleRef": {"kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "ichor-cni", "namespace": "ichor-system"}]}),
        ];
        let g = grants(&objects);
        assert_eq!(g.len(), 1);
        assert_eq!(wildcards(&g).len(), 1);
    }
}
