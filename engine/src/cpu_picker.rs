//! The shared exclusive-CPU picker: which `n` CPUs of a pool a container gets for itself.
//! Policies call it; it reads the state through a [`StateView`] and decides nothing else.

use crate::cpuset::CpuSet;
use crate::request::CoreGrain;
use crate::state::StateView;
use crate::topology::PoolId;

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
    // Free CPUs per packing group: the core's cluster, else its NUMA node. Counted once per
    // group (clusters and nodes that meet the pool), looked up per core.
    let mut group_free: Vec<u16> = Vec::with_capacity(topo.clusters.len() + topo.nodes.len());
    group_free.extend(topo.clusters.iter().map(|g| {
        if g.intersects(&pool.cpus) {
            g.intersection(&avail).len() as u16
        } else {
            0
        }
    }));
    group_free.extend(
        topo.nodes
            .iter()
            .map(|n| n.cpus.intersection(&avail).len() as u16),
    );
    let n_clusters = topo.clusters.len();
    let group_of = |core: &CpuSet| -> usize {
        let Some(cpu) = core.first() else { return 0 };
        match topo.cluster_of_cpu(cpu) {
            Some(cl) if topo.clusters[cl].len() > core.len() => group_free[cl] as usize,
            _ => topo
                .node_index_of_cpu(cpu)
                .map(|i| group_free[n_clusters + i] as usize)
                .unwrap_or(0),
        }
    };
    // (whole core free, free CPUs in its group, first cpu) for every core with a free CPU.
    let mut cores: Vec<(bool, usize, usize, CpuSet)> = Vec::with_capacity(topo.cores.len());
    cores.extend(topo.cores.iter().filter(|c| c.intersects(&avail)).map(|c| {
        let free = c.intersection(&avail);
        (free == *c, group_of(c), c.first().unwrap_or(0), free)
    }));
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
    cores.sort_unstable_by_key(|(whole, gfree, first, _)| (!*whole, *gfree, *first));
    if grain == CoreGrain::SiblingPair {
        // Two threads of one core: the first core (whole ones first, packed) with two free.
        return cores
            .iter()
            .filter(|(_, _, _, free)| n == 2 && free.len() >= 2)
            .map(|(_, _, _, free)| {
                let mut pair = CpuSet::new();
                for cpu in free.iter().take(2) {
                    pair.insert(cpu);
                }
                pair
            })
            .find(|pair| keeps(pair));
    }
    let mut picked = CpuSet::new();
    for (whole, _, _, free) in &cores {
        let need = n - picked.len();
        if need == 0 {
            break;
        }
        if *whole && free.len() <= need {
            let next = picked.union(free);
            if keeps(&next) {
                picked = next;
            }
        }
    }
    // Remainder: split cores first, then whole ones (not with whole cores only).
    if picked.len() < n && grain == CoreGrain::Threads {
        cores.sort_unstable_by_key(|(whole, gfree, first, _)| (*whole, *gfree, *first));
        for (_, _, _, free) in &cores {
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
