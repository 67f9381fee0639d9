//! `--explain`: the discovered tree and what the policy would do with a few sample containers.

use crate::agent::{Agent, ContainerInfo, PodInfo};
use std::fmt::Write as _;

/// Sample containers: (name, QoS cgroup, request CPUs, limit CPUs).
const SAMPLES: [(&str, &str, u64, Option<u64>); 5] = [
    ("burstable-4-8", "burstable", 4, Some(8)),
    ("burstable-25-35", "burstable", 25, Some(35)),
    ("burstable-50-60", "burstable", 50, Some(60)),
    ("guaranteed-4", "", 4, Some(4)),
    ("besteffort", "besteffort", 0, None),
];

pub fn explain(agent: &Agent) -> String {
    let topo = agent.topology();
    let cfg = agent.config();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "topology: {} CPUs online, {} sockets, {} dies, {} NUMA nodes, {} clusters, {} cores, isolated [{}]",
        topo.online.len(),
        topo.sockets,
        topo.dies,
        topo.nodes.len(),
        topo.clusters.len(),
        topo.cores.len(),
        topo.isolated
    );
    for n in &topo.nodes {
        let d: Vec<String> = n.distances.iter().map(|(_, d)| d.to_string()).collect();
        let _ = writeln!(
            out,
            "  numa node {}: cpus [{}] memory {} MiB distances [{}]",
            n.id,
            n.cpus,
            n.memory_bytes >> 20,
            d.join(" ")
        );
    }
    for dev in &topo.devices {
        let _ = writeln!(
            out,
            "  pci {} class {:#08x} numa node {:?}",
            dev.address, dev.class, dev.numa_node
        );
    }
    let _ = writeln!(out, "pool tree:");
    out.push_str(&topo.describe());
    let _ = writeln!(
        out,
        "policy: {} (memory topology {}, cluster affinity {}, exclusive CPUs {})",
        cfg.policy, cfg.memory_topology, cfg.cluster_affinity, cfg.exclusive_cpus
    );
    let _ = writeln!(
        out,
        "sample decisions (each placed after the ones above it):"
    );
    for (i, (name, qos, req, lim)) in SAMPLES.iter().enumerate() {
        let c = ContainerInfo {
            id: format!("sample-{i}"),
            name: (*name).into(),
            pod: PodInfo {
                name: (*name).into(),
                namespace: "default".into(),
                cgroup_parent: Some(format!("/kubepods/{qos}")),
                ..Default::default()
            },
            cpu_shares: Some(if *req == 0 { 2 } else { req * 1024 }),
            cpu_quota: lim.map(|l| (l * 100_000) as i64),
            cpu_period: Some(100_000),
            ..Default::default()
        };
        let adj = agent.create(&c);
        let _ = writeln!(
            out,
            "  {name:<16} -> cpus [{}] mems [{}]",
            adj.cpus
                .map(|c| c.to_string())
                .unwrap_or_else(|| "unchanged".into()),
            adj.mems.unwrap_or_default()
        );
    }
    out
}
