//! Pure helpers on a release manifest: splitting it into objects, the key
//! Helm matches objects on (group, kind, namespace, name — never the
//! version), Helm's ownership metadata, and rollout readiness of workloads.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize as _;
use serde_json::{Map, Value};

/// Label Helm sets on every object it manages.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Annotation naming the owning release.
pub const RELEASE_NAME_ANNOTATION: &str = "meta.helm.sh/release-name";
/// Annotation naming the owning release's namespace (the release namespace).
pub const RELEASE_NAMESPACE_ANNOTATION: &str = "meta.helm.sh/release-namespace";
/// `helm.sh/resource-policy: keep` keeps an object when it leaves the manifest.
pub const RESOURCE_POLICY_ANNOTATION: &str = "helm.sh/resource-policy";

/// One object of a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestObject {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// As written in the manifest; the engine fills in the release namespace
    /// for namespaced kinds that have none.
    pub namespace: Option<String>,
    pub body: Value,
}

impl ManifestObject {
    /// `(group, version)` of `apiVersion`.
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", self.api_version.as_str()),
        }
    }

    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            group: self.group_version().0.to_string(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone().unwrap_or_default(),
            name: self.name.clone(),
        }
    }

    /// Whether `helm.sh/resource-policy` says `keep`.
    pub fn keep(&self) -> bool {
        has_keep_policy(&self.body)
    }
}

/// Whether an object's annotations carry `helm.sh/resource-policy: keep`.
pub fn has_keep_policy(body: &Value) -> bool {
    body.pointer("/metadata/annotations")
        .and_then(|a| a.get(RESOURCE_POLICY_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("keep"))
}

/// The identity Helm compares objects on between two manifests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        };
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

/// Why a manifest cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest document {index} is not valid YAML")]
    Yaml {
        index: usize,
        source: serde_yaml_ng::Error,
    },
    #[error(
        "manifest document {index} ({source_file}) lacks {field}; every object needs apiVersion, kind and metadata.name"
    )]
    Missing {
        index: usize,
        source_file: String,
        field: &'static str,
    },
}

/// Splits a manifest (`---`-separated YAML) into its objects, in order,
/// skipping empty documents and expanding `kind: List`.
pub fn parse_manifest(manifest: &str) -> Result<Vec<ManifestObject>, ManifestError> {
    let mut out = Vec::new();
    let manifest = &yaml11_octals(manifest);
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(manifest).enumerate() {
        let value =
            Value::deserialize(doc).map_err(|source| ManifestError::Yaml { index, source })?;
        let source_file = source_of(manifest, index);
        match value {
            Value::Null => {}
            Value::Object(ref m) if m.is_empty() => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                for item in m
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(object(index, &source_file, item.clone())?);
                }
            }
            v => out.push(object(index, &source_file, v)?),
        }
    }
    Ok(out)
}

/// Rewrites plain block-style scalars that YAML 1.1 reads as octal integers
/// (`defaultMode: 0400`) to their decimal value. Helm and the API server read
/// manifests as YAML 1.1 (`0400` is 256); YAML 1.2, which serde_yaml_ng
/// follows, reads such a scalar as the string "0400", which the API server
/// refuses for an integer field. Quoted scalars and the lines of block
/// scalars (`|`, `>`) are left as they are.
pub fn yaml11_octals(manifest: &str) -> std::borrow::Cow<'_, str> {
    let mut out = String::with_capacity(manifest.len());
    let mut changed = false;
    // The indentation of the key that opened a block scalar, while inside it.
    let mut block: Option<usize> = None;
    for line in manifest.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let indent = body.len() - body.trim_start().len();
        if let Some(opener) = block {
            if body.trim().is_empty() || indent > opener {
                out.push_str(line);
                continue;
            }
            block = None;
        }
        let (value_at, value) = plain_value(body);
        let value = value.split(" #").next().unwrap_or_default().trim_end();
        if value.starts_with('|') || value.starts_with('>') {
            block = Some(indent);
        }
        let octal = value.len() > 1
            && value.starts_with('0')
            && value.bytes().all(|b| (b'0'..=b'7').contains(&b));
        match (octal, u64::from_str_radix(value, 8)) {
            (true, Ok(n)) => {
                changed = true;
                out.push_str(&body[..value_at]);
                out.push_str(&n.to_string());
                out.push_str(&body[value_at + value.len()..]);
                out.push_str(&line[body.len()..]);
            }
            _ => out.push_str(line),
        }
    }
    if changed {
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(manifest)
    }
}

/// A key holding one of these is quoted or inside a flow collection: the
/// `: ` after it does not end a plain key.
const NOT_PLAIN_KEY: [char; 4] = ['"', '\'', '{', '['];

