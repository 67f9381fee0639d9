//! The start-path benchmark's samples and its report (tables on stdout).

use super::Args;
use std::collections::BTreeMap;
use std::time::Duration;
use tap_e2e::cpumeter::Used;
use tap_e2e::stats::{ms, ms_delta, Summary};

pub fn setup_name(s: char) -> &'static str {
    match s {
        'a' => "(a) containerd + NRI, no plugin",
        'b' => "(b) kunpeng-tap, NRI plugin",
        'c' => "(c) kunpeng-tap, CRI proxy",
        'd' => "(d) nri-plugins topology-aware v0.12.1",
        'e' => "(e) no-op NRI plugin (Go, containerd's NRI stub)",
        'f' => "(f) no-op NRI plugin (Rust, kunpeng-tap's own transport)",
        'g' => "(g) pass-through CRI proxy (Rust, kunpeng-tap's own transport)",
        _ => "?",
    }
}

/// One run's samples and what the plugin reported about itself.
#[derive(Default)]
pub struct Samples {
    pub create: Vec<Duration>,
    pub start: Vec<Duration>,
    pub both: Vec<Duration>,
    /// create+start of the Burstable (shared-pool) containers only.
    pub both_shared: Vec<Duration>,
    /// create+start of the Guaranteed (exclusive-CPU) containers only.
    pub both_exclusive: Vec<Duration>,
    /// (p50, p99) of create+start in each run, to show the run-to-run spread.
    pub per_run: Vec<(Duration, Duration)>,
    pub stop_remove: Vec<Duration>,
    /// CPU time (user + system, all threads) spent during the create+start phase, and the
    /// containers of that phase: the plugin's (with its user/system split) and containerd's.
    pub agent_cpu: Used,
    pub containerd_cpu: Duration,
    pub cpu_containers: u32,
    /// Wall time of the create+start phase (to take the background share out of agent_cpu).
    pub phase_wall: Duration,
    /// The agent's CPU time over `idle_wall` with no container starting.
    pub agent_idle_cpu: Duration,
    pub idle_wall: Duration,
    /// The agent's CPU figures are from a cgroup (nanoseconds, ended threads counted).
    pub precise_cpu: bool,
    /// Mean time per call the agent's own metrics show (engine per hook; proxied calls).
    pub agent_means: BTreeMap<String, (f64, u64)>,
    pub loads: Vec<String>,
}

impl Samples {
    pub fn extend(&mut self, o: Samples) {
        self.create.extend(o.create);
        self.start.extend(o.start);
        self.both.extend(o.both);
        self.both_shared.extend(o.both_shared);
        self.both_exclusive.extend(o.both_exclusive);
        self.per_run.extend(o.per_run);
        self.agent_cpu = self.agent_cpu + o.agent_cpu;
        self.containerd_cpu += o.containerd_cpu;
        self.precise_cpu = o.precise_cpu && (self.cpu_containers == 0 || self.precise_cpu);
        self.cpu_containers = self.cpu_containers.saturating_add(o.cpu_containers);
        self.phase_wall += o.phase_wall;
        self.agent_idle_cpu += o.agent_idle_cpu;
        self.idle_wall += o.idle_wall;
        self.stop_remove.extend(o.stop_remove);
        for (k, (mean, n)) in o.agent_means {
            let e = self.agent_means.entry(k).or_insert((0.0, 0));
            let total = e.1 + n;
            if total > 0 {
                e.0 = (e.0 * e.1 as f64 + mean * n as f64) / total as f64;
            }
            e.1 = total;
        }
        self.loads.extend(o.loads);
    }
}

