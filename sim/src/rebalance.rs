//! `tap-sim --rebalance`: usage-aware rebalancing on generated traces. The engine
//! places the trace's containers as in the main table; every `round_s` simulated seconds a
//! sampling round measures each live container's usage ([`UsageModel`]) and, with the
//! rebalancer on, applies the moves [`Rebalancer::plan`] returns through
//! [`Engine::relocate`], as the agent's convergence loop would.
//!
//! Usage imbalance, the figure judged: per NUMA node, the measured usage of the engine's
//! shared grants (exclusive and reserved grants left out, as the rebalancer leaves them out; a
//! container the engine refused runs everywhere and is left out too), spread over the nodes of
//! its cpuset in proportion to its CPUs there, a container's demand bounded by its cpuset and
//! a node's by its shared CPUs (`Run::measure`); max/mean over the nodes with CPUs, per
//! round in the measured window (rounds are evenly spaced, so their mean is the time-weighted
//! mean).

use crate::sim::{container_request, Machine};
use crate::trace::Trace;
use crate::usage::UsageModel;
use std::collections::{BTreeMap, HashMap};
use tap_engine::engine::Outcome;
use tap_engine::{Engine, EngineConfig, Qos, RebalanceConfig, Rebalancer, UsageSample};

/// What the agent is taken to measure of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// What it would use: its usage plus its time waiting for a CPU (from `cpu.pressure` or
    /// schedstat), bounded by its cpuset only.
    Demand,
    /// What it got: on a node whose shared CPUs are oversubscribed, every container gets the
    /// same share of its demand (the CPU time `cpu.stat` reports); the excess is invisible.
    Contended,
}

/// How the rounds run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setup {
    pub round_s: f64,
    pub measure: Measure,
    pub model: UsageModel,
    /// The rebalancer's configuration; `None`: no rebalancing (measure only).
    pub rebalance: Option<RebalanceConfig>,
}

/// What one run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRun {
    /// (time in s, usage imbalance) of every round in the measured window.
    pub rounds: Vec<(f64, f64)>,
    /// The same, of usage per shared CPU.
    pub rounds_per_cpu: Vec<(f64, f64)>,
    /// Moves made in the window, and refused by the engine (0 expected: plans fit).
    pub moves: usize,
    pub refused_moves: usize,
    /// Cpuset updates of containers other than the moved one, caused by moves (0 expected).
    pub neighbour_updates: usize,
    /// Live containers times hours, over the window.
    pub container_hours: f64,
    /// Most moves of any one container, and containers moved at least once (whole run).
    pub max_moves_one: usize,
    pub moved_containers: usize,
    pub containers: usize,
    /// Share of the Guaranteed and Burstable containers placed within one NUMA node.
    pub one_numa_not_be: f64,
}

/// Which usage imbalance figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    Usage,
    UsagePerSharedCpu,
}

impl UsageRun {
    fn series(&self, f: Figure) -> &[(f64, f64)] {
        match f {
            Figure::Usage => &self.rounds,
            Figure::UsagePerSharedCpu => &self.rounds_per_cpu,
        }
    }

    /// Mean over the rounds (time-weighted: rounds are evenly spaced).
    pub fn mean(&self, f: Figure) -> f64 {
        let v = self.series(f);
        v.iter().map(|r| r.1).sum::<f64>() / v.len().max(1) as f64
    }