/// Where the value of a block-style line starts (after `key: ` or `- `), and
/// the rest of the line from there.
fn plain_value(line: &str) -> (usize, &str) {
    let mut at = line.len() - line.trim_start().len();
    loop {
        let rest = &line[at..];
        if let Some(r) = rest.strip_prefix("- ") {
            at += rest.len() - r.len() + (r.len() - r.trim_start().len());
            continue;
        }
        break;
    }
    let rest = &line[at..];
    if let Some(colon) = rest.find(": ")
        && !rest[..colon].contains(NOT_PLAIN_KEY)
    {
        let after = &rest[colon + 2..];
        at += colon + 2 + (after.len() - after.trim_start().len());
    }
    (at, &line[at..])
}

fn source_of(manifest: &str, index: usize) -> String {
    manifest
        .split("\n---")
        .filter(|d| !d.trim().is_empty())
        .nth(index)
        .and_then(|d| d.lines().find_map(|l| l.trim().strip_prefix("# Source: ")))
        .unwrap_or("unknown template")
        .to_string()
}

fn object(index: usize, source_file: &str, body: Value) -> Result<ManifestObject, ManifestError> {
    let missing = |field| ManifestError::Missing {
        index,
        source_file: source_file.to_string(),
        field,
    };
    let api_version = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| missing("apiVersion"))?;
    let kind = body
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| missing("kind"))?;
    let name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or_else(|| missing("metadata.name"))?;
    let namespace = body
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    Ok(ManifestObject {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        namespace,
        body,
    })
}

/// Sets Helm's ownership label and annotations on `body`.
pub fn stamp_ownership(body: &mut Value, release: &str, release_namespace: &str) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let labels = meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if !labels.is_object() {
        *labels = Value::Object(Map::new());
    }
    labels
        .as_object_mut()
        .expect("labels is an object")
        .insert(MANAGED_BY_LABEL.into(), "Helm".into());
    let ann = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ann.is_object() {
        *ann = Value::Object(Map::new());
    }
    let ann = ann.as_object_mut().expect("annotations is an object");
    ann.insert(RELEASE_NAME_ANNOTATION.into(), release.into());
    ann.insert(
        RELEASE_NAMESPACE_ANNOTATION.into(),
        release_namespace.into(),
    );
}

/// One piece of Helm's ownership metadata that is not this release's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnershipDifference {
    /// The `app.kubernetes.io/managed-by` label is not `Helm`.
    ManagedBy { found: Option<String> },
    /// The `meta.helm.sh/release-name` annotation names another release.
    ReleaseName {
        found: Option<String>,
        release: String,
    },
    /// The `meta.helm.sh/release-namespace` annotation names another namespace.
    ReleaseNamespace {
        found: Option<String>,
        namespace: String,
    },
}

impl fmt::Display for OwnershipDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnershipDifference::ManagedBy { found } => write!(
                f,
                "label {MANAGED_BY_LABEL} is {}, not Helm",
                shown(found.as_deref())
            ),
            OwnershipDifference::ReleaseName { found, release } => write!(
                f,
                "annotation {RELEASE_NAME_ANNOTATION} is {}, not {release}",
                shown(found.as_deref())
            ),
            OwnershipDifference::ReleaseNamespace { found, namespace } => write!(
                f,
                "annotation {RELEASE_NAMESPACE_ANNOTATION} is {}, not {namespace}",
                shown(found.as_deref())
            ),
        }
    }
}

/// A live object that does not carry this release's ownership metadata:
/// what differs, each piece once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", differences.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct OwnershipMismatch {
    pub differences: Vec<OwnershipDifference>,
}

/// Whether a live object carries the ownership metadata of this release.
/// `Err` lists what differs, for the error message.
pub fn check_ownership(
    live: &Value,
    release: &str,
    release_namespace: &str,
) -> Result<(), OwnershipMismatch> {
    let label = live
        .pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .and_then(Value::as_str);
    let ann = |k: &str| {
        live.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    let owned = |v: Option<&str>| v.map(str::to_string);
    let mut differences = Vec::new();
    if label != Some("Helm") {
        differences.push(OwnershipDifference::ManagedBy {
            found: owned(label),
        });
    }
    let name = ann(RELEASE_NAME_ANNOTATION);
    if name != Some(release) {
        differences.push(OwnershipDifference::ReleaseName {
            found: owned(name),
            release: release.to_string(),
        });
    }
    let ns = ann(RELEASE_NAMESPACE_ANNOTATION);
    if ns != Some(release_namespace) {
        differences.push(OwnershipDifference::ReleaseNamespace {
            found: owned(ns),
            namespace: release_namespace.to_string(),
        });
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(OwnershipMismatch { differences })
    }
}

fn shown(v: Option<&str>) -> String {
    v.map_or_else(|| "absent".to_string(), |s| format!("{s:?}"))
}

/// Objects of `old` whose key is not in `new`, in reverse order of `old`
/// (so dependants go before what they depend on).
pub fn removed<'a>(old: &'a [ManifestObject], new: &[ManifestObject]) -> Vec<&'a ManifestObject> {
    let keep: std::collections::HashSet<ObjectKey> = new.iter().map(ManifestObject::key).collect();
    old.iter()
        .rev()
        .filter(|o| !keep.contains(&o.key()))
        .collect()
}

