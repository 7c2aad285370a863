//! Who changed a spec: the stamp Ichor's admission webhook puts on every
//! TalosCluster and TalosMachine whose spec a request changes.
//!
//! The user comes from the admission request, which the API server fills in
//! from its own authentication: a client cannot choose it. A request that
//! writes the annotation by hand gets it overwritten (when it also changes the
//! spec) or put back (when it does not), so the annotation always names the
//! last writer of the spec as it stands.
//!
//! A rollback asked for with [`ROLLBACK_ANNOTATION`] (the UI's way: its
//! identity may not read the revision it names) is a spec change asked for:
//! the request names its user, and the controller's own write that carries
//! it out (the spec written back, the request removed) keeps that name. Only
//! the controller's identity gets that: anyone else's spec change names
//! them, whatever request it removes.

use ichor_api::history::{CHANGED_BY_ANNOTATION, ChangedBy, ROLLBACK_ANNOTATION};
use serde_json::{Value, json};

/// What the webhook does to the annotation of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stamp {
    /// The request leaves both the spec and the annotation as they were.
    Keep,
    /// The request creates the object or changes its spec: name its user.
    Set(ChangedBy),
    /// The request changes the annotation but not the spec: put the old
    /// value back (`None`: the object had none, so remove it).
    Restore(Option<String>),
}

/// The stamp for one admission request. `old` is absent on create; `at` is
/// the admission time, RFC 3339 in UTC; `controller` is the user the
/// controller itself is authenticated as, when it is known.
pub fn stamp(
    old: Option<&Value>,
    new: &Value,
    user: &str,
    at: &str,
    controller: Option<&str>,
) -> Stamp {
    let set = || {
        Stamp::Set(ChangedBy {
            user: user.to_owned(),
            at: at.to_owned(),
        })
    };
    let Some(old) = old else {
        return set();
    };
    let asked = rollback_request(new);
    if asked.is_some() && asked != rollback_request(old) {
        return set();
    }
    let carries_out_a_rollback = controller == Some(user)
        && rollback_request(old).is_some()
        && rollback_request(new).is_none();
    if old.get("spec") != new.get("spec") && !carries_out_a_rollback {
        return set();
    }
    let before = annotation(old);
    if annotation(new) == before {
        Stamp::Keep
    } else {
        Stamp::Restore(before.map(str::to_owned))
    }
}

/// The annotation's raw value on an object, if any.
fn annotation(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/annotations")?
        .get(CHANGED_BY_ANNOTATION)?
        .as_str()
}

/// The rollback request an object carries, if any.
fn rollback_request(object: &Value) -> Option<&Value> {
    object
        .pointer("/metadata/annotations")?
        .get(ROLLBACK_ANNOTATION)
}

/// The changed-by record an object carries, when its annotation holds one.
/// A value that does not parse counts as none: it was never Ichor's.
pub fn changed_by(object: &Value) -> Option<ChangedBy> {
    serde_json::from_str(annotation(object)?).ok()
}

