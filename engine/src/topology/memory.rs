//! Memory tiers: what a NUMA node's memory is ([`MemoryKind`]), the memory nodes a set of CPU
//! nodes uses by default (their DRAM), and the memory-only nodes of a kind nearest to them.

use super::Topology;
use crate::nodeset::NodeSet;
use serde::Serialize;

crate::names! {
    /// What a NUMA node's memory is. Nodes with CPUs are DRAM; a memory-only node (no CPUs) is HBM
    /// when the HMAT gives it more read bandwidth than every DRAM node, else PMEM or CXL memory
    /// (slower than DRAM: the kernel cannot tell the two apart without vendor data).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum MemoryKind: "memory kind", Ignored {
        Dram = "dram",
        /// PMEM or CXL memory (`memory-type: pmem` or `cxl`).
        Pmem = "pmem/cxl" | "pmem" | "cxl",
        Hbm = "hbm",
    }
}

impl Topology {
    /// Memory nodes to use with a set of CPU nodes by default: their own DRAM. Memory-only
    /// nodes (PMEM, CXL, HBM) never enter by default: see [`Topology::tier_nodes`].
    pub fn mems_for_nodes(&self, cpu_nodes: &NodeSet) -> NodeSet {
        *cpu_nodes
    }

    /// The memory-only nodes of `kind` nearest to `cpu_nodes`: for each of those nodes, the
    /// `kind` node at the smallest distance from it (the lowest id among equals). Empty when
    /// the machine has no memory of that kind.
    pub fn tier_nodes(&self, cpu_nodes: &NodeSet, kind: MemoryKind) -> NodeSet {
        let mut out = NodeSet::new();
        for c in cpu_nodes.iter().filter_map(|id| self.node(id as u32)) {
            let nearest = self
                .nodes
                .iter()
                .filter(|n| n.kind == kind && n.cpus.is_empty())
                .min_by_key(|n| (c.distance_to(n.id), n.id));
            if let Some(n) = nearest {
                out.insert(n.id as usize);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::machine;
    use super::super::{RawNode, Topology};
    use super::*;
    use crate::cpuset::CpuSet;

    /// Memory-only nodes stay out of every pool's mems and memory; `tier_nodes` finds the
    /// nearest of a kind; HMAT bandwidth above DRAM's makes a node HBM.
    #[test]
    fn memory_only_nodes_are_tiers_found_by_distance() {
        let mut raw = machine(2, 1, 1, 1, 4);
        raw.nodes[0].distances.extend([17, 28]);
        raw.nodes[1].distances.extend([28, 13]);
        for (n, bw) in raw.nodes.iter_mut().zip([100_000, 100_000]) {
            n.read_bandwidth = Some(bw);
        }
        // (id, GiB, distances, read bandwidth): PMEM nearer node 0, HBM nearer node 1.
        let memory_only = [
            (2, 128, [17, 28, 10, 28], 30_000),
            (3, 16, [28, 13, 28, 10], 400_000),
        ];
        for (id, gib, distances, bw) in memory_only {
            raw.nodes.push(RawNode {
                id,
                cpus: CpuSet::new(),
                memory_bytes: gib << 30,
                distances: distances.to_vec(),
                read_bandwidth: Some(bw),
                memory_tier: None,
            });
        }
        let t = Topology::build(&raw).unwrap();
        let kinds: Vec<MemoryKind> = t.nodes.iter().map(|n| n.kind).collect();
        use MemoryKind::*;
        assert_eq!(kinds, vec![Dram, Dram, Pmem, Hbm]);
        let s0 = t.pool_by_name("socket0").unwrap();
        assert_eq!(s0.mems.to_string(), "0");
        assert_eq!(s0.memory_bytes, 64 << 30);
        let both = NodeSet::parse("0-1").unwrap();
        assert_eq!(t.tier_nodes(&both, Pmem).to_string(), "2");
        assert_eq!(t.tier_nodes(&s0.numa_nodes, Hbm).to_string(), "3");
        // No DRAM-only machine has a tier.
        let t = Topology::build(&machine(2, 1, 1, 1, 4)).unwrap();
        assert!(t.tier_nodes(&both, Pmem).is_empty());
    }
}
