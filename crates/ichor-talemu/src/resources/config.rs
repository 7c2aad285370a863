//! The `config` namespace: the machine config (active and persistent) and
//! the machine type.

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::ichor::specs;
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NodeView, item};
use crate::derive::ConfigFacts;

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::MACHINE_CONFIG.namespace,
        r#type: kinds::MACHINE_CONFIG.r#type,
        display: "MachineConfig",
        extra_aliases: &[],
        sensitive: true,
        columns: &[],
    },
    Definition {
        namespace: kinds::MACHINE_TYPE.namespace,
        r#type: kinds::MACHINE_TYPE.r#type,
        display: "MachineType",
        extra_aliases: &[],
        sensitive: false,
        columns: &[],
    },
];

/// The config resources of a configured node.
pub(super) fn items(view: &NodeView<'_>, active: &[u8], facts: &ConfigFacts) -> Vec<Item> {
    let mut items = vec![machine_config_item(kinds::MACHINE_CONFIG.id, active)];
    if let Some(persistent) = view.persistent_config {
        items.push(machine_config_item(
            kinds::MACHINE_CONFIG_PERSISTENT_ID,
            persistent,
        ));
    }
    items.push(machine_type_item(facts));
    items
}

fn machine_config_item(id: &str, bytes: &[u8]) -> Item {
    let spec = specs::MachineConfigSpec {
        yaml_marshalled: bytes.to_vec(),
    };
    let text = String::from_utf8_lossy(bytes).into_owned();
    Item {
        namespace: kinds::MACHINE_CONFIG.namespace.to_string(),
        r#type: kinds::MACHINE_CONFIG.r#type.to_string(),
        id: id.to_string(),
        proto_spec: spec.encode_to_vec(),
        yaml_spec: serde_yaml_ng::to_string(&Value::from(text)).unwrap_or_default(),
        annotations: vec![("talos.dev/yaml-spec".to_string(), "1".to_string())],
    }
}

fn machine_type_item(facts: &ConfigFacts) -> Item {
    item(
        kinds::MACHINE_TYPE.namespace,
        kinds::MACHINE_TYPE.r#type,
        kinds::MACHINE_TYPE.id,
        specs::MachineTypeSpec {
            machine_type: facts.machine_type.proto(),
        }
        .encode_to_vec(),
        Value::from(facts.machine_type.as_str()),
    )
}
