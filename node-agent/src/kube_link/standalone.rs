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
use tap_engine::sysfs::discover_dir;
use tap_engine::{Engine, Topology};
use tokio_util::sync::CancellationToken;

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("TAP_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if flags.verbose >= 3 { "debug" } else { "info" })
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(flags) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kunpeng-tap-kube-link: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> anyhow::Result<()> {
    let raw = discover_dir(&flags.sysfs_root).with_context(|| {
        format!(
            "discovering the topology under {}",
            flags.sysfs_root.display()
        )
    })?;
    let topo = Arc::new(Topology::build(&raw).context("building the topology model")?);
    let metrics = Arc::new(Metrics::new());
    let agent = Arc::new(Agent::new(
        Engine::new(topo, flags.engine_config()),
        metrics,
        None,
        "kube-link",
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        let s = shutdown.clone();
        tokio::spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            } else {
                let _ = tokio::signal::ctrl_c().await;
            }
            s.cancel();
        });
        node_agent::kube_link::run(&flags, agent, shutdown).await
    })
}
