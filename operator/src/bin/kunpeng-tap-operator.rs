use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tap_operator::lease::LeaderElector;
use tap_operator::metrics::{self, Metrics};
use tokio_util::sync::CancellationToken;

use tap_bin_support::LogFormat;

/// kunpeng-tap operator: resolves TopologyPolicies onto Nodes as NodeTopology objects.
///
/// The API server is found through KUBECONFIG (or ~/.kube/config), else the in-cluster
/// service account.
#[derive(Debug, Parser)]
#[command(name = "kunpeng-tap-operator", version, about)]
struct Flags {
    /// Path to a kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Take a Lease before writing, so only one replica writes at a time.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    leader_elect: bool,
    #[arg(long, default_value = "kunpeng-tap-operator")]
    lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, else kube-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    /// How long a lease stays valid without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// A leader that could not renew for this long stops (must be < lease duration).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    /// How often to try to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// This replica's identity in the Lease (default: $POD_NAME or the hostname, plus the pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// TEST ONLY: shift the acquireTime/renewTime this replica writes into the Lease by a
    /// signed duration (`+1h`, `-90s`), to play a node whose clock is off. Expiry never depends
    /// on those timestamps; the e2e tests use this to prove it.
    #[arg(long, hide = true, default_value = "0s", value_parser = parse_signed_duration, allow_hyphen_values = true)]
    test_wall_clock_offset: jiff::SignedDuration,
    /// Address for /metrics (empty = off).
    #[arg(long, default_value = ":8080")]
    metrics_bind_address: String,
    /// Address for /healthz and /readyz (empty = off).
    #[arg(long, default_value = ":8081")]
    health_probe_bind_address: String,
    /// Log verbosity: 0-1 warnings, 2 info, 3 debug, 4+ trace.
    #[arg(short = 'v', long = "verbose", default_value_t = 2)]
    verbose: u8,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

fn parse_signed_duration(s: &str) -> Result<jiff::SignedDuration, String> {
    let (negative, rest) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let d = jiff::SignedDuration::try_from(parse_duration(rest)?)
        .map_err(|e| format!("duration {s:?} out of range: {e}"))?;
    Ok(if negative { -d } else { d })
}

fn bind(s: &str) -> anyhow::Result<std::net::SocketAddr> {
    tap_bin_support::parse_bind(s).map_err(anyhow::Error::msg)
}

/// Serves the endpoint `name` on a task of its own at `address` (`host:port`); nothing when
/// `address` is empty. A failure while serving is logged.
fn spawn_endpoint<F, Fut>(
    name: &'static str,
    address: &str,
    metrics: &Arc<Metrics>,
    serve: F,
) -> anyhow::Result<()>
where
    F: FnOnce(std::net::SocketAddr, Arc<Metrics>) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    if address.is_empty() {
        return Ok(());
    }
    let served = serve(bind(address)?, metrics.clone());
    tokio::spawn(async move {
        if let Err(e) = served.await {
            tracing::error!("{name} endpoint: {e:#}");
        }
    });
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

async fn client(f: &Flags) -> anyhow::Result<kube::Client> {
    let config = match &f.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

fn main() -> std::process::ExitCode {
    let f = Flags::parse();
    tap_bin_support::init_logging(f.verbose, f.log_format);
    let rt = match tap_bin_support::runtime(tap_bin_support::Threads::Two) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kunpeng-tap-operator: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(f)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("kunpeng-tap-operator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(f: Flags) -> anyhow::Result<()> {
    if f.renew_deadline >= f.lease_duration {
        anyhow::bail!("--renew-deadline must be shorter than --lease-duration");
    }
    let client = client(&f).await.context("connecting to the API server")?;
    let metrics = Arc::new(Metrics::new());
    spawn_endpoint(
        "metrics",
        &f.metrics_bind_address,
        &metrics,
        metrics::serve_metrics,
    )?;
    spawn_endpoint(
        "health",
        &f.health_probe_bind_address,
        &metrics,
        metrics::serve_health,
    )?;
    let shutdown = tap_bin_support::shutdown_on_signal();
    let identity = format!(
        "{}_{}",
        f.identity.clone().unwrap_or_else(hostname),
        std::process::id()
    );
    tracing::info!(identity = %identity, leader_elect = f.leader_elect, version = env!("CARGO_PKG_VERSION"), "kunpeng-tap-operator starting");

    if !f.leader_elect {
        metrics.leader.set(1);
        return Ok(tap_operator::controller::run(client, metrics, &identity, shutdown).await?);
    }

    let elector = Arc::new(
        LeaderElector::new(
            kube::Api::namespaced(client.clone(), &f.lease_namespace),
            &f.lease_name,
            &identity,
            f.lease_duration,
        )
        .with_wall_clock_offset(f.test_wall_clock_offset),
    );
    if !f.test_wall_clock_offset.is_zero() {
        tracing::warn!(offset = %f.test_wall_clock_offset, "TEST ONLY: Lease timestamps are written with a shifted wall clock");
    }
    // A standby is healthy and ready: it does its job by waiting.
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    loop {
        match elector.try_acquire_or_renew().await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("leader election: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(f.retry_period) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
    metrics.leader.set(1);
    metrics
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);

    let lost = CancellationToken::new();
    let renewer = {
        let (elector, lost, shutdown) = (elector.clone(), lost.clone(), shutdown.clone());
        let (retry, deadline) = (f.retry_period, f.renew_deadline);
        tokio::spawn(async move {
            let mut last_ok = Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = shutdown.cancelled() => return,
                }
                match elector.try_acquire_or_renew().await {
                    Ok(true) => last_ok = Instant::now(),
                    Ok(false) => {
                        tracing::error!("leader lease taken by another replica");
                        lost.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!("renewing the leader lease: {e}");
                        if last_ok.elapsed() > deadline {
                            tracing::error!("could not renew the leader lease within {deadline:?}");
                            lost.cancel();
                            return;
                        }
                    }
                }
            }
        })
    };
    let controllers_stop = CancellationToken::new();
    {
        let (c, s, l) = (controllers_stop.clone(), shutdown.clone(), lost.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = s.cancelled() => {},
                _ = l.cancelled() => {},
            }
            c.cancel();
        });
    }
    let result =
        tap_operator::controller::run(client, metrics.clone(), &identity, controllers_stop)
            .await
            .map_err(anyhow::Error::from);
    renewer.abort();
    metrics.leader.set(0);
    if lost.is_cancelled() {
        anyhow::bail!("lost the leader lease; exiting so that no two replicas write");
    }
    elector.release().await;
    result
}
