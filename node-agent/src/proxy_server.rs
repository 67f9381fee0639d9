//! What the two proxy modes share around their protocol: the socket they listen on, rebuilding
//! the state from the runtime before serving, and the accept loop with a bounded graceful stop.

use crate::metrics::Metrics;
use anyhow::Context;
use std::future::Future;
use std::path::Path;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

/// Binds the proxy's unix socket, making its folder and removing a stale socket file.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// Rebuilds the state with `restore` (which says how many containers it found), retrying with
/// backoff while the runtime cannot be reached. Serving only after it, no create races the
/// restore. Returns `false` if `shutdown` came first.
pub async fn restore_until_done<F, Fut>(
    metrics: &Metrics,
    runtime: &str,
    shutdown: &CancellationToken,
    mut restore: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<usize>>,
{
    let mut delay = Duration::from_millis(200);
    loop {
        match restore().await {
            Ok(n) => {
                tracing::info!(containers = n, "state rebuilt from {runtime}");
                return true;
            }
            Err(e) => {
                tracing::warn!("cannot rebuild state from {runtime} yet: {e:#}");
                metrics.count_error("sync", "runtime");
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Accepts connections until `shutdown`, each served by `serve_conn` on a task of its own
/// (given the shutdown token, to stop gracefully). Then waits up to `grace` for the open ones
/// and closes what is left (long-lived streams). Returns how many were closed that way.
pub async fn serve_connections<F, Fut>(
    listener: UnixListener,
    shutdown: CancellationToken,
    grace: Duration,
    mut serve_conn: F,
) -> usize
where
    F: FnMut(UnixStream, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            acc = listener.accept() => match acc {
                Ok((stream, _)) => {
                    conns.spawn(serve_conn(stream, shutdown.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: do not spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    let drained = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drained).await.is_ok() {
        return 0;
    }
    let open = conns.len();
    tracing::info!(
        open,
        "connections still open after the graceful timeout (long-lived streams); closing them"
    );
    conns.shutdown().await;
    open
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn serves_then_stops_within_the_grace() {
        let dir = std::env::temp_dir().join(format!("tap-ps-{}", std::process::id()));
        let sock = dir.join("sub/s.sock");
        let l = bind_unix(&sock).expect("bind");
        // A second bind replaces the stale socket file.
        drop(l);
        let l = bind_unix(&sock).expect("rebind");
        let stop = CancellationToken::new();
        // Echo one byte; the second connection never ends by itself.
        let server = tokio::spawn(serve_connections(
            l,
            stop.clone(),
            Duration::from_millis(300),
            |mut s: UnixStream, _stop| async move {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).await.is_ok() {
                    if s.write_all(&b).await.is_err() {
                        break;
                    }
                }
            },
        ));
        let mut c = UnixStream::connect(&sock).await.expect("connect");
        c.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.expect("echo");
        assert_eq!(&b, b"x");
        let t = std::time::Instant::now();
        stop.cancel();
        let closed = server.await.expect("server task");
        assert_eq!(closed, 1, "the open connection is closed at the deadline");
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(t.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn restore_retries_until_it_works_or_shutdown() {
        let metrics = Metrics::new();
        let stop = CancellationToken::new();
        let mut tries = 0;
        let ok = restore_until_done(&metrics, "test", &stop, || {
            tries += 1;
            let n = tries;
            async move {
                if n < 2 {
                    anyhow::bail!("not yet")
                }
                Ok(3)
            }
        })
        .await;
        assert!(ok);
        assert_eq!(tries, 2);
        stop.cancel();
        let ok =
            restore_until_done(&metrics, "test", &stop, || async { anyhow::bail!("never") }).await;
        assert!(!ok);
    }
}