    /// 95th percentile over the rounds (nearest rank).
    pub fn p95(&self, f: Figure) -> f64 {
        let mut v: Vec<f64> = self.series(f).iter().map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        let rank = ((0.95 * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
        v.get(rank - 1).copied().unwrap_or(0.0)
    }

    pub fn moves_per_container_hour(&self) -> f64 {
        if self.container_hours > 0.0 {
            self.moves as f64 / self.container_hours
        } else {
            0.0
        }
    }
}

/// A live container: what its usage is drawn from.
struct Live {
    key: u64,
    qos: Qos,
    request: u64,
    limit: Option<u64>,
    arrival: f64,
}

/// The run's moving parts.
struct Run<'a> {
    m: &'a Machine,
    setup: &'a Setup,
    engine: Engine,
    rebalancer: Option<Rebalancer>,
    live: BTreeMap<String, Live>,
    moved: HashMap<String, usize>,
    out: UsageRun,
    window: (f64, f64),
}

/// Replays `trace` with the engine under `cfg`, sampling usage every round (and rebalancing
/// when `setup` says so).
pub fn simulate_usage(m: &Machine, trace: &Trace, cfg: &EngineConfig, setup: &Setup) -> UsageRun {
    let mut events: Vec<(f64, bool, usize)> = Vec::with_capacity(trace.pods.len() * 2);
    for (i, p) in trace.pods.iter().enumerate() {
        events.push((p.arrival_s, true, i));
        if let Some(d) = p.departure_s {
            events.push((d, false, i));
        }
    }
    // Departures before arrivals at the same instant; then trace order (as the main table).
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut run = Run {
        m,
        setup,
        engine: Engine::new(m.topo.clone(), cfg.clone()),
        rebalancer: setup.rebalance.map(Rebalancer::new),
        live: BTreeMap::new(),
        moved: HashMap::new(),
        out: UsageRun::default(),
        window: (trace.warmup_s, trace.last_arrival()),
    };
    let mut gpus = Gpus::new(m);
    let (mut tick, mut next) = (0u64, 0.0f64);
    let mut not_be = (0usize, 0usize);
    for &(time, arrival, pod_ix) in &events {
        while next <= time && next <= run.window.1 {
            run.round(next, tick);
            tick += 1;
            next += setup.round_s;
        }
        let pod = &trace.pods[pod_ix];
        for (ci, c) in pod.containers.iter().enumerate() {
            let id = format!("{}/{}/{}", pod.namespace, pod.name, c.name);
            if !arrival {
                run.live.remove(&id);
                run.engine.remove(&id);
                gpus.free(&id);
                continue;
            }
            let req = container_request(pod, c, &id, gpus.take(&id, c.gpus));
            let qos = req.qos();
            if let Outcome::Placed(p) = run.engine.create(&req) {
                if qos != Qos::BestEffort {
                    not_be.0 += usize::from(m.numa_of(&p.cpus) == 1);
                }
            }
            not_be.1 += usize::from(qos != Qos::BestEffort);
            run.out.containers += 1;
            let key = (pod_ix as u64) << 8 | ci as u64;
            let (request, limit) = (req.cpu_request_milli, req.cpu_limit_milli);
            let live = Live {
                key,
                qos,
                request,
                limit,
                arrival: time,
            };
            run.live.insert(id, live);
        }
    }
    run.out.one_numa_not_be = not_be.0 as f64 / not_be.1.max(1) as f64;
    run.out.max_moves_one = run.moved.values().copied().max().unwrap_or(0);
    run.out.moved_containers = run.moved.len();
    run.out
}

impl Run<'_> {
    /// One sampling round at time `t`: measure, and rebalance when asked.
    fn round(&mut self, t: f64, tick: u64) {
        let demand: Vec<UsageSample> = self
            .live
            .iter()
            .map(|(id, l)| UsageSample {
                id: id.clone(),
                usage_milli: self.setup.model.usage_milli(
                    l.key,
                    l.qos,
                    l.request,
                    l.limit,
                    t - l.arrival,
                ),
            })
            .collect();
        let (samples, per_node, cap) = self.measure(demand);
        let in_window = t >= self.window.0 && t <= self.window.1;
        if in_window {
            if let Some(imb) = imbalance(&per_node, |_| 1.0) {
                self.out.rounds.push((t, imb));
            }
            if let Some(imb) = imbalance(&per_node, |i| cap[i]) {
                self.out.rounds_per_cpu.push((t, imb));
            }
            self.out.container_hours += self.live.len() as f64 * self.setup.round_s / 3600.0;
        }
        let Some(r) = self.rebalancer.as_mut() else {
            return;
        };
        let plan = r.plan(&self.engine, &samples, tick, &|_| false);
        for mv in plan {
            match self.engine.relocate(&mv.id, mv.to) {
                Ok(ups) => {
                    let others = ups.iter().filter(|u| *u.container_id != *mv.id).count();
                    self.out.neighbour_updates += others;
                    self.out.moves += usize::from(in_window);
                    *self.moved.entry(mv.id).or_default() += 1;
                }
                Err(_) => self.out.refused_moves += 1,
            }
        }
        let hint = r.hint(&self.engine, &samples);
        self.engine.set_usage_hint(hint);
    }

