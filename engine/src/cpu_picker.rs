//! The shared exclusive-CPU picker: which `n` CPUs of a pool a container gets for itself.
//! Policies call it; it reads the state through a [`StateView`] and decides nothing else.

use crate::cpuset::CpuSet;
use crate::request::CoreGrain;
use crate::state::StateView;
use crate::topology::{PoolId, Topology};

/// A core with a free CPU, as the picker ranks it, packed in one word so that ranking the
/// cores of a socket or a machine sorts plain integers: from the top bit down, whether the
/// core is split (not every CPU free), the free CPUs of its packing group (its cluster, else
/// its NUMA node), its first CPU (the tie-break) and its index in [`Topology::cores`], 21 bits
/// each (saturated: no machine has two million CPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FreeCore(u64);

const FIELD: u64 = (1 << 21) - 1;
const SPLIT: u64 = 1 << 63;

impl FreeCore {
    fn new(whole: bool, group_free: usize, first: usize, index: usize) -> FreeCore {
        let f = |v: usize| u64::try_from(v).unwrap_or(FIELD).min(FIELD);
        let split = if whole { 0 } else { SPLIT };
        FreeCore(split | f(group_free) << 42 | f(first) << 21 | f(index))
    }

    fn whole(self) -> bool {
        self.0 & SPLIT == 0
    }

    fn index(self) -> usize {
        // 21 bits fit any usize this code runs on.
        (self.0 & FIELD) as usize
    }

    /// The same core ranked split cores first (the remainder's order).
    fn split_first(self) -> u64 {
        self.0 ^ SPLIT
    }
}

/// Free CPUs (those of `avail`) per core, per cluster and per NUMA node (indices into
/// [`Topology::cores`], [`Topology::clusters`] and [`Topology::nodes`]), in one vector.
struct FreeCounts {
    counts: Vec<u16>,
    clusters_at: usize,
    nodes_at: usize,
}

impl FreeCounts {
    /// One pass over the free CPUs (a few per core) rather than intersecting every core and
    /// cluster of the machine with `avail`: an exclusive grant's decision visits only what
    /// is free. NUMA nodes are few: intersected.
    fn of(topo: &Topology, avail: &CpuSet) -> FreeCounts {
        let clusters_at = topo.cores.len();
        let nodes_at = clusters_at + topo.clusters.len();
        let mut counts = vec![0u16; nodes_at + topo.nodes.len()];
        for cpu in avail.iter() {
            if let Some(c) = topo.core_of_cpu(cpu) {
                counts[c] = counts[c].saturating_add(1);
            }
            if let Some(c) = topo.cluster_of_cpu(cpu) {
                counts[clusters_at + c] = counts[clusters_at + c].saturating_add(1);
            }
        }
        for (i, n) in topo.nodes.iter().enumerate() {
            counts[nodes_at + i] =
                u16::try_from(n.cpus.intersection(avail).len()).unwrap_or(u16::MAX);
        }
        FreeCounts {
            counts,
            clusters_at,
            nodes_at,
        }
    }

    fn per_core(&self) -> &[u16] {
        &self.counts[..self.clusters_at]
    }

    fn cluster(&self, i: usize) -> usize {
        usize::from(self.counts[self.clusters_at + i])
    }

    fn node(&self, i: usize) -> usize {
        usize::from(self.counts[self.nodes_at + i])
    }
}

/// The cores with a free CPU (`free_in[core] > 0`), ranked by the picker's figures;
/// `group_of(first cpu, core size)` gives a core's group figure.
fn free_cores(
    topo: &Topology,
    free_in: &[u16],
    group_of: impl Fn(usize, usize) -> usize,
) -> Vec<FreeCore> {
    let mut cores = Vec::with_capacity(free_in.iter().filter(|&&k| k > 0).count());
    for (index, &k) in free_in.iter().enumerate().filter(|(_, &k)| k > 0) {
        let core = &topo.cores[index];
        let (len, first) = (topo.core_size(index), core.first().unwrap_or(0));
        cores.push(FreeCore::new(
            usize::from(k) == len,
            group_of(first, len),
            first,
            index,
        ));
    }
    cores
}

