//! The invariant the convergence loop keeps, checked against the real runtimes:
//! at rest, (a) no shared container's cgroup cpuset meets an exclusive grant and (b) every
//! container's cgroup cpuset equals the agent's books (`/grants`). The agent runs on this
//! host's own sysfs, not folded, so the cpusets are the real ones.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// The longest a create may take through the agent in a churn test: far below the kubelet's
/// 2 min, and what a create waiting on a hung neighbour's update would exceed.
pub const CREATE_BOUND: Duration = Duration::from_secs(5);

/// Prints why `res` failed and then the agent's log tail (the reason first, so that it survives
/// a log shortened to its head and tail).
pub fn print_agent_log_on_failure<T>(res: &Result<T>, agent: &crate::docker::TapAgent) {
    if let Err(e) = res {
        eprintln!("failed: {e:#}\n--- agent log ---\n{}", agent.log_tail(60));
    }
}

/// The end of a churn test: every create (faults aside) was within [`CREATE_BOUND`].
pub fn check_slowest_create(slowest: Duration) -> Result<()> {
    anyhow::ensure!(
        slowest < CREATE_BOUND,
        "the slowest create took {slowest:?}"
    );
    eprintln!("slowest create: {slowest:.1?}");
    Ok(())
}

/// How long the books and the runtime may take to agree after a phase: the loop's writes are
/// immediate, a failed one is retried within seconds, a lost one is read back within 30 s.
pub const SETTLE: Duration = Duration::from_secs(45);

/// The bound the agent promises on a node that stays quiet after an event: every cgroup as
/// the books say within 10 s (the kubelet's own CPU manager reconcile period).
pub const BOUND: Duration = Duration::from_secs(10);

/// Fails when a phase came to rest later than [`BOUND`].
pub fn check_bound(phase: &str, took: Duration) -> Result<()> {
    anyhow::ensure!(
        took <= BOUND,
        "{phase}: at rest only after {took:.1?}, beyond the {BOUND:?} bound"
    );
    Ok(())
}

/// One container in the agent's books.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booked {
    pub cpus: BTreeSet<usize>,
    pub exclusive: bool,
}

