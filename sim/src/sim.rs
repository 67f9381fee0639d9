//! Replays a trace against one placement policy and measures what it did.
//!
//! Policies: no pinning (every container on all CPUs), a model of the kubelet's static CPU
//! manager, and the engine (`numa-aware`, `topology-aware` with its options), driven through
//! its public API exactly as the node agent drives it (`Engine::create` / `Engine::remove`).
//!
//! Every policy is judged by the same policy-independent ledger: each container's CPU request
//! and size (limit, or request without a limit) are charged to the NUMA nodes of the cpuset it
//! got (in proportion to its CPUs on each node), and exclusive CPUs are counted per node. From
//! that ledger, before each placement, the simulator asks whether a single-node placement was
//! possible: some NUMA node whose non-exclusive CPUs hold the container's size and whose
//! uncommitted request capacity holds its request. BestEffort containers (no request, no
//! limit, and by design no NUMA affinity) are left out of that question.

use crate::floor::{Composition, ImbalanceProfile};
use crate::kubelet::KubeletStatic;
use crate::trace::Trace;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;
use tap_engine::engine::Outcome;
use tap_engine::topology::RawTopology;
use tap_engine::{ContainerRequest, CpuSet, Engine, EngineConfig, Overrides, Reason, Topology};

/// The machine: topology plus per-CPU socket and die identities for the metrics.
#[derive(Debug, Clone)]
pub struct Machine {
    pub topo: Arc<Topology>,
    /// Socket id of every CPU (index = CPU id; `u32::MAX` where offline).
    cpu_socket: Vec<u32>,
    /// Die identity (socket, die) of every CPU.
    cpu_die: Vec<(u32, u32)>,
    /// Index into `topo.nodes` of every CPU.
    cpu_node_idx: Vec<usize>,
    /// GPUs: (PCI address, NUMA node), in address order.
    pub gpus: Vec<(String, Option<u32>)>,
    pub name: String,
}

impl Machine {
    /// The machine of a fixture in the repository (tests).
    #[cfg(test)]
    pub fn fixture(name: &str) -> Machine {
        let raw = tap_engine::testdata::discover_fixture(name).expect("fixture");
        Machine::new("fixture", &raw).expect("machine")
    }

    pub fn new(name: &str, raw: &RawTopology) -> anyhow::Result<Machine> {
        let topo = Arc::new(Topology::build(raw)?);
        let max = raw.cpus.iter().map(|c| c.id).max().unwrap_or(0);
        let mut cpu_socket = vec![u32::MAX; max + 1];
        let mut cpu_die = vec![(u32::MAX, u32::MAX); max + 1];
        for c in &raw.cpus {
            cpu_socket[c.id] = c.package;
            cpu_die[c.id] = (c.package, c.die);
        }
        let mut cpu_node_idx = vec![usize::MAX; max + 1];
        for (i, n) in topo.nodes.iter().enumerate() {
            for cpu in n.cpus.iter() {
                if cpu <= max {
                    cpu_node_idx[cpu] = i;
                }
            }
        }
        let mut gpus: Vec<(String, Option<u32>)> = topo
            .devices
            .iter()
            .filter(|d| d.is_gpu())
            .map(|d| (d.address.clone(), d.numa_node))
            .collect();
        gpus.sort();
        Ok(Machine {
            topo,
            cpu_socket,
            cpu_die,
            cpu_node_idx,
            gpus,
            name: name.to_string(),
        })
    }

    pub fn cpus(&self) -> usize {
        self.topo.online.len()
    }

    pub fn memory_bytes(&self) -> u64 {
        self.topo.nodes.iter().map(|n| n.memory_bytes).sum()
    }

    fn count<T: Ord + Copy>(&self, cpus: &CpuSet, f: impl Fn(usize) -> T) -> usize {
        cpus.iter().map(f).collect::<BTreeSet<T>>().len()
    }

    pub fn sockets_of(&self, cpus: &CpuSet) -> usize {
        self.count(cpus, |c| {
            self.cpu_socket.get(c).copied().unwrap_or(u32::MAX)
        })
    }

    pub fn dies_of(&self, cpus: &CpuSet) -> usize {
        self.count(cpus, |c| {
            self.cpu_die.get(c).copied().unwrap_or((u32::MAX, u32::MAX))
        })
    }

    pub fn numa_of(&self, cpus: &CpuSet) -> usize {
        self.count(cpus, |c| {
            self.cpu_node_idx.get(c).copied().unwrap_or(usize::MAX)
        })
    }
}

/// A placement policy under test.
#[derive(Debug, Clone)]
pub enum Policy {
    /// No pinning: every container may run on every CPU.
    NoPinning,
    /// The kubelet's static CPU manager (see [`crate::kubelet`]).
    KubeletStatic,
    /// The engine with this configuration.
    Engine(EngineConfig),
}

#[derive(Debug, Clone)]
pub struct PolicyRun {
    pub label: String,
    pub policy: Policy,
}

