//! Start-path benchmark: what a placement plugin adds to CreateContainer + StartContainer on a
//! real containerd 1.7 with runc (docs/design/start-path.md).
//!
//! For every setup, a fresh private containerd (NRI on; tap_e2e::containerd) gets a few Pod
//! sandboxes and then `--containers` busybox `sleep` containers, created and started one after
//! the other through CRI and each call timed on the client; all stay running until the end, then
//! are stopped and removed. Setups:
//!   a  containerd, NRI on, no plugin (the floor)
//!   b  kunpeng-tap (release build) as an NRI plugin
//!   c  kunpeng-tap (release build) as the CRI proxy: the calls go through its socket
//!   d  containers/nri-plugins' topology-aware plugin as an NRI plugin, when
//!      hack/e2e/setup-nri-plugins.sh could build it (skipped, with the reason, otherwise)
//!   e  a no-op NRI plugin in Go, on containerd's NRI stub (hack/e2e/nri-noop)
//!   f  a no-op NRI plugin in Rust on kunpeng-tap's own transport (`tap-nri-noop`)
//!   g  a pass-through CRI proxy on kunpeng-tap's own proxy transport (`tap-cri-relay`): the
//!      calls go through its socket, as in (c)
//! kunpeng-tap decides on a 96-CPU fixture folded onto this host (`--fold-cpus-to-host`), so
//! the cpusets runc applies are valid here. `--rounds` repeats the setups in turn, each round
//! starting one setup later (a b c, b c a, c a b, ...), so drift in the machine's load is spread
//! over all of them.
//!
//! Run as root after hack/e2e/setup-containerd.sh:
//!   cargo run --release -p tap-e2e --bin start-path -- --containers 200 --rounds 2

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tap_e2e::containerd::{
    remove_cgroup_tree, CgroupQos, ContainerSpec, Containerd, ContainerdOptions, Cri, PodSpec,
};
use tap_e2e::cpumeter::{proc_stat_cpu, CpuMeter, Reading, Used};
use tap_e2e::docker::{terminate, TapAgent};
use tap_e2e::nri_runtime::bench_agent_args;
use tap_e2e::stats::{ms, Summary};
use tap_e2e::util::{self, RmDir};

mod report;
use report::{print_report, setup_name, Samples};

const FIXTURE: &str = "synthetic-2s-4numa-96c-gpu";
/// Where hack/e2e/setup-nri-plugins.sh puts the Go plugin.
const NRI_PLUGINS_BIN: &str = "/var/cache/kunpeng-tap/bin/nri-topology-aware-v0.12.1";
/// Where hack/e2e/setup-nri-noop.sh puts the no-op plugin.
const NRI_NOOP_BIN: &str = "/var/cache/kunpeng-tap/bin/nri-noop";

#[derive(Parser, Debug)]
#[command(about = "CreateContainer + StartContainer latency with and without a placement plugin")]
struct Args {
    /// Measured containers per setup and round.
    #[arg(long, default_value_t = 200)]
    containers: usize,
    /// Unmeasured containers created first in each run (first-use costs).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Times every setup runs, in turn.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Setups to run (a, b, c, d, e, f, g), comma-separated.
    #[arg(long, default_value = "a,b,c,d,e,f,g", value_delimiter = ',')]
    setups: Vec<char>,
    /// The kunpeng-tap binary (default: `cargo build --release` of node-agent).
    #[arg(long, env = "TAP_BIN")]
    agent: Option<PathBuf>,
    /// The nri-plugins topology-aware binary.
    #[arg(long, default_value = NRI_PLUGINS_BIN)]
    nri_plugins: PathBuf,
    /// The no-op NRI plugin (hack/e2e/setup-nri-noop.sh).
    #[arg(long, default_value = NRI_NOOP_BIN)]
    nri_noop: PathBuf,
    /// The no-op NRI plugin on kunpeng-tap's transport (default: `cargo build --release` of
    /// tap-e2e's `tap-nri-noop`).
    #[arg(long)]
    nri_noop_rs: Option<PathBuf>,
    /// The pass-through CRI proxy on kunpeng-tap's transport (default: `cargo build
    /// --release` of tap-e2e's `tap-cri-relay`).
    #[arg(long)]
    cri_relay: Option<PathBuf>,
    /// Keep the agent logs of each run in this folder.
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// Seconds the agent is left idle (containers running, none starting) before the measured
    /// phase: its background CPU, to tell apart from what each start costs.
    #[arg(long, default_value_t = 10)]
    idle: u64,
}

