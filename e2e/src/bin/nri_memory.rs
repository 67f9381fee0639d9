//! `tap-nri-memory`: the resident memory of the release `kunpeng-tap` agent in NRI mode as it
//! comes to know 1,000 containers. A measurement program, not a test (docs/design/scale.md):
//!
//! ```text
//! cargo build --release -p node-agent --bin kunpeng-tap
//! cargo run --release -p tap-e2e --bin tap-nri-memory -- \
//!     [--containers 1000] [--steps 4] [--fixture synthetic-4s-8numa-smt-384t] [--bare]
//! ```
//!
//! It plays the runtime over a Unix socket with the real NRI protocol
//! ([`tap_e2e::nri_runtime`]): accepts the agent's registration, Configure, an empty
//! Synchronize, then CreateContainer for the containers of the mix (5% Guaranteed 1 CPU, 75%
//! Burstable 50m, 20% BestEffort; one Pod each, kubelet-like labels, annotations and
//! environment; `--bare`: without them, to tell what the metadata costs), one after the
//! other. After registration and after each step it scrapes the agent's /metrics (as
//! Prometheus would) and reads `/proc/PID/status` and `smaps_rollup`.
//! It prints a Markdown table, the answers' tally, the containers the agent accounts
//! (`tap_topology_node_containers`, summed) and the load average; it exits non-zero
//! when a create was not answered with a cpuset or the agent does not account them all.

use anyhow::{bail, Context, Result};
use std::time::Duration;
use tap_e2e::docker::tcp_get;
use tap_e2e::nri_runtime::{create_mix, start_agent, AgentOnRuntime, CreateTally, MixOptions};
use tap_e2e::procmem::ProcMemory;
use tap_e2e::util::{self, RmDir};

struct Opts {
    containers: usize,
    steps: usize,
    fixture: String,
    bare: bool,
}

fn parse() -> Result<Opts> {
    let mut o = Opts {
        containers: 1000,
        steps: 4,
        fixture: "synthetic-4s-8numa-smt-384t".into(),
        bare: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--containers" => o.containers = value("--containers")?.parse()?,
            "--steps" => o.steps = value("--steps")?.parse::<usize>()?.max(1),
            "--fixture" => o.fixture = value("--fixture")?,
            "--bare" => o.bare = true,
            "-h" | "--help" => {
                println!("tap-nri-memory [--containers N] [--steps K] [--fixture NAME] [--bare]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    Ok(o)
}

fn main() -> Result<()> {
    let o = parse()?;
    let bin = util::release_agent_binary()?;
    // TapAgent starts the binary TAP_BIN names; nothing else runs yet in this process.
    std::env::set_var("TAP_BIN", &bin);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(o, bin))
}

async fn scrape(addr: &str) -> Result<String> {
    let addr = addr.to_string();
    let (code, body) = tokio::task::spawn_blocking(move || tcp_get(&addr, "/metrics")).await??;
    anyhow::ensure!(code == 200, "/metrics answered {code}");
    Ok(body)
}

async fn run(o: Opts, bin: std::path::PathBuf) -> Result<()> {
    let dir = util::temp_dir("tap-nri-mem")?;
    let _rm = RmDir(dir.clone());
    let fixture = util::fixture_dir(&o.fixture);
    anyhow::ensure!(fixture.is_dir(), "no fixture {}", fixture.display());
    // BestEffort containers get a cpuset too: every create is answered with one.
    let AgentOnRuntime {
        agent,
        runtime: _runtime,
        session,
    } = start_agent(&dir, &fixture).await?;
    let pid = agent.pid().context("agent not running")?;

    let mut rows: Vec<(usize, ProcMemory)> = Vec::new();
    let mut tally = CreateTally::default();
    let mut metrics = scrape(&agent.metrics_addr).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    rows.push((0, ProcMemory::read(pid)?));
    let mut done = 0;
    for step in 1..=o.steps {
        let to = o.containers * step / o.steps;
        let t = create_mix(
            &session,
            done..to,
            MixOptions {
                keep: false,
                bare: o.bare,
            },
        )
        .await?;
        tally.answered += t.answered;
        tally.with_cpuset += t.with_cpuset;
        tally.without_cpuset.extend(t.without_cpuset);
        done = to;
        metrics = scrape(&agent.metrics_addr).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        rows.push((done, ProcMemory::read(pid)?));
    }
    let known = tap_e2e::text::metric_sum(&metrics, "tap_topology_node_containers");

    println!(
        "agent: {} (fixture {}{})",
        bin.display(),
        o.fixture,
        if o.bare { ", bare containers" } else { "" }
    );
    println!();
    println!("| containers | VmRSS | VmHWM | RssAnon | RssFile | smaps Anonymous | Private_Dirty | threads |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
    for (n, m) in &rows {
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} |",
            mib(m.rss_kib),
            mib(m.hwm_kib),
            mib(m.anon_kib),
            mib(m.file_kib),
            mib(m.smaps_anonymous_kib),
            mib(m.private_dirty_kib),
            m.threads
        );
    }
    if let (Some((_, first)), Some((n, last))) = (rows.first(), rows.last()) {
        if *n > 0 {
            println!();
            println!(
                "per container: {:.2} KiB of RSS ({:.2} KiB anonymous)",
                last.rss_kib.saturating_sub(first.rss_kib) as f64 / *n as f64,
                last.anon_kib.saturating_sub(first.anon_kib) as f64 / *n as f64
            );
        }
    }
    println!(
        "creates answered: {}, with a cpuset: {}; containers the agent accounts: {known}",
        tally.answered, tally.with_cpuset
    );
    println!("load average: {}", util::load_average());
    session.close().await;
    drop(agent);
    if tally.with_cpuset != o.containers || known as usize != o.containers {
        bail!(
            "expected {} creates answered with a cpuset and accounted; first without: {:?}",
            o.containers,
            tally.without_cpuset
        );
    }
    Ok(())
}
