//! The comparison table.

use crate::rebalance::{Figure, Pair};
use crate::sim::{Outcomes, Summary};
use std::fmt::Write as _;

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn us(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

/// A Markdown table's first two lines: its column names and their alignment.
fn head(names: &str, alignment: &str) -> String {
    format!("{names}\n{alignment}\n")
}

/// A Markdown table, one row per policy.
pub fn table(results: &[Outcomes]) -> String {
    let mut out = head(
        "| policy | containers | 1 NUMA | 1 NUMA (not BestEffort) | 1 L3 (not BestEffort) | 1 die | 1 socket | 1 NUMA where one fits | spans NUMA though one fits | NUMA imbalance by request (max/mean) | by limit | exclusive grants / CPUs (peak) | Guaranteed-integer left shared | exclusive on split cores | refused | fallback to root | cpuset updates of others | decision p50 µs | decision p99 µs | GPU-local |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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

/// `--rebalance`: one row per seed and policy, usage imbalance (raw, and per shared CPU)
/// without and with the rebalancer, its moves, and the placements' locality; a last row per
/// policy with the worst of each column.
pub fn rebalance_table(rows: &[(u64, Vec<Pair>)]) -> String {
    let mut out = head(
        "| seed | policy | containers | usage imbalance mean, without | p95, without | mean, with | p95, with | per shared CPU: mean, without | p95, without | mean, with | p95, with | moves | moves per container-hour | most moves of one container | containers moved | 1 NUMA (not BestEffort), without | with | neighbour updates from moves | moves refused |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for (seed, pairs) in rows {
        for p in pairs {
            let (a, b) = (&p.without, &p.with);
            let _ = writeln!(
                out,
                "| {seed} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} |",
                p.label,
                b.containers,
                figures(p, Figure::Usage),
                figures(p, Figure::UsagePerSharedCpu),
                b.moves,
                b.moves_per_container_hour(),
                b.max_moves_one,
                b.moved_containers,
                pct(a.one_numa_not_be),
                pct(b.one_numa_not_be),
                b.neighbour_updates,
                b.refused_moves,
            );
        }
    }
    let labels: Vec<&str> = rows
        .first()
        .map(|r| r.1.iter().map(|p| p.label.as_str()).collect())
        .unwrap_or_default();
    for label in labels {
        let _ = writeln!(out, "{}", worst_row(rows, label));
    }
    out
}

/// Mean and p95 without, mean and p95 with, of one figure: four cells.
fn figures(p: &Pair, f: Figure) -> String {
    let (a, b) = (&p.without, &p.with);
    format!(
        "{:.3} | {:.3} | {:.3} | {:.3}",
        a.mean(f),
        a.p95(f),
        b.mean(f),
        b.p95(f)
    )
}

fn worst_row(rows: &[(u64, Vec<Pair>)], label: &str) -> String {
    let all: Vec<&Pair> = rows
        .iter()
        .flat_map(|r| r.1.iter().filter(|p| p.label == label))
        .collect();
    let worst = |f: &dyn Fn(&Pair) -> f64| all.iter().map(|p| f(p)).fold(f64::MIN, f64::max);
    let four = |fig: Figure| {
        format!(
            "**{:.3}** | **{:.3}** | **{:.3}** | **{:.3}**",
            worst(&|p| p.without.mean(fig)),
            worst(&|p| p.without.p95(fig)),
            worst(&|p| p.with.mean(fig)),
            worst(&|p| p.with.p95(fig)),
        )
    };
    format!(
        "| worst | {label} | | {} | {} | | **{:.2}** | **{}** | | | | **{}** | **{}** |",
        four(Figure::Usage),
        four(Figure::UsagePerSharedCpu),
        worst(&|p| p.with.moves_per_container_hour()),
        worst(&|p| p.with.max_moves_one as f64),
        worst(&|p| p.with.neighbour_updates as f64),
        worst(&|p| p.with.refused_moves as f64),
    )
}
