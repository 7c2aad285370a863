//! Maps of strings read as Talos reads them: Go's YAML decoder puts any
//! scalar into a string field as written, so `zone: 1` or `spot: true`
//! under `nodeLabels` is the label value "1" or "true", not an error.

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer};
use serde_yaml_ng::Value;

/// An optional map whose values are any scalar, kept as their text (a
/// null value is the empty string, as Go leaves a string it cannot set).
pub fn string_map<'de, D>(deserializer: D) -> Result<Option<IndexMap<String, String>>, D::Error>
where
    D: Deserializer<'de>,
{
    let Some(map) = Option::<IndexMap<String, Value>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    map.into_iter()
        .map(|(key, value)| {
            let text = match value {
                Value::String(s) => s,
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                Value::Null => String::new(),
                other => {
                    return Err(serde::de::Error::custom(format!(
                        "{key}: a {} where a string is expected",
                        kind(&other)
                    )));
                }
            };
            Ok((key, text))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Sequence(_) => "list",
        Value::Mapping(_) => "map",
        Value::Tagged(_) => "tagged value",
        _ => "scalar",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Labels {
        #[serde(default, deserialize_with = "string_map")]
        labels: Option<IndexMap<String, String>>,
    }

    fn read(yaml: &str) -> Result<Option<IndexMap<String, String>>, serde_yaml_ng::Error> {
        serde_yaml_ng::from_str::<Labels>(yaml).map(|l| l.labels)
    }

    #[test]
    fn scalars_are_their_text() {
        let labels = read("labels: {zone: 1, spot: true, name: web, ratio: 1.5, empty: ~}")
            .unwrap()
            .unwrap();
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("zone", "1"),
                ("spot", "true"),
                ("name", "web"),
                ("ratio", "1.5"),
                ("empty", "")
            ]
        );
        assert_eq!(read("{}").unwrap(), None);
        assert_eq!(read("labels: null").unwrap(), None);
    }

    #[test]
    fn a_list_or_map_value_is_refused_naming_the_key() {
        let err = read("labels: {zone: [a]}").unwrap_err().to_string();
        assert!(
            err.contains("zone: a list where a string is expected"),
            "{err}"
        );
    }
}
