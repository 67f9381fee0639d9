//! What keeps the NUMA imbalance by request up (`tap-sim --imbalance-profile`): a
//! time-weighted profile of the most loaded node. The imbalance is the time average of the
//! most loaded node's requested CPUs over the mean; this splits its excess over 1 into the
//! moments when that node holds more requests than it has CPUs and the others, and tells what
//! the node holds at the moments over: the requests of shared containers placed on it alone,
//! the CPUs held exclusively on it, and the shares of shared containers whose cpusets span
//! two or more nodes (charged to each node in proportion to their CPUs there, as the imbalance
//! itself is). `crate::seeds::profile_table` prints it per seed.

/// What a node's requested milli-CPUs are made of.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Composition {
    /// Shared containers whose cpuset lies on this node alone.
    pub shared_one_node: u64,
    /// Exclusive CPUs on this node (a whole CPU each), of one-node and wider grants.
    pub exclusive: u64,
    /// This node's share of shared containers spanning two nodes.
    pub shared_two_nodes: u64,
    /// This node's share of shared containers spanning three nodes or more.
    pub shared_wider: u64,
    /// The node's CPUs, in milli-CPUs.
    pub capacity: u64,
}

impl Composition {
    /// Adds one container's charge on this node: `request` milli-CPUs, `exclusive` CPUs, its
    /// cpuset spanning `nodes` nodes.
    pub fn add(&mut self, request: u64, exclusive: u64, nodes: usize) {
        let slot = match (exclusive > 0, nodes) {
            (true, _) => &mut self.exclusive,
            (false, 0 | 1) => &mut self.shared_one_node,
            (false, 2) => &mut self.shared_two_nodes,
            (false, _) => &mut self.shared_wider,
        };
        *slot = slot.saturating_add(request);
    }

    pub fn total(&self) -> u64 {
        self.shared_one_node
            .saturating_add(self.exclusive)
            .saturating_add(self.shared_two_nodes)
            .saturating_add(self.shared_wider)
    }

    fn parts(&self) -> [u64; 4] {
        [
            self.shared_one_node,
            self.exclusive,
            self.shared_two_nodes,
            self.shared_wider,
        ]
    }
}

/// The profile of one run, over the measurement window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImbalanceProfile {
    span: f64,
    /// Time the most loaded node held more requests than CPUs.
    over: f64,
    /// Integral of (max / mean - 1), over all moments and over the moments over.
    excess: f64,
    excess_over: f64,
    /// Integral of each part of the most loaded node's composition (milli-CPUs), at the
    /// moments over.
    parts_over: [f64; 4],
    capacity_over: f64,
    /// Integral of the mean node's requests (milli-CPUs), over all moments and over the
    /// moments over.
    mean: f64,
    mean_over: f64,
}

impl ImbalanceProfile {
    /// One interval of `dt` seconds during which the most loaded node held `max` (with the
    /// composition `c`) and the nodes `mean` on average, in milli-CPUs.
    pub fn observe(&mut self, c: &Composition, mean: f64, dt: f64) {
        if mean <= 0.0 || dt <= 0.0 {
            return;
        }
        let max = c.total() as f64;
        let excess = (max / mean - 1.0).max(0.0) * dt;
        self.span += dt;
        self.excess += excess;
        self.mean += mean * dt;
        if c.total() > c.capacity {
            self.over += dt;
            self.excess_over += excess;
            self.mean_over += mean * dt;
            for (acc, part) in self.parts_over.iter_mut().zip(c.parts()) {
                *acc += part as f64 * dt;
            }
            self.capacity_over += c.capacity as f64 * dt;
        }
    }

    /// The imbalance by request this profile accounts for (1 + the mean excess).
    pub fn imbalance(&self) -> f64 {
        if self.span > 0.0 {
            1.0 + self.excess / self.span
        } else {
            0.0
        }
    }

    /// Share of the window during which the most loaded node was over its CPUs.
    pub fn over_share(&self) -> f64 {
        ratio(self.over, self.span)
    }

    /// The excess over 1 contributed by the moments over, and by the others (per second of
    /// the window).
    pub fn excess_split(&self) -> (f64, f64) {
        (
            ratio(self.excess_over, self.span),
            ratio(self.excess - self.excess_over, self.span),
        )
    }

    /// At the moments over, the mean CPUs of the most loaded node by part (one-node shared,
    /// exclusive, two-node shares, wider shares), and its mean CPUs.
    pub fn composition_over(&self) -> ([f64; 4], f64) {
        let cpus = |v: f64| ratio(v, self.over) / 1000.0;
        (self.parts_over.map(cpus), cpus(self.capacity_over))
    }

    /// Requested CPUs of the mean node: over the window, and at the moments over.
    pub fn mean_node(&self) -> (f64, f64) {
        (
            ratio(self.mean, self.span) / 1000.0,
            ratio(self.mean_over, self.over) / 1000.0,
        )
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(one: u64, excl: u64, two: u64, wide: u64) -> Composition {
        let mut c = Composition {
            capacity: 4000,
            ..Default::default()
        };
        c.add(one, 0, 1);
        c.add(excl, excl / 1000, 1);
        c.add(two, 0, 2);
        c.add(wide, 0, 4);
        c
    }

    #[test]
    fn the_excess_splits_into_moments_over_and_the_others() {
        let mut f = ImbalanceProfile::default();
        // 1 s at 5 CPUs against a mean of 4 (over the node's 4 CPUs): excess 0.25.
        f.observe(&node(2000, 1000, 1500, 500), 4000.0, 1.0);
        // 3 s at 3 CPUs against a mean of 2 (not over): excess 0.5 each second.
        f.observe(&node(3000, 0, 0, 0), 2000.0, 3.0);
        assert!((f.imbalance() - (1.0 + 1.75 / 4.0)).abs() < 1e-12);
        assert!((f.over_share() - 0.25).abs() < 1e-12);
        let (over, other) = f.excess_split();
        assert!((over - 0.25 / 4.0).abs() < 1e-12 && (other - 1.5 / 4.0).abs() < 1e-12);
        let (parts, cpus) = f.composition_over();
        assert_eq!(parts, [2.0, 1.0, 1.5, 0.5]);
        assert_eq!(cpus, 4.0);
        assert_eq!(f.mean_node(), ((4.0 + 3.0 * 2.0) / 4.0, 4.0));
    }

    #[test]
    fn an_empty_machine_adds_nothing() {
        let mut f = ImbalanceProfile::default();
        f.observe(&Composition::default(), 0.0, 2.0);
        assert_eq!(f, ImbalanceProfile::default());
        assert_eq!((f.imbalance(), f.over_share()), (0.0, 0.0));
    }
}