/// Takes `n` exclusive CPUs from pool `id`: whole free cores first, packed into the cluster (or
/// NUMA node) with the fewest free CPUs; with [`CoreGrain::Threads`] a remainder smaller than a
/// core comes from an already split core first, with [`CoreGrain::WholeCores`] there is none
/// (whole cores or nothing), and [`CoreGrain::SiblingPair`] takes two hyperthreads of one core.
/// CPUs whose taking would leave a pool's shared containers fewer CPUs than they request are
/// passed over while others can be taken ([`Keep::Requests`]); where no pick keeps every
/// such pool whole, the packed pick that leaves each at least one CPU is taken. `None` when
/// the pool cannot give `n` CPUs without leaving a pool that has shared containers with no
/// CPU, or the machine with no shared CPU at all.
pub fn pick_exclusive(e: &StateView<'_>, id: PoolId, n: usize, grain: CoreGrain) -> Option<CpuSet> {
    let topo = e.topology();
    let pool = &topo.pools[id];
    let avail = e.shared_cpus(&pool.cpus);
    if n == 0 || avail.len() < n {
        return None;
    }
    // Free CPUs per core and per packing group (the core's cluster, else its NUMA node),
    // counted in one pass over the free CPUs; looked up per core.
    let free = FreeCounts::of(topo, &avail);
    let group_of = |first: usize, core_len: usize| -> usize {
        match topo.cluster_of_cpu(first) {
            Some(cl) if topo.cluster_size(cl) > core_len => free.cluster(cl),
            _ => topo
                .node_index_of_cpu(first)
                .map(|i| free.node(i))
                .unwrap_or(0),
        }
    };
    let mut cores = free_cores(topo, free.per_core(), group_of);
    let mut guards = guards(e, id, &avail);
    // Whole cores, packed.
    cores.sort_unstable();
    let free_in = free.per_core();
    let ranked = Ranked {
        cores: &cores,
        free_in,
    };
    pick(topo, &avail, ranked, n, grain, &mut guards, Keep::Requests)
        .or_else(|| pick(topo, &avail, ranked, n, grain, &mut guards, Keep::OneCpu))
}

/// How many shared CPUs a guarded set must keep after a pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// As many as the shared requests charged to it need (never more than it has), at least
    /// one: a grant does not squeeze the shared containers of one pool onto fewer CPUs than
    /// they requested while other CPUs could be taken instead.
    Requests,
    /// One CPU (the fallback when no pick keeps the requests whole).
    OneCpu,
}

/// A set of CPUs whose shared ones an exclusive pick must not empty, how many of them are
/// shared, and how many its shared requests need. A pick takes only shared CPUs, so whether it
/// takes one of the guard's is a lookup in `cpus`.
struct Guard<'t> {
    cpus: &'t CpuSet,
    len: usize,
    needs: usize,
    /// What the pass under way may still take (see [`Budget`]).
    room: usize,
}

impl Guard<'_> {
    /// How many of its CPUs a pick may take.
    fn allowance(&self, keep: Keep) -> usize {
        let keeps = match keep {
            Keep::OneCpu => 1,
            Keep::Requests => self.needs.min(self.len).max(1),
        };
        self.len.saturating_sub(keeps)
    }
}

/// What a pick may still take from each guard (its `room`, set for one pass).
struct Budget<'g, 't> {
    guards: &'g mut [Guard<'t>],
    /// Every guard has room for the whole pick: nothing to check.
    ample: bool,
}

impl<'g, 't> Budget<'g, 't> {
    fn new(guards: &'g mut [Guard<'t>], keep: Keep, n: usize) -> Budget<'g, 't> {
        let mut ample = true;
        for g in guards.iter_mut() {
            g.room = g.allowance(keep);
            ample &= g.room >= n;
        }
        Budget { guards, ample }
    }

    /// Whether `cpus` may be taken on top of what was taken so far.
    fn allows(&self, cpus: &CpuSet) -> bool {
        self.ample
            || self
                .guards
                .iter()
                .all(|g| g.cpus.intersection(cpus).len() <= g.room)
    }

    /// Takes `cpus` when [`Budget::allows`] them.
    fn take(&mut self, cpus: &CpuSet) -> bool {
        if self.ample {
            return true;
        }
        if !self.allows(cpus) {
            return false;
        }
        for g in self.guards.iter_mut() {
            g.room -= g.cpus.intersection(cpus).len();
        }
        true
    }
}

