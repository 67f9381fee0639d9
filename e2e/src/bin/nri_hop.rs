//! `tap-nri-hop`: the CPU an NRI plugin spends per container start and per removal, measured
//! without containerd (docs/design/start-path.md, "The hop alone"). A measurement program, not a test:
//!
//! ```text
//! cargo build --release -p node-agent --bin kunpeng-tap
//! cargo run --release -p tap-e2e --bin tap-nri-hop -- [--containers 200] [--rounds 4]
//! ```
//!
//! It plays the runtime ([`tap_e2e::nri_runtime`], the NRI protocol over a Unix socket) for two
//! plugins at once, each on its own socket: the release `kunpeng-tap` in NRI mode (the
//! start-path benchmark's flags: topology-aware on the 96-CPU fixture, folded onto this host)
//! and `tap-nri-noop` (the same transport answering nothing). Each round, for each plugin in
//! turn (the order rotates), it creates `--containers` containers one after the other, each a
//! CreateContainer and its PostStartContainer event as containerd sends them (kubelet-like
//! Pods: every 8th Guaranteed with 1 CPU, the others Burstable), then stops and removes them
//! all (StopContainer and the REMOVE_CONTAINER event). The plugin's CPU is read from a cgroup
//! of its own (`tap_e2e::cpumeter`, nanoseconds) around each phase.
//!
//! With no runtime, no runc and no shim in the path, thousands of starts take seconds, and
//! the figure is the plugin's alone: its difference to the no-op is the agent's own work per
//! start, the no-op's figure the floor of the transport. `start-path` measures the same
//! plugins on a real containerd. The plugins' process ids are printed at the start, for
//! `perf record -p` (`--settle` waits before the first round).

use anyhow::{ensure, Context, Result};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::cpumeter::{CpuMeter, Used};
use tap_e2e::docker::TapAgent;
use tap_e2e::nri_runtime::{
    adjusted_cpus, bench_agent_args, container, pod, NriRuntime, PluginSession, Qos,
};
use tap_e2e::stats::Summary;
use tap_e2e::util::{self, RmDir};

#[derive(Parser, Debug)]
#[command(about = "CPU per container start of an NRI plugin, without containerd")]
struct Args {
    /// Containers created (and then removed) per plugin and round.
    #[arg(long, default_value_t = 200)]
    containers: usize,
    /// Rounds; each plugin is measured once per round.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// The agent binary (default: TAP_BIN, or the workspace's release build). Given more than
    /// once, each is measured in every round (`agent`, `agent2`, ...): an A/B comparison
    /// under the same load.
    #[arg(long)]
    agent: Vec<PathBuf>,
    /// The no-op plugin (default: tap-e2e's `tap-nri-noop`, built in release).
    #[arg(long)]
    noop: Option<PathBuf>,
    /// Measure only the agent.
    #[arg(long)]
    agent_only: bool,
    /// The sysfs fixture the agent decides on.
    #[arg(long, default_value = "synthetic-2s-4numa-96c-gpu")]
    fixture: String,
    /// Milliseconds between one container's start and the next create (0: back to back). A
    /// real start keeps the plugin idle for tens of milliseconds while runc and the shim
    /// work, and the plugin's next call finds its caches cold.
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
    /// Seconds to wait after both plugins registered, before the first round.
    #[arg(long, default_value_t = 1)]
    settle: u64,
}

/// A plugin under measurement, registered with its own runtime.
struct Plugin {
    name: String,
    session: PluginSession,
    meter: CpuMeter,
    /// Keeps the process; dropped (stopped) at the end.
    _process: Process,
    _runtime: NriRuntime,
}