/// The JSON patch (RFC 6902) that carries out a stamp on `new`, the object
/// as the request would store it. `None` when nothing changes.
pub fn patch(stamp: &Stamp, new: &Value) -> Option<Value> {
    let key = format!(
        "/metadata/annotations/{}",
        CHANGED_BY_ANNOTATION.replace('~', "~0").replace('/', "~1")
    );
    let value = match stamp {
        Stamp::Keep => return None,
        Stamp::Set(by) => Some(serde_json::to_string(by).expect("a ChangedBy serialises")),
        Stamp::Restore(old) => old.clone(),
    };
    let has_annotations = new
        .pointer("/metadata/annotations")
        .is_some_and(Value::is_object);
    let current = annotation(new);
    let ops = match (value, has_annotations) {
        (None, _) if current.is_none() => return None,
        (None, _) => vec![json!({"op": "remove", "path": key})],
        (Some(v), true) => vec![json!({"op": "add", "path": key, "value": v})],
        (Some(v), false) => vec![json!({
            "op": "add",
            "path": "/metadata/annotations",
            "value": {CHANGED_BY_ANNOTATION: v},
        })],
    };
    Some(Value::Array(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: &str = "2026-12-02T08:00:00Z";

    fn machine(spec: Value, annotation: Option<&str>) -> Value {
        let mut m = json!({"metadata": {"name": "w1"}, "spec": spec});
        if let Some(a) = annotation {
            m["metadata"]["annotations"] = json!({CHANGED_BY_ANNOTATION: a, "other": "x"});
        }
        m
    }

    /// Applies a patch the way the API server does, with the operations this
    /// module emits (add and remove of an annotation or the whole map).
    fn apply(patch: &Value, object: &mut Value) {
        for op in patch.as_array().unwrap() {
            let path = op["path"].as_str().unwrap();
            if path == "/metadata/annotations" {
                object["metadata"]["annotations"] = op["value"].clone();
                continue;
            }
            let annotations = object["metadata"]["annotations"].as_object_mut().unwrap();
            match op["op"].as_str().unwrap() {
                "add" => {
                    annotations.insert(CHANGED_BY_ANNOTATION.into(), op["value"].clone());
                }
                "remove" => {
                    annotations.remove(CHANGED_BY_ANNOTATION);
                }
                other => panic!("unexpected op {other}"),
            }
        }
    }

    fn forged() -> String {
        serde_json::to_string(&ChangedBy {
            user: "someone-else".into(),
            at: "2020-01-01T00:00:00Z".into(),
        })
        .unwrap()
    }

    /// Covers: R16.4
    #[test]
    fn a_create_names_its_user_even_with_a_hand_set_annotation() {
        let new = machine(json!({"hold": true}), Some(&forged()));
        let s = stamp(None, &new, "system:serviceaccount:a:writer", AT, None);
        let mut stored = new.clone();
        apply(&patch(&s, &new).unwrap(), &mut stored);
        let by = changed_by(&stored).unwrap();
        assert_eq!(by.user, "system:serviceaccount:a:writer");
        assert_eq!(by.at, AT);
        assert_eq!(stored["metadata"]["annotations"]["other"], "x");
    }

    /// Covers: R16.4
    #[test]
    fn a_spec_change_with_a_forged_annotation_records_the_real_user() {
        let old = machine(json!({"hold": true}), None);
        let new = machine(json!({"hold": false}), Some(&forged()));
        let s = stamp(Some(&old), &new, "bob", AT, None);
        let mut stored = new.clone();
        apply(&patch(&s, &new).unwrap(), &mut stored);
        assert_eq!(changed_by(&stored).unwrap().user, "bob");
    }

    /// Covers: R16.4
    #[test]
    fn an_annotation_forged_without_a_spec_change_is_put_back_or_removed() {
        let real = serde_json::to_string(&ChangedBy {
            user: "alice".into(),
            at: AT.into(),
        })
        .unwrap();
        let old = machine(json!({"hold": true}), Some(&real));
        let new = machine(json!({"hold": true}), Some(&forged()));
        let s = stamp(Some(&old), &new, "mallory", AT, None);
        assert_eq!(s, Stamp::Restore(Some(real.clone())));
        let mut stored = new.clone();
        apply(&patch(&s, &new).unwrap(), &mut stored);
        assert_eq!(changed_by(&stored).unwrap().user, "alice");

        let old = machine(json!({"hold": true}), None);
        let s = stamp(Some(&old), &new, "mallory", AT, None);
        assert_eq!(s, Stamp::Restore(None));
        let mut stored = new.clone();
        apply(&patch(&s, &new).unwrap(), &mut stored);
        assert!(changed_by(&stored).is_none());
        assert_eq!(stored["metadata"]["annotations"]["other"], "x");
    }

    #[test]
    fn a_request_that_changes_neither_is_left_alone() {
        let real = serde_json::to_string(&ChangedBy {
            user: "alice".into(),
            at: AT.into(),
        })
        .unwrap();
        let old = machine(json!({"hold": true}), Some(&real));
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"team": "a"});
        assert_eq!(stamp(Some(&old), &new, "bob", AT, None), Stamp::Keep);
        assert_eq!(patch(&Stamp::Keep, &new), None);
    }

    #[test]
    fn an_object_without_annotations_gets_the_map() {
        let new = machine(json!({}), None);
        let s = stamp(None, &new, "alice", AT, None);
        let p = patch(&s, &new).unwrap();
        assert_eq!(p[0]["path"], "/metadata/annotations");
        let mut stored = new.clone();
        apply(&p, &mut stored);
        assert_eq!(changed_by(&stored).unwrap().user, "alice");
    }

    /// Whatever the old and new annotations hold, after the patch the stored
    /// object names either the requesting user (the spec changed) or exactly
    /// what it named before (it did not).
    #[test]
    fn no_request_can_choose_the_recorded_user() {
        let values: Vec<Option<String>> = vec![
            None,
            Some(forged()),
            Some("not json".into()),
            Some(
                serde_json::to_string(&ChangedBy {
                    user: "alice".into(),
                    at: AT.into(),
                })
                .unwrap(),
            ),
        ];
        for old_a in &values {
            for new_a in &values {
                for spec_changes in [false, true] {
                    let old = machine(json!({"hold": true}), old_a.as_deref());
                    let new = machine(json!({"hold": !spec_changes}), new_a.as_deref());
                    let s = stamp(Some(&old), &new, "requester", AT, None);
                    let mut stored = new.clone();
                    if let Some(p) = patch(&s, &new) {
                        apply(&p, &mut stored);
                    }
                    if spec_changes {
                        assert_eq!(changed_by(&stored).unwrap().user, "requester");
                    } else {
                        assert_eq!(annotation(&stored), old_a.as_deref());
                    }
                }
            }
        }
    }

    fn with_rollback_request(mut object: Value, revision: Option<&str>) -> Value {
        if let Some(r) = revision {
            object["metadata"]["annotations"][ROLLBACK_ANNOTATION] = json!(r);
        }
        object
    }

    const CONTROLLER: &str = "system:serviceaccount:ichor-system:ichor-controller";

    /// Covers: R16.8
    #[test]
    fn a_rollback_asked_for_names_its_user_and_the_controllers_write_back_keeps_it() {
        let alice = serde_json::to_string(&ChangedBy {
            user: "alice".into(),
            at: AT.into(),
        })
        .unwrap();
        // Carol asks, changing no spec field: she is named.
        let old = machine(json!({"patches": ["b"]}), Some(&alice));
        let asked = with_rollback_request(old.clone(), Some("1"));
        let s = stamp(Some(&old), &asked, "carol", AT, Some(CONTROLLER));
        let mut stored = asked.clone();
        apply(&patch(&s, &asked).unwrap(), &mut stored);
        assert_eq!(changed_by(&stored).unwrap().user, "carol");
        // The controller writes revision 1's spec back and removes the
        // request: Carol stays named.
        let mut written = stored.clone();
        written["spec"] = json!({"patches": ["a"]});
        written["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(ROLLBACK_ANNOTATION);
        let s = stamp(Some(&stored), &written, CONTROLLER, AT, Some(CONTROLLER));
        assert_eq!(s, Stamp::Keep);
        assert_eq!(changed_by(&written).unwrap().user, "carol");
    }

    /// Covers: R16.4
    #[test]
    fn only_the_controller_keeps_the_requesters_name_when_a_request_goes() {
        let carol = serde_json::to_string(&ChangedBy {
            user: "carol".into(),
            at: AT.into(),
        })
        .unwrap();
        let old =
            with_rollback_request(machine(json!({"patches": ["b"]}), Some(&carol)), Some("1"));
        let new = machine(json!({"patches": ["mallory's"]}), Some(&carol));
        // Mallory removes Carol's request while changing the spec.
        let s = stamp(Some(&old), &new, "mallory", AT, Some(CONTROLLER));
        assert!(
            matches!(&s, Stamp::Set(by) if by.user == "mallory"),
            "{s:?}"
        );
        // A controller whose identity is not known is named as any writer.
        let s = stamp(Some(&old), &new, CONTROLLER, AT, None);
        assert!(
            matches!(&s, Stamp::Set(by) if by.user == CONTROLLER),
            "{s:?}"
        );
        // The controller changing the spec with no request pending is named.
        let plain = machine(json!({"patches": ["b"]}), Some(&carol));
        let s = stamp(Some(&plain), &new, CONTROLLER, AT, Some(CONTROLLER));
        assert!(
            matches!(&s, Stamp::Set(by) if by.user == CONTROLLER),
            "{s:?}"
        );
    }
}
