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

/// The sum of every sample of metric `name` (any labels) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// The value of one series, written as the exposition writes it (`name{labels}`), if present.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
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
    }

    #[test]
    fn grant_records_read_by_field() {
        let rec = "v1;p=numa1;c=4-7;n=1;m=1";
        assert_eq!(grant_fields(rec)["c"], "4-7");
        assert_eq!(grant_nodes(rec).unwrap(), BTreeSet::from([1]));
        assert!(grant_nodes("v1;p=root").is_err());
    }
}