/// The standard line-up: no pinning, kubelet static, numa-aware, topology-aware (plain, with
/// memory binding, with cluster affinity, with both).
pub fn standard_policies() -> Vec<PolicyRun> {
    use tap_engine::PolicyKind;
    let ta = EngineConfig::default();
    let mut out = vec![
        PolicyRun {
            label: "none (no pinning)".into(),
            policy: Policy::NoPinning,
        },
        PolicyRun {
            label: "kubelet static".into(),
            policy: Policy::KubeletStatic,
        },
        PolicyRun {
            label: "numa-aware".into(),
            policy: Policy::Engine(EngineConfig {
                policy: PolicyKind::NumaAware,
                ..ta.clone()
            }),
        },
        PolicyRun {
            label: "topology-aware".into(),
            policy: Policy::Engine(ta.clone()),
        },
    ];
    out.push(PolicyRun {
        label: "topology-aware, cache affinity off".into(),
        policy: Policy::Engine(EngineConfig {
            cache_affinity: tap_engine::CacheAffinity::Off,
            ..ta.clone()
        }),
    });
    out.push(PolicyRun {
        label: "topology-aware, exclusive-cores threads".into(),
        policy: Policy::Engine(EngineConfig {
            exclusive_cores: tap_engine::CoreGrain::Threads,
            ..ta.clone()
        }),
    });
    out.push(PolicyRun {
        label: "topology-aware +mem".into(),
        policy: Policy::Engine(EngineConfig {
            memory_topology: true,
            ..ta.clone()
        }),
    });
    out.push(PolicyRun {
        label: "topology-aware +cluster".into(),
        policy: Policy::Engine(EngineConfig {
            cluster_affinity: true,
            ..ta.clone()
        }),
    });
    out.push(PolicyRun {
        label: "topology-aware +mem +cluster".into(),
        policy: Policy::Engine(EngineConfig {
            memory_topology: true,
            cluster_affinity: true,
            ..ta
        }),
    });
    out
}

/// What happened to one container.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub id: String,
    pub numa_nodes: usize,
    pub dies: usize,
    pub sockets: usize,
    /// A single-NUMA placement was possible when it arrived (never for BestEffort).
    pub single_possible: bool,
    pub best_effort: bool,
    pub exclusive_cpus: usize,
    /// Exclusive CPUs that are not whole cores: the container shares a core's hyperthreads
    /// with another container.
    pub split_cores: bool,
    /// All its CPUs share one last-level (L3) cache (`None`: the machine reports no L3 groups).
    pub one_l3: Option<bool>,
    /// Whole CPUs a Guaranteed integer-CPU container qualifies for (the kubelet's rule).
    pub exclusive_eligible: Option<usize>,
    pub refused: bool,
    pub fallback: bool,
    /// Decision time of the policy (engine policies only).
    pub latency_ns: Option<u64>,
    /// Some(true) when the container has GPUs and all its CPUs are on its GPUs' NUMA nodes.
    pub gpu_local: Option<bool>,
}

/// Everything measured for one policy over one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcomes {
    pub label: String,
    pub engine: bool,
    pub placed: Vec<Placed>,
    /// Time-weighted mean over the measured window of max/mean requested CPUs per NUMA node.
    pub imbalance: f64,
    /// The same for CPU limits (requests where no limit).
    pub limit_imbalance: f64,
    /// Time-weighted mean overcommit (limits, or requests without limits, over CPUs).
    pub overcommit: f64,
    /// Time-weighted mean of the live containers' CPU requests over the machine's CPUs.
    pub request_util: f64,
    /// Time-weighted mean of the fullest NUMA node's requests over its CPUs.
    pub max_node_util: f64,
    /// Highest number of CPUs held exclusively at once.
    pub exclusive_peak: usize,
    /// Cpuset changes of other, running containers caused by decisions.
    pub updates: usize,
    /// What the most loaded node held over the window ([`simulate_profiled`]; empty
    /// otherwise).
    pub imbalance_profile: ImbalanceProfile,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub containers: usize,
    pub one_numa: f64,
    pub one_die: f64,
    pub one_socket: f64,
    /// Share of Guaranteed and Burstable containers within one NUMA node.
    pub one_numa_not_be: f64,
    /// Share of Guaranteed and Burstable containers within one L3 cache (`None`: no L3 data).
    pub one_l3_not_be: Option<f64>,
    /// Share within one NUMA node among containers for which one was possible.
    pub one_numa_where_fits: f64,
    /// Share of all containers spanning NUMA nodes although one node was possible.
    pub spans_although_fits: f64,
    pub imbalance: f64,
    pub limit_imbalance: f64,
    pub overcommit: f64,
    pub exclusive_grants: usize,
    pub exclusive_cpus: usize,
    pub exclusive_peak: usize,
    /// Guaranteed integer-CPU containers that ended up on shared CPUs.
    pub exclusive_missed: usize,
    /// Exclusive grants that split a core (hyperthreads shared with another container).
    pub exclusive_split: usize,
    pub refused: usize,
    pub fallback: usize,
    pub updates: usize,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub gpu_containers: usize,
    pub gpu_local: usize,
}

