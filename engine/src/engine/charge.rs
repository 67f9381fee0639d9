//! A grant's load on its pools and NUMA nodes: added when it is placed, taken back when it
//! goes. The grant's figures are worked out once per charge ([`Charge::of`]): the exclusive
//! CPU count is a population count of a 1,024-bit set, and was taken again for every ancestor
//! pool and node (the bulk of a shared create + remove's charging).

use super::Engine;
use crate::grant::Grant;
use crate::request::PolicyKind;

/// Which way a charge moves the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Add,
    TakeBack,
}

impl Direction {
    /// Figures come from outside (requests, limits, memory): saturating, so a huge request
    /// never wraps or panics.
    #[inline]
    fn step(self, v: u64, d: u64) -> u64 {
        match self {
            Direction::Add => v.saturating_add(d),
            Direction::TakeBack => v.saturating_sub(d),
        }
    }

    #[inline]
    fn step32(self, v: u32, d: u32) -> u32 {
        match self {
            Direction::Add => v.saturating_add(d),
            Direction::TakeBack => v.saturating_sub(d),
        }
    }
}

/// Whether a grant holds exclusive CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    Shared,
    Exclusive,
}

/// A grant's figures as its pools and nodes are charged them.
#[derive(Debug, Clone, Copy)]
struct Charge {
    holding: Holding,
    /// [`Grant::charged_request`].
    request: u64,
    limit: u64,
    memory: u64,
    exclusive_cpus: u32,
    /// 1 for a shared numa-aware grant (counted by [`crate::types::NodeLoad::shared`]).
    node_shared: u32,
}

impl Charge {
    fn of(g: &Grant) -> Charge {
        // An empty set is checked without counting it: a shared grant counts nothing.
        let (holding, excl) = if g.exclusive.is_empty() {
            (Holding::Shared, 0)
        } else {
            (Holding::Exclusive, g.exclusive.len())
        };
        let excl_milli = u64::try_from(excl).unwrap_or(u64::MAX).saturating_mul(1000);
        let numa_shared = holding == Holding::Shared && g.policy == PolicyKind::NumaAware;
        Charge {
            holding,
            request: g.request_milli.max(excl_milli),
            limit: g.limit_milli.unwrap_or(0),
            memory: g.memory_bytes,
            exclusive_cpus: u32::try_from(excl).unwrap_or(u32::MAX),
            node_shared: u32::from(numa_shared),
        }
    }
}

impl Engine {
    /// Charges a grant to its pools and nodes (a grant on the reserved CPUs, in no pool, to
    /// none).
    pub(super) fn charge(&mut self, g: &Grant) {
        self.charge_both(g, Direction::Add);
    }

    pub(super) fn uncharge(&mut self, g: &Grant) {
        self.charge_both(g, Direction::TakeBack);
    }

    fn charge_both(&mut self, g: &Grant, dir: Direction) {
        if g.off_pools() {
            return;
        }
        let c = Charge::of(g);
        self.charge_pools(g, &c, dir);
        self.charge_nodes(g, &c, dir);
    }

    /// Adds (or takes back) a grant's load on its pool and every ancestor.
    fn charge_pools(&mut self, g: &Grant, c: &Charge, dir: Direction) {
        let mut first = true;
        for a in self.topo.ancestors(g.pool) {
            let Some(l) = self.pool_load.get_mut(a) else {
                continue;
            };
            l.request_milli = dir.step(l.request_milli, c.request);
            l.limit_milli = dir.step(l.limit_milli, c.limit);
            l.memory_bytes = dir.step(l.memory_bytes, c.memory);
            l.exclusive_cpus = dir.step32(l.exclusive_cpus, c.exclusive_cpus);
            if first {
                l.containers = dir.step32(l.containers, 1);
                if c.holding == Holding::Shared {
                    l.shared_containers = dir.step32(l.shared_containers, 1);
                }
                first = false;
            }
        }
    }

    /// Adds (or takes back) a grant's load on its NUMA nodes, split evenly (the first node
    /// takes the remainder so the sum is exact). A grant on one node (most are) takes that
    /// node's figures whole, without counting and walking its 1,024-bit node set.
    fn charge_nodes(&mut self, g: &Grant, c: &Charge, dir: Direction) {
        if let Some(node) = g.nodes.single() {
            self.charge_node(node, c.request, c.limit, c.node_shared, dir);
            return;
        }
        let n = g.nodes.len() as u64;
        if n == 0 {
            return;
        }
        for (i, node) in g.nodes.iter().enumerate() {
            let share = |v: u64| {
                let extra = if i == 0 { v % n } else { 0 };
                (v / n).saturating_add(extra)
            };
            self.charge_node(node, share(c.request), share(c.limit), c.node_shared, dir);
        }
    }

    /// Adds (or takes back) figures on NUMA node `id` (nothing when the topology has no such
    /// node).
    fn charge_node(&mut self, id: usize, request: u64, limit: u64, shared: u32, dir: Direction) {
        let Some(pos) = self.topo.nodes.iter().position(|x| x.id as usize == id) else {
            return;
        };
        let Some(load) = self.node_load.get_mut(pos) else {
            return;
        };
        load.request_milli = dir.step(load.request_milli, request);
        load.limit_milli = dir.step(load.limit_milli, limit);
        load.shared = dir.step32(load.shared, shared);
    }
}