/// What a workload's rollout still waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RolloutPending {
    #[error("observed generation {observed} < {generation}")]
    Generation { observed: i64, generation: i64 },
    #[error("no status reported yet")]
    NoStatus,
    #[error("{have}/{want} {counted}")]
    Short {
        have: i64,
        want: i64,
        counted: Counted,
    },
}

/// What a rollout counts against the wanted number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    ReplicasUpdated,
    ReplicasAvailable,
    ReplicasReady,
    PodsUpdated,
    PodsReady,
}

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Counted::ReplicasUpdated => "replicas updated",
            Counted::ReplicasAvailable => "replicas available",
            Counted::ReplicasReady => "replicas ready",
            Counted::PodsUpdated => "pods updated",
            Counted::PodsReady => "pods ready",
        })
    }
}

/// Each count in order, the first short of `want` is what the rollout waits for.
fn counts_reach(want: i64, counts: &[(i64, Counted)]) -> Result<(), RolloutPending> {
    match counts.iter().find(|(have, _)| *have < want) {
        Some(&(have, counted)) => Err(RolloutPending::Short {
            have,
            want,
            counted,
        }),
        None => Ok(()),
    }
}

/// Whether a workload has rolled out, from its live JSON; `Err` says what
/// it still waits for. Kinds without a rollout are ready at once.
pub fn rollout_status(kind: &str, live: &Value) -> Result<(), RolloutPending> {
    let int = |p: &str| live.pointer(p).and_then(Value::as_i64);
    let generation = int("/metadata/generation").unwrap_or(0);
    let observed_ok = || match int("/status/observedGeneration") {
        Some(o) if o >= generation => Ok(()),
        Some(observed) => Err(RolloutPending::Generation {
            observed,
            generation,
        }),
        None => Err(RolloutPending::NoStatus),
    };
    match kind {
        "Deployment" => {
            observed_ok()?;
            counts_reach(
                int("/spec/replicas").unwrap_or(1),
                &[
                    (
                        int("/status/updatedReplicas").unwrap_or(0),
                        Counted::ReplicasUpdated,
                    ),
                    (
                        int("/status/availableReplicas").unwrap_or(0),
                        Counted::ReplicasAvailable,
                    ),
                ],
            )
        }
        "DaemonSet" => {
            observed_ok()?;
            counts_reach(
                int("/status/desiredNumberScheduled").unwrap_or(0),
                &[
                    (
                        int("/status/updatedNumberScheduled").unwrap_or(0),
                        Counted::PodsUpdated,
                    ),
                    (int("/status/numberReady").unwrap_or(0), Counted::PodsReady),
                ],
            )
        }
        "StatefulSet" => {
            observed_ok()?;
            counts_reach(
                int("/spec/replicas").unwrap_or(1),
                &[
                    (
                        int("/status/readyReplicas").unwrap_or(0),
                        Counted::ReplicasReady,
                    ),
                    (
                        int("/status/updatedReplicas").unwrap_or(0),
                        Counted::ReplicasUpdated,
                    ),
                ],
            )
        }
        _ => Ok(()),
    }
}

/// Whether the kind has a rollout to wait for.
pub fn has_rollout(kind: &str) -> bool {
    matches!(kind, "Deployment" | "DaemonSet" | "StatefulSet")
}

/// Hooks of a rendered release that would have to run for `event`s of
/// install, upgrade or rollback (Ichor does not run hooks), as
/// `name (events)` strings.
pub fn lifecycle_hooks(hooks: &[Value]) -> Vec<String> {
    hooks
        .iter()
        .filter_map(|h| {
            let events: Vec<&str> = h
                .get("events")?
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let lifecycle = events.iter().any(|e| {
                matches!(
                    *e,
                    "pre-install"
                        | "post-install"
                        | "pre-upgrade"
                        | "post-upgrade"
                        | "pre-rollback"
                        | "post-rollback"
                )
            });
            lifecycle.then(|| {
                format!(
                    "{} {} ({})",
                    h.get("kind").and_then(Value::as_str).unwrap_or("?"),
                    h.get("name").and_then(Value::as_str).unwrap_or("?"),
                    events.join(",")
                )
            })
        })
        .collect()
}

