//! A node's COSI resources with their versions, and the watch events a
//! change of them sends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use ichor_talos_client::proto::cosi::resource as cosi;

use crate::resources::Item;

#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub item: Item,
    pub version: u64,
    pub created: SystemTime,
    pub updated: SystemTime,
}

impl Stored {
    pub fn to_proto(&self) -> cosi::Resource {
        cosi::Resource {
            metadata: Some(cosi::Metadata {
                namespace: self.item.namespace.clone(),
                r#type: self.item.r#type.clone(),
                id: self.item.id.clone(),
                version: self.version.to_string(),
                owner: String::new(),
                phase: "running".to_string(),
                created: Some(prost_types::Timestamp::from(self.created)),
                updated: Some(prost_types::Timestamp::from(self.updated)),
                finalizers: Vec::new(),
                labels: Default::default(),
                annotations: self.item.annotations.iter().cloned().collect(),
            }),
            spec: Some(cosi::Spec {
                proto_spec: self.item.proto_spec.clone(),
                yaml_spec: self.item.yaml_spec.clone(),
            }),
        }
    }

    /// A tombstone (metadata only) for DESTROYED events.
    pub fn tombstone(&self) -> cosi::Resource {
        let mut r = self.to_proto();
        r.spec = None;
        r
    }
}

pub(crate) type Key = (String, String, String);

/// Replaces the resources of `store` with `items` at `now`: a new item
/// starts at version 1, a changed one takes the next version, one no longer
/// there goes. Returns the watch events of the changes, in the order made.
pub(crate) fn update(
    store: &mut BTreeMap<Key, Stored>,
    items: Vec<Item>,
    now: SystemTime,
) -> Vec<cosi::Event> {
    let mut events = Vec::new();
    let mut seen = BTreeSet::new();
    for item in items {
        let key = (item.namespace.clone(), item.r#type.clone(), item.id.clone());
        seen.insert(key.clone());
        match store.get_mut(&key) {
            Some(stored) if stored.item == item => {}
            Some(stored) => {
                let old = stored.to_proto();
                stored.item = item;
                stored.version += 1;
                stored.updated = now;
                events.push(event(
                    stored.to_proto(),
                    cosi::EventType::Updated,
                    Some(old),
                ));
            }
            None => {
                let stored = Stored {
                    item,
                    version: 1,
                    created: now,
                    updated: now,
                };
                events.push(event(stored.to_proto(), cosi::EventType::Created, None));
                store.insert(key, stored);
            }
        }
    }
    let gone: Vec<Key> = store
        .keys()
        .filter(|k| !seen.contains(*k))
        .cloned()
        .collect();
    for key in gone {
        if let Some(stored) = store.remove(&key) {
            events.push(event(stored.tombstone(), cosi::EventType::Destroyed, None));
        }
    }
    events
}

fn event(
    resource: cosi::Resource,
    event_type: cosi::EventType,
    old: Option<cosi::Resource>,
) -> cosi::Event {
    cosi::Event {
        resource: Some(resource),
        event_type: event_type as i32,
        old,
        error: None,
        bookmark: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, yaml: &str) -> Item {
        Item {
            namespace: "config".to_string(),
            r#type: "T".to_string(),
            id: id.to_string(),
            proto_spec: Vec::new(),
            yaml_spec: yaml.to_string(),
            annotations: Vec::new(),
        }
    }

    fn kinds(events: &[cosi::Event]) -> Vec<(i32, String)> {
        events
            .iter()
            .map(|e| {
                let id = e.resource.as_ref().and_then(|r| r.metadata.as_ref());
                (e.event_type, id.map(|m| m.id.clone()).unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn an_update_versions_the_changes_and_reports_them_in_order() {
        use cosi::EventType::{Created, Destroyed, Updated};
        let mut store = BTreeMap::new();
        let t0 = SystemTime::UNIX_EPOCH;
        let t1 = t0 + std::time::Duration::from_secs(1);
        let events = update(&mut store, vec![item("a", "1"), item("b", "1")], t0);
        assert_eq!(
            kinds(&events),
            [(Created as i32, "a".into()), (Created as i32, "b".into())]
        );
        assert!(update(&mut store, vec![item("a", "1"), item("b", "1")], t1).is_empty());

        let events = update(&mut store, vec![item("a", "2")], t1);
        assert_eq!(
            kinds(&events),
            [(Updated as i32, "a".into()), (Destroyed as i32, "b".into())]
        );
        assert!(events[0].old.is_some() && events[1].resource.as_ref().unwrap().spec.is_none());
        let a = &store[&("config".to_string(), "T".to_string(), "a".to_string())];
        assert_eq!((a.version, a.created, a.updated), (2, t0, t1));
        assert_eq!(store.len(), 1);
    }
}
