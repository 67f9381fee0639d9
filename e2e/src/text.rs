//! The texts of the agent the tests read back: its grant record and its Prometheus metrics.

use std::collections::{BTreeMap, BTreeSet};

/// The fields of a grant record (`v1;p=<pool>;c=<cpus>;n=<nodes>;...`): each `key=value`.
pub fn grant_fields(record: &str) -> BTreeMap<String, String> {
    record
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The NUMA nodes of a grant record (its `n=` list).
pub fn grant_nodes(record: &str) -> anyhow::Result<BTreeSet<usize>> {
    use anyhow::Context;
    let nodes = grant_fields(record)
        .remove("n")
        .with_context(|| format!("no n= in the grant record {record:?}"))?;
    crate::util::parse_list(&nodes)
}

/// One sample of a Prometheus text exposition: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of metric `name` (any labels) in a Prometheus text exposition.
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{').unwrap_or((series, "}"));
            (metric == name).then_some(())?;
            Some(Sample {
                labels: labels_of(labels.strip_suffix('}')?),
                value: value.trim().parse().ok()?,
            })
        })
        .collect()
}

/// `a="x",b="y,z"` as a map (escaped quotes in values, which the agent never writes, are not
/// read).
fn labels_of(mut text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while let Some((key, rest)) = text.split_once("=\"") {
        let Some(end) = rest.find('"') else { break };
        let key = key.trim_start_matches(',').trim();
        out.insert(key.to_string(), rest[..end].to_string());
        text = &rest[end + 1..];
    }
    out
}

/// The sum of every sample of metric `name` (any labels) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    samples(text, name).iter().map(|s| s.value).sum()
}

/// The value of one series, written as the exposition writes it (`name{labels}`), if present.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether every line of `lines` that contains `part` ends in the value `value` (as written).
pub fn all_at(lines: &[String], part: &str, value: &str) -> bool {
    lines
        .iter()
        .filter(|l| l.contains(part))
        .all(|l| l.rsplit(' ').next() == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_adds_every_series_of_the_name_only() {
        let text = "# HELP x y\nx{a=\"1\"} 2\nx{a=\"2\"} 3.5\nx_total 9\nx 1\n";
        assert_eq!(metric_sum(text, "x"), 6.5);
        assert_eq!(metric_sum(text, "x_total"), 9.0);
        assert_eq!(metric_sum(text, "nope"), 0.0);
        assert_eq!(series_value(text, "x{a=\"2\"}"), Some(3.5));
        assert_eq!(series_value(text, "x"), Some(1.0));
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        assert!(all_at(&lines, "x_total", "9") && !all_at(&lines, "x{", "2"));
        let x = samples(text, "x");
        assert_eq!(x.len(), 3);
        assert_eq!((x[1].labels["a"].as_str(), x[1].value), ("2", 3.5));
        assert!(x[2].labels.is_empty());
        let y = samples("y{cpus=\"0,2\",zone=\"n1\"} 4\n", "y");
        assert_eq!(
            (y[0].labels["cpus"].as_str(), y[0].labels["zone"].as_str()),
            ("0,2", "n1")
        );
    }

    #[test]
    fn grant_records_read_by_field() {
        let rec = "v1;p=numa1;c=4-7;n=1;m=1";
        assert_eq!(grant_fields(rec)["c"], "4-7");
        assert_eq!(grant_nodes(rec).unwrap(), BTreeSet::from([1]));
        assert!(grant_nodes("v1;p=root").is_err());
    }
}
