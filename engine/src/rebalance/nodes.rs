//! The NUMA nodes a rebalancing round looks at: each node's NUMA pool and the usage of the
//! shared grants on it, and the imbalance figures before and after a move.

use super::{BalanceBy, UsageSample};
use crate::grant::Grant;
use crate::nodeset::NodeSet;
use crate::state::StateView;
use crate::topology::{PoolId, Topology};
use crate::types::Site;

/// The NUMA nodes a round looks at, and their usage.
pub(super) struct Nodes {
    /// Per node (position in the topology's list): its NUMA pool, when it has shared CPUs.
    pub pool: Vec<Option<PoolId>>,
    pub usage: Vec<u64>,
    /// What a node's usage is divided by before comparing: 1, or its shared CPUs.
    per: Vec<f64>,
    /// Each node's shared CPUs, in milli-CPUs.
    shared: Vec<u64>,
}

impl Nodes {
    /// Each node's NUMA pool (where it has shared CPUs) and the usage of the shared grants on
    /// it (a grant over several nodes spread in proportion to its CPUs on each).
    pub fn measure(view: &StateView<'_>, usage: &[UsageSample], by: BalanceBy) -> Nodes {
        let topo = view.topology();
        let shared: Vec<u64> = topo
            .nodes
            .iter()
            .map(|n| view.shared_cpus(&n.cpus).len() as u64 * 1000)
            .collect();
        let per = shared
            .iter()
            .map(|s| match by {
                BalanceBy::Usage => 1.0,
                BalanceBy::UsagePerSharedCpu => (*s).max(1000) as f64 / 1000.0,
            })
            .collect();
        let pool: Vec<Option<PoolId>> = numa_pools(topo)
            .into_iter()
            .map(|p| p.filter(|p| view.pool_has_shared_cpus(*p)))
            .collect();
        let mut out = Nodes {
            usage: vec![0u64; topo.nodes.len()],
            pool,
            per,
            shared,
        };
        for s in usage {
            let Some(g) = view.grant(&s.id) else { continue };
            if !g.is_exclusive() && g.site == Site::Pools {
                out.spread(topo, g, s.usage_milli);
            }
        }
        out
    }

    /// Adds `usage` of grant `g` to its nodes with shared CPUs: all of it to its node when it
    /// has one, else in proportion to its CPUs on each (the last taking the remainder).
    fn spread(&mut self, topo: &Topology, g: &Grant, usage: u64) {
        if g.nodes.len() == 1 {
            let p = g.nodes.iter().next().and_then(|id| node_pos(topo, id));
            if let Some(p) = p.filter(|p| self.pool[*p].is_some()) {
                self.usage[p] = self.usage[p].saturating_add(usage);
            }
            return;
        }
        let cpus = |p: usize| {
            let on = self.pool[p].is_some() && g.nodes.contains(topo.nodes[p].id as usize);
            if on {
                g.cpus.intersection(&topo.nodes[p].cpus).len() as u64
            } else {
                0
            }
        };
        let total: u64 = (0..self.usage.len()).map(cpus).sum();
        let mut left = usage;
        let mut last = None;
        for p in (0..self.usage.len()).filter(|p| cpus(*p) > 0) {
            let part = u64::try_from(u128::from(usage) * u128::from(cpus(p)) / u128::from(total))
                .unwrap_or(u64::MAX);
            self.usage[p] = self.usage[p].saturating_add(part);
            left = left.saturating_sub(part);
            last = Some(p);
        }
        if let Some(p) = last {
            self.usage[p] = self.usage[p].saturating_add(left);
        }
    }

    /// Whether node `p`'s usage exceeds its shared CPUs: its containers wait for CPUs.
    pub fn oversubscribed(&self, p: usize) -> bool {
        self.usage[p] > self.shared[p]
    }

    /// Max/mean of the usage over the nodes with shared CPUs (`None` with fewer than two, or
    /// no usage).
    pub fn imbalance(&self) -> Option<f64> {
        self.figures(|p| self.usage[p]).map(|(imb, _)| imb)
    }

    /// The imbalance and sum of squares after moving `x` from node `src` to node `dst`.
    pub fn after(&self, src: usize, dst: usize, x: u64) -> Option<(f64, f64)> {
        self.figures(|p| match p {
            _ if p == src => self.usage[p].saturating_sub(x),
            _ if p == dst => self.usage[p].saturating_add(x),
            _ => self.usage[p],
        })
    }

    /// Max/mean and sum of squares of the nodes' loads (usage, or usage per shared CPU).
    fn figures(&self, usage: impl Fn(usize) -> u64) -> Option<(f64, f64)> {
        let (mut n, mut total, mut max, mut sq) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for p in (0..self.pool.len()).filter(|p| self.pool[*p].is_some()) {
            let load = usage(p) as f64 / self.per[p];
            n += 1.0;
            total += load;
            max = max.max(load);
            sq += load * load;
        }
        if n < 2.0 || total <= 0.0 {
            return None;
        }
        Some((max * n / total, sq))
    }
}

/// Each NUMA node's pool (by position in the topology's node list): the shallowest pool of
/// that node alone (its NUMA pool, or a socket or die that holds one node).
pub fn numa_pools(topo: &Topology) -> Vec<Option<PoolId>> {
    let one = |id: u32| {
        let only = NodeSet::from_ids([id as usize]);
        topo.pools
            .iter()
            .find(|p| p.numa_nodes == only)
            .map(|p| p.id)
    };
    topo.nodes.iter().map(|n| one(n.id)).collect()
}

/// The position in the topology's node list of NUMA node `id`.
pub(super) fn node_pos(topo: &Topology, id: usize) -> Option<usize> {
    topo.node_position(id)
}