/// Counts objects per kind, for logs.
pub fn kinds(objects: &[ManifestObject]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in objects {
        *m.entry(o.kind.clone()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const M: &str = "---\n# Source: c/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: ns\n---\n# Source: c/templates/b.yaml\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: cilium\n  annotations:\n    helm.sh/resource-policy: keep\n---\n# Source: c/templates/empty.yaml\n\n";

    /// Cilium's chart writes `defaultMode: 0400`; helm and the API server
    /// read it as YAML 1.1 (256).
    #[test]
    fn yaml_1_1_octals_become_integers_and_nothing_else_changes() {
        let m = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    quoted: \"0400\"\n    script: |\n      mode: 0755\n      - 0644\nspec:\n  volumes:\n    - name: a\n      secret:\n        defaultMode: 0400 # owner read\n        items:\n          - mode: 0644\n    - projected:\n        defaultMode: 420\n  list:\n    - 0600\n    - 0\n    - 089\n";
        let objs = parse_manifest(m).unwrap();
        let b = &objs[0].body;
        assert_eq!(
            b.pointer("/spec/volumes/0/secret/defaultMode"),
            Some(&json!(256))
        );
        assert_eq!(
            b.pointer("/spec/volumes/0/secret/items/0/mode"),
            Some(&json!(420))
        );
        assert_eq!(
            b.pointer("/spec/volumes/1/projected/defaultMode"),
            Some(&json!(420))
        );
        assert_eq!(b.pointer("/spec/list"), Some(&json!([384, 0, "089"])));
        assert_eq!(
            b.pointer("/metadata/annotations/quoted"),
            Some(&json!("0400"))
        );
        assert_eq!(
            b.pointer("/metadata/annotations/script"),
            Some(&json!("mode: 0755\n- 0644\n"))
        );
        let plain = "a: 1\n";
        assert!(matches!(
            yaml11_octals(plain),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn splits_manifest_and_keys_ignore_version() {
        let objs = parse_manifest(M).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0].key().to_string(), "ConfigMap ns/a");
        assert_eq!(objs[1].group_version(), ("apps", "v1"));
        assert!(objs[1].keep() && !objs[0].keep());
        let mut other = objs[1].clone();
        other.api_version = "apps/v1beta2".into();
        assert_eq!(other.key(), objs[1].key());
    }

    #[test]
    fn missing_fields_name_the_template() {
        let e = parse_manifest(
            "---\n# Source: c/templates/x.yaml\nkind: ConfigMap\nmetadata:\n  name: a\n",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("c/templates/x.yaml") && e.to_string().contains("apiVersion"),
            "{e}"
        );
    }

    #[test]
    fn removed_is_reverse_order_and_by_key() {
        let old = parse_manifest(M).unwrap();
        let new = vec![old[0].clone()];
        let gone = removed(&old, &new);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].name, "cilium");
    }

    #[test]
    fn stamping_and_ownership() {
        let mut body = json!({"metadata": {"name": "x", "labels": {"a": "b"}}});
        assert!(check_ownership(&body, "cilium", "kube-system").is_err());
        stamp_ownership(&mut body, "cilium", "kube-system");
        assert_eq!(body["metadata"]["labels"]["a"], "b");
        check_ownership(&body, "cilium", "kube-system").unwrap();
        let e = check_ownership(&body, "cilium", "other")
            .unwrap_err()
            .to_string();
        assert!(e.contains("meta.helm.sh/release-namespace"), "{e}");
    }

    #[test]
    fn rollout_rules() {
        let ds = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2,
            "desiredNumberScheduled": 3, "updatedNumberScheduled": 3, "numberReady": 2}});
        assert_eq!(
            rollout_status("DaemonSet", &ds).unwrap_err().to_string(),
            "2/3 pods ready"
        );
        assert_eq!(
            rollout_status("DaemonSet", &json!({"metadata": {"generation": 1}}))
                .unwrap_err()
                .to_string(),
            "no status reported yet"
        );
        let dep = json!({"metadata": {"generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1}});
        rollout_status("Deployment", &dep).unwrap();
        rollout_status("ConfigMap", &json!({})).unwrap();
    }

    #[test]
    fn only_lifecycle_hooks_are_reported() {
        let hooks = vec![
            json!({"name": "t", "kind": "Pod", "events": ["test"]}),
            json!({"name": "certs", "kind": "Job", "events": ["post-install", "post-upgrade"]}),
        ];
        assert_eq!(
            lifecycle_hooks(&hooks),
            vec!["Job certs (post-install,post-upgrade)"]
        );
    }
}
