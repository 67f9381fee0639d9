//! `--explain`: the discovered tree and what the policy would do with a few sample containers.

use crate::agent::{Agent, ContainerInfo, PodInfo};
use std::fmt::Write as _;
use tap_engine::cpu_model::{CpuModel, CpuModelSource};
use tap_engine::devices::{DeviceKind, DeviceScheme};
use tap_engine::request::{
    EXCLUSIVE_CORES_KEY, HIDE_HYPERTHREADS_KEY, MEMORY_TYPE_KEY, NUMA_POLICY_KEY, RESERVED_CPUS_KEY,
};
use tap_engine::topology::{Level, PciDevice, Topology};

/// A sample container: name, QoS cgroup, request CPUs, limit CPUs, Pod annotations.
type Sample = (
    &'static str,
    &'static str,
    u64,
    Option<u64>,
    &'static [(&'static str, &'static str)],
);

const SAMPLES: [Sample; 11] = [
    ("burstable-4-8", "burstable", 4, Some(8), &[]),
    // Small enough for one cluster (a Kunpeng's 4 cores, a test guest's 2).
    ("burstable-1-2", "burstable", 1, Some(2), &[]),
    ("burstable-25-35", "burstable", 25, Some(35), &[]),
    ("burstable-50-60", "burstable", 50, Some(60), &[]),
    ("guaranteed-4", "", 4, Some(4), &[]),
    ("besteffort", "besteffort", 0, None, &[]),
    // Hyperthreads: 3 CPUs are no whole number of 2-thread cores (shared, and said so on SMT
    // machines); one core's sibling pair; 4 CPUs seen as one thread per core.
    ("guaranteed-3", "", 3, Some(3), &[]),
    (
        "sibling-pair-2",
        "",
        2,
        Some(2),
        &[(EXCLUSIVE_CORES_KEY, "sibling-pair")],
    ),
    (
        "hide-threads-4",
        "",
        4,
        Some(4),
        &[(HIDE_HYPERTHREADS_KEY, "true")],
    ),
    // Memory tiers: DRAM plus the nearest PMEM/CXL node (memory-only nodes never by default).
    (
        "pmem-1-2",
        "burstable",
        1,
        Some(2),
        &[(MEMORY_TYPE_KEY, "dram,pmem")],
    ),
    // A whole NUMA node, if one is still free of the samples above.
    PROBE,
];

/// `numa-policy: exclusive`: shown alone on the empty machine first, and after the others.
const PROBE: Sample = (
    "numa-exclusive-2-4",
    "burstable",
    2,
    Some(4),
    &[(NUMA_POLICY_KEY, "exclusive")],
);

/// The pool tree, one line per pool; cluster pools only when cluster affinity is on and cache
/// pools only when cache affinity is (they are not placed on otherwise), else a note saying
/// why not (`off`).
fn pool_tree(topo: &Topology, clusters: bool, caches: bool, off: &str) -> String {
    let mut out = String::new();
    let mut hidden = 0usize;
    let mut hidden_caches = 0usize;
    for p in topo.walk() {
        if p.level == Level::Cluster && !clusters {
            hidden += 1;
            continue;
        }
        if p.level == Level::Cache && !caches {
            hidden_caches += 1;
            continue;
        }
        let _ = writeln!(out, "{}", p.describe());
    }
    if hidden > 0 {
        let _ = writeln!(out, "  ({hidden} cluster pools not shown: {off})");
    }
    if hidden_caches > 0 {
        let _ = writeln!(
            out,
            "  ({hidden_caches} cache pools not shown: --cache-affinity is off)"
        );
    }
    out
}

