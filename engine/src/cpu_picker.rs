//! The shared exclusive-CPU picker: which `n` CPUs of a pool a container gets for itself.
//! Policies call it; it reads the state through a [`StateView`] and decides nothing else.

use crate::cpuset::CpuSet;
use crate::request::CoreGrain;
use crate::state::StateView;
use crate::topology::{PoolId, Topology};

/// A core with a free CPU, as the picker ranks it.
#[derive(Debug, Clone, Copy)]
struct FreeCore {
    /// Every CPU of the core is free.
    whole: bool,
    /// Free CPUs in the core's packing group (its cluster, else its NUMA node).
    group_free: usize,
    /// The core's first CPU (free or not): the tie-break.
    first: usize,
    /// Its free CPUs.
    free: usize,
    /// Its index in [`Topology::cores`].
    index: usize,
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
        cores.push(FreeCore {
            whole: usize::from(k) == len,
            group_free: group_of(first, len),
            first,
            free: usize::from(k),
            index,
        });
    }
    cores
}

/// Takes `n` exclusive CPUs from pool `id`: whole free cores first, packed into the cluster (or
/// NUMA node) with the fewest free CPUs; with [`CoreGrain::Threads`] a remainder smaller than a
/// core comes from an already split core first, with [`CoreGrain::WholeCores`] there is none
/// (whole cores or nothing), and [`CoreGrain::SiblingPair`] takes two hyperthreads of one core.
/// `None` when the pool cannot give `n` CPUs so without leaving a pool that has shared
/// containers with no CPU, or the machine with no shared CPU at all.
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
    // Pools and NUMA nodes with shared containers must keep a CPU (topology-aware spans are
    // pools, numa-aware spans are unions of nodes): CPUs whose taking would leave one with none
    // are passed over, so packing into the fullest cluster cannot starve it and fail the whole
    // pool while other cores are free. Whenever the plain packed pick keeps every such set a
    // CPU, this picks exactly the same CPUs.
    // The machine always keeps one shared CPU, shared containers or not (as the kubelet's
    // static policy keeps its shared pool): a container placed later, or one left unadjusted,
    // always has a CPU that is no one's exclusively.
    let mut guarded: Vec<CpuSet> = Vec::with_capacity(topo.pools.len() + topo.nodes.len() + 1);
    guarded.push(e.shared_cpus(&topo.online));
    guarded.extend(
        topo.pools
            .iter()
            .filter(|p| e.pool_load(p.id).shared_containers > 0 && p.cpus.intersects(&avail))
            .map(|p| e.shared_cpus(&p.cpus)),
    );
    guarded.extend(
        topo.nodes
            .iter()
            .zip(e.node_load())
            .filter(|(n, l)| l.shared > 0 && n.cpus.intersects(&avail))
            .map(|(n, _)| e.shared_cpus(&n.cpus)),
    );
    let keeps = |set: &CpuSet| guarded.iter().all(|g| !g.difference(set).is_empty());
    // Whole cores, packed.
    cores.sort_unstable_by_key(|c| (!c.whole, c.group_free, c.first));
    if grain == CoreGrain::SiblingPair {
        // Two threads of one core: the first core (whole ones first, packed) with two free.
        return cores
            .iter()
            .filter(|c| n == 2 && c.free >= 2)
            .map(|c| {
                let mut pair = CpuSet::new();
                for cpu in topo.cores[c.index].intersection(&avail).iter().take(2) {
                    pair.insert(cpu);
                }
                pair
            })
            .find(|pair| keeps(pair));
    }
    let mut picked = CpuSet::new();
    for c in &cores {
        let need = n - picked.len();
        if need == 0 {
            break;
        }
        if c.whole && c.free <= need {
            let next = picked.union(&topo.cores[c.index]);
            if keeps(&next) {
                picked = next;
            }
        }
    }
    // Remainder: split cores first, then whole ones (not with whole cores only).
    if picked.len() < n && grain == CoreGrain::Threads {
        cores.sort_unstable_by_key(|c| (c.whole, c.group_free, c.first));
        for c in &cores {
            let free = topo.cores[c.index].intersection(&avail);
            for cpu in free.difference(&picked).iter() {
                if picked.len() == n {
                    break;
                }
                let mut next = picked;
                next.insert(cpu);
                if keeps(&next) {
                    picked = next;
                }
            }
        }
    }
    if picked.len() != n {
        return None;
    }
    Some(picked)
}