enum Process {
    Agent(TapAgent),
    Child(Child),
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Process::Child(c) = self {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Process {
    fn pid(&self) -> Option<u32> {
        match self {
            Process::Agent(a) => a.pid(),
            Process::Child(c) => Some(c.id()),
        }
    }
}

/// One phase of one round: the CPU used and the round trips of its calls.
struct Phase {
    cpu: Used,
    /// Per container: the create and its PostStartContainer, or the stop and the removal.
    trips: Vec<Duration>,
}

struct Row {
    round: usize,
    plugin: String,
    start: Phase,
    remove: Phase,
    with_cpuset: usize,
}

async fn start_plugin(name: String, bin: &Path, args: &Args, dir: &Path) -> Result<Plugin> {
    let dir = dir.join(&name);
    std::fs::create_dir_all(&dir)?;
    let runtime = NriRuntime::bind(&dir.join("nri.sock"))?;
    let socket = runtime.path().to_path_buf();
    let accept = tokio::spawn(async move {
        let s = runtime.accept(Duration::from_secs(60)).await?;
        s.handshake().await?;
        anyhow::Ok((runtime, s))
    });
    let log = dir.join("plugin.log");
    let process = match name.starts_with("agent") {
        true => {
            let (bin, a) = (
                bin.to_path_buf(),
                bench_agent_args(&socket, &args.fixture, &dir.join("state")),
            );
            let agent = tokio::task::spawn_blocking(move || TapAgent::start_binary(&bin, &a, &log))
                .await??;
            Process::Agent(agent)
        }
        false => {
            let out = std::fs::File::create(&log)?;
            let child = Command::new(bin)
                .arg(format!("--nri-socket={}", socket.display()))
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            Process::Child(child)
        }
    };
    let (runtime, session) = accept
        .await?
        .with_context(|| format!("registering {name}"))?;
    let pid = process.pid().context("the plugin has no process")?;
    eprintln!("{name}: pid {pid}, {}", bin.display());
    Ok(Plugin {
        name,
        session,
        meter: CpuMeter::for_pid(pid, &format!("tap-nri-hop-{pid}")),
        _process: process,
        _runtime: runtime,
    })
}

/// The containers of round `round`: ids unique over the run.
fn containers(round: usize, n: usize) -> Vec<(Qos, usize)> {
    (0..n)
        .map(|i| {
            let qos = match i % 8 {
                0 => Qos::Guaranteed,
                _ => Qos::Burstable,
            };
            (qos, round * n + i)
        })
        .collect()
}

async fn measure(p: &Plugin, round: usize, n: usize, gap: Duration) -> Result<Row> {
    let made: Vec<_> = containers(round, n)
        .into_iter()
        .map(|(qos, i)| {
            let pd = pod(i, qos);
            let c = container(i, &pd, qos);
            (pd, c)
        })
        .collect();
    let mut with_cpuset = 0;
    let before = p.meter.read();
    let mut trips = Vec::with_capacity(n);
    for (pd, c) in &made {
        let t = Instant::now();
        let resp = p.session.create_container(pd, c).await?;
        trips.push(t.elapsed());
        with_cpuset += usize::from(adjusted_cpus(&resp).is_some());
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
    }
    let start = Phase {
        cpu: p.meter.since(&before),
        trips,
    };
    let before = p.meter.read();
    let mut trips = Vec::with_capacity(n);
    for (pd, c) in &made {
        let t = Instant::now();
        p.session.stop_and_remove(pd, c).await?;
        trips.push(t.elapsed());
    }
    let remove = Phase {
        cpu: p.meter.since(&before),
        trips,
    };
    Ok(Row {
        round,
        plugin: p.name.clone(),
        start,
        remove,
        with_cpuset,
    })
}

fn per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

fn print_rows(rows: &[Row], n: usize) {
    println!("| round | plugin | CPU per start µs (user / system) | CPU per removal µs | create+post-start p50 / p99 µs | answers with a cpuset |");
    println!("|---:|---|---:|---:|---:|---:|");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for r in rows {
        let s = &r.start.cpu;
        let trips = Summary::of(&r.start.trips);
        println!(
            "| {} | {} | {:.1} ({:.1} / {:.1}) | {:.1} | {:.0} / {:.0} | {} of {n} |",
            r.round + 1,
            r.plugin,
            per(s.total, n),
            per(s.user, n),
            per(s.system, n),
            per(r.remove.cpu.total, n),
            trips.map_or(0.0, |t| us(t.p50)),
            trips.map_or(0.0, |t| us(t.p99)),
            r.with_cpuset,
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

fn print_summary(rows: &[Row], n: usize) {
    println!();
    let mut names: Vec<&str> = rows.iter().map(|r| r.plugin.as_str()).collect();
    names.dedup();
    names.sort();
    names.dedup();
    for name in names {
        let of = |f: &dyn Fn(&Row) -> Duration| {
            median(
                rows.iter()
                    .filter(|r| r.plugin == name)
                    .map(|r| per(f(r), n))
                    .collect(),
            )
        };
        println!(
            "{name}: median CPU per start {:.1} µs, per removal {:.1} µs",
            of(&|r| r.start.cpu.total),
            of(&|r| r.remove.cpu.total)
        );
    }
    // Rounds differ more than builds do: each agent against the first, round by round.
    let others: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|r| r.plugin.as_str())
        .filter(|n| n.starts_with("agent") && *n != "agent")
        .collect();
    for name in others {
        let diffs: Vec<f64> = rows
            .iter()
            .filter(|r| r.plugin == name)
            .filter_map(|r| {
                let base = rows
                    .iter()
                    .find(|b| b.round == r.round && b.plugin == "agent")?;
                Some(per(r.start.cpu.total, n) - per(base.start.cpu.total, n))
            })
            .collect();
        let better = diffs.iter().filter(|d| **d < 0.0).count();
        println!(
            "{name} - agent, round by round: median {:+.1} µs per start ({better} of {} rounds lower)",
            median(diffs.clone()),
            diffs.len()
        );
    }
    println!("load average: {}", util::load_average());
}

async fn run(args: Args) -> Result<()> {
    ensure!(args.containers > 0 && args.rounds > 0, "nothing to measure");
    let agents = match args.agent.is_empty() {
        true => vec![util::release_agent_binary()?],
        false => args.agent.clone(),
    };
    let dir = RmDir(util::temp_dir("tap-nri-hop")?);
    let mut plugins = Vec::new();
    for (k, bin) in agents.iter().enumerate() {
        let name = match k {
            0 => "agent".to_string(),
            _ => format!("agent{}", k + 1),
        };
        plugins.push(start_plugin(name, bin, &args, &dir.0).await?);
    }
    if !args.agent_only {
        let noop = match &args.noop {
            Some(p) => p.clone(),
            None => util::cargo_bin_profile("tap-e2e", "tap-nri-noop", true)?,
        };
        plugins.push(start_plugin("noop".into(), &noop, &args, &dir.0).await?);
    }
    ensure!(
        plugins.iter().all(|p| p.meter.precise()),
        "no cgroup for the plugins' CPU (run as root): the 10 ms ticks cannot resolve a start"
    );
    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    let gap = Duration::from_millis(args.gap_ms);
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for k in 0..plugins.len() {
            let p = &plugins[(round + k) % plugins.len()];
            let row = measure(p, round, args.containers, gap).await?;
            eprintln!(
                "round {} {}: {:.1} µs per start",
                round + 1,
                row.plugin,
                per(row.start.cpu.total, args.containers)
            );
            rows.push(row);
        }
    }
    let agent_answers = rows.iter().filter(|r| r.plugin.starts_with("agent"));
    for r in agent_answers {
        ensure!(
            r.with_cpuset == args.containers,
            "the agent set a cpuset on {} of {} creates in round {}",
            r.with_cpuset,
            args.containers,
            r.round + 1
        );
    }
    print_rows(&rows, args.containers);
    print_summary(&rows, args.containers);
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}
