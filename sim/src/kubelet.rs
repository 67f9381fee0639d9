//! A model of the kubelet's static CPU manager policy, with the topology manager at its
//! default (`none`), as the Kubernetes documentation describes it: only containers of
//! Guaranteed Pods with an integer CPU request get exclusive CPUs; every other container runs
//! on the shared pool, which is all CPUs not held exclusively. The model allocates exclusive
//! CPUs the way the static policy is documented to (whole sockets, then whole NUMA nodes when
//! the request covers them, then whole physical cores, then single threads), packing into the
//! socket / NUMA node with the fewest free CPUs. It does not try to keep a request inside one
//! NUMA node: without a topology manager policy the kubelet does not either.
//!
//! A request that cannot be met (or that would empty the shared pool) fails Pod admission in
//! the kubelet: the simulator counts it as refused and runs the container on the shared pool.

use std::collections::HashMap;
use std::sync::Arc;
use tap_engine::{ContainerRequest, CpuSet, Level, Topology};

pub struct KubeletStatic {
    topo: Arc<Topology>,
    sockets: Vec<CpuSet>,
    taken: CpuSet,
    exclusive: HashMap<String, CpuSet>,
    shared: usize,
}

impl KubeletStatic {
    pub fn new(topo: Arc<Topology>) -> KubeletStatic {
        let mut sockets: Vec<CpuSet> = topo
            .pools
            .iter()
            .filter(|p| p.level == Level::Socket)
            .map(|p| p.cpus)
            .collect();
        if sockets.is_empty() {
            sockets.push(topo.online);
        }
        KubeletStatic {
            topo,
            sockets,
            taken: CpuSet::new(),
            exclusive: HashMap::new(),
            shared: 0,
        }
    }

    /// The shared pool: every CPU not held exclusively.
    pub fn shared_pool(&self) -> CpuSet {
        self.topo.online.difference(&self.taken)
    }

    /// Places a container: `(cpus, exclusive, cpuset updates of running containers)`, or
    /// `None` when admission would fail (the container is then counted on the shared pool).
    pub fn create(&mut self, req: &ContainerRequest) -> Option<(CpuSet, bool, usize)> {
        let Some(n) = req.exclusive_cpus() else {
            self.shared += 1;
            return Some((self.shared_pool(), false, 0));
        };
        let avail = self.shared_pool();
        // The shared pool must keep at least one CPU.
        if avail.len() <= n {
            self.shared += 1;
            return None;
        }
        let Some(set) = self.take(avail, n) else {
            self.shared += 1;
            return None;
        };
        self.taken = self.taken.union(&set);
        self.exclusive.insert(req.id.clone(), set);
        // The kubelet rewrites the cpuset of every container on the shared pool.
        Some((set, true, self.shared))
    }

    /// Releases a container; returns the cpuset updates it causes.
    pub fn remove(&mut self, id: &str) -> usize {
        match self.exclusive.remove(id) {
            Some(set) => {
                self.taken = self.taken.difference(&set);
                self.shared
            }
            None => {
                self.shared = self.shared.saturating_sub(1);
                0
            }
        }
    }

    /// Packed allocation of `n` CPUs out of `avail`.
    fn take(&self, avail: CpuSet, n: usize) -> Option<CpuSet> {
        let topo = &self.topo;
        let mut picked = CpuSet::new();
        let mut free = avail;
        let node_sets: Vec<CpuSet> = topo.cpu_nodes().map(|x| x.cpus).collect();
        // Whole sockets, then whole NUMA nodes, while the request covers one.
        for units in [&self.sockets, &node_sets] {
            loop {
                let need = n - picked.len();
                let whole = units
                    .iter()
                    .find(|u| !u.is_empty() && u.len() <= need && u.is_subset(&free));
                match whole {
                    Some(u) => {
                        picked = picked.union(u);
                        free = free.difference(u);
                    }
                    None => break,
                }
            }
        }
        let free_in = |free: &CpuSet, cpu: usize| -> (usize, usize) {
            let node = node_sets
                .iter()
                .find(|s| s.contains(cpu))
                .map(|s| s.intersection(free).len())
                .unwrap_or(0);
            let socket = self
                .sockets
                .iter()
                .find(|s| s.contains(cpu))
                .map(|s| s.intersection(free).len())
                .unwrap_or(0);
            (socket, node)
        };
        // Whole cores, from the socket / node with the fewest free CPUs.
        loop {
            let need = n - picked.len();
            let best = topo
                .cores
                .iter()
                .filter(|c| c.len() <= need && c.is_subset(&free))
                .min_by_key(|c| {
                    let f = c.first().unwrap_or(0);
                    (free_in(&free, f), f)
                });
            match best {
                Some(c) => {
                    picked = picked.union(c);
                    free = free.difference(c);
                }
                None => break,
            }
        }
        // Single threads: partly used cores first, packed.
        while picked.len() < n {
            let best = free.iter().min_by_key(|cpu| {
                let core_free = topo
                    .core_of_cpu(*cpu)
                    .and_then(|i| topo.cores.get(i))
                    .map(|c| c.intersection(&free).len())
                    .unwrap_or(0);
                (free_in(&free, *cpu), core_free, *cpu)
            })?;
            picked.insert(best);
            free.remove(best);
        }
        Some(picked)
    }
}
