//! The comparison table.

use crate::sim::{Outcomes, Summary};
use std::fmt::Write as _;

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn us(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

/// A Markdown table, one row per policy.
pub fn table(results: &[Outcomes]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | containers | 1 NUMA | 1 NUMA (not BestEffort) | 1 L3 (not BestEffort) | 1 die | 1 socket | 1 NUMA where one fits | spans NUMA though one fits | NUMA imbalance by request (max/mean) | by limit | exclusive grants / CPUs (peak) | Guaranteed-integer left shared | exclusive on split cores | refused | fallback to root | cpuset updates of others | decision p50 µs | decision p99 µs | GPU-local |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results {
        let s: Summary = r.summary();
        let gpu = if s.gpu_containers == 0 {
            "-".to_string()
        } else {
            format!("{}/{}", s.gpu_local, s.gpu_containers)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {:.3} | {} / {} ({}) | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            s.containers,
            pct(s.one_numa),
            pct(s.one_numa_not_be),
            s.one_l3_not_be.map_or_else(|| "-".to_string(), pct),
            pct(s.one_die),
            pct(s.one_socket),
            pct(s.one_numa_where_fits),
            pct(s.spans_although_fits),
            s.imbalance,
            s.limit_imbalance,
            s.exclusive_grants,
            s.exclusive_cpus,
            s.exclusive_peak,
            s.exclusive_missed,
            s.exclusive_split,
            s.refused,
            s.fallback,
            s.updates,
            us(s.p50_us),
            us(s.p99_us),
            gpu
        );
    }
    out
}
