//! `tap-sim`: placement quality of no pinning, the kubelet's static CPU manager and the
//! kunpeng-tap policies on a workload trace. See docs/design/sim.md.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use tap_sim::gen::{generate, GenParams};
use tap_sim::plot::{plot, Point, Series};
use tap_sim::report::table;
use tap_sim::sim::{simulate_with, standard_policies, Machine, Outcomes};
use tap_sim::trace::Trace;

#[derive(Parser, Debug)]
#[command(
    name = "tap-sim",
    version,
    about = "Replay a workload trace against a fixture topology and compare placement policies"
)]
struct Args {
    /// sysfs root of the machine (a folder, or a dump file such as fixtures/sysfs/*), as the
    /// agent's `--sysfs-root`; `--sysfs` is kept as an alias.
    #[arg(long, alias = "sysfs")]
    sysfs_root: PathBuf,
    /// Trace file (JSON, see docs/design/sim.md). Without it a trace is generated.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Generator seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Generator target overcommit (sum of CPU limits of live containers / CPUs).
    #[arg(long, default_value_t = 2.0)]
    overcommit: f64,
    /// Generator: Pod arrivals.
    #[arg(long, default_value_t = 3000)]
    pods: usize,
    /// Generator: mean Pod lifetime in seconds (default 600).
    #[arg(long)]
    lifetime_s: Option<f64>,
    /// Generator: percent Burstable,BestEffort,Guaranteed.
    #[arg(long, default_value = "70,20,10")]
    mix: String,
    /// Write the trace used (generated or read) to this file.
    #[arg(long)]
    write_trace: Option<PathBuf>,
    /// Write an SVG plot of locality against overcommit (runs the --sweep).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Time each engine decision this many times (extra runs on a copy of the state) and keep
    /// the fastest, to take scheduler noise out of the latency figures; 1 = single shot.
    #[arg(long, default_value_t = 1)]
    latency_repeats: usize,
    /// Instead of the comparison table, one row per generated trace of these seeds (`1-10`,
    /// `1,4,6`) for kubelet static, numa-aware and topology-aware: locality, imbalance, p99.
    #[arg(long, conflicts_with_all = ["trace", "plot"])]
    seeds: Option<String>,
    /// --seeds: after the table, what keeps the imbalance by request up, per seed and engine
    /// policy: how long the most loaded node held more requests than CPUs, the share of the
    /// excess from those moments, and what that node held then (docs/measurements/sim.md).
    #[arg(long, requires = "seeds")]
    imbalance_profile: bool,
    /// Usage-aware rebalancing: instead of the comparison table, topology-aware and
    /// numa-aware without and with the rebalancer, on usage traces, per seed (--seeds, or
    /// --seed): usage imbalance across NUMA nodes, moves, locality.
    #[arg(long, conflicts_with = "plot")]
    rebalance: bool,
    /// --rebalance: seconds between sampling rounds (one round = one tick).
    #[arg(long, default_value_t = 10.0)]
    rebalance_round_s: f64,
    /// --rebalance: imbalance (max/mean) above which the rebalancer acts.
    #[arg(long, default_value_t = 1.15)]
    rebalance_threshold: f64,
    /// --rebalance: consecutive rounds above the threshold before acting.
    #[arg(long, default_value_t = 3)]
    rebalance_window: u32,
    /// --rebalance: moves per round at most.
    #[arg(long, default_value_t = 2)]
    rebalance_max_moves: usize,
    /// --rebalance: rounds before the same container may move again.
    #[arg(long, default_value_t = 60)]
    rebalance_cooldown: u64,
    /// --rebalance: seconds a container keeps one usage level (a phase).
    #[arg(long, default_value_t = 300.0)]
    usage_phase_s: f64,
    /// --rebalance: share of Burstable phases that are hot (2-4x the request).
    #[arg(long, default_value_t = 0.15)]
    usage_hot_share: f64,
    /// --rebalance: what the rebalancer balances: `per-shared-cpu` (usage per shared CPU of
    /// each node, the default) or `usage`.
    #[arg(long, default_value = "per-shared-cpu", value_parser = ["per-shared-cpu", "usage"])]
    rebalance_by: String,
    /// --rebalance: how new shared containers are placed with the rebalancer on: `usage`
    /// (among the places that fit by requests, the NUMA node least busy per shared CPU, from
    /// the last round's usage) or `requests` (as without).
    #[arg(long, default_value = "requests", value_parser = ["requests", "usage"])]
    rebalance_place: String,
    /// --rebalance: when a container may move again before its cooldown is over: `never` or
    /// `off-oversubscribed` (off a node whose measured usage exceeds its shared CPUs).
    #[arg(long, default_value = "never", value_parser = ["never", "off-oversubscribed"])]
    rebalance_cooldown_waiver: String,
    /// --rebalance: what the agent measures of a container: `demand` (usage plus time waiting
    /// for a CPU) or `contended` (CPU time got: an oversubscribed node hides its excess).
    #[arg(long, default_value = "demand", value_parser = ["demand", "contended"])]
    usage_measure: String,
    /// --rebalance: write an SVG of the usage imbalance over time of the first seed.
    #[arg(long, requires = "rebalance")]
    rebalance_plot: Option<PathBuf>,
    /// Overcommit targets of the sweep for --plot.
    #[arg(long, default_value = "1,1.5,2,2.5,3")]
    sweep: String,
}

