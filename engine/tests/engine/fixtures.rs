//! Discovery and tree building on every sysfs fixture: the real-machine dumps are checked
//! against their `expected.json` (computed from the files independently) and against the pool
//! counts containers/nri-plugins' own tests expect from the same dumps.

use crate::common::pool_cpus;
use tap_engine::sysfs::FileSource;
use tap_engine::testdata::{discover_fixture, fixture};
use tap_engine::{CpuSet, Level, Topology};

fn load(name: &str) -> Topology {
    let raw = discover_fixture(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    Topology::build(&raw).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const REAL: [&str; 5] = [
    "4socket-4numa-144cpu-smt2",
    "2socket-snc2-4numa-2pmem-112cpu-smt2",
    "2socket-snc2-4numa-80cpu-smt2",
    "desktop-1socket-1numa-20cpu-smt2",
    "hybrid-1socket-1numa-16cpu-4p8e",
];

#[test]
fn real_dumps_match_expected_json() {
    for name in REAL {
        let t = load(name);
        let text = fixture(name).unwrap().read("expected.json").unwrap();
        let exp: serde_json::Value = serde_json::from_str(&text).unwrap();
        let set = |v: &serde_json::Value| CpuSet::parse(v.as_str().unwrap()).unwrap();
        assert_eq!(t.online, set(&exp["cpus_online"]), "{name}: online");
        assert_eq!(t.isolated, set(&exp["cpus_isolated"]), "{name}: isolated");
        let packages = exp["packages"].as_object().unwrap();
        assert_eq!(t.sockets, packages.len(), "{name}: sockets");
        assert_eq!(
            t.dies,
            exp["dies"].as_object().unwrap().len(),
            "{name}: dies"
        );
        assert_eq!(
            t.cores.len() as u64,
            exp["core_count"].as_u64().unwrap(),
            "{name}: cores"
        );
        for (id, node) in exp["numa_nodes"].as_object().unwrap() {
            let id: u32 = id.parse().unwrap();
            let n = t
                .node(id)
                .unwrap_or_else(|| panic!("{name}: node {id} missing"));
            assert_eq!(n.cpus, set(&node["cpus"]), "{name}: node {id} cpus");
            let kib = node["mem_total_kib"].as_u64().unwrap();
            assert_eq!(n.memory_bytes, kib * 1024, "{name}: node {id} memory");
            let dist: Vec<u32> = node["distance"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as u32)
                .collect();
            let ours: Vec<u32> = n.distances.iter().map(|(_, d)| *d).collect();
            assert_eq!(ours, dist, "{name}: node {id} distances");
        }
        // Every socket pool (or the root for one socket) holds exactly its package's CPUs.
        for cpus in packages.values() {
            let s = set(cpus);
            assert!(
                t.pools.iter().any(|p| p.cpus == s),
                "{name}: no pool for package {s}"
            );
        }
    }
}

#[test]
fn pool_counts_match_what_nri_plugins_expects_of_the_same_dumps() {
    // desktop: 1 pool (the socket is the root, 20 CPUs).
    let t = load("desktop-1socket-1numa-20cpu-smt2");
    assert_eq!(t.pools.len(), 1);
    assert_eq!(t.root().cpus.len(), 20);
    // server: root + 2 sockets + 4 NUMA nodes of 28 CPUs. nri-plugins puts the PMEM nodes in
    // the pool of their closest DRAM node; we keep memory-only nodes out of every pool (issue
    // 23: they enter a container's mems only by its `memory-type`).
    let t = load("2socket-snc2-4numa-2pmem-112cpu-smt2");
    assert_eq!(t.pools.len(), 7);
    let numa: Vec<_> = t.pools.iter().filter(|p| p.level == Level::Numa).collect();
    assert_eq!(numa.len(), 4);
    assert!(numa.iter().all(|p| p.cpus.len() == 28));
    assert_eq!(t.pool_by_name("numa0").unwrap().mems.to_string(), "0");
    assert_eq!(t.pool_by_name("numa2").unwrap().mems.to_string(), "2");
    // 4-socket: root + 4 sockets of 36 CPUs; single-NUMA sockets get no NUMA child.
    let t = load("4socket-4numa-144cpu-smt2");
    assert_eq!(t.pools.len(), 5);
    assert!(t.pools[1..]
        .iter()
        .all(|p| p.level == Level::Socket && p.cpus.len() == 36));
}

#[test]
fn hybrid_e_core_clusters_become_cluster_pools() {
    let t = load("hybrid-1socket-1numa-16cpu-4p8e");
    let clusters = pool_cpus(&t, Level::Cluster);
    assert_eq!(clusters, vec!["8-11", "12-15"]);
}

#[test]
fn synthetic_shapes() {
    let t = load("synthetic-1s-2numa-per-die-offline");
    assert_eq!(t.online.len(), 30);
    assert!(!t.online.contains(5) && !t.online.contains(17));
    assert_eq!(t.pools.iter().filter(|p| p.level == Level::Numa).count(), 2);

    let t = load("synthetic-4s-8numa-smt-384t");
    assert_eq!(t.online.len(), 384);
    assert_eq!(t.sockets, 4);
    assert_eq!(t.pools.iter().filter(|p| p.level == Level::Numa).count(), 8);
    assert_eq!(t.cores.len(), 192);
    assert!(t.cores.iter().all(|c| c.len() == 2));
    let gpus: Vec<_> = t
        .devices
        .iter()
        .filter(|d| d.is_gpu())
        .map(|d| d.numa_node)
        .collect();
    assert_eq!(gpus, vec![Some(0), Some(5)]);

    let t = load("synthetic-2s-2numa-smt-96t");
    // Sibling of CPU 0 is CPU 48.
    assert_eq!(t.cores[0].to_string(), "0,48");
}

/// The live arm64 kernel's sysfs (QEMU `virt`, 2 sockets x 2 clusters x 2 cores, a NUMA node per
/// socket), captured by the NUMA guest tier: sockets, nodes and clusters as QEMU was told.
#[test]
fn the_arm64_guest_capture_has_qemus_sockets_nodes_and_clusters() {
    let name = "qemu-arm64-2s-4cluster-2numa";
    let t = load(name);
    assert_eq!(t.online, CpuSet::parse("0-7").unwrap());
    assert_eq!(t.sockets, 2);
    assert_eq!(t.nodes.len(), 2);
    assert_eq!(t.node(0).unwrap().cpus, CpuSet::parse("0-3").unwrap());
    assert_eq!(t.node(1).unwrap().cpus, CpuSet::parse("4-7").unwrap());
    let d: Vec<u32> = t
        .node(1)
        .unwrap()
        .distances
        .iter()
        .map(|(_, d)| *d)
        .collect();
    assert_eq!(d, vec![20, 10]);
    let clusters = pool_cpus(&t, Level::Cluster);
    assert_eq!(clusters, vec!["0-1", "2-3", "4-5", "6-7"]);
}

/// The two Kunpeng fixtures name their CPU the same way in sysfs (`midr_el1`) and in their
/// `/proc/cpuinfo`; the synthetic others, made without either, are unknown; the QEMU capture is
/// no Kunpeng.
#[test]
fn kunpeng_fixtures_identify_from_midr_and_from_cpuinfo() {
    use tap_engine::cpu_model::{identify, CpuModelSource, KnownCpu, Midr};
    use tap_engine::sysfs::{DirSource, MapSource};
    use tap_engine::testdata::proc_fixture_dir;
    let cases = [
        (
            "synthetic-2s-4numa-96c-kunpeng920",
            KnownCpu::Kunpeng920,
            "0x481fd010",
        ),
        (
            "synthetic-1s-2numa-96c-kunpeng950",
            KnownCpu::Kunpeng950,
            "0x480fd060",
        ),
    ];
    for (name, known, bits) in cases {
        let sys = fixture(name).unwrap();
        let proc = DirSource::new(proc_fixture_dir(name));
        let from_sysfs = identify(&sys, &proc, 0);
        assert!(from_sysfs.problems.is_empty(), "{name}: {from_sysfs:?}");
        assert_eq!(from_sysfs.model.source, CpuModelSource::SysfsMidr, "{name}");
        assert_eq!(from_sysfs.model.known(), Some(known), "{name}");
        assert_eq!(from_sysfs.model.midr, Midr::parse(bits), "{name}");
        // Every online CPU's register says the same.
        let t = load(name);
        for cpu in t.online.iter() {
            assert_eq!(
                identify(&sys, &proc, cpu).model,
                from_sysfs.model,
                "{name} cpu{cpu}"
            );
        }
        // Without sysfs's register, cpuinfo gives the same fields.
        let from_proc = identify(&MapSource::default(), &proc, 0);
        assert_eq!(
            from_proc.model.source,
            CpuModelSource::ProcCpuinfo,
            "{name}"
        );
        assert_eq!(from_proc.model.midr, from_sysfs.model.midr, "{name}");
        let text = std::fs::read_to_string(proc_fixture_dir(name).join("cpuinfo")).unwrap();
        assert_eq!(
            text.matches("processor\t:").count(),
            t.online.len(),
            "{name}: one cpuinfo block per online CPU"
        );
    }
    let other = identify(
        &fixture("synthetic-2s-4numa-96c-gpu").unwrap(),
        &MapSource::default(),
        0,
    );
    assert_eq!(other.model.name(), "unknown");
    // The live arm64 guest's capture: QEMU's `-cpu max` (implementer 0x00, part 0x051) is no
    // Kunpeng.
    let qemu = identify(
        &fixture("qemu-arm64-2s-4cluster-2numa").unwrap(),
        &MapSource::default(),
        0,
    );
    assert_eq!(qemu.model.midr, Midr::parse("0x00000000000f0510"));
    assert_eq!(qemu.model.known(), None);
    assert_eq!(qemu.model.name(), "software-defined part 0x051");
}

#[test]
fn kunpeng_fixture_shapes() {
    // Kunpeng 920: 2 sockets, 4 NUMA nodes of 24 cores, clusters of 4 cores.
    let t = load("synthetic-2s-4numa-96c-kunpeng920");
    assert_eq!((t.sockets, t.nodes.len(), t.cores.len()), (2, 4, 96));
    assert_eq!(t.clusters.len(), 24);
    assert!(t.clusters.iter().all(|c| c.len() == 4));
    assert_eq!(t.node(1).unwrap().cpus.to_string(), "24-47");
    // The 0xd06 one: 1 socket, 2 dies = 2 NUMA nodes of 48 cores, clusters of 4 cores.
    let t = load("synthetic-1s-2numa-96c-kunpeng950");
    assert_eq!((t.sockets, t.nodes.len(), t.cores.len()), (1, 2, 96));
    assert_eq!(t.clusters.len(), 24);
    assert_eq!(
        t.pools.iter().filter(|p| p.level == Level::Cluster).count(),
        24
    );
}