/// The guarded sets. Pools and NUMA nodes with shared containers must keep a CPU
/// (topology-aware spans are pools, numa-aware spans are unions of nodes), and a pool with
/// shared requests charged to it or below keeps the CPUs they need where possible: CPUs whose
/// taking would break that are passed over, so packing into the fullest cluster cannot starve
/// a pool while other cores are free. The machine always keeps one shared CPU, shared
/// containers or not (as the kubelet's static policy keeps its shared pool): a container
/// placed later, or one left unadjusted, always has a CPU that is no one's exclusively.
fn guards<'t>(e: &StateView<'t>, id: PoolId, avail: &CpuSet) -> Vec<Guard<'t>> {
    let topo = e.topology();
    let mut guards: Vec<Guard<'t>> = Vec::with_capacity(topo.pools.len() + topo.nodes.len() + 1);
    guards.push(Guard {
        cpus: &topo.online,
        len: e.shared_cpus(&topo.online).len(),
        needs: 1,
        room: 0,
    });
    // The pools a pick from `id` can touch: `id`, its ancestors and the pools below it.
    guards.extend(topo.ancestors(id).skip(1).filter_map(|a| pool_guard(e, a)));
    guard_below(e, id, &mut guards);
    guards.extend(
        topo.nodes
            .iter()
            .zip(e.node_load())
            .filter(|(n, l)| l.shared > 0 && n.cpus.intersects(avail))
            .map(|(n, _)| Guard {
                cpus: &n.cpus,
                len: e.shared_cpus(&n.cpus).len(),
                needs: 1,
                room: 0,
            }),
    );
    guards
}

/// The guards of pool `id` and of the pools below it (the pool tree is a few levels deep).
fn guard_below<'t>(e: &StateView<'t>, id: PoolId, out: &mut Vec<Guard<'t>>) {
    out.extend(pool_guard(e, id));
    for c in &e.topology().pools[id].children {
        guard_below(e, *c, out);
    }
}

/// The guard of pool `id`, when it has shared containers or shared requests.
fn pool_guard<'t>(e: &StateView<'t>, id: PoolId) -> Option<Guard<'t>> {
    let load = e.pool_load(id);
    let shared_request = load
        .request_milli
        .saturating_sub(u64::from(load.exclusive_cpus).saturating_mul(1000));
    if load.shared_containers == 0 && shared_request == 0 {
        return None;
    }
    // Its shared CPUs: the usable ones less those taken (`taken_cpus` counts them).
    let len = (e.capacity_milli(id) / 1000).saturating_sub(u64::from(load.taken_cpus));
    Some(Guard {
        cpus: &e.topology().pools[id].cpus,
        len: usize::try_from(len).unwrap_or(usize::MAX),
        needs: usize::try_from(shared_request.div_ceil(1000)).unwrap_or(usize::MAX),
        room: 0,
    })
}

/// The cores in ranking order, and the free CPUs of every core.
#[derive(Clone, Copy)]
struct Ranked<'a> {
    cores: &'a [FreeCore],
    free_in: &'a [u16],
}

impl Ranked<'_> {
    fn free(&self, c: FreeCore) -> usize {
        self.free_in.get(c.index()).map_or(0, |k| usize::from(*k))
    }
}

/// The pick itself over the ranked `cores` (see [`pick_exclusive`]), keeping every guard.
fn pick(
    topo: &Topology,
    avail: &CpuSet,
    ranked: Ranked<'_>,
    n: usize,
    grain: CoreGrain,
    guards: &mut [Guard<'_>],
    keep: Keep,
) -> Option<CpuSet> {
    let mut budget = Budget::new(guards, keep, n);
    if grain == CoreGrain::SiblingPair {
        // Two threads of one core: the first core (whole ones first, packed) with two free.
        return ranked
            .cores
            .iter()
            .filter(|c| n == 2 && ranked.free(**c) >= 2)
            .map(|c| {
                let mut pair = CpuSet::new();
                for cpu in topo.cores[c.index()].intersection(avail).iter().take(2) {
                    pair.insert(cpu);
                }
                pair
            })
            .find(|pair| budget.allows(pair));
    }
    // `taken` counts the CPUs of `picked` (no count of a 1,024-bit set per core).
    let (mut picked, mut taken) = (CpuSet::new(), 0usize);
    for &c in ranked.cores {
        let need = n - taken;
        if need == 0 {
            break;
        }
        let free = ranked.free(c);
        if c.whole() && free <= need {
            let core = &topo.cores[c.index()];
            if budget.take(core) {
                picked = picked.union(core);
                taken += free;
            }
        }
    }
    // Remainder: split cores first, then whole ones (not with whole cores only).
    if taken < n && grain == CoreGrain::Threads {
        let mut split_first = ranked.cores.to_vec();
        split_first.sort_unstable_by_key(|c| c.split_first());
        for c in &split_first {
            let free = topo.cores[c.index()].intersection(avail);
            for cpu in free.difference(&picked).iter() {
                if taken == n {
                    break;
                }
                let mut one = CpuSet::new();
                one.insert(cpu);
                if budget.take(&one) {
                    picked.insert(cpu);
                    taken += 1;
                }
            }
        }
    }
    if taken != n {
        return None;
    }
    Some(picked)
}
