//! tap-cri-relay: a CRI proxy that changes nothing, on kunpeng-tap's own proxy transport.
//!
//! It serves HTTP/2 on `--listen` with the agent's server (`cri_proxy::serve_calls`: the same
//! windows and graceful stop) and forwards every call to `--upstream` through the agent's
//! `cri_proxy::grpc::Upstream` (one shared HTTP/2 connection), on a Tokio current-thread
//! runtime as the agent runs (`tap_bin_support::Threads::One`). It decodes nothing, places
//! nothing, keeps no state and lists nothing. The start-path benchmark runs it as row (g):
//! what relaying costs a CRI proxy on this stack, under the proxy's own work
//! (docs/design/start-path.md).
//!
//! When it ends (SIGTERM or Ctrl-C) it prints one line `tap-cri-relay calls: total=N
//! create=N start=N`, so the benchmark can check that every container went through it.

use anyhow::{Context, Result};
use clap::Parser;
use node_agent::cri_proxy::grpc::Upstream;
use node_agent::cri_proxy::serve_calls;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "A CRI proxy that forwards every call unchanged, on kunpeng-tap's transport")]
struct Args {
    /// The socket to serve (created; a stale one is replaced).
    #[arg(long)]
    listen: PathBuf,
    /// The runtime's CRI socket.
    #[arg(long)]
    upstream: PathBuf,
}

#[derive(Default)]
struct Calls {
    total: AtomicU64,
    create: AtomicU64,
    start: AtomicU64,
}

const RUNTIME: &str = "/runtime.v1.RuntimeService/";

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tap_bin_support::runtime(tap_bin_support::Threads::One)
        .context("starting the async runtime")?;
    rt.block_on(relay(args))
}

async fn relay(args: Args) -> Result<()> {
    let shutdown = tap_bin_support::shutdown_on_signal();
    let listener = node_agent::proxy_server::bind_unix(&args.listen, None)?;
    let upstream = Arc::new(Upstream::new(&args.upstream));
    let calls = Arc::new(Calls::default());
    eprintln!(
        "tap-cri-relay: {} -> {}",
        args.listen.display(),
        args.upstream.display()
    );
    let counted = calls.clone();
    serve_calls(listener, shutdown, Duration::from_secs(2), move |req| {
        let (up, c) = (upstream.clone(), counted.clone());
        async move {
            c.total.fetch_add(1, Ordering::Relaxed);
            match req.uri().path().strip_prefix(RUNTIME) {
                Some("CreateContainer") => c.create.fetch_add(1, Ordering::Relaxed),
                Some("StartContainer") => c.start.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            up.forward(req).await
        }
    })
    .await;
    let _ = std::fs::remove_file(&args.listen);
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "tap-cri-relay calls: total={} create={} start={}",
        n(&calls.total),
        n(&calls.create),
        n(&calls.start)
    );
    Ok(())
}