/// The PCI devices: each GPU or NPU with what names it (`VA_VISIBLE_DEVICES=0`, ...) and its
/// NUMA node; console displays (a BMC's or a virtual machine's VGA) on one line, as not GPUs.
fn device_lines(topo: &Topology) -> String {
    let mut out = String::new();
    let mut consoles = Vec::new();
    for dev in &topo.devices {
        let kind = dev.kind();
        let ids = format!("{:04x}:{:04x}", dev.vendor, dev.device);
        if kind == DeviceKind::Console {
            consoles.push(format!("{} ({ids})", dev.address));
            continue;
        }
        let _ = writeln!(
            out,
            "  pci {} {kind} {ids} class {:#08x} ({}) numa node {}",
            dev.address,
            dev.class,
            names_of(dev, &topo.devices),
            dev.numa_node
                .map_or_else(|| "unknown".to_string(), |n| n.to_string())
        );
    }
    if !consoles.is_empty() {
        let _ = writeln!(
            out,
            "  not GPUs (a BMC's or virtual machine's VGA): {}",
            consoles.join(", ")
        );
    }
    out
}

/// How a container names `dev`: `NVIDIA_VISIBLE_DEVICES=0 or GPU-…, VA_VISIBLE_DEVICES=1`.
fn names_of(dev: &PciDevice, all: &[PciDevice]) -> String {
    let names: Vec<String> = DeviceScheme::ALL
        .iter()
        .filter_map(|s| {
            let i = s
                .devices(all)
                .iter()
                .position(|d| d.address == dev.address)?;
            let uuid = match (s, &dev.uuid) {
                (DeviceScheme::Nvidia, Some(u)) => format!(" or {u}"),
                _ => String::new(),
            };
            Some(format!("{}={i}{uuid}", s.env_var()))
        })
        .collect();
    if names.is_empty() {
        "no device variable".into()
    } else {
        names.join(", ")
    }
}

/// The `cpu:` line: the model, its Arm implementer and part, and where it was read.
fn cpu_line(cpu: &CpuModel) -> String {
    match cpu.source {
        CpuModelSource::SysfsMidr => format!("cpu: {cpu}, from midr_el1 under --sysfs-root"),
        CpuModelSource::ProcCpuinfo => format!("cpu: {cpu}, from cpuinfo under --proc-root"),
        CpuModelSource::None => "cpu: unknown (no midr_el1 under --sysfs-root, nothing usable \
                                 in cpuinfo under --proc-root)"
            .to_string(),
    }
}

pub fn explain(agent: &Agent) -> String {
    let topo = agent.topology();
    let mut out = machine_lines(topo);
    out.push_str(&policy_lines(agent));
    out.push_str(&sample_lines(agent));
    out
}

/// The `topology:` and `cpu:` lines, the NUMA nodes and the devices.
fn machine_lines(topo: &Topology) -> String {
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
    let _ = writeln!(out, "{}", cpu_line(&topo.cpu));
    for n in &topo.nodes {
        let d: Vec<String> = n.distances.iter().map(|(_, d)| d.to_string()).collect();
        let tier = if n.cpus.is_empty() {
            format!(" memory-only ({}: only by memory-type)", n.kind)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  numa node {}: cpus [{}] memory {} MiB distances [{}]{tier}",
            n.id,
            n.cpus,
            n.memory_bytes >> 20,
            d.join(" ")
        );
    }
    out.push_str(&device_lines(topo));
    out
}