/// The agent's books, from its `/grants` endpoint, by container key.
pub fn books(metrics_addr: &str) -> Result<HashMap<String, Booked>> {
    let (status, body) = crate::docker::tcp_get(metrics_addr, "/grants")?;
    anyhow::ensure!(status == 200, "/grants answered {status}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).context("/grants is not JSON")?;
    let mut out = HashMap::new();
    for (k, g) in v.as_object().context("/grants is not an object")? {
        let cpus = g["cpus"].as_str().context("grant without cpus")?;
        out.insert(
            k.clone(),
            Booked {
                cpus: parse_list(cpus)?,
                exclusive: g["exclusive"].as_bool().unwrap_or(false),
            },
        );
    }
    Ok(out)
}

pub use crate::util::parse_list;

/// What the invariant finds wrong with `live` (container key -> cgroup cpuset of every running
/// container the test made, all of which the agent places) against the books; empty at rest.
pub fn violations(
    books: &HashMap<String, Booked>,
    live: &HashMap<String, BTreeSet<usize>>,
) -> Vec<String> {
    let exclusive: BTreeSet<usize> = books
        .values()
        .filter(|b| b.exclusive)
        .flat_map(|b| b.cpus.iter().copied())
        .collect();
    let mut out = Vec::new();
    for (key, cpus) in live {
        let Some(b) = books.get(key) else {
            out.push(format!("{key} runs on {cpus:?} with no grant"));
            continue;
        };
        if !b.exclusive && !cpus.is_disjoint(&exclusive) {
            out.push(format!(
                "shared {key} runs on {cpus:?}, exclusive CPUs are {exclusive:?}"
            ));
        }
        if *cpus != b.cpus {
            out.push(format!(
                "{key}: the cgroup has {cpus:?}, the books {:?}",
                b.cpus
            ));
        }
    }
    for key in books.keys() {
        if !live.contains_key(key) {
            out.push(format!("{key} is in the books but not running"));
        }
    }
    out
}

/// Waits until the invariant holds for what `live` reads, failing with the last violations
/// after [`SETTLE`]. Returns how long it took.
pub async fn wait_at_rest<F>(phase: &str, metrics_addr: &str, mut live: F) -> Result<Duration>
where
    F: AsyncFnMut() -> Result<HashMap<String, BTreeSet<usize>>>,
{
    let start = Instant::now();
    let mut last = Vec::new();
    while start.elapsed() < SETTLE {
        let seen = live().await;
        let b = books(metrics_addr);
        match (seen, b) {
            (Ok(seen), Ok(b)) => {
                last = violations(&b, &seen);
                if last.is_empty() {
                    eprintln!(
                        "{phase}: at rest after {:.1?} ({} containers, {} exclusive)",
                        start.elapsed(),
                        seen.len(),
                        b.values().filter(|g| g.exclusive).count()
                    );
                    return Ok(start.elapsed());
                }
            }
            (Err(e), _) | (_, Err(e)) => last = vec![format!("{e:#}")],
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("{phase}: not at rest after {SETTLE:?}: {last:#?}")
}

/// A small seeded generator (xorshift64*), so a failing churn can be replayed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (v % n.max(1) as u64) as usize
    }
}

/// The seed of a churn run: `TAP_CHURN_SEED`, else 1.
pub fn seed() -> u64 {
    std::env::var("TAP_CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// How long the soak goes on after the phases: `TAP_CHURN_SECONDS` (0, no soak, by default).
/// `TAP_E2E=1 TAP_CHURN_SECONDS=600 cargo test -p tap-e2e --test e2e -- --include-ignored churn_docker::`
/// soaks 10 min.
pub fn soak_seconds() -> Duration {
    Duration::from_secs(
        std::env::var("TAP_CHURN_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    )
}

/// The seeds the soak runs first, one round each: `TAP_CHURN_SEEDS`, a list (`11,17`), a
/// range (`1-40`) or both (`1-5,9`); none when unset.
pub fn soak_seeds() -> Result<Vec<u64>> {
    let spec = std::env::var("TAP_CHURN_SEEDS").unwrap_or_default();
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || anyhow::anyhow!("TAP_CHURN_SEEDS: {part:?} is not a seed or a range a-b");
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u64, u64) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b || b - a > 10_000 {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Seeded rounds (`round(seed, n)`: a churn and a check at rest): the seeds of
/// [`soak_seeds`], then more for [`soak_seconds`].
pub async fn soak(mut round: impl AsyncFnMut(u64, u64) -> Result<()>) -> Result<()> {
    let (until, t0) = (soak_seconds(), Instant::now());
    let mut n = 0u64;
    for s in soak_seeds()? {
        n += 1;
        round(s, n).await?;
    }
    while t0.elapsed() < until {
        n += 1;
        round(seed().wrapping_add(n), n).await?;
    }
    if n > 0 {
        eprintln!("soak: {n} rounds, each at rest, in {:.0?}", t0.elapsed());
    }
    Ok(())
}

/// The agent flags that make it place on this host's own sysfs (no fixture, no fold).
pub fn on_this_host(args: Vec<String>) -> Vec<String> {
    args.into_iter()
        .filter(|a| !a.starts_with("--sysfs-root") && a != "--fold-cpus-to-host")
        .chain(["--sysfs-root=/sys".to_string()])
        .collect()
}

/// The host has the two CPUs the churn needs (an exclusive CPU next to a shared one).
pub fn host_has_two_cpus() -> Result<()> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    let n = parse_list(&online)?.len();
    anyhow::ensure!(n >= 2, "the churn needs 2 online CPUs, this host has {n}");
    Ok(())
}

/// The pid of the runtime shim serving `id` (a containerd shim is started with `-id <id>`: the
/// sandbox's id under the CRI, the container's under dockerd).
pub fn shim_pid(id: &str) -> Result<u32> {
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.windows(15).any(|w| w == b"containerd-shim"));
        if is_shim
            && args
                .windows(2)
                .any(|w| w[0] == b"-id" && w[1] == id.as_bytes())
        {
            return Ok(pid);
        }
    }
    bail!("no shim serves {id}")
}

/// Stops a process (SIGSTOP) until dropped (SIGCONT): a hung shim.
pub struct Frozen(pub u32);

impl Frozen {
    pub fn new(pid: u32) -> Result<Frozen> {
        signal(pid, "STOP")?;
        Ok(Frozen(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = signal(self.0, "CONT");
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let st = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(st.success(), "kill -{sig} {pid} failed");
    Ok(())
}
