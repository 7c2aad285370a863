//! Label selectors as Kubernetes evaluates them, for the places that judge
//! which pods a PodDisruptionBudget covers: the controller's drain and the
//! lab's stand-in for the disruption controller read it from here, so both
//! answer alike.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `selector` selects `labels` (policy/v1: an empty selector selects
/// every pod; an unknown operator selects nothing).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .as_ref()
        .is_none_or(|ml| ml.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let by_expressions = selector.match_expressions.as_ref().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn selectors_select() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())]
            .into_iter()
            .collect();
        let by_label = LabelSelector {
            match_labels: Some(
                [("app".to_string(), "web".to_string())]
                    .into_iter()
                    .collect(),
            ),
            match_expressions: None,
        };
        assert!(selects(&by_label, &labels));
        let other = LabelSelector {
            match_labels: Some(
                [("app".to_string(), "db".to_string())]
                    .into_iter()
                    .collect(),
            ),
            match_expressions: None,
        };
        assert!(!selects(&other, &labels));
        let expr = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["web".into(), "api".into()]),
            }]),
        };
        assert!(selects(&expr, &labels));
        assert!(selects(&LabelSelector::default(), &labels));
    }
}
