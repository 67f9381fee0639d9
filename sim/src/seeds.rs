//! Placement quality over many generated traces: one row per seed, for the policies whose
//! balance and locality are tracked (kubelet static for reference, numa-aware, topology-aware),
//! a row with the worst figure of each column, and a row per goal of [`crate::goals`] (its
//! threshold, and whether the worst seed met it). `tap-sim --seeds 1-10`.

use crate::goals::{Metric, GOALS};
use crate::sim::{simulate_with, Machine, Outcomes, PolicyRun, Summary};
use crate::trace::Trace;
use std::fmt::Write as _;

/// Parses `1-10` or `1,4,6` (or a mix: `1-3,7`) into seeds, in order.
pub fn parse_seeds(s: &str) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 10_000 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// One seed's figures for one policy.
struct Cell {
    fits: f64,
    imbalance: f64,
    limit_imbalance: f64,
    p99_us: Option<f64>,
}

impl From<&Summary> for Cell {
    fn from(s: &Summary) -> Cell {
        Cell {
            fits: s.one_numa_where_fits,
            imbalance: s.imbalance,
            limit_imbalance: s.limit_imbalance,
            p99_us: s.p99_us,
        }
    }
}

/// One seed: its container count and one cell per policy (with whether it is an engine run).
struct Row {
    seed: u64,
    containers: usize,
    cells: Vec<(Cell, bool)>,
}

/// Runs every policy of `policies` on the trace each seed gives and returns a Markdown table:
/// per policy, "1 NUMA where one fits", imbalance by request and by limit, and (engine
/// policies) the decision p99.
pub fn table(
    m: &Machine,
    seeds: &[u64],
    trace_of: impl Fn(u64) -> anyhow::Result<Trace>,
    policies: &[PolicyRun],
    repeats: usize,
) -> anyhow::Result<String> {
    let mut rows: Vec<Row> = Vec::new();
    for &seed in seeds {
        let t = trace_of(seed)?;
        let containers = t.pods.iter().map(|p| p.containers.len()).sum();
        let cells = policies
            .iter()
            .map(|p| {
                let o: Outcomes = simulate_with(m, &t, p, repeats.max(1));
                (Cell::from(&o.summary()), o.engine)
            })
            .collect();
        rows.push(Row {
            seed,
            containers,
            cells,
        });
    }
    let mut out = String::new();
    let mut head = String::from("| seed | containers |");
    let mut rule = String::from("|---:|---:|");
    for p in policies {
        let _ = write!(
            head,
            " {0}: 1 NUMA where one fits | {0}: imbalance by request | {0}: by limit |",
            p.label
        );
        rule.push_str("---:|---:|---:|");
        if matches!(p.policy, crate::sim::Policy::Engine(_)) {
            let _ = write!(head, " {}: p99 µs |", p.label);
            rule.push_str("---:|");
        }
    }
    let _ = writeln!(out, "{head}\n{rule}");
    for Row {
        seed,
        containers,
        cells,
    } in &rows
    {
        let _ = write!(out, "| {seed} | {containers} |");
        for (c, engine) in cells {
            let _ = write!(
                out,
                " {:.1}% | {:.3} | {:.3} |",
                c.fits * 100.0,
                c.imbalance,
                c.limit_imbalance
            );
            if *engine {
                let _ = write!(out, " {} |", us(c.p99_us));
            }
        }
        out.push('\n');
    }
    let worst: Vec<Worst> = (0..policies.len()).map(|i| Worst::of(&rows, i)).collect();
    worst_row(&mut out, policies, &worst);
    goal_rows(&mut out, policies, &worst);
    Ok(out)
}

/// The worst of each column over the seeds of one policy: lowest locality, highest imbalance
/// and p99.
struct Worst {
    fits: f64,
    imbalance: f64,
    limit_imbalance: f64,
    p99_us: Option<f64>,
}

impl Worst {
    fn of(rows: &[Row], i: usize) -> Worst {
        let col = || rows.iter().map(move |r| &r.cells[i].0);
        Worst {
            fits: col().map(|c| c.fits).fold(f64::INFINITY, f64::min),
            imbalance: col().map(|c| c.imbalance).fold(0.0, f64::max),
            limit_imbalance: col().map(|c| c.limit_imbalance).fold(0.0, f64::max),
            p99_us: col()
                .filter_map(|c| c.p99_us)
                .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x)))),
        }
    }

    fn value(&self, m: Metric) -> f64 {
        match m {
            Metric::OneNumaWhereFits => self.fits,
            Metric::ImbalanceByRequest => self.imbalance,
            Metric::ImbalanceByLimit => self.limit_imbalance,
        }
    }
}

fn worst_row(out: &mut String, policies: &[PolicyRun], worst: &[Worst]) {
    let _ = write!(out, "| worst | |");
    for (p, w) in policies.iter().zip(worst) {
        let _ = write!(
            out,
            " **{:.1}%** | **{:.3}** | **{:.3}** |",
            w.fits * 100.0,
            w.imbalance,
            w.limit_imbalance
        );
        if matches!(p.policy, crate::sim::Policy::Engine(_)) {
            let _ = write!(out, " **{}** |", us(w.p99_us));
        }
    }
    out.push('\n');
}