fn share(n: usize, d: usize) -> f64 {
    if d == 0 {
        0.0
    } else {
        n as f64 / d as f64
    }
}

/// The `q`-quantile (0..=1) of a sorted slice, nearest-rank.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

impl Outcomes {
    pub fn summary(&self) -> Summary {
        let n = self.placed.len();
        let fits: Vec<&Placed> = self.placed.iter().filter(|p| p.single_possible).collect();
        let mut lat: Vec<u64> = self.placed.iter().filter_map(|p| p.latency_ns).collect();
        lat.sort_unstable();
        let gpu: Vec<bool> = self.placed.iter().filter_map(|p| p.gpu_local).collect();
        Summary {
            containers: n,
            one_numa: share(self.placed.iter().filter(|p| p.numa_nodes == 1).count(), n),
            one_die: share(self.placed.iter().filter(|p| p.dies == 1).count(), n),
            one_socket: share(self.placed.iter().filter(|p| p.sockets == 1).count(), n),
            one_numa_not_be: share(
                self.placed
                    .iter()
                    .filter(|p| !p.best_effort && p.numa_nodes == 1)
                    .count(),
                self.placed.iter().filter(|p| !p.best_effort).count(),
            ),
            one_l3_not_be: self.placed.iter().any(|p| p.one_l3.is_some()).then(|| {
                share(
                    self.placed
                        .iter()
                        .filter(|p| !p.best_effort && p.one_l3 == Some(true))
                        .count(),
                    self.placed.iter().filter(|p| !p.best_effort).count(),
                )
            }),
            one_numa_where_fits: share(
                fits.iter().filter(|p| p.numa_nodes == 1).count(),
                fits.len(),
            ),
            spans_although_fits: share(fits.iter().filter(|p| p.numa_nodes > 1).count(), n),
            imbalance: self.imbalance,
            limit_imbalance: self.limit_imbalance,
            overcommit: self.overcommit,
            exclusive_grants: self.placed.iter().filter(|p| p.exclusive_cpus > 0).count(),
            exclusive_cpus: self.placed.iter().map(|p| p.exclusive_cpus).sum(),
            exclusive_peak: self.exclusive_peak,
            exclusive_missed: self
                .placed
                .iter()
                .filter(|p| p.exclusive_eligible.is_some() && p.exclusive_cpus == 0)
                .count(),
            exclusive_split: self.placed.iter().filter(|p| p.split_cores).count(),
            refused: self.placed.iter().filter(|p| p.refused).count(),
            fallback: self.placed.iter().filter(|p| p.fallback).count(),
            updates: self.updates,
            p50_us: quantile(&lat, 0.5).map(|v| v as f64 / 1000.0),
            p99_us: quantile(&lat, 0.99).map(|v| v as f64 / 1000.0),
            gpu_containers: gpu.len(),
            gpu_local: gpu.iter().filter(|g| **g).count(),
        }
    }
}

/// The policy-independent load ledger per NUMA node.
struct Ledger {
    /// CPUs per node.
    cap: Vec<u64>,
    req: Vec<u64>,
    /// Sizes (limit, or request without a limit) per node.
    lim: Vec<u64>,
    excl: Vec<u64>,
    /// Per container: (node index, request and size charged, exclusive CPUs on that node).
    charges: HashMap<String, Vec<(usize, u64, u64, u64)>>,
    /// Per container: its request, size and whether its CPUs are exclusive.
    meta: HashMap<String, (u64, u64, bool)>,
}

impl Ledger {
    fn new(m: &Machine) -> Ledger {
        let cap: Vec<u64> = m.topo.nodes.iter().map(|n| n.cpus.len() as u64).collect();
        Ledger {
            req: vec![0; cap.len()],
            lim: vec![0; cap.len()],
            excl: vec![0; cap.len()],
            cap,
            charges: HashMap::new(),
            meta: HashMap::new(),
        }
    }

    fn single_possible(&self, request: u64, size: u64) -> bool {
        (0..self.cap.len()).any(|i| {
            self.cap[i].saturating_sub(self.excl[i]) * 1000 >= size
                && (self.cap[i] * 1000).saturating_sub(self.req[i]) >= request
        })
    }