fn cpu_time(pid: Option<u32>) -> Duration {
    pid.map_or(Duration::ZERO, proc_stat_cpu)
}

/// The agent's CPU time over `secs` seconds in which no container starts, and the wall time.
async fn idle_cpu(meter: Option<&CpuMeter>, secs: u64) -> (Duration, Duration) {
    let (c0, t0) = (meter.map(CpuMeter::read), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    (cpu_since(meter, c0.as_ref()).total, t0.elapsed())
}

/// What `meter` counted since `earlier` (nothing without a meter).
fn cpu_since(meter: Option<&CpuMeter>, earlier: Option<&Reading>) -> Used {
    match (meter, earlier) {
        (Some(m), Some(e)) => m.since(e),
        _ => Used::default(),
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The containers of a run: 4 Pods (3 Burstable, 1 Guaranteed); every 8th container is
/// Guaranteed with 1 exclusive CPU, the others Burstable 250m/500m. On the 96-CPU fixture the
/// 200 fit (25 exclusive CPUs + 43.75 shared).
fn pods() -> Vec<(PodSpec, bool)> {
    let mut v: Vec<(PodSpec, bool)> = (0..3)
        .map(|i| {
            (
                PodSpec::new(&format!("bench-b{i}"), CgroupQos::Burstable),
                false,
            )
        })
        .collect();
    v.push((PodSpec::new("bench-g", CgroupQos::Guaranteed), true));
    v
}

/// Which Pod container `i` goes to, and its spec (Pod 3 is the Guaranteed one).
fn container(i: usize) -> (usize, ContainerSpec) {
    if i % 8 == 7 {
        let mut c = ContainerSpec::cpus(&format!("c{i}"), 1000, Some(1000));
        c.memory_limit_bytes = Some(64 << 20);
        (3, c)
    } else {
        (i % 3, ContainerSpec::cpus(&format!("c{i}"), 250, Some(500)))
    }
}

/// An NRI plugin that is not kunpeng-tap (setup d); killed on drop.
struct ExternalPlugin {
    child: Child,
}

impl Drop for ExternalPlugin {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(5));
    }
}

impl ExternalPlugin {
    /// Starts `bin` with `args`, its output in `<dir>/nri-plugins.log`, and waits up to
    /// `secs` for `ready` (checked every 100 ms); fails if it exits first (with its log).
    fn start(
        bin: &Path,
        args: &[String],
        dir: &Path,
        (secs, ready): (u64, impl Fn() -> bool),
    ) -> Result<ExternalPlugin> {
        let log_path = dir.join("nri-plugins.log");
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut p = ExternalPlugin { child };
        tap_e2e::util::wait_child_ready(
            &mut p.child,
            &bin.display().to_string(),
            tap_e2e::util::Patience {
                timeout: Duration::from_secs(secs),
                poll: Duration::from_millis(100),
            },
            ready,
            || std::fs::read_to_string(&log_path).unwrap_or_default(),
        )?;
        Ok(p)
    }
}

/// Starts the nri-plugins topology-aware plugin with a local config file (no API server: its
/// `--config-file` replaces the custom resource) and waits until containerd has synchronized it.
fn start_nri_plugins(bin: &Path, ctd: &Containerd, dir: &Path) -> Result<ExternalPlugin> {
    let cfg = dir.join("topology-aware.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: config.nri/v1alpha1\nkind: TopologyAwarePolicy\nmetadata:\n  name: default\n\
         spec:\n  pinCPU: true\n  pinMemory: true\n  reservedResources:\n    cpu: 750m\n",
    )?;
    let args = [
        format!("--config-file={}", cfg.display()),
        format!("--state-dir={}", dir.join("nri-plugins-state").display()),
        format!("--pid-file={}", dir.join("nri-plugins.pid").display()),
    ];
    start_external(bin, &args, ctd, dir)
}

/// Starts an NRI plugin that is not kunpeng-tap with `--nri-socket` and `args`, logging to
/// `nri-plugins.log`, and waits until containerd has synchronized it.
fn start_external(
    bin: &Path,
    args: &[String],
    ctd: &Containerd,
    dir: &Path,
) -> Result<ExternalPlugin> {
    // containerd 1.7 logs `plugin "<name>" connected` once it has synchronized a plugin.
    const CONNECTED: &str = " connected\"";
    let before = ctd_log_count(ctd, CONNECTED);
    let mut all = vec![format!("--nri-socket={}", ctd.nri_socket().display())];
    all.extend_from_slice(args);
    let registered = || ctd_log_count(ctd, CONNECTED) > before;
    ExternalPlugin::start(bin, &all, dir, (60, registered))
}

fn ctd_log_count(ctd: &Containerd, needle: &str) -> usize {
    std::fs::read_to_string(ctd.log_path())
        .map(|s| s.matches(needle).count())
        .unwrap_or(0)
}

/// Mean seconds per observation of every histogram series of the agent's /metrics.
fn agent_means(text: &str) -> BTreeMap<String, (f64, u64)> {
    let mut sums = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        for (suffix, map) in [("_sum{", &mut sums), ("_count{", &mut counts)] {
            if let Some(pos) = series.find(suffix) {
                let key = format!("{}{}", &series[..pos], &series[pos + suffix.len() - 1..]);
                if let Ok(v) = value.parse::<f64>() {
                    map.insert(key, v);
                }
            }
        }
    }
    sums.into_iter()
        .filter_map(|(k, s)| {
            let n = *counts.get(&k)?;
            (n > 0.0).then(|| (k, (s / n, n as u64)))
        })
        .collect()
}

