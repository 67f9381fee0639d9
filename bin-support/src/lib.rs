//! What the kunpeng-tap binaries (agent, kube link, operator) share at start-up: the logging
//! set-up behind their `-v`/`--log-format` flags, and the shutdown token SIGTERM or Ctrl-C
//! cancels.

use tokio_util::sync::CancellationToken;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The `tracing` level of a `-v` count: 0-1 warn, 2 info (the reference's default), 3 debug,
/// 4+ trace.
pub fn level_of(verbose: u8) -> &'static str {
    match verbose {
        0 | 1 => "warn",
        2 => "info",
        3 => "debug",
        _ => "trace",
    }
}

/// Sets up `tracing` to stderr, text or JSON, at the level of `verbose`; `TAP_LOG` (an
/// env-filter directive) overrides the level. Colours only when stderr is a terminal (not in
/// a file, a pipe, a container log or the journal).
pub fn init_logging(verbose: u8, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TAP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level_of(verbose)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// A token cancelled at the first SIGTERM or Ctrl-C. Call it inside a Tokio runtime.
pub fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM: {e}; only Ctrl-C stops this process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        tracing::info!("shutting down");
        s.cancel();
    });
    shutdown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_levels_follow_the_reference() {
        for (verbose, level) in [
            (0, "warn"),
            (1, "warn"),
            (2, "info"),
            (3, "debug"),
            (4, "trace"),
            (9, "trace"),
        ] {
            assert_eq!(level_of(verbose), level, "-v x{verbose}");
        }
    }
}

/// How many threads run a binary's async tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// All tasks on the thread that starts the runtime (blocking work still goes to the
    /// blocking pool): the node agent, whose hooks take microseconds and whose CPU per
    /// container start is mostly waking threads and handing messages between them
    /// (docs/design/start-path.md).
    One,
    /// Two worker threads: the operator and the kube link, which serve many objects at once.
    Two,
}

/// The async runtime a binary runs on, all drivers enabled.
pub fn runtime(threads: Threads) -> std::io::Result<tokio::runtime::Runtime> {
    match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Threads::Two => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
}

/// A listen address from `:9091`, `0.0.0.0:9091` or `127.0.0.1:9091` (a bare port means all
/// interfaces).
pub fn parse_bind(s: &str) -> Result<std::net::SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|e| format!("invalid bind address {s:?}: {e}"))
}

#[cfg(test)]
mod bind_tests {
    use super::parse_bind;

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind(":9091").unwrap().to_string(), "0.0.0.0:9091");
        assert_eq!(
            parse_bind("127.0.0.1:8080").unwrap().to_string(),
            "127.0.0.1:8080"
        );
        assert!(parse_bind("9091").unwrap_err().contains("9091"));
        assert!(parse_bind("").is_err());
    }
}
