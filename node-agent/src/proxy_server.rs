//! What the two proxy modes share around their protocol: the socket they listen on, rebuilding
//! the state from the runtime before serving, and the accept loop with a bounded graceful stop.

use crate::flags::Flags;
use crate::hook::Hook;
use crate::ledger::runtime::{Runtime, RECONCILE_EVERY};
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::retry::{pause, Delays, Spread};
use anyhow::Context;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

/// The group id named by `--socket-group` (a number, or a name in /etc/group); `None` when
/// empty.
pub fn resolve_group(spec: &str) -> anyhow::Result<Option<u32>> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(None);
    }
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(Some(gid));
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse::<u32>().ok()?;
            (name == spec).then_some(gid)
        })
        .next()
        .map(Some)
        .with_context(|| format!("--socket-group={spec}: no such group in /etc/group"))
}

/// Binds the proxy's unix socket: 0600, or 0660 owned by `group`, whatever the umask. The
/// socket is made under a temporary name and renamed into place, so it never exists with a
/// looser mode. A stale socket at the path is replaced; any other file there is an error.
pub fn bind_unix(path: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            tracing::info!(socket = %path.display(), "replacing a stale socket")
        }
        Ok(m) => anyhow::bail!(
            "{} exists and is not a socket ({}); refusing to replace it",
            path.display(),
            if m.is_dir() { "a directory" } else { "a file" }
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", path.display())),
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).with_context(|| format!("binding {}", tmp.display()))?;
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    let secured = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .and_then(|_| match group {
            Some(gid) => std::os::unix::fs::chown(&tmp, None, Some(gid)),
            None => Ok(()),
        })
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = secured {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("securing {}", path.display()));
    }
    Ok(listener)
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
    let mut delays = Delays::doubling(
        Duration::from_millis(200),
        Duration::from_secs(5),
        Spread::Exact,
    );
    loop {
        match restore().await {
            Ok(n) => {
                tracing::info!(containers = n, "state rebuilt from {runtime}");
                return true;
            }
            Err(e) => {
                tracing::warn!("cannot rebuild state from {runtime} yet: {e:#}");
                metrics.count_error(Hook::Sync, crate::metrics::ErrorKind::Runtime);
                if !pause(delays.next_delay(), shutdown).await {
                    return false;
                }
            }
        }
    }
}

/// How long start-up waits for the first restore before binding the socket anyway.
pub const RESTORE_BOUND: Duration = Duration::from_secs(15);

/// Rebuilds the state with `restore` on a task of its own ([`restore_until_done`]) and waits
/// for it up to [`RESTORE_BOUND`]: the caller binds its socket then, restored or not, so a
/// wedged runtime never keeps the socket away from the kubelet. Until the restore is done the
/// agent is not ready and the proxies forward every call unadjusted (fail open): deciding on an
/// engine that does not know the runtime's containers could hand out CPUs already taken.
/// `/readyz` waits for the socket as well ([`Metrics::expect_socket`]).
pub async fn restore_or_serve_open<F, Fut>(
    metrics: &Arc<Metrics>,
    runtime: String,
    shutdown: &CancellationToken,
    restore: F,
) -> Startup
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<usize>> + Send,
{
    metrics.expect_socket();
    let (m, stop) = (metrics.clone(), shutdown.clone());
    let mut task = tokio::spawn(async move {
        let done = restore_until_done(&m, &runtime, &stop, restore).await;
        if done {
            m.runtime_connected.set(1);
            m.set_ready(true);
        }
        done
    });
    tokio::select! {
        _ = shutdown.cancelled() => {
            let _ = task.await;
            Startup::Stopped
        }
        done = &mut task => match done {
            Ok(true) => Startup::Restored,
            _ => Startup::Stopped,
        },
        _ = tokio::time::sleep(RESTORE_BOUND) => {
            tracing::warn!(
                bound_s = RESTORE_BOUND.as_secs(),
                "the runtime has not answered the restore yet; serving, and forwarding every call unadjusted until it does"
            );
            metrics.count_error(Hook::Sync, crate::metrics::ErrorKind::NotReady);
            Startup::Restoring(task)
        }
    }
}

/// How start-up ended.
pub enum Startup {
    /// Shut down before anything was served.
    Stopped,
    Restored,
    /// Serving open while the restore goes on.
    Restoring(tokio::task::JoinHandle<bool>),
}

impl Startup {
    /// Waits for a restore still going on (it ends with the shutdown).
    pub async fn finish(self) {
        if let Startup::Restoring(t) = self {
            let _ = t.await;
        }
    }
}

/// A runtime proxy as its start-up sees it: a runtime the ledger's loops reach through it,
/// and its books.
pub trait Proxy: Runtime + 'static {
    /// `CRI`, `Docker`: for the log.
    const KIND: &'static str;

    fn ledger(&self) -> &Arc<Ledger>;
}

/// A proxy started: its socket bound, its ledger's loops running.
pub struct Serving {
    pub listener: UnixListener,
    pub loops: LedgerLoops,
}

