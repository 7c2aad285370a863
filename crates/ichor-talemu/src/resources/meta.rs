//! The `meta` namespace: the resource definitions and namespaces themselves.

use prost::Message;
use serde_yaml_ng::Value;

use ichor_talos_client::proto::cosi::resource::meta::{
    NamespaceSpec, ResourceDefinitionSpec, resource_definition_spec,
};
use ichor_talos_client::resources as kinds;

use super::{Definition, Item, NAMESPACES, aliases, definitions, item, map, strings};

pub(super) const DEFINITIONS: &[Definition] = &[
    Definition {
        namespace: kinds::RESOURCE_DEFINITION.namespace,
        r#type: kinds::RESOURCE_DEFINITION.r#type,
        display: "ResourceDefinition",
        extra_aliases: &["api-resources"],
        sensitive: false,
        columns: &[("Aliases", "{.aliases[:]}")],
    },
    Definition {
        namespace: kinds::NAMESPACE.namespace,
        r#type: kinds::NAMESPACE.r#type,
        display: "Namespace",
        extra_aliases: &["ns"],
        sensitive: false,
        columns: &[],
    },
];

/// The meta resources: definitions and namespaces.
pub fn meta_items() -> Vec<Item> {
    let mut items = Vec::new();
    for def in definitions() {
        let (aliases, all_aliases) = aliases(def);
        let spec = ResourceDefinitionSpec {
            resource_type: def.r#type.to_string(),
            display_type: def.display.to_string(),
            default_namespace: def.namespace.to_string(),
            aliases: aliases.clone(),
            all_aliases: all_aliases.clone(),
            print_columns: def
                .columns
                .iter()
                .map(|(n, p)| resource_definition_spec::PrintColumn {
                    name: n.to_string(),
                    json_path: p.to_string(),
                })
                .collect(),
            sensitivity: if def.sensitive {
                resource_definition_spec::Sensitivity::Sensitive as i32
            } else {
                0
            },
        };
        let mut yaml = vec![
            ("type", Value::from(def.r#type)),
            ("displayType", Value::from(def.display)),
            ("defaultNamespace", Value::from(def.namespace)),
            ("aliases", strings(&aliases)),
            ("allAliases", strings(&all_aliases)),
            (
                "printColumns",
                Value::Sequence(
                    def.columns
                        .iter()
                        .map(|(n, p)| {
                            map(vec![
                                ("name", Value::from(*n)),
                                ("jsonPath", Value::from(*p)),
                            ])
                        })
                        .collect(),
                ),
            ),
        ];
        if def.sensitive {
            yaml.push(("sensitivity", Value::from("sensitive")));
        }
        items.push(item(
            "meta",
            kinds::RESOURCE_DEFINITION.r#type,
            &def.r#type.to_lowercase(),
            spec.encode_to_vec(),
            map(yaml),
        ));
    }
    for (ns, description) in NAMESPACES {
        let spec = NamespaceSpec {
            description: description.to_string(),
        };
        items.push(item(
            "meta",
            kinds::NAMESPACE.r#type,
            ns,
            spec.encode_to_vec(),
            map(vec![("description", Value::from(*description))]),
        ));
    }
    items
}