    fn charge(
        &mut self,
        m: &Machine,
        id: &str,
        cpus: &CpuSet,
        (request, size): (u64, u64),
        exclusive: bool,
    ) {
        let mut per: Vec<(usize, u64)> = Vec::new();
        for cpu in cpus.iter() {
            let idx = m.cpu_node_idx.get(cpu).copied().unwrap_or(usize::MAX);
            if idx == usize::MAX {
                continue;
            }
            match per.iter_mut().find(|(i, _)| *i == idx) {
                Some(e) => e.1 += 1,
                None => per.push((idx, 1)),
            }
        }
        let total: u64 = per.iter().map(|p| p.1).sum();
        let mut out = Vec::new();
        let (mut given, mut given_l) = (0, 0);
        for (k, (idx, n)) in per.iter().enumerate() {
            // Proportional split; the last node takes the rounding remainder.
            let split = |v: u64, given: u64| {
                if k + 1 == per.len() {
                    v - given
                } else {
                    v * n / total.max(1)
                }
            };
            let (r, l) = (split(request, given), split(size, given_l));
            given += r;
            given_l += l;
            let ex = if exclusive { *n } else { 0 };
            self.req[*idx] += r;
            self.lim[*idx] += l;
            self.excl[*idx] += ex;
            out.push((*idx, r, l, ex));
        }
        self.charges.insert(id.to_string(), out);
        self.meta.insert(id.to_string(), (request, size, exclusive));
    }

    /// A running container's cpuset changed (exclusive CPUs taken from or returned to its
    /// pool): its request now spreads over the new cpuset.
    fn recharge(&mut self, m: &Machine, id: &str, cpus: &CpuSet) {
        if let Some((request, size, exclusive)) = self.meta.get(id).copied() {
            self.uncharge(id);
            self.charge(m, id, cpus, (request, size), exclusive);
        }
    }

    fn uncharge(&mut self, id: &str) {
        self.meta.remove(id);
        if let Some(v) = self.charges.remove(id) {
            for (idx, r, l, ex) in v {
                self.req[idx] -= r;
                self.lim[idx] -= l;
                self.excl[idx] -= ex;
            }
        }
    }

    /// The node with the most requests, what they are made of, and the mean per node.
    fn most_loaded(&self) -> Option<(Composition, f64)> {
        let (idx, _) = self
            .req
            .iter()
            .enumerate()
            .max_by_key(|(i, r)| (**r, usize::MAX - i))?;
        let mut c = Composition {
            capacity: self.cap[idx].saturating_mul(1000),
            ..Default::default()
        };
        for v in self.charges.values() {
            for &(_, r, _, ex) in v.iter().filter(|e| e.0 == idx) {
                c.add(r, ex, v.len());
            }
        }
        let total: u64 = self.req.iter().sum();
        Some((c, total as f64 / self.req.len() as f64))
    }

    /// Max/mean over NUMA nodes of `load` (requests or sizes).
    fn imbalance(load: &[u64]) -> Option<f64> {
        let total: u64 = load.iter().sum();
        if total == 0 || load.is_empty() {
            return None;
        }
        let mean = total as f64 / load.len() as f64;
        let max = *load.iter().max().unwrap_or(&0) as f64;
        Some(max / mean)
    }
}

/// The request of container `c` of `pod`, as the agent would build it (annotations read the
/// agent's way; the CPU request defaulted as the API server does).
pub fn container_request(
    pod: &crate::trace::PodSpec,
    c: &crate::trace::ContainerSpec,
    id: &str,
    device_nodes: Vec<u32>,
) -> ContainerRequest {
    let annotations: HashMap<String, String> = pod
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let (overrides, _) = Overrides::from_pod(&HashMap::new(), &annotations, &c.name);
    ContainerRequest {
        id: id.to_string(),
        pod_uid: format!("uid-{}", pod.name),
        pod_name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        container_name: c.name.clone(),
        qos: Some(pod.qos.into()),
        cpu_request_milli: c.effective_request(),
        cpu_limit_milli: c.cpu_limit,
        memory_limit_bytes: c.memory_limit,
        device_nodes,
        claims: Vec::new(),
        overrides,
    }
}

enum State {
    None,
    Kubelet(Box<KubeletStatic>),
    Engine(Box<Engine>),
}

struct Event {
    time: f64,
    arrival: bool,
    pod: usize,
}

/// Whether a run works out its [`ImbalanceProfile`]: a walk of every live container per event,
/// between decisions, so off where decisions are timed for their latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profiling {
    Off,
    On,
}

/// Replays `trace` on `machine` under `run`'s policy, timing each decision once.
pub fn simulate(machine: &Machine, trace: &Trace, run: &PolicyRun) -> Outcomes {
    replay(machine, trace, run, 1, Profiling::Off)
}

/// Like [`simulate`], with [`Outcomes::imbalance_profile`] worked out.
pub fn simulate_profiled(machine: &Machine, trace: &Trace, run: &PolicyRun) -> Outcomes {
    replay(machine, trace, run, 1, Profiling::On)
}

/// Like [`simulate`]; each engine decision is timed `latency_repeats` times (the extra times
/// on clones of the engine state, which are then dropped) and the fastest time is kept. With 1
/// the time is that of the real decision alone, including any preemption of the process.
pub fn simulate_with(
    machine: &Machine,
    trace: &Trace,
    run: &PolicyRun,
    latency_repeats: usize,
) -> Outcomes {
    replay(machine, trace, run, latency_repeats, Profiling::Off)
}

