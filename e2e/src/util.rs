//! Small helpers shared by the e2e tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether the e2e tier is enabled (`TAP_E2E=1`).
pub fn enabled() -> bool {
    std::env::var("TAP_E2E").map(|v| v == "1").unwrap_or(false)
}

/// Fails the calling test unless the e2e tier is on. The tier's tests are `#[ignore]`d (a plain
/// `cargo test` lists them as ignored); one that runs was asked for (`--include-ignored`), so
/// without the tier it fails rather than pass having done nothing.
pub fn require_e2e_tier() {
    assert!(
        enabled(),
        "an e2e tier test needs TAP_E2E=1 and the components hack/e2e/setup-*.sh install \
         (bash hack/test.sh e2e)"
    );
}

/// A program a setup script installs: the path in env `var`, else `default`. Panics (never
/// skips) naming `setup` when it is not there.
pub fn installed(var: &str, default: &str, setup: &str) -> PathBuf {
    let p = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        p.exists(),
        "{} not found: run {setup} (or set {var})",
        p.display()
    );
    p
}

/// Kills and reaps the child in `child`, if any, leaving `None`.
pub fn stop_child(child: &mut Option<std::process::Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Removes `dir`, or with `TAP_E2E_KEEP=1` keeps it for debugging and says so.
pub fn remove_unless_kept(dir: &Path) {
    if std::env::var("TAP_E2E_KEEP").is_ok_and(|v| v == "1") {
        eprintln!("kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Unmounts (lazily) whatever is mounted under `dir`, the deepest first.
pub fn unmount_under(dir: &Path) {
    let prefix = dir.to_string_lossy().into_owned();
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = mi
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    mounts.dedup();
    for m in mounts {
        let _ = std::process::Command::new("umount")
            .args(["-l", m])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `out`'s stdout when `what args` succeeded; else an error with its output.
pub fn stdout_of(what: &str, args: &[&str], out: std::process::Output) -> anyhow::Result<String> {
    if !out.status.success() {
        anyhow::bail!(
            "{what} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How long to wait for something, and how often to look.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    pub timeout: std::time::Duration,
    pub poll: std::time::Duration,
}

/// Waits until `ready()`, looking every `poll` for `timeout` at most; fails with `log()` when
/// `child` (`what`) exits first or the time runs out.
pub fn wait_child_ready(
    child: &mut std::process::Child,
    what: &str,
    Patience { timeout, poll }: Patience,
    mut ready: impl FnMut() -> bool,
    log: impl Fn() -> String,
) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + timeout;
    while !ready() {
        if let Some(st) = child.try_wait()? {
            anyhow::bail!("{what} exited ({st}):\n{}", log());
        }
        anyhow::ensure!(
            std::time::Instant::now() < until,
            "{what} was not ready in {timeout:?}:\n{}",
            log()
        );
        std::thread::sleep(poll);
    }
    Ok(())
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The sysfs root of fixture `name` as a folder: the repository ships each fixture as one dump
/// file (`fixtures/sysfs/<name>`), which the engine's helper writes out once under the Cargo
/// target directory ([`tap_engine::testdata::materialised`]) for what needs a real directory:
/// an agent's `--sysfs-root`, a bind mount, an image layer. Read it, don't change it.
pub fn fixture_dir(name: &str) -> PathBuf {
    tap_engine::testdata::materialised(name).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// Builds a binary of this workspace (`cargo build -p <package> --bin <bin>`) and returns its
/// path under `CARGO_TARGET_DIR` (or `./target`); cargo's own lock makes concurrent calls safe.
pub fn cargo_bin(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    cargo_bin_profile(package, bin, false)
}

/// As [`cargo_bin`], with `--release` when `release` (the benchmarks measure release builds).
pub fn cargo_bin_profile(package: &str, bin: &str, release: bool) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = workspace_root();
    let mut args = vec!["build", "-q", "-p", package, "--bin", bin];
    if release {
        args.push("--release");
    }
    let out = std::process::Command::new(cargo)
        .current_dir(&root)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running cargo build")?;
    if !out.status.success() {
        anyhow::bail!(
            "cargo {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let p = target
        .join(if release { "release" } else { "debug" })
        .join(bin);
    anyhow::ensure!(p.exists(), "{} not found after cargo build", p.display());
    Ok(p)
}

/// The `kunpeng-tap` agent binary, built once per test process; `TAP_BIN` (or the older
/// `TAP_AGENT_BIN`) names a prebuilt one instead.
pub fn agent_binary() -> anyhow::Result<PathBuf> {
    static BIN: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("TAP_BIN").or_else(|| std::env::var_os("TAP_AGENT_BIN")) {
            return Ok(PathBuf::from(p));
        }
        cargo_bin("node-agent", "kunpeng-tap").map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// The release build of the `kunpeng-tap` agent for measurements: `TAP_BIN` if set, else
/// `<CARGO_TARGET_DIR or ./target>/release/kunpeng-tap`, which must exist (`cargo build
/// --release -p node-agent --bin kunpeng-tap`): a measurement never builds a debug agent.
pub fn release_agent_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("TAP_BIN") {
        return Ok(PathBuf::from(p));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let p = target.join("release").join("kunpeng-tap");
    anyhow::ensure!(
        p.exists(),
        "{} is missing: run `cargo build --release -p node-agent --bin kunpeng-tap` first (or set TAP_BIN)",
        p.display()
    );
    Ok(p)
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), as `uptime` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Drops ANSI colour sequences from a log.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Removes the cgroup directories at `rel` (relative to the hierarchy root) in every mounted
/// hierarchy (`/sys/fs/cgroup/<rel>` for v2, `/sys/fs/cgroup/<controller>/<rel>` for v1),
/// children first. Errors are ignored: this is cleanup.
pub fn remove_cgroup_dirs(rel: &str) {
    let rel = rel.trim_start_matches('/');
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup").join(rel)];
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in rd.flatten() {
            roots.push(e.path().join(rel));
        }
    }
    fn rm(p: &Path) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    rm(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(p);
    }
    for r in roots {
        if r.is_dir() {
            rm(&r);
        }
    }
}

static TEMP_SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh, short temp dir `/tmp/<prefix>-<pid>-<n>` (unix socket paths inside it must stay
/// under 108 bytes).
pub fn temp_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(format!(
        "/tmp/{prefix}-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// On a failed scenario, prints the agent's log (`<dir>/agent.log`) and the last lines of the
/// daemon it ran against (`daemon` names it, `tail` reads them).
pub fn print_logs_on_failure<T>(
    res: &anyhow::Result<T>,
    dir: &Path,
    daemon: &str,
    tail: impl FnOnce() -> String,
) {
    if res.is_err() {
        eprintln!(
            "--- agent log\n{}\n--- {daemon} log\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default(),
            tail()
        );
    }
}

/// Removes a folder (and all in it) when dropped: a test's scratch space.
pub struct RmDir(pub PathBuf);

impl Drop for RmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `f` every `every` until it answers `true`; an error counts as "not yet" (the thing
/// polled may be restarting) and the last one is named if `timeout` passes first.
pub fn wait_until(
    what: &str,
    timeout: std::time::Duration,
    every: std::time::Duration,
    mut f: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    loop {
        let last_err = match f() {
            Ok(true) => return Ok(()),
            Ok(false) => None,
            Err(e) => Some(e),
        };
        if start.elapsed() > timeout {
            let msg = format!("timed out after {timeout:?} waiting for {what}");
            return Err(match last_err {
                Some(e) => e.context(msg),
                None => anyhow::anyhow!(msg),
            });
        }
        std::thread::sleep(every);
    }
}

/// `GET path` over HTTP/1.0 on 127.0.0.1:`port`: the whole response, headers included (5 s
/// read timeout). Enough for the agent's and the operator's /metrics and probes.
pub fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// The CPUs of the last `placed` line of an agent's text log that contains `needle` (e.g.
/// `container=<id> ` or ` pod=<name> `): the fixture's CPUs, before any folding.
pub fn logged_cpus(log: &str, needle: &str) -> Option<BTreeSet<usize>> {
    let line = log
        .lines()
        .rfind(|l| l.contains(" placed ") && l.contains(" cpus=") && l.contains(needle))?;
    let cpus = line.split(" cpus=").nth(1)?.split(' ').next()?;
    parse_list(cpus).ok()
}

/// A kernel CPU or node list (`0-3,8`), read by the engine's parser.
pub fn parse_list(s: &str) -> anyhow::Result<BTreeSet<usize>> {
    Ok(tap_engine::CpuSet::parse(s)?.iter().collect())
}

/// This host's online CPUs, ascending.
pub fn host_cpus() -> Vec<usize> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .expect("reading /sys/devices/system/cpu/online");
    parse_list(&online)
        .expect("parsing /sys/devices/system/cpu/online")
        .into_iter()
        .collect()
}

/// What `--fold-cpus-to-host` makes of a fixture's NUMA node `n`: host CPU `host[n mod count]`.
pub fn folded_node(n: usize) -> BTreeSet<usize> {
    let host = host_cpus();
    BTreeSet::from([host[n % host.len()]])
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