/// The pool tree and the policy line (with why cluster affinity is off, where a rule turned it
/// off on this CPU).
fn policy_lines(agent: &Agent) -> String {
    let cfg = agent.config();
    let clusters_off = agent.clusters_off();
    let off = match &clusters_off {
        Some(o) => format!(
            "--cluster-affinity-rule={} and this CPU is not part 0xd06",
            o.rule
        ),
        None => "--topology-cluster-affinity is off".to_string(),
    };
    let mut out = String::from("pool tree:\n");
    let caches = cfg.cache_affinity == tap_engine::CacheAffinity::On;
    out.push_str(&pool_tree(
        agent.topology(),
        cfg.cluster_affinity,
        caches,
        &off,
    ));
    let _ = writeln!(
        out,
        "policy: {} (memory topology {}, cluster affinity {}, cache affinity {}, exclusive CPUs {} in {} cores)",
        cfg.policy,
        cfg.memory_topology,
        cfg.cluster_affinity,
        caches,
        cfg.exclusive_cpus,
        cfg.exclusive_cores
    );
    if let Some(o) = clusters_off {
        let _ = writeln!(out, "  {o}");
    }
    if !cfg.reserved.is_empty() {
        let r = &cfg.reserved_for;
        let _ = writeln!(
            out,
            "reserved CPUs {} (in no pool): namespaces [{}], reserved-cpus annotation {}",
            cfg.reserved,
            r.namespaces.join(", "),
            match r.annotation {
                tap_engine::ReservedAnnotation::Honoured => "honoured",
                tap_engine::ReservedAnnotation::Ignored => "ignored",
            }
        );
    }
    out
}

/// What the policy decides for the sample containers, placed one after the other.
fn sample_lines(agent: &Agent) -> String {
    let mut out = String::new();
    let mut notes = agent.notes().attach();
    // Alone on the empty machine, then removed: a whole NUMA node.
    let _ = writeln!(out, "alone on the empty machine, then removed:");
    let probe = sample_container("probe", &PROBE);
    let line = sample_line(agent, &mut notes, &probe);
    let _ = writeln!(out, "  {:<16} -> {line}", PROBE.0);
    agent.remove(&probe.id);
    let _ = writeln!(
        out,
        "sample decisions (each placed after the ones above it): cpus (pool), mems: why"
    );
    for (i, sample) in SAMPLES.iter().enumerate() {
        let line = sample_line(
            agent,
            &mut notes,
            &sample_container(&format!("sample-{i}"), sample),
        );
        let _ = writeln!(out, "  {:<16} -> {line}", sample.0);
    }
    // A device the kubelet allocated (pod-resources) on the last NUMA node.
    if let Some(last) = agent.topology().nodes.last().map(|n| n.id) {
        let mut c = sample_container(
            "kubelet-device",
            &("kubelet-device", "burstable", 1, Some(2), &[]),
        );
        c.kubelet_devices = vec![crate::pod_resources::KubeletDevice {
            resource: "example.com/accel".into(),
            id: "accel-0".into(),
            numa_nodes: vec![last],
            claim: None,
        }];
        let line = sample_line(agent, &mut notes, &c);
        let _ = writeln!(out, "  {:<16} -> {line}", "kubelet-device");
    }
    if let Some(daemon) = system_daemon(agent) {
        let line = sample_line(agent, &mut notes, &daemon);
        let _ = writeln!(out, "  {:<16} -> {line}", daemon.name);
    }
    out
}

/// With reserved CPUs: a system daemon's container, in the first namespace allowed on them
/// (`kube-system` asking by annotation when none is listed).
fn system_daemon(agent: &Agent) -> Option<ContainerInfo> {
    let cfg = agent.config();
    if cfg.reserved.is_empty() {
        return None;
    }
    let listed = cfg.reserved_for.namespaces.first();
    let ask: &[(&str, &str)] = match listed {
        Some(_) => &[],
        None => &[(RESERVED_CPUS_KEY, "true")],
    };
    let sample = ("system-daemon", "burstable", 1, Some(2), ask);
    let mut c = sample_container("system-daemon", &sample);
    c.pod.namespace = listed.map_or("kube-system", String::as_str).to_string();
    Some(c)
}