fn replay(
    machine: &Machine,
    trace: &Trace,
    run: &PolicyRun,
    latency_repeats: usize,
    profiling: Profiling,
) -> Outcomes {
    let topo = &machine.topo;
    let all = topo.online;
    let mut state = match &run.policy {
        Policy::NoPinning => State::None,
        Policy::KubeletStatic => State::Kubelet(Box::new(KubeletStatic::new(topo.clone()))),
        Policy::Engine(cfg) => State::Engine(Box::new(Engine::new(topo.clone(), cfg.clone()))),
    };
    let mut events: Vec<Event> = Vec::with_capacity(trace.pods.len() * 2);
    for (i, p) in trace.pods.iter().enumerate() {
        events.push(Event {
            time: p.arrival_s,
            arrival: true,
            pod: i,
        });
        if let Some(d) = p.departure_s {
            events.push(Event {
                time: d,
                arrival: false,
                pod: i,
            });
        }
    }
    // Departures before arrivals at the same instant; then trace order.
    events.sort_by(|a, b| {
        a.time
            .total_cmp(&b.time)
            .then(a.arrival.cmp(&b.arrival))
            .then(a.pod.cmp(&b.pod))
    });

    let mut ledger = Ledger::new(machine);
    let mut placed = Vec::new();
    let mut updates = 0usize;
    let mut gpu_free: Vec<bool> = vec![true; machine.gpus.len()];
    let mut gpu_held: HashMap<String, Vec<usize>> = HashMap::new();
    let (w0, w1) = (trace.warmup_s, trace.last_arrival());
    let (mut imb_area, mut oc_area, mut span) = (0.0f64, 0.0f64, 0.0f64);
    let mut lim_imb_area = 0.0f64;
    let mut profile = ImbalanceProfile::default();
    let (mut util_area, mut max_util_area) = (0.0f64, 0.0f64);
    let mut last_t = 0.0f64;
    let mut size_live: u64 = 0;
    let mut sizes: HashMap<String, u64> = HashMap::new();
    let mut excl_now = 0usize;
    let mut excl_peak = 0usize;
    let mut excl_of: HashMap<String, usize> = HashMap::new();
    let mut kubelet_shared: std::collections::HashSet<String> = Default::default();

    for ev in &events {
        // Time-weighted figures over [w0, w1].
        let (a, b) = (last_t.max(w0), ev.time.min(w1));
        if b > a {
            let dt = b - a;
            if let Some(i) = Ledger::imbalance(&ledger.req) {
                imb_area += i * dt;
            }
            if let Some(i) = Ledger::imbalance(&ledger.lim) {
                lim_imb_area += i * dt;
            }
            if profiling == Profiling::On {
                if let Some((c, mean)) = ledger.most_loaded() {
                    profile.observe(&c, mean, dt);
                }
            }
            oc_area += size_live as f64 / (machine.cpus() as f64 * 1000.0) * dt;
            let total: u64 = ledger.req.iter().sum();
            util_area += total as f64 / (machine.cpus() as f64 * 1000.0) * dt;
            let max_util = (0..ledger.cap.len())
                .map(|i| ledger.req[i] as f64 / (ledger.cap[i].max(1) * 1000) as f64)
                .fold(0.0, f64::max);
            max_util_area += max_util * dt;
            span += dt;
        }
        last_t = ev.time;
        let pod = &trace.pods[ev.pod];
        for c in &pod.containers {
            let id = format!("{}/{}/{}", pod.namespace, pod.name, c.name);
            if !ev.arrival {
                ledger.uncharge(&id);
                size_live -= sizes.remove(&id).unwrap_or(0);
                excl_now -= excl_of.remove(&id).unwrap_or(0);
                if let Some(g) = gpu_held.remove(&id) {
                    for i in g {
                        gpu_free[i] = true;
                    }
                }
                match &mut state {
                    State::None => {}
                    State::Kubelet(k) => {
                        kubelet_shared.remove(&id);
                        let n = k.remove(&id);
                        if n > 0 {
                            updates += n;
                            let pool = k.shared_pool();
                            for s in &kubelet_shared {
                                ledger.recharge(machine, s, &pool);
                            }
                        }
                    }
                    State::Engine(e) => {
                        let ups = e.remove(&id);
                        updates += ups.len();
                        for u in &ups {
                            ledger.recharge(machine, u.container_id, u.cpus);
                        }
                    }
                }
                continue;
            }
            let request = c.effective_request();
            let size = crate::gen::size_milli(c).max(request);
            // GPUs: the first free ones in address order, all or nothing.
            let mut device_nodes = Vec::new();
            if c.gpus > 0 {
                let free: Vec<usize> = (0..gpu_free.len()).filter(|i| gpu_free[*i]).collect();
                if free.len() >= c.gpus as usize {
                    let take: Vec<usize> = free[..c.gpus as usize].to_vec();
                    for i in &take {
                        gpu_free[*i] = false;
                        if let Some(n) = machine.gpus[*i].1 {
                            device_nodes.push(n);
                        }
                    }
                    gpu_held.insert(id.clone(), take);
                }
            }
            let req = container_request(pod, c, &id, device_nodes.clone());
            let best_effort = req.qos() == tap_engine::Qos::BestEffort;
            let single_possible = !best_effort && ledger.single_possible(request, size);
            let (mut cpus, mut exclusive, mut refused, mut fallback, mut latency) =
                (all, 0usize, false, false, None);
            match &mut state {
                State::None => {}
                State::Kubelet(k) => match k.create(&req) {
                    Some((set, excl, n_updates)) => {
                        cpus = set;
                        exclusive = if excl { set.len() } else { 0 };
                        updates += n_updates;
                        if excl {
                            let pool = k.shared_pool();
                            for s in &kubelet_shared {
                                ledger.recharge(machine, s, &pool);
                            }
                        }
                    }
                    None => refused = true,
                },
                State::Engine(e) => {
                    let mut best = u64::MAX;
                    for _ in 1..latency_repeats {
                        let mut scratch = (**e).clone();
                        let t0 = Instant::now();
                        let _ = std::hint::black_box(scratch.create(&req));
                        best = best.min(t0.elapsed().as_nanos() as u64);
                    }
                    let t0 = Instant::now();
                    let out = e.create(&req);
                    latency = Some(best.min(t0.elapsed().as_nanos() as u64));
                    match out {
                        Outcome::Placed(p) => {
                            cpus = p.cpus;
                            if p.exclusive {
                                exclusive = p.cpus.len();
                            }
                            fallback = matches!(
                                p.reason,
                                Reason::Fallback | Reason::ForcedLevelUnavailable(_)
                            );
                            updates += p.updates.len();
                            for u in &p.updates {
                                ledger.recharge(machine, u.container_id, u.cpus);
                            }
                        }
                        // Fail open: the container runs unadjusted, on all CPUs.
                        Outcome::Skipped(_) => refused = true,
                    }
                }
            }
            ledger.charge(machine, &id, &cpus, (request, size), exclusive > 0);
            if matches!(state, State::Kubelet(_)) && exclusive == 0 {
                kubelet_shared.insert(id.clone());
            }
            size_live += size;
            sizes.insert(id.clone(), size);
            if exclusive > 0 {
                excl_now += exclusive;
                excl_of.insert(id.clone(), exclusive);
                excl_peak = excl_peak.max(excl_now);
            }
            let gpu_local = (!device_nodes.is_empty()).then(|| {
                let nodes = topo.nodes_of(&cpus);
                let local = nodes.iter().all(|n| device_nodes.contains(&(n as u32)));
                local
            });
            placed.push(Placed {
                id,
                numa_nodes: machine.numa_of(&cpus),
                dies: machine.dies_of(&cpus),
                sockets: machine.sockets_of(&cpus),
                single_possible,
                best_effort,
                exclusive_cpus: exclusive,
                split_cores: exclusive > 0
                    && topo
                        .cores
                        .iter()
                        .any(|c| c.intersects(&cpus) && !c.is_subset(&cpus)),
                one_l3: (!topo.caches.is_empty())
                    .then(|| topo.caches.iter().any(|l| cpus.is_subset(l))),
                exclusive_eligible: req.exclusive_cpus(),
                refused,
                fallback,
                latency_ns: latency,
                gpu_local,
            });
        }
    }
    Outcomes {
        label: run.label.clone(),
        engine: matches!(run.policy, Policy::Engine(_)),
        placed,
        imbalance: if span > 0.0 { imb_area / span } else { 0.0 },
        limit_imbalance: if span > 0.0 { lim_imb_area / span } else { 0.0 },
        overcommit: if span > 0.0 { oc_area / span } else { 0.0 },
        request_util: if span > 0.0 { util_area / span } else { 0.0 },
        max_node_util: if span > 0.0 {
            max_util_area / span
        } else {
            0.0
        },
        exclusive_peak: excl_peak,
        updates,
        imbalance_profile: profile,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Trace;
    use tap_engine::testdata::Shape;

    /// 2 sockets x 1 NUMA node x 4 single-thread cores: CPUs 0-3 on node 0, 4-7 on node 1.
    fn tiny_machine() -> Machine {
        Machine::new("tiny", &Shape::plain(2, 1, 4, 8 << 30).raw()).unwrap()
    }

    /// Four Burstable Pods of request 2 / limit 3 CPUs arriving at t=0..3, all leaving at 10;
    /// the window is [2, 4].
    const TINY: &str = r#"{"name": "tiny", "warmup_s": 2, "pods": [
      {"name": "a", "qos": "Burstable", "arrival_s": 0, "departure_s": 10, "containers": [{"name": "c", "cpu_request": "2", "cpu_limit": "3"}]},
      {"name": "b", "qos": "Burstable", "arrival_s": 1, "departure_s": 10, "containers": [{"name": "c", "cpu_request": "2", "cpu_limit": "3"}]},
      {"name": "c", "qos": "Burstable", "arrival_s": 2, "departure_s": 10, "containers": [{"name": "c", "cpu_request": "2", "cpu_limit": "3"}]},
      {"name": "d", "qos": "Burstable", "arrival_s": 4, "departure_s": 10, "containers": [{"name": "c", "cpu_request": "2", "cpu_limit": "3"}]}
    ]}"#;

    /// `trace` (JSON) replayed on [`tiny_machine`] under `policy`.
    fn on_tiny(trace: &str, policy: Policy, profiling: Profiling) -> Outcomes {
        let run = PolicyRun {
            label: "test".into(),
            policy,
        };
        replay(
            &tiny_machine(),
            &Trace::parse(trace).unwrap(),
            &run,
            1,
            profiling,
        )
    }

    /// One figure of every placed container, in order.
    fn each<T>(o: &Outcomes, figure: impl Fn(&Placed) -> T) -> Vec<T> {
        o.placed.iter().map(figure).collect()
    }

    #[test]
    fn no_pinning_metrics_are_known() {
        let o = on_tiny(TINY, Policy::NoPinning, Profiling::Off);
        let s = o.summary();
        assert_eq!(s.containers, 4);
        // Everything spans both nodes and both sockets.
        assert_eq!((s.one_numa, s.one_socket, s.one_die), (0.0, 0.0, 0.0));
        // Each Pod charges 1 CPU of request to each node. The first three find a node with 2
        // CPUs of request free (4, 3, 2 free); the fourth finds 1 free on each: no single node.
        assert_eq!(
            each(&o, |p| p.single_possible),
            vec![true, true, true, false]
        );
        assert_eq!(s.one_numa_where_fits, 0.0);
        assert_eq!(s.spans_although_fits, 0.75);
        // Even split: perfectly balanced.
        assert!((s.imbalance - 1.0).abs() < 1e-9, "{}", s.imbalance);
        // Window [2, 4]: three Pods of limit 3 live on 8 CPUs -> 9/8.
        assert!((s.overcommit - 9.0 / 8.0).abs() < 1e-9, "{}", s.overcommit);
        assert_eq!((s.refused, s.fallback, s.exclusive_cpus), (0, 0, 0));
        assert_eq!(s.p50_us, None);
    }

    #[test]
    fn topology_aware_metrics_are_known() {
        let o = on_tiny(
            TINY,
            Policy::Engine(EngineConfig::default()),
            Profiling::Off,
        );
        let s = o.summary();
        // Pools: machine > socket0 (node 0), socket1 (node 1).
        // a -> socket0 (tie, lower id); b -> socket1 (only there does the limit fit too);
        // c: both sockets have 2 CPUs of request free, less than its limit of 3, while the
        // machine has 4; the root is the last resort, so c goes to a socket (socket0: tie on
        // free request and limit room, lower id). d: only socket1 has room left.
        assert_eq!(each(&o, |p| p.numa_nodes), vec![1, 1, 1, 1]);
        // Ledger before d: node 0 holds 4, node 1 holds 2 of 4: node 1 still fits.
        assert_eq!(
            each(&o, |p| p.single_possible),
            vec![true, true, true, true]
        );
        assert_eq!((s.one_numa, s.one_socket), (1.0, 1.0));
        assert_eq!((s.one_numa_where_fits, s.spans_although_fits), (1.0, 0.0));
        // Window [2, 4]: node 0 holds a and c (4 CPUs of request, 6 of limit), node 1 holds b
        // (2 and 3): 4/3 by request, 6/4.5 by limit.
        assert!((s.imbalance - 4.0 / 3.0).abs() < 1e-9, "{}", s.imbalance);
        assert!(
            (s.limit_imbalance - 6.0 / 4.5).abs() < 1e-9,
            "{}",
            s.limit_imbalance
        );
        assert_eq!((s.refused, s.fallback), (0, 0));
        assert!(s.p50_us.is_some() && s.p99_us.is_some());
    }

    #[test]
    fn kubelet_static_pins_only_guaranteed_integer() {
        let trace = r#"{"name": "k", "pods": [
          {"name": "g", "qos": "Guaranteed", "arrival_s": 0, "departure_s": 5, "containers": [{"name": "c", "cpu_limit": "2", "memory_limit": "1Gi"}]},
          {"name": "h", "qos": "Guaranteed", "arrival_s": 1, "departure_s": 5, "containers": [{"name": "c", "cpu_limit": "500m", "memory_limit": "1Gi"}]},
          {"name": "b", "qos": "Burstable", "arrival_s": 2, "departure_s": 5, "containers": [{"name": "c", "cpu_request": "1"}]},
          {"name": "big", "qos": "Guaranteed", "arrival_s": 3, "departure_s": 5, "containers": [{"name": "c", "cpu_limit": "6", "memory_limit": "1Gi"}]}
        ]}"#;
        let o = on_tiny(trace, Policy::KubeletStatic, Profiling::Off);
        let s = o.summary();
        assert_eq!(s.exclusive_grants, 1);
        assert_eq!(s.exclusive_cpus, 2);
        assert_eq!(o.placed[0].numa_nodes, 1);
        // The others share the remaining 6 CPUs, on both nodes.
        assert_eq!(o.placed[1].numa_nodes, 2);
        assert_eq!(o.placed[2].numa_nodes, 2);
        // 6 exclusive CPUs would leave the shared pool empty: refused.
        assert!(o.placed[3].refused);
        assert_eq!(s.refused, 1);
        assert_eq!(s.exclusive_peak, 2);
    }

    #[test]
    fn ledger_follows_cpuset_changes_of_running_containers() {
        // b (1 CPU, shared) spreads over all 8 CPUs; g then takes CPUs 0-1 exclusively, so b
        // runs on 2-7: 2/6 of its request on node 0, 4/6 on node 1. Window [2, 3]:
        // node 0 = 2000 + 333, node 1 = 667 -> max/mean = 2333 / 1500.
        let trace = r#"{"name": "k", "warmup_s": 2, "pods": [
          {"name": "b", "qos": "Burstable", "arrival_s": 0, "containers": [{"name": "c", "cpu_request": "1"}]},
          {"name": "g", "qos": "Guaranteed", "arrival_s": 1, "containers": [{"name": "c", "cpu_limit": "2", "memory_limit": "1Gi"}]},
          {"name": "e", "qos": "BestEffort", "arrival_s": 3, "containers": [{"name": "c"}]}
        ]}"#;
        let o = on_tiny(trace, Policy::KubeletStatic, Profiling::Off);
        assert!(
            (o.imbalance - 2333.0 / 1500.0).abs() < 1e-9,
            "{}",
            o.imbalance
        );
        assert_eq!(o.updates, 1);
        assert_eq!(o.imbalance_profile, ImbalanceProfile::default());
        // The profile accounts for the same imbalance; node 0 (2,333 of its 4,000) is never over.
        let f = &on_tiny(trace, Policy::KubeletStatic, Profiling::On).imbalance_profile;
        assert!((f.imbalance() - o.imbalance).abs() < 1e-9, "{f:?}");
        assert_eq!(f.over_share(), 0.0);
    }

    #[test]
    fn the_imbalance_profile_tells_what_the_most_loaded_node_holds() {
        // No pinning: three containers of 3 CPUs of request each spread over both 4-CPU nodes,
        // 4.5 CPUs of request on each: both over their CPUs all the time, all of it shares of
        // two-node cpusets; balanced (1.0).
        let trace = r#"{"name": "p", "warmup_s": 1, "pods": [
          {"name": "a", "qos": "Burstable", "arrival_s": 0, "containers": [{"name": "c", "cpu_request": "3"}]},
          {"name": "b", "qos": "Burstable", "arrival_s": 0.5, "containers": [{"name": "c", "cpu_request": "3"}]},
          {"name": "c", "qos": "Burstable", "arrival_s": 1, "containers": [{"name": "c", "cpu_request": "3"}]},
          {"name": "d", "qos": "BestEffort", "arrival_s": 3, "containers": [{"name": "c"}]}
        ]}"#;
        let o = on_tiny(trace, Policy::NoPinning, Profiling::On);
        let f = &o.imbalance_profile;
        assert!((f.imbalance() - 1.0).abs() < 1e-9 && (o.imbalance - 1.0).abs() < 1e-9);
        assert_eq!(f.over_share(), 1.0);
        assert_eq!(f.composition_over(), ([0.0, 0.0, 4.5, 0.0], 4.0));
        assert_eq!(f.mean_node(), (4.5, 4.5));
    }

    #[test]
    fn best_effort_is_left_out_of_locality_where_one_fits() {
        // A Burstable 1/2 and a BestEffort container: the engine leaves the BestEffort one on
        // all CPUs (both nodes), which counts against "1 NUMA" but not against "1 NUMA where
        // one fits" or the Guaranteed/Burstable share.
        let trace = r#"{"name": "be", "pods": [
          {"name": "b", "qos": "Burstable", "arrival_s": 0, "containers": [{"name": "c", "cpu_request": "1", "cpu_limit": "2"}]},
          {"name": "e", "qos": "BestEffort", "arrival_s": 1, "containers": [{"name": "c"}]}
        ]}"#;
        let o = on_tiny(
            trace,
            Policy::Engine(EngineConfig::default()),
            Profiling::Off,
        );
        assert_eq!(each(&o, |p| p.numa_nodes), vec![1, 2]);
        assert_eq!(each(&o, |p| p.single_possible), vec![true, false]);
        let s = o.summary();
        assert_eq!((s.one_numa, s.one_numa_not_be), (0.5, 1.0));
        assert_eq!(s.one_numa_where_fits, 1.0);
    }

    #[test]
    fn quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[7], 0.99), Some(7));
    }
}
