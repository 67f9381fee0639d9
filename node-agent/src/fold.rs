//! `--fold-cpus-to-host`: applies decisions made on a large (fixture) topology to the CPUs of a
//! smaller host, for tests; off in production.
//!
//! The fold keeps NUMA nodes apart: the fixture's NUMA node `k` maps onto host CPU
//! `host[k mod n]` (n = the host's online CPU count), and every fixture CPU maps onto the image
//! of its node. A set of CPUs maps onto the union of its CPUs' images, so a shared pool spanning
//! several nodes (a socket, a die, the machine) becomes the union of its nodes' images. On a
//! 2-CPU host with the 4-node fixture, nodes 0 and 2 land on host CPU 0 and nodes 1 and 3 on host
//! CPU 1: two containers placed on neighbouring nodes get different cgroup cpusets. Memory nodes
//! fold the same way onto the host's nodes (`host_node[k mod m]`). A CPU the topology puts on no
//! node (not seen in practice) maps onto `host[cpu mod n]`.

use tap_engine::{CpuSet, NodeSet, Topology};

/// The fold. Pure: built from the topology's node CPU lists and the host's CPU and node ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFold {
    /// The host's online CPUs, ascending.
    host_cpus: Vec<usize>,
    /// The host's NUMA nodes with CPUs, ascending (never empty: `[0]` when unknown).
    host_nodes: Vec<usize>,
    /// Host CPU of each topology CPU id (`None`: the CPU is on no node).
    cpu_image: Vec<Option<usize>>,
}

impl HostFold {
    /// `node_cpus`: each NUMA node of the topology (id, its CPUs). `None` when the host has no
    /// CPUs.
    pub fn new(
        node_cpus: &[(u32, CpuSet)],
        host_cpus: &CpuSet,
        host_nodes: &NodeSet,
    ) -> Option<HostFold> {
        let host: Vec<usize> = host_cpus.iter().collect();
        if host.is_empty() {
            return None;
        }
        let mut nodes: Vec<usize> = host_nodes.iter().collect();
        if nodes.is_empty() {
            nodes.push(0);
        }
        let max_cpu = node_cpus
            .iter()
            .filter_map(|(_, s)| s.iter().max())
            .max()
            .map_or(0, |m| m + 1);
        let mut cpu_image = vec![None; max_cpu];
        for (id, cpus) in node_cpus {
            let image = host[*id as usize % host.len()];
            for c in cpus.iter() {
                cpu_image[c] = Some(image);
            }
        }
        Some(HostFold {
            host_cpus: host,
            host_nodes: nodes,
            cpu_image,
        })
    }

    /// The fold of `topo` onto a host with these CPUs and nodes.
    pub fn for_topology(
        topo: &Topology,
        host_cpus: &CpuSet,
        host_nodes: &NodeSet,
    ) -> Option<HostFold> {
        let nodes: Vec<(u32, CpuSet)> = topo.nodes.iter().map(|n| (n.id, n.cpus)).collect();
        HostFold::new(&nodes, host_cpus, host_nodes)
    }

    /// The host CPU of one topology CPU.
    pub fn cpu(&self, cpu: usize) -> usize {
        self.cpu_image
            .get(cpu)
            .copied()
            .flatten()
            .unwrap_or_else(|| self.host_cpus[cpu % self.host_cpus.len()])
    }

    /// The host CPUs of a topology cpuset (the union of its CPUs' images).
    pub fn cpus(&self, set: &CpuSet) -> CpuSet {
        CpuSet::from_ids(set.iter().map(|c| self.cpu(c)))
    }