/// A sample's container, with id `id`.
fn sample_container(id: &str, (name, qos, req, lim, annotations): &Sample) -> ContainerInfo {
    ContainerInfo {
        id: id.to_string(),
        name: (*name).into(),
        pod: PodInfo {
            name: (*name).into(),
            namespace: "default".into(),
            cgroup_parent: Some(format!("/kubepods/{qos}")),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
        cpu_shares: Some(if *req == 0 { 2 } else { req * 1024 }),
        cpu_quota: lim.map(|l| (l * 100_000) as i64),
        cpu_period: Some(100_000),
        ..Default::default()
    }
}

/// Places `c` and says what the agent decided: the notes it made for the Pod Events (where and
/// why, and what it could not honour).
fn sample_line(
    agent: &Agent,
    notes: &mut Option<tokio::sync::mpsc::Receiver<crate::notes::Note>>,
    c: &ContainerInfo,
) -> String {
    let adj = agent.create(c);
    let mut said = Vec::new();
    while let Some(n) = notes.as_mut().and_then(|rx| rx.try_recv().ok()) {
        said.push(match n.kind {
            crate::notes::Kind::NotHonoured => format!("not honoured: {}", n.message),
            _ => n.message,
        });
    }
    match (said.is_empty(), adj.cpus) {
        (false, _) => said.join("; "),
        (true, Some(cpus)) => format!("cpus {cpus}"),
        (true, None) => "unchanged".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use std::sync::Arc;
    use tap_engine::{Engine, EngineConfig};

    /// Asserts the output holds each of `texts`.
    fn assert_says(out: &str, texts: &[&str]) {
        for text in texts {
            assert!(out.contains(text), "no {text:?} in:\n{out}");
        }
    }

    fn agent(cluster_affinity: bool) -> Agent {
        agent_on("synthetic-2s-4numa-96c-gpu", cluster_affinity)
    }

    fn agent_on(fixture: &str, cluster_affinity: bool) -> Agent {
        let cfg = EngineConfig {
            cluster_affinity,
            ..Default::default()
        };
        agent_with(fixture, cfg)
    }

    fn agent_with(fixture: &str, cfg: EngineConfig) -> Agent {
        let raw = tap_engine::testdata::discover_fixture(fixture).expect("fixture");
        let topo = Arc::new(Topology::build(&raw).expect("topology"));
        Agent::new(
            Engine::new(topo, cfg),
            Arc::new(Metrics::new()),
            None,
            "explain",
        )
    }

    #[test]
    fn samples_say_pool_and_reason_and_the_tree_follows_the_settings() {
        let out = explain(&agent(false));
        assert!(
            out.contains(
                "pci 0000:10:00.0 gpu 1002:67c7 class 0x030000 (VA_VISIBLE_DEVICES=0) numa node 1"
            ),
            "{out}"
        );
        assert!(!out.contains("Some("), "debug formatting: {out}");
        assert!(
            !out.contains("[cluster]"),
            "cluster pools listed with affinity off: {out}"
        );
        assert_says(
            &out,
            &[
                "24 cluster pools not shown",
                "burstable-4-8    -> cpus 0-23 (numa0): fits one numa",
                // The exclusive sample goes to the node least loaded with what runs on it: numa1
                // (numa2 and numa3 carry the socket1 sample's share; the balance term).
                "guaranteed-4     -> cpus 24-27 (numa1, exclusive)",
                // numa-policy exclusive: a whole node alone, none left after the samples.
                "numa-exclusive-2-4 -> cpus 0-23 (numa0, exclusive): numa-policy exclusive: a whole NUMA node",
                "numa-exclusive-2-4 -> left on all CPUs: numa-policy exclusive: no NUMA node is free",
            ],
        );
        let with = explain(&agent(true));
        assert!(with.contains("cluster0 [cluster] cpus 0-3"), "{with}");
        assert!(!with.contains("not shown"), "{with}");
    }

    /// With reserved CPUs a system daemon is among the samples: on the reserved CPUs when its
    /// namespace is listed, else asking by annotation and said not honoured.
    #[test]
    fn a_system_daemon_sample_shows_the_reserved_cpus() {
        use tap_engine::{CpuSet, ReservedAccess};
        let reserved = CpuSet::parse("0-1").unwrap();
        let listed = EngineConfig {
            reserved,
            reserved_for: ReservedAccess {
                namespaces: vec!["kube-system".into()],
                ..Default::default()
            },
            ..Default::default()
        };
        let out = explain(&agent_with("synthetic-2s-4numa-96c-gpu", listed));
        assert_says(
            &out,
            &[
                "reserved CPUs 0-1 (in no pool): namespaces [kube-system], reserved-cpus annotation ignored",
                "system-daemon    -> cpus 0-1 (reserved): system daemon: the reserved CPUs",
            ],
        );
        let unlisted = EngineConfig {
            reserved,
            ..Default::default()
        };
        let out = explain(&agent_with("synthetic-2s-4numa-96c-gpu", unlisted));
        assert!(
            out.contains("system-daemon    -> cpus ")
                && out.contains("not honoured: reserved-cpus: this Pod's namespace may not use"),
            "{out}"
        );
        assert!(!explain(&agent(false)).contains("system-daemon"));
    }

    /// The hyperthread samples on an SMT machine (siblings n and n+48): 3 CPUs are no whole
    /// cores (shared, said so), the sibling pair is one core, hidden threads one per core.
    #[test]
    fn hyperthread_samples_say_what_they_got_on_smt() {
        let out = explain(&agent_on("synthetic-2s-2numa-smt-96t", false));
        let line = |name: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(name))
                .unwrap_or_else(|| panic!("no {name} line: {out}"))
                .to_string()
        };
        assert!(
            line("guaranteed-3").contains("not honoured: exclusive-cores whole"),
            "{out}"
        );
        assert!(
            line("sibling-pair-2").contains("cpus 2,50 (socket0, exclusive)"),
            "{out}"
        );
        assert!(
            line("hide-threads-4").contains("cpus 3-4 (socket0, exclusive)"),
            "{out}"
        );
        // Without SMT: no sibling pair, said so; 3 CPUs exclusive.
        let flat = explain(&agent(false));
        assert!(
            flat.contains("not honoured: exclusive-cores sibling-pair: no core"),
            "{flat}"
        );
        assert!(!flat.contains("exclusive-cores whole"), "{flat}");
    }

    /// The memory tier sample on the 2-PMEM server: memory-only nodes are listed as such and
    /// enter only the `memory-type` sample's mems, with the PMEM node nearest to its CPUs.
    #[test]
    fn memory_tier_sample_adds_the_nearest_pmem_node() {
        let out = explain(&agent_on("2socket-snc2-4numa-2pmem-112cpu-smt2", false));
        assert!(
            out.contains("numa node 4: cpus [] memory 126976 MiB distances [17 28 28 28 10 28] memory-only (pmem/cxl"),
            "{out}"
        );
        let pmem = out
            .lines()
            .find(|l| l.trim_start().starts_with("pmem-1-2"))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(pmem.contains("(numa2), mems 2,5: fits one numa"), "{out}");
        assert!(!pmem.contains("not honoured"), "{out}");
        assert!(out.contains("socket0 [socket] cpus 0,2,4"), "{out}");
        assert!(
            !out.contains("mems 0,4") && !out.contains("mems 2,5 mem"),
            "{out}"
        );
        let flat = explain(&agent(false));
        assert!(
            flat.contains(
                "not honoured: memory-type pmem/cxl: this machine has no pmem/cxl memory"
            ),
            "{flat}"
        );
    }

    /// L3 groups smaller than a NUMA node are cache pools in the tree, and the small samples
    /// land on one; `--cache-affinity=off` hides them.
    #[test]
    fn cache_pools_are_listed_and_used() {
        let out = explain(&agent_on("synthetic-2s-2numa-64t-8ccx", false));
        assert_says(
            &out,
            &[
                "    cache0 [cache] cpus 0-3,32-35 (8) mems 0",
                "burstable-4-8    -> cpus 0-3,32-35 (cache0): fits one cache",
                "cache affinity true",
            ],
        );
    }
}