pub fn print_report(args: &Args, all: &BTreeMap<char, Samples>, skipped: &[(char, String)]) {
    let base = all.get(&'a').and_then(|s| Summary::of(&s.both));
    println!(
        "\n## Start path: CreateContainer + StartContainer, {} containers x {} round(s) per setup\n",
        args.containers, args.rounds
    );
    println!(
        "| setup | n | create p50 | create p99 | start p50 | start p99 | create+start p50 | \
         create+start p99 | p99 - (a) | stop+remove p50 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (setup, s) in all {
        let (Some(c), Some(st), Some(b), Some(sr)) = (
            Summary::of(&s.create),
            Summary::of(&s.start),
            Summary::of(&s.both),
            Summary::of(&s.stop_remove),
        ) else {
            continue;
        };
        let delta = match (setup, base) {
            ('a', _) | (_, None) => "".to_string(),
            (_, Some(a)) => ms_delta(a.p99, b.p99),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            setup_name(*setup),
            b.n,
            ms(c.p50),
            ms(c.p99),
            ms(st.p50),
            ms(st.p99),
            ms(b.p50),
            ms(b.p99),
            delta,
            ms(sr.p50),
        );
    }
    println!(
        "\nBy kind of container (create+start, ms; Guaranteed containers take exclusive CPUs, \
         which shrinks the shared pool: the plugin then also updates the cpusets of running \
         containers):\n"
    );
    println!("| setup | Burstable n | p50 | p99 | Guaranteed n | p50 | p99 |");
    println!("|---|---|---|---|---|---|---|");
    for (setup, s) in all {
        if let (Some(sh), Some(ex)) = (Summary::of(&s.both_shared), Summary::of(&s.both_exclusive))
        {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                setup_name(*setup),
                sh.n,
                ms(sh.p50),
                ms(sh.p99),
                ex.n,
                ms(ex.p50),
                ms(ex.p99)
            );
        }
    }
    println!("\nEach run's create+start p50 / p99 (ms), the spread between runs of one setup:");
    for (setup, s) in all {
        let runs: Vec<String> = s
            .per_run
            .iter()
            .map(|(a, b)| format!("{} / {}", ms(*a), ms(*b)))
            .collect();
        println!("  {}: {}", setup_name(*setup), runs.join(", "));
    }
    println!(
        "\nCPU time per measured container during create+start (user + system, all threads; \
         containerd in 10 ms ticks summed over the run, the plugin from a cgroup of its own \
         where one could be made):"
    );
    for (setup, s) in all {
        let n = s.cpu_containers.max(1);
        let plugin = match (setup, s.precise_cpu) {
            ('a', _) => "-".into(),
            (_, true) => format!("{:.3} ms (cgroup)", per_ms(s.agent_cpu.total, n)),
            (_, false) => format!("{} ms (ticks)", ms(s.agent_cpu.total / n)),
        };
        println!(
            "  {}: containerd {} ms, the plugin {plugin}",
            setup_name(*setup),
            ms(s.containerd_cpu / n),
        );
    }
    print_idle_share(all);
    print_split(all);
    println!("\n(milliseconds; p50 - (a) of create+start:");
    if let Some(a) = base {
        for (setup, s) in all.iter().filter(|(k, _)| **k != 'a') {
            if let Some(b) = Summary::of(&s.both) {
                println!("  {}: {}", setup_name(*setup), ms_delta(a.p50, b.p50));
            }
        }
    }
    println!(")");
    for (setup, why) in skipped {
        println!("\n{} skipped: {why}", setup_name(*setup));
    }
    for (setup, s) in all {
        if !s.agent_means.is_empty() {
            println!(
                "\n{} — the agent's own mean time per call:",
                setup_name(*setup)
            );
            for (k, (mean, n)) in &s.agent_means {
                println!("  {k}: {:.1} µs x {n}", mean * 1e6);
            }
        }
        println!(
            "{} load averages (1/5/15 min) at the start and end of each run: {}",
            setup_name(*setup),
            s.loads.join(" -> ")
        );
    }
}

/// The agent's background CPU (measured idle) and what is left per start once the background
/// share of the phase's wall time is taken out.
fn print_idle_share(all: &BTreeMap<char, Samples>) {
    for (setup, s) in all.iter().filter(|(k, _)| **k != 'a') {
        if s.idle_wall.is_zero() {
            continue;
        }
        let rate = s.agent_idle_cpu.as_secs_f64() / s.idle_wall.as_secs_f64();
        let background = s.phase_wall.as_secs_f64() * rate;
        let n = f64::from(s.cpu_containers.max(1));
        let per_start = (s.agent_cpu.total.as_secs_f64() - background).max(0.0) / n;
        println!(
            "  {}: idle {:.2} ms CPU per second ({} ms over {:.0} s); per start without the \
             background share {:.3} ms",
            setup_name(*setup),
            rate * 1e3,
            ms(s.agent_idle_cpu),
            s.idle_wall.as_secs_f64(),
            per_start * 1e3
        );
    }
}

/// Milliseconds of `d` per container of `n`.
fn per_ms(d: Duration, n: u32) -> f64 {
    (d / n.max(1)).as_secs_f64() * 1e3
}

/// The plugin's CPU per container start split into user and system time: the kernel's user and
/// system counts over the phase, scaled to the precise total (`tap_e2e::cpumeter`).
fn print_split(all: &BTreeMap<char, Samples>) {
    println!(
        "\nThe plugin's CPU per container start, user and system (ms; the kernel's split scaled \
         to the total):\n"
    );
    println!("| setup | CPU per start | user | system | user share | split from |");
    println!("|---|---:|---:|---:|---:|---|");
    for (setup, s) in all.iter().filter(|(k, _)| **k != 'a') {
        let (u, n) = (&s.agent_cpu, s.cpu_containers);
        let user_share = match u.user + u.system {
            d if d.is_zero() => "-".to_string(),
            d => format!("{:.0}%", u.user.as_secs_f64() / d.as_secs_f64() * 100.0),
        };
        let from = match u.ticks {
            Some(t) => format!("{t} ticks of 10 ms"),
            None => "µs counters".into(),
        };
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {user_share} | {from} |",
            setup_name(*setup),
            per_ms(u.total, n),
            per_ms(u.user, n),
            per_ms(u.system, n),
        );
    }
}
