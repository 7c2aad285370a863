//! Hand-written schema fragments where the derived one cannot say enough.

use schemars::{Schema, SchemaGenerator, json_schema};

use crate::cilium::owned_top_level_keys;

/// `spec.cni.cilium.values`: free-form chart values, kept as given. The
/// Ichor-owned top-level keys are declared (as int-or-string, the only loose
/// type CEL can see) so that the CEL rule on `cilium` can refuse them.
pub(crate) fn cilium_values(_: &mut SchemaGenerator) -> Schema {
    let mut properties = serde_json::Map::new();
    let keys: Vec<&str> = owned_top_level_keys().collect();
    for key in &keys {
        properties.insert(
            (*key).to_owned(),
            serde_json::json!({ "x-kubernetes-int-or-string": true }),
        );
    }
    json_schema!({
        "description": format!("Cilium Helm chart values merged over Ichor's defaults (free-form). The keys Ichor owns ({}) are refused: set spec.cni.tunnel and spec.cni.kubeProxy instead.", keys.join(", ")),
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": properties,
    })
}