    /// What the shared containers are measured to use, given their demand: at most their
    /// cpuset's CPUs, spread over its NUMA nodes in proportion to its CPUs there; with
    /// [`Measure::Contended`], where a node's shared CPUs are oversubscribed, every share on it
    /// is cut in the same proportion. Also the measured usage per NUMA node (nodes without
    /// CPUs: `None`), and its shared CPUs (milli-CPUs). Exclusive and reserved grants run on
    /// their own CPUs and are left out, as are refused containers.
    fn measure(&self, demand: Vec<UsageSample>) -> (Vec<UsageSample>, Vec<Option<f64>>, Vec<f64>) {
        let topo = &self.m.topo;
        let n = topo.nodes.len();
        let cap = self.shared_milli();
        let shares = |g: &tap_engine::grant::Grant, usage: u64| -> Vec<f64> {
            let mut per = vec![0.0f64; n];
            let usage = usage.min(g.cpus.len() as u64 * 1000) as f64;
            for cpu in g.cpus.iter() {
                if let Some(i) = topo.node_index_of_cpu(cpu) {
                    per[i] += usage / g.cpus.len() as f64;
                }
            }
            per
        };
        let shared = |id: &str| {
            self.engine
                .grant(id)
                .filter(|g| !g.is_exclusive() && !g.off_pools() && !g.cpus.is_empty())
        };
        let mut want = vec![0.0f64; n];
        for s in &demand {
            if let Some(g) = shared(&s.id) {
                for (w, x) in want.iter_mut().zip(shares(g, s.usage_milli)) {
                    *w += x;
                }
            }
        }
        let factor: Vec<f64> = (0..n)
            .map(|i| {
                if self.setup.measure == Measure::Contended && want[i] > cap[i] {
                    cap[i] / want[i]
                } else {
                    1.0
                }
            })
            .collect();
        let measured = demand
            .into_iter()
            .filter_map(|s| {
                let per = shares(shared(&s.id)?, s.usage_milli);
                let u: f64 = per.iter().zip(&factor).map(|(x, f)| x * f).sum();
                Some(UsageSample {
                    id: s.id,
                    usage_milli: u.round() as u64,
                })
            })
            .collect();
        let per_node = (0..n)
            .map(|i| (!topo.nodes[i].cpus.is_empty()).then(|| want[i] * factor[i]))
            .collect();
        (measured, per_node, cap)
    }
}

impl Run<'_> {
    /// Each NUMA node's shared CPUs (usable, not exclusive), in milli-CPUs.
    fn shared_milli(&self) -> Vec<f64> {
        let topo = &self.m.topo;
        let mut cap = vec![0.0f64; topo.nodes.len()];
        for cpu in self.engine.shared_cpus(&topo.online).iter() {
            if let Some(i) = topo.node_index_of_cpu(cpu) {
                cap[i] += 1000.0;
            }
        }
        cap
    }
}

/// Max/mean over the NUMA nodes with CPUs of their measured usage, each divided by `per(i)`
/// (1, or the node's shared CPUs; a node without shared CPUs is left out then).
fn imbalance(per_node: &[Option<f64>], per: impl Fn(usize) -> f64) -> Option<f64> {
    let v: Vec<f64> = (0..per_node.len())
        .filter_map(|i| per_node[i].filter(|_| per(i) > 0.0).map(|u| u / per(i)))
        .collect();
    let total: f64 = v.iter().sum();
    if v.len() < 2 || total <= 0.0 {
        return None;
    }
    Some(v.iter().copied().fold(0.0, f64::max) * v.len() as f64 / total)
}

/// GPUs handed out as the main table does: the first free ones in address order, all or none.
struct Gpus {
    node: Vec<Option<u32>>,
    free: Vec<bool>,
    held: HashMap<String, Vec<usize>>,
}

impl Gpus {
    fn new(m: &Machine) -> Gpus {
        Gpus {
            node: m.gpus.iter().map(|g| g.1).collect(),
            free: vec![true; m.gpus.len()],
            held: HashMap::new(),
        }
    }

    /// The NUMA nodes of the GPUs taken for `id` (none when fewer than `n` are free).
    fn take(&mut self, id: &str, n: u32) -> Vec<u32> {
        let free: Vec<usize> = (0..self.free.len()).filter(|i| self.free[*i]).collect();
        if n == 0 || free.len() < n as usize {
            return Vec::new();
        }
        let take = free[..n as usize].to_vec();
        let nodes = take.iter().filter_map(|i| self.node[*i]).collect();
        for i in &take {
            self.free[*i] = false;
        }
        self.held.insert(id.to_string(), take);
        nodes
    }

    fn free(&mut self, id: &str) {
        for i in self.held.remove(id).unwrap_or_default() {
            self.free[i] = true;
        }
    }
}

/// One policy on one trace, without and with the rebalancer.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub label: String,
    pub without: UsageRun,
    pub with: UsageRun,
}

/// The engine policies compared: topology-aware and numa-aware, with the agent's defaults.
pub fn policies() -> Vec<(String, EngineConfig)> {
    let ta = EngineConfig::default();
    let na = EngineConfig {
        policy: tap_engine::PolicyKind::NumaAware,
        ..ta.clone()
    };
    vec![("topology-aware".into(), ta), ("numa-aware".into(), na)]
}

/// Every policy of [`policies`] on `trace`, without and with rebalancing by `cfg`.
pub fn compare(
    m: &Machine,
    trace: &Trace,
    model: UsageModel,
    (round_s, measure): (f64, Measure),
    cfg: RebalanceConfig,
) -> Vec<Pair> {
    let setup = |rebalance| Setup {
        round_s,
        measure,
        model,
        rebalance,
    };
    policies()
        .into_iter()
        .map(|(label, pc)| Pair {
            without: simulate_usage(m, trace, &pc, &setup(None)),
            with: simulate_usage(m, trace, &pc, &setup(Some(cfg))),
            label,
        })
        .collect()
}

#[cfg(test)]
mod tests;