    /// The host memory nodes of a topology node set.
    pub fn nodes(&self, set: &NodeSet) -> NodeSet {
        NodeSet::from_ids(
            set.iter()
                .map(|n| self.host_nodes[n % self.host_nodes.len()]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap()
    }

    /// The 4-node fixture's shape: 0-23, 24-47, 48-71, 72-95.
    fn four_nodes() -> Vec<(u32, CpuSet)> {
        vec![
            (0, set("0-23")),
            (1, set("24-47")),
            (2, set("48-71")),
            (3, set("72-95")),
        ]
    }

    /// Asserts `f` folds each CPU list onto the host CPU list paired with it.
    fn assert_folds(f: &HostFold, cases: &[(&str, &str)]) {
        for (cpus, host) in cases {
            assert_eq!(f.cpus(&set(cpus)).to_string(), *host, "{cpus}");
        }
    }

    fn two_cpu_host() -> HostFold {
        HostFold::new(&four_nodes(), &set("0-1"), &NodeSet::parse("0").unwrap()).unwrap()
    }

    #[test]
    fn each_node_folds_onto_host_cpu_k_mod_n() {
        let f = two_cpu_host();
        assert_folds(
            &f,
            &[
                ("0-23", "0"),
                ("24-47", "1"),
                ("48-71", "0"),
                ("72-95", "1"),
                // A single (exclusive) CPU folds onto its node's image.
                ("3", "0"),
                ("30", "1"),
            ],
        );
    }

    #[test]
    fn neighbouring_nodes_get_different_host_cpusets() {
        let f = two_cpu_host();
        assert_ne!(f.cpus(&set("0-23")), f.cpus(&set("24-47")));
    }

    #[test]
    fn a_shared_pool_folds_onto_the_union_of_its_nodes_images() {
        let f = two_cpu_host();
        // Socket 0 = nodes 0 and 1; the machine = all four.
        assert_folds(
            &f,
            &[
                ("0-47", "0-1"),
                ("0-95", "0-1"),
                // Nodes 0 and 2 only: both on host CPU 0.
                ("0-23,48-71", "0"),
                // Part of one node is still that node's image.
                ("4-7", "0"),
            ],
        );
    }

    #[test]
    fn larger_hosts_and_sparse_host_cpu_ids() {
        let f = HostFold::new(
            &four_nodes(),
            &set("2,5,7,9"),
            &NodeSet::parse("0").unwrap(),
        )
        .unwrap();
        assert_folds(
            &f,
            &[
                ("0-23", "2"),
                ("24-47", "5"),
                ("48-71", "7"),
                ("72-95", "9"),
                ("20-50", "2,5,7"),
            ],
        );
    }

    #[test]
    fn memory_nodes_fold_onto_host_nodes() {
        let f = two_cpu_host();
        assert_eq!(f.nodes(&NodeSet::parse("1-3").unwrap()).to_string(), "0");
        let g = HostFold::new(&four_nodes(), &set("0-3"), &NodeSet::parse("0-1").unwrap()).unwrap();
        assert_eq!(g.nodes(&NodeSet::parse("1").unwrap()).to_string(), "1");
        assert_eq!(g.nodes(&NodeSet::parse("2").unwrap()).to_string(), "0");
        // No host node known: node 0.
        let h = HostFold::new(&four_nodes(), &set("0-1"), &NodeSet::new()).unwrap();
        assert_eq!(h.nodes(&NodeSet::parse("3").unwrap()).to_string(), "0");
    }

    #[test]
    fn a_cpu_on_no_node_falls_back_to_cpu_mod_n() {
        let f = HostFold::new(&[(0, set("0-3"))], &set("0-1"), &NodeSet::new()).unwrap();
        assert_folds(&f, &[("5", "1"), ("0-3", "0")]);
        assert!(HostFold::new(&four_nodes(), &CpuSet::new(), &NodeSet::new()).is_none());
    }

    #[test]
    fn the_fixture_topology_folds_by_node() {
        let raw = tap_engine::testdata::discover_fixture("synthetic-2s-4numa-96c-gpu").unwrap();
        let topo = Topology::build(&raw).unwrap();
        let f = HostFold::for_topology(&topo, &set("0-1"), &NodeSet::parse("0").unwrap()).unwrap();
        let images: Vec<String> = topo
            .nodes
            .iter()
            .map(|n| f.cpus(&n.cpus).to_string())
            .collect();
        assert_eq!(images, ["0", "1", "0", "1"]);
    }
}