/// The binaries the setups run.
struct Bins {
    agent: Option<PathBuf>,
    noop_rs: Option<PathBuf>,
    relay: Option<PathBuf>,
}

async fn run_setup(setup: char, args: &Args, bins: &Bins) -> Result<Samples> {
    remove_cgroup_tree();
    let dir = util::temp_dir("tap-sp")?;
    let _rm = RmDir(dir.clone());
    let ctd = Containerd::start(ContainerdOptions::default())?;
    let mut agent = None;
    let mut external = None;
    let socket = match setup {
        'a' => ctd.cri_socket(),
        'b' => {
            let bin = bins.agent.as_deref().context("no agent binary")?;
            let args = bench_agent_args(&ctd.nri_socket(), FIXTURE, &dir.join("state"));
            agent = Some(start_agent(bin, &args, &dir)?);
            ctd.cri_socket()
        }
        'c' => {
            let bin = bins.agent.as_deref().context("no agent binary")?;
            let proxy = dir.join("cri.sock");
            let mut args = ctd.cri_proxy_agent_args(&proxy, Some(FIXTURE), &dir.join("state"));
            args.push("--resource-policy=topology-aware".into());
            agent = Some(start_agent(bin, &args, &dir)?);
            proxy
        }
        'd' => {
            external = Some(start_nri_plugins(&args.nri_plugins, &ctd, &dir)?);
            ctd.cri_socket()
        }
        'e' => {
            external = Some(start_external(&args.nri_noop, &[], &ctd, &dir)?);
            ctd.cri_socket()
        }
        'f' => {
            let bin = bins.noop_rs.as_deref().context("no tap-nri-noop binary")?;
            let name = ["--name=noop-rs".to_string()];
            external = Some(start_external(bin, &name, &ctd, &dir)?);
            ensure!(
                ctd_log_count(&ctd, r#"\"10-noop-rs\" connected"#) == 1,
                "containerd did not log tap-nri-noop's registration"
            );
            ctd.cri_socket()
        }
        'g' => {
            let bin = bins.relay.as_deref().context("no tap-cri-relay binary")?;
            let relay = dir.join("relay.sock");
            external = Some(start_relay(bin, &relay, &ctd, &dir)?);
            relay
        }
        _ => bail!("unknown setup {setup}"),
    };
    let plugin_pid = agent
        .as_ref()
        .and_then(TapAgent::pid)
        .or_else(|| external.as_ref().map(|e| e.child.id()));
    let plugged = matches!(setup, 'b' | 'c' | 'd');
    let res = measure(
        &socket,
        args,
        agent.as_ref(),
        plugin_pid,
        ctd.pid(),
        plugged,
    )
    .await;
    if res.is_err() {
        eprintln!("--- containerd log\n{}", ctd.log_tail(30));
        if let Some(a) = &agent {
            eprintln!("--- agent log\n{}", a.log_tail(30));
        }
    }
    // The plugins end first: what they print when they end is in the logs kept.
    drop(agent);
    drop(external);
    if let Some(keep) = &args.keep_logs {
        std::fs::create_dir_all(keep)?;
        for f in ["agent.log", "nri-plugins.log"] {
            let _ = std::fs::copy(dir.join(f), keep.join(format!("{setup}-{f}")));
        }
        let _ = std::fs::copy(ctd.log_path(), keep.join(format!("{setup}-containerd.log")));
    }
    drop(ctd);
    remove_cgroup_tree();
    let (log, made) = (dir.join("nri-plugins.log"), args.warmup + args.containers);
    match setup {
        'f' if res.is_ok() => check_calls(&log, "tap-nri-noop", &["create", "post_start"], made)?,
        'g' if res.is_ok() => check_calls(&log, "tap-cri-relay", &["create", "start"], made)?,
        _ => {}
    }
    res
}

/// Every container of the run went through the no-op plugin (f) or the relay (g): the line
/// `<tool> calls: key=N ...` it printed when it ended counts each of `keys` once per container
/// (`containers`), so these rows cannot measure a run without them.
fn check_calls(log: &Path, tool: &str, keys: &[&str], containers: usize) -> Result<()> {
    let text = std::fs::read_to_string(log)?;
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{tool} calls:")))
        .with_context(|| format!("{tool} printed no calls:\n{text}"))?;
    let count = |key: &str| {
        line.split_whitespace().find_map(|w| {
            w.strip_prefix(key)?
                .strip_prefix('=')?
                .parse::<usize>()
                .ok()
        })
    };
    for key in keys {
        ensure!(
            count(key) == Some(containers),
            "{tool} counted {key} {:?} times, not {containers}: {line}",
            count(key)
        );
    }
    Ok(())
}

/// Starts the pass-through relay on `listen` in front of containerd's CRI socket; returns
/// once the socket is there.
fn start_relay(bin: &Path, listen: &Path, ctd: &Containerd, dir: &Path) -> Result<ExternalPlugin> {
    let args = [
        format!("--listen={}", listen.display()),
        format!("--upstream={}", ctd.cri_socket().display()),
    ];
    ExternalPlugin::start(bin, &args, dir, (30, || listen.exists()))
}

fn start_agent(bin: &Path, args: &[String], dir: &Path) -> Result<TapAgent> {
    TapAgent::start_binary(bin, args, &dir.join("agent.log"))
}

async fn measure(
    socket: &Path,
    args: &Args,
    agent: Option<&TapAgent>,
    plugin_pid: Option<u32>,
    ctd_pid: Option<u32>,
    plugged: bool,
) -> Result<Samples> {
    let mut cri = Cri::connect(socket).await?;
    let mut sandboxes = Vec::new();
    for (pod, _) in pods() {
        sandboxes.push(cri.run_pod(&pod).await?);
    }
    let mut s = Samples {
        loads: vec![load()],
        ..Default::default()
    };
    let total = args.warmup + args.containers;
    let mut ids = Vec::with_capacity(total);
    let meter = plugin_pid.map(|p| CpuMeter::for_pid(p, &format!("tap-start-path-{p}")));
    s.precise_cpu = meter.as_ref().is_some_and(CpuMeter::precise);
    let mut cpu0 = (None, Duration::ZERO);
    let mut phase0 = Instant::now();
    for i in 0..total {
        if i == args.warmup {
            (s.agent_idle_cpu, s.idle_wall) = idle_cpu(meter.as_ref(), args.idle).await;
            cpu0 = (meter.as_ref().map(CpuMeter::read), cpu_time(ctd_pid));
            phase0 = Instant::now();
        }
        let (pod, spec) = container(i);
        let req = cri.create_request(&sandboxes[pod], &spec)?;
        let t0 = Instant::now();
        let id = cri
            .raw()
            .create_container(req)
            .await
            .with_context(|| format!("CreateContainer {i}"))?
            .into_inner()
            .container_id;
        let t1 = Instant::now();
        cri.start_container(&id).await?;
        let t2 = Instant::now();
        if i >= args.warmup {
            s.create.push(t1 - t0);
            s.start.push(t2 - t1);
            s.both.push(t2 - t0);
            if pod == 3 {
                s.both_exclusive.push(t2 - t0);
            } else {
                s.both_shared.push(t2 - t0);
            }
        }
        ids.push(id);
    }
    s.phase_wall = phase0.elapsed();
    s.agent_cpu = cpu_since(meter.as_ref(), cpu0.0.as_ref());
    s.containerd_cpu = cpu_time(ctd_pid).saturating_sub(cpu0.1);
    s.cpu_containers = u32::try_from(args.containers).unwrap_or(u32::MAX);
    s.loads.push(load());
    if let Some(b) = Summary::of(&s.both) {
        s.per_run.push((b.p50, b.p99));
    }
    if let Some(a) = agent {
        // Every container went through the plugin: one placement each, none failed open.
        let m = a.metrics()?;
        let placed: f64 = m
            .lines()
            .filter(|l| l.starts_with("tap_placements_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        ensure!(
            placed as usize == total,
            "the agent placed {placed} of {total} containers:\n{}",
            a.log_tail(20)
        );
        s.agent_means = agent_means(&m);
    }
    if plugged {
        let last = ids.last().context("no container")?;
        ensure!(
            !cri.spec_cpuset(last).await?.is_empty(),
            "the last container has no cpuset: the plugin did not adjust it"
        );
    }
    for id in &ids {
        let t0 = Instant::now();
        cri.stop_container(id).await?;
        cri.remove_container(id).await?;
        s.stop_remove.push(t0.elapsed());
    }
    cri.remove_all_pods().await?;
    Ok(s)
}

/// `given`, or the release build of `package`'s `bin` when none is given.
fn binary(given: &Option<PathBuf>, package: &str, bin: &str) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.clone()),
        None => util::cargo_bin_profile(package, bin, true),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.containers > 0 && args.rounds > 0, "nothing to measure");
    tap_e2e::containerd::check_installed()?;
    let needs = |setups: &[char]| args.setups.iter().any(|s| setups.contains(s));
    let bins = Bins {
        agent: match needs(&['b', 'c']) {
            true => Some(binary(&args.agent, "node-agent", "kunpeng-tap")?),
            false => None,
        },
        noop_rs: match needs(&['f']) {
            true => Some(binary(&args.nri_noop_rs, "tap-e2e", "tap-nri-noop")?),
            false => None,
        },
        relay: match needs(&['g']) {
            true => Some(binary(&args.cri_relay, "tap-e2e", "tap-cri-relay")?),
            false => None,
        },
    };
    let mut setups = Vec::new();
    let mut skipped = Vec::new();
    for s in &args.setups {
        match s {
            'd' if !args.nri_plugins.exists() => skipped.push((
                'd',
                format!(
                    "{} is absent; hack/e2e/setup-nri-plugins.sh builds it where the Go module \
                     proxy serves all of it (docs/design/start-path.md says why it does not today)",
                    args.nri_plugins.display()
                ),
            )),
            'e' if !args.nri_noop.exists() => skipped.push((
                'e',
                format!(
                    "{} is absent; bash hack/e2e/setup-nri-noop.sh builds it",
                    args.nri_noop.display()
                ),
            )),
            'a' | 'b' | 'c' | 'd' | 'e' | 'f' | 'g' => setups.push(*s),
            other => bail!("unknown setup {other:?} (a, b, c, d, e, f or g)"),
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!(
        "host: {} CPUs, load {} at start; agent {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load(),
        bins.agent
            .as_ref()
            .map_or("-".into(), |p| p.display().to_string())
    );
    let mut all: BTreeMap<char, Samples> = BTreeMap::new();
    for round in 0..args.rounds {
        // Each round starts one setup later (a b c, b c a, c a b, ...): no setup always runs
        // first, when the containerd image cache and the machine are in a given state.
        let mut order = setups.clone();
        if !order.is_empty() {
            let k = round % order.len();
            order.rotate_left(k);
        }
        for &s in &order {
            let t = Instant::now();
            let r = rt.block_on(run_setup(s, &args, &bins))?;
            let both = Summary::of(&r.both);
            eprintln!(
                "round {} {}: p50 {} p99 {} ms ({:.0?})",
                round + 1,
                setup_name(s),
                both.map_or("-".into(), |b| ms(b.p50)),
                both.map_or("-".into(), |b| ms(b.p99)),
                t.elapsed()
            );
            all.entry(s).or_default().extend(r);
        }
    }
    print_report(&args, &all, &skipped);
    Ok(())
}