/// A row per goal ([`GOALS`]) whose policy is in the table: the threshold in the second
/// column, and in the goal's own cell whether the worst seed met it.
fn goal_rows(out: &mut String, policies: &[PolicyRun], worst: &[Worst]) {
    for g in &GOALS {
        let Some(at) = policies.iter().position(|p| p.label == g.policy) else {
            continue;
        };
        let _ = write!(out, "| goal | {} |", g.threshold_text());
        for (i, p) in policies.iter().enumerate() {
            for m in [
                Metric::OneNumaWhereFits,
                Metric::ImbalanceByRequest,
                Metric::ImbalanceByLimit,
            ] {
                let cell = match (i == at && m == g.metric, g.met(worst[i].value(m))) {
                    (true, true) => "**met**",
                    (true, false) => "**missed**",
                    (false, _) => "",
                };
                let _ = write!(out, " {cell} |");
            }
            if matches!(p.policy, crate::sim::Policy::Engine(_)) {
                out.push_str(" |");
            }
        }
        out.push('\n');
    }
}

fn us(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

/// `tap-sim --seeds ... --imbalance-profile`: a Markdown table of the profile per seed for the
/// engine's policies of `policies`.
pub fn profile_table(
    m: &Machine,
    seeds: &[u64],
    trace_of: impl Fn(u64) -> anyhow::Result<Trace>,
    policies: &[PolicyRun],
) -> anyhow::Result<String> {
    let mut out = String::from(
        "| seed | policy | imbalance by request | mean node | time over | excess from moments over / other | \
         most loaded node over: one-node shared | exclusive | 2-node shares | 3+-node shares | CPUs | mean node then |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &seed in seeds {
        let t = trace_of(seed)?;
        for p in policies
            .iter()
            .filter(|p| matches!(p.policy, crate::sim::Policy::Engine(_)))
        {
            let o: Outcomes = crate::sim::simulate_profiled(m, &t, p);
            profile_row(&mut out, seed, &p.label, &o.imbalance_profile);
        }
    }
    Ok(out)
}

fn profile_row(out: &mut String, seed: u64, label: &str, f: &crate::floor::ImbalanceProfile) {
    let (over, other) = f.excess_split();
    let (parts, cpus) = f.composition_over();
    let (mean, mean_over) = f.mean_node();
    let _ = writeln!(
        out,
        "| {seed} | {label} | {:.3} | {mean:.1} | {:.1}% | {over:.3} / {other:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {cpus:.0} | {mean_over:.1} |",
        f.imbalance(),
        f.over_share() * 100.0,
        parts[0],
        parts[1],
        parts[2],
        parts[3],
    );
}

#[cfg(test)]
mod tests {
    use super::{parse_seeds, table};
    use crate::gen::{generate, GenParams};
    use crate::sim::{simulate, standard_policies, Machine};

    fn machine() -> Machine {
        Machine::fixture("synthetic-2s-4numa-96c-gpu")
    }

    /// Each row holds that seed's own figures, and the last row the worst of each column.
    #[test]
    fn rows_match_single_runs_and_worst_is_the_extreme() {
        let m = machine();
        let trace = |seed: u64| {
            let mut p = GenParams::new(seed, m.cpus() as u64, m.memory_bytes(), 2.0);
            p.pods = 150;
            generate(&p)
        };
        let policies: Vec<_> = standard_policies()
            .into_iter()
            .filter(|p| p.label == "numa-aware" || p.label == "topology-aware")
            .collect();
        let out = table(&m, &[3, 5], |s| Ok(trace(s)), &policies, 1).expect("table");
        let rows: Vec<Vec<String>> = out
            .lines()
            .skip(2)
            .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
            .collect();
        assert_eq!(rows.len(), 6, "two seeds, the worst row, 3 goals:\n{out}");
        // Columns: "", seed, containers, then per policy fits, imbalance, by limit, p99.
        let imb_col = 4 + 4; // topology-aware's imbalance by request
        for (row, seed) in rows.iter().zip([3u64, 5]) {
            assert_eq!(row[1], seed.to_string());
            let s = simulate(&m, &trace(seed), &policies[1]).summary();
            assert_eq!(row[imb_col], format!("{:.3}", s.imbalance), "{out}");
            assert_eq!(
                row[imb_col - 1],
                format!("{:.1}%", s.one_numa_where_fits * 100.0)
            );
        }
        let num = |c: &str| {
            c.trim_matches('*')
                .trim_end_matches('%')
                .parse::<f64>()
                .unwrap()
        };
        let worst = &rows[2];
        assert_eq!(worst[1], "worst");
        let max_imb = num(&rows[0][imb_col]).max(num(&rows[1][imb_col]));
        assert_eq!(num(&worst[imb_col]), max_imb);
        let min_fits = num(&rows[0][imb_col - 1]).min(num(&rows[1][imb_col - 1]));
        assert_eq!(num(&worst[imb_col - 1]), min_fits);
        // The request goal's row: its threshold, and its verdict in topology-aware's column.
        let goal = &rows[4];
        assert_eq!((goal[1].as_str(), goal[2].as_str()), ("goal", "< 1.10"));
        let verdict = if max_imb < 1.10 {
            "**met**"
        } else {
            "**missed**"
        };
        assert_eq!(goal[imb_col], verdict, "{out}");
        assert_eq!(
            goal[3..].iter().filter(|c| !c.is_empty()).count(),
            1,
            "{out}"
        );
        assert_eq!(goal.len(), worst.len(), "as many cells as the worst row");
    }

    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seeds("1-3"), Some(vec![1, 2, 3]));
        assert_eq!(parse_seeds("4, 6,1-2"), Some(vec![4, 6, 1, 2]));
        assert_eq!(parse_seeds("3-1"), None);
        assert_eq!(parse_seeds("x"), None);
        assert_eq!(parse_seeds(""), None);
    }
}
