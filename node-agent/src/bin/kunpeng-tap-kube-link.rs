//! `kunpeng-tap-kube-link`: the agent's NodeTopology link alone, without a runtime hook.
//!
//! It discovers the topology (`--sysfs-root`), builds the same engine and [`Agent`] as
//! `kunpeng-tap`, and runs [`node_agent::kube_link::run`]: it follows the node's NodeTopology
//! policy, caches it in `--state-dir`, and reports the status (mode `kube-link`, no
//! containers). For checking a node's link to the API server (and for the e2e tests) where no
//! runtime mode is in use. It takes `kunpeng-tap`'s flags; the runtime ones are ignored.

use anyhow::Context;
use clap::Parser;
use node_agent::agent::Agent;
use node_agent::flags::Flags;
use node_agent::metrics::Metrics;
use std::sync::Arc;
use tap_engine::Engine;

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    flags.init_logging();
    match run(flags) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kunpeng-tap-kube-link: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> anyhow::Result<()> {
    let topo = flags.load_topology()?;
    let metrics = Arc::new(Metrics::for_mode("kube-link"));
    let agent = Arc::new(Agent::new(
        Engine::new(topo, flags.engine_config()),
        metrics,
        None,
        "kube-link",
    ));
    // No runtime: the empty state is the whole truth (no containers to restore).
    agent
        .restore(&[])
        .context("starting the placement engine")?;
    let rt = tap_bin_support::runtime(tap_bin_support::Threads::Two)
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = tap_bin_support::shutdown_on_signal();
        // No runtime: the NodeResourceTopology's zones account for no pod, so it carries no
        // pod fingerprint.
        let mut opts = node_agent::kube_link::LinkOptions::from_flags(&flags);
        opts.nrt_advertised.fingerprint = node_agent::kube_link::nrt::Fingerprint::Omitted;
        node_agent::kube_link::run(opts, agent, shutdown).await
    })
}