fn parse_list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| anyhow::anyhow!("bad {what} value {x:?}"))
        })
        .collect()
}

fn params(args: &Args, m: &Machine, overcommit: f64) -> Result<GenParams> {
    let mix: Vec<u32> = parse_list(&args.mix, "--mix")?;
    if mix.len() != 3 || mix.iter().sum::<u32>() == 0 {
        bail!("--mix needs three percentages: Burstable,BestEffort,Guaranteed");
    }
    let mut p = GenParams::new(args.seed, m.cpus() as u64, m.memory_bytes(), overcommit);
    p.pods = args.pods;
    p.mix = [mix[0], mix[1], mix[2]];
    p.gpus = m.gpus.len() as u32;
    if let Some(l) = args.lifetime_s {
        if l.is_nan() || l <= 0.0 {
            bail!("--lifetime-s must be positive");
        }
        p.mean_lifetime_s = l;
    }
    Ok(p)
}

fn run_all(m: &Machine, t: &Trace, repeats: usize) -> Vec<Outcomes> {
    standard_policies()
        .iter()
        .map(|p| simulate_with(m, t, p, repeats.max(1)))
        .collect()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let raw = tap_engine::sysfs::discover_dir(&args.sysfs_root)
        .with_context(|| format!("discovering topology under {}", args.sysfs_root.display()))?;
    let name = args
        .sysfs_root
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let m = Machine::new(&name, &raw)?;
    if args.rebalance {
        return rebalance(&args, &m);
    }
    if let Some(list) = &args.seeds {
        let seeds = tap_sim::seeds::parse_seeds(list)
            .ok_or_else(|| anyhow::anyhow!("bad --seeds {list:?}: expected e.g. 1-10 or 1,4,6"))?;
        let policies: Vec<_> = standard_policies()
            .into_iter()
            .filter(|p| {
                ["kubelet static", "numa-aware", "topology-aware"].contains(&p.label.as_str())
            })
            .collect();
        println!(
            "machine: {} ({} CPUs); generated traces, overcommit {}, {} pods each; decision latency: fastest of {} per decision",
            m.name,
            m.cpus(),
            args.overcommit,
            args.pods,
            args.latency_repeats.max(1)
        );
        println!();
        let trace_of = |seed: u64| -> Result<Trace> {
            let mut p = params(&args, &m, args.overcommit)?;
            p.seed = seed;
            Ok(generate(&p))
        };
        print!(
            "{}",
            tap_sim::seeds::table(&m, &seeds, trace_of, &policies, args.latency_repeats)?
        );
        if args.imbalance_profile {
            println!("\nWhat keeps the imbalance by request up (requested CPUs, time-weighted):\n");
            print!(
                "{}",
                tap_sim::seeds::profile_table(&m, &seeds, trace_of, &policies)?
            );
        }
        return Ok(());
    }
    let trace = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Trace::parse(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => generate(&params(&args, &m, args.overcommit)?),
    };
    if let Some(path) = &args.write_trace {
        std::fs::write(path, trace.to_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let containers: usize = trace.pods.iter().map(|p| p.containers.len()).sum();
    println!(
        "machine: {} ({} CPUs, {} sockets, {} dies, {} NUMA nodes, {} clusters, {} GPUs)",
        m.name,
        m.cpus(),
        m.topo.sockets,
        m.topo.dies,
        m.topo.cpu_nodes().count(),
        m.topo.clusters.len(),
        m.gpus.len()
    );
    println!(
        "trace: {} ({} pods, {} containers; window {:.1}-{:.1} s)",
        trace.name,
        trace.pods.len(),
        containers,
        trace.warmup_s,
        trace.last_arrival()
    );
    if !trace.description.is_empty() {
        println!("  {}", trace.description);
    }
    let results = run_all(&m, &trace, args.latency_repeats);
    if let Some(r) = results.first() {
        println!(
            "measured in the window (time-weighted): overcommit {:.2}x, CPU requests at {:.1}% of the machine",
            r.overcommit,
            r.request_util * 100.0
        );
    }
    println!(
        "decision latency: {}",
        if args.latency_repeats > 1 {
            format!("fastest of {} timings per decision", args.latency_repeats)
        } else {
            "one timing per decision".to_string()
        }
    );
    println!();
    print!("{}", table(&results));

    if let Some(path) = &args.plot {
        sweep(&args, &m, path)?;
    }
    Ok(())
}

/// One table of the sweep: its title and the cell of one point.
struct SweepTable {
    title: &'static str,
    cell: fn(&Point) -> String,
}

const SWEEP_TABLES: [SweepTable; 3] = [
    SweepTable {
        title: "share within one NUMA node where one fits",
        cell: |p| format!(" {:.1}% |", p.one_numa_where_fits * 100.0),
    },
    SweepTable {
        title: "NUMA imbalance (max/mean of requested CPUs)",
        cell: |p| format!(" {:.3} |", p.imbalance),
    },
    SweepTable {
        title: "NUMA imbalance (max/mean of CPU limits, requests where none)",
        cell: |p| format!(" {:.3} |", p.limit_imbalance),
    },
];

/// `--plot`: the standard policies at each overcommit of `--sweep`, three tables (locality
/// where one node fits, imbalance by request, by limit) and the plot.
fn sweep(args: &Args, m: &Machine, path: &std::path::Path) -> Result<()> {
    let levels: Vec<f64> = parse_list(&args.sweep, "--sweep")?;
    let mut series: Vec<Series> = standard_policies()
        .iter()
        .map(|p| Series {
            label: p.label.clone(),
            points: Vec::new(),
        })
        .collect();
    let mut header = String::from("| policy |");
    for oc in levels {
        let t = generate(&params(args, m, oc)?);
        let res = run_all(m, &t, 1);
        let measured = res.first().map(|r| r.overcommit).unwrap_or(oc);
        let util = res.first().map(|r| r.request_util).unwrap_or(0.0);
        header.push_str(&format!(
            " {oc}x (measured {measured:.2}x, requests {:.0}%) |",
            util * 100.0
        ));
        for (i, r) in res.iter().enumerate() {
            let s = r.summary();
            series[i].points.push(Point {
                overcommit: measured,
                one_numa: s.one_numa,
                one_numa_where_fits: s.one_numa_where_fits,
                imbalance: s.imbalance,
                limit_imbalance: s.limit_imbalance,
            });
        }
    }
    for table in SWEEP_TABLES {
        println!();
        println!("sweep (seed {}): {}", args.seed, table.title);
        println!("{header}");
        println!("|---|{}", "---:|".repeat(series[0].points.len()));
        for s in &series {
            let cells: String = s.points.iter().map(|p| (table.cell)(p)).collect();
            println!("| {} |{cells}", s.label);
        }
    }
    plot(
        path,
        &format!(
            "tap-sim: locality vs overcommit on {} (seed {})",
            m.name, args.seed
        ),
        &series,
    )?;
    println!();
    println!("plot written to {}", path.display());
    Ok(())
}

/// `--rebalance`: the usage-aware rebalancing comparison (see docs/design/sim.md).
fn rebalance(args: &Args, m: &Machine) -> Result<()> {
    let seeds = match &args.seeds {
        Some(list) => tap_sim::seeds::parse_seeds(list)
            .ok_or_else(|| anyhow::anyhow!("bad --seeds {list:?}: expected e.g. 1-10 or 1,4,6"))?,
        None => vec![args.seed],
    };
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.rebalance_round_s) || !positive(args.usage_phase_s) {
        bail!("--rebalance-round-s and --usage-phase-s must be positive");
    }
    let cfg = tap_engine::RebalanceConfig {
        threshold: args.rebalance_threshold,
        window: args.rebalance_window,
        max_moves: args.rebalance_max_moves,
        cooldown: args.rebalance_cooldown,
        by: match args.rebalance_by.as_str() {
            "usage" => tap_engine::BalanceBy::Usage,
            _ => tap_engine::BalanceBy::UsagePerSharedCpu,
        },
        place: match args.rebalance_place.as_str() {
            "usage" => tap_engine::PlaceBy::Usage,
            _ => tap_engine::PlaceBy::Requests,
        },
        cooldown_waiver: match args.rebalance_cooldown_waiver.as_str() {
            "off-oversubscribed" => tap_engine::CooldownWaiver::OffOversubscribed,
            _ => tap_engine::CooldownWaiver::Never,
        },
    };
    println!(
        "machine: {} ({} CPUs); generated traces, overcommit {}, {} pods each; usage phases of {} s, {}% of Burstable phases hot; measured: {}; sampled every {} s; rebalancer {:?}",
        m.name, m.cpus(), args.overcommit, args.pods, args.usage_phase_s, args.usage_hot_share * 100.0, args.usage_measure, args.rebalance_round_s, cfg
    );
    println!();
    let measure = match args.usage_measure.as_str() {
        "contended" => tap_sim::rebalance::Measure::Contended,
        _ => tap_sim::rebalance::Measure::Demand,
    };
    let mut rows = Vec::new();
    for seed in seeds {
        let mut p = params(args, m, args.overcommit)?;
        p.seed = seed;
        let trace = match &args.trace {
            Some(path) => Trace::parse(&std::fs::read_to_string(path)?)?,
            None => generate(&p),
        };
        let model = tap_sim::usage::UsageModel {
            seed,
            phase_s: args.usage_phase_s,
            hot_share: args.usage_hot_share,
        };
        let pairs =
            tap_sim::rebalance::compare(m, &trace, model, (args.rebalance_round_s, measure), cfg);
        rows.push((seed, pairs));
    }
    print!("{}", tap_sim::report::rebalance_table(&rows));
    if let (Some(path), Some((seed, pairs))) = (&args.rebalance_plot, rows.first()) {
        // The first policy (topology-aware): both figures, without and with.
        let series: Vec<(String, Vec<(f64, f64)>)> = pairs
            .iter()
            .take(1)
            .flat_map(|p| {
                let l = &p.label;
                [
                    (format!("{l}: usage, without"), p.without.rounds.clone()),
                    (
                        format!("{l}: usage, with the rebalancer"),
                        p.with.rounds.clone(),
                    ),
                    (
                        format!("{l}: per shared CPU, without"),
                        p.without.rounds_per_cpu.clone(),
                    ),
                    (
                        format!("{l}: per shared CPU, with"),
                        p.with.rounds_per_cpu.clone(),
                    ),
                ]
            })
            .collect();
        let title = format!(
            "tap-sim: usage imbalance over time on {} (seed {seed})",
            m.name
        );
        tap_sim::plot::plot_timeline(path, &title, &series, cfg.threshold)?;
        println!();
        println!("plot written to {}", path.display());
    }
    Ok(())
}
