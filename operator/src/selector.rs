//! Label selectors (`matchLabels` + `matchExpressions`), compiled once and matched often.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "matchExpressions[{0}]: unknown operator {1:?} (use In, NotIn, Exists or DoesNotExist)"
    )]
    UnknownOperator(usize, String),
    #[error("matchExpressions[{0}]: operator {1} needs at least one value")]
    NeedsValues(usize, String),
    #[error("matchExpressions[{0}]: operator {1} takes no values")]
    NoValuesAllowed(usize, String),
    #[error("empty label key")]
    EmptyKey,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A compiled label selector. The empty selector matches everything (as for Nodes in
/// Kubernetes' own node selectors).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    reqs: Vec<Requirement>,
}

impl Selector {
    pub fn compile(ls: &LabelSelector) -> Result<Selector, SelectorError> {
        let mut reqs = Vec::new();
        for (k, v) in ls.match_labels.iter().flatten() {
            if k.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            reqs.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for (i, e) in ls.match_expressions.iter().flatten().enumerate() {
            if e.key.is_empty() {
                return Err(SelectorError::EmptyKey);
            }
            let values = e.values.clone().unwrap_or_default();
            let r = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError::NeedsValues(i, e.operator.clone()))
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError::NoValuesAllowed(i, e.operator.clone()))
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => return Err(SelectorError::UnknownOperator(i, other.to_string())),
            };
            reqs.push(r);
        }
        Ok(Selector { reqs })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| r.matches(labels))
    }

    /// Label pairs of which a matching node must carry at least one (for indexing): the first
    /// `matchLabels` pair, else the values of the first `In` expression; `None` when the
    /// selector has no such requirement (it must be checked against every node).
    pub fn index_keys(&self) -> Option<Vec<(String, String)>> {
        if let Some(Requirement::Equals(k, v)) = self
            .reqs
            .iter()
            .find(|r| matches!(r, Requirement::Equals(..)))
        {
            return Some(vec![(k.clone(), v.clone())]);
        }
        self.reqs.iter().find_map(|r| match r {
            Requirement::In(k, vs) => Some(vs.iter().map(|v| (k.clone(), v.clone())).collect()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn empty_selector_matches_all() {
        let s = Selector::compile(&LabelSelector::default()).unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
        assert_eq!(s.index_keys(), None);
    }

    #[test]
    fn labels_and_expressions() {
        let ls = LabelSelector {
            match_labels: Some(labels(&[("pool", "arm")])),
            match_expressions: Some(vec![
                expr("zone", "In", &["a", "b"]),
                expr("gpu", "DoesNotExist", &[]),
                expr("tier", "NotIn", &["batch"]),
                expr("kunpeng", "Exists", &[]),
            ]),
        };
        let s = Selector::compile(&ls).unwrap();
        assert!(s.matches(&labels(&[("pool", "arm"), ("zone", "a"), ("kunpeng", "")])));
        assert!(s.matches(&labels(&[
            ("pool", "arm"),
            ("zone", "b"),
            ("kunpeng", "1"),
            ("tier", "web")
        ])));
        assert!(!s.matches(&labels(&[("pool", "arm"), ("zone", "c"), ("kunpeng", "")])));
        assert!(!s.matches(&labels(&[
            ("pool", "arm"),
            ("zone", "a"),
            ("kunpeng", ""),
            ("gpu", "1")
        ])));
        assert!(!s.matches(&labels(&[
            ("pool", "arm"),
            ("zone", "a"),
            ("kunpeng", ""),
            ("tier", "batch")
        ])));
        assert!(!s.matches(&labels(&[("pool", "x86"), ("zone", "a"), ("kunpeng", "")])));
        assert_eq!(s.index_keys(), Some(vec![("pool".into(), "arm".into())]));
    }

    #[test]
    fn in_expression_indexes_each_value() {
        let ls = LabelSelector {
            match_expressions: Some(vec![expr("zone", "In", &["a", "b"])]),
            ..Default::default()
        };
        let s = Selector::compile(&ls).unwrap();
        assert_eq!(
            s.index_keys(),
            Some(vec![
                ("zone".into(), "a".into()),
                ("zone".into(), "b".into())
            ])
        );
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let bad = |e| LabelSelector {
            match_expressions: Some(vec![e]),
            ..Default::default()
        };
        assert!(matches!(
            Selector::compile(&bad(expr("a", "Gt", &["1"]))),
            Err(SelectorError::UnknownOperator(0, _))
        ));
        assert!(matches!(
            Selector::compile(&bad(expr("a", "In", &[]))),
            Err(SelectorError::NeedsValues(..))
        ));
        assert!(matches!(
            Selector::compile(&bad(expr("a", "Exists", &["x"]))),
            Err(SelectorError::NoValuesAllowed(..))
        ));
        assert_eq!(
            Selector::compile(&bad(expr("", "Exists", &[]))),
            Err(SelectorError::EmptyKey)
        );
    }
}