/// The proxy modes' start-up: rebuilds the books from the runtime (named `runtime` in the log)
/// as [`restore_or_serve_open`] does, binds the proxy socket and starts the ledger's loops.
/// `None` when `shutdown` came first.
pub async fn start<P: Proxy>(
    flags: &Flags,
    metrics: &Arc<Metrics>,
    proxy: &Arc<P>,
    runtime: String,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Serving>> {
    let group = resolve_group(&flags.socket_group)?;
    let p = proxy.clone();
    let restorer = restore_or_serve_open(metrics, runtime, shutdown, move || {
        let p = p.clone();
        async move { p.ledger().restore_from(&*p).await }
    })
    .await;
    if matches!(restorer, Startup::Stopped) {
        return Ok(None);
    }
    let listener = bind_unix(&flags.runtime_proxy_endpoint, group)?;
    metrics.set_socket_bound(true);
    tracing::info!(socket = %flags.runtime_proxy_endpoint.display(), backend = %flags.runtime_endpoint_path().display(), "{} proxy serving", P::KIND);
    let loops = LedgerLoops::spawn(proxy.ledger(), proxy.clone(), restorer, flags, shutdown);
    Ok(Some(Serving { listener, loops }))
}

/// The ledger's loops beside a proxy that serves: writing cpusets (converge), comparing with
/// the runtime once the state is restored (reconcile), rebalancing and reading cgroups back.
pub struct LedgerLoops {
    ledger: Arc<Ledger>,
    tasks: [tokio::task::JoinHandle<()>; 4],
}

impl LedgerLoops {
    pub fn spawn<P: Runtime + 'static>(
        ledger: &Arc<Ledger>,
        proxy: Arc<P>,
        restorer: Startup,
        flags: &Flags,
        shutdown: &CancellationToken,
    ) -> LedgerLoops {
        let converger = tokio::spawn(ledger.clone().converge(proxy.clone(), shutdown.clone()));
        let (l, stop) = (ledger.clone(), shutdown.clone());
        let reconciler = tokio::spawn(async move {
            // The periodic comparison starts once the state is restored (it would adopt every
            // container before the state file's records are read).
            restorer.finish().await;
            l.keep_reconciled(proxy, RECONCILE_EVERY, stop).await
        });
        let rebalancer = crate::usage::rebalance_loop::spawn(ledger, flags, shutdown);
        let cgroups = crate::cgroupfs::Cgroupfs::find(&flags.cgroup_root);
        let reader = crate::ledger::readback::spawn(ledger, cgroups, shutdown);
        LedgerLoops {
            ledger: ledger.clone(),
            tasks: [converger, reconciler, rebalancer, reader],
        }
    }

    /// After serving: waits for the loops (they end with the shutdown), saves the grant
    /// records and removes the proxy socket.
    pub async fn finish(self, metrics: &Metrics, flags: &Flags) {
        futures_util::future::join_all(self.tasks).await;
        self.ledger.flush_records();
        metrics.set_socket_bound(false);
        let _ = std::fs::remove_file(&flags.runtime_proxy_endpoint);
    }
}

/// A connection hyper serves, which can be told to finish what it has under way and close.
pub trait GracefulConnection: Future<Output = hyper::Result<()>> {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

/// An HTTP/1 connection that may be upgraded (Docker's attach and exec streams).
impl<I, B, S> GracefulConnection for http1::UpgradeableConnection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::UpgradeableConnection::graceful_shutdown(self)
    }
}

/// An HTTP/2 connection (gRPC).
impl<I, B, S, E> GracefulConnection for http2::Connection<I, S, E>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http2::Connection::graceful_shutdown(self)
    }
}

/// Serves `conn` until it ends, or until `stop`: then lets it finish gracefully. `peer` names
/// the other side in the log of a connection that failed.
pub async fn serve_until_stopped<C: GracefulConnection>(
    conn: C,
    stop: CancellationToken,
    peer: &str,
) {
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r { tracing::debug!("{peer} connection: {e}") },
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
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
        let l = bind_unix(&sock, None).expect("bind");
        // A second bind replaces the stale socket file.
        drop(l);
        let l = bind_unix(&sock, None).expect("rebind");
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
    async fn the_socket_is_private_whatever_the_umask_and_other_files_are_kept() {
        let dir = std::env::temp_dir().join(format!("tap-ps-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sock = dir.join("p.sock");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let _l = bind_unix(&sock, None).expect("bind");
        assert_eq!(mode(&sock), 0o600);
        let gid = std::fs::metadata(&dir)
            .map(|m| std::os::unix::fs::MetadataExt::gid(&m))
            .unwrap();
        let _l = bind_unix(&sock, Some(gid)).expect("rebind with a group");
        assert_eq!(mode(&sock), 0o660);
        let file = dir.join("not-a-socket");
        std::fs::write(&file, "keep me").unwrap();
        let e = bind_unix(&file, None).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        assert_eq!(resolve_group("").unwrap(), None);
        assert_eq!(resolve_group("0").unwrap(), Some(0));
        assert_eq!(resolve_group("root").unwrap(), Some(0));
        assert!(resolve_group("no-such-group-here").is_err());
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
