use super::*;
use crate::cpu_model::identify;
use crate::source::DirSource;
use crate::testdata::{discover_fixture, fixture, fixture_names, proc_fixture_dir};
use crate::CpuSet;

/// Fixture `name` with its CPU model identified as the agent does (MIDR, else cpuinfo).
fn topology(name: &str) -> Topology {
    let mut raw = discover_fixture(name).unwrap();
    let (sys, proc) = (
        fixture(name).unwrap(),
        DirSource::new(proc_fixture_dir(name)),
    );
    raw.cpu = identify(&sys, &proc, 0).model;
    Topology::build(&raw).unwrap()
}

fn attr<'a>(d: &'a DeviceSpec, key: &str) -> Option<&'a AttrValue> {
    d.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

#[test]
fn every_fixture_offers_each_numa_node_with_cpus_once_with_its_cpus_and_memory() {
    for name in fixture_names().unwrap() {
        let t = topology(&name);
        let all = t.online.difference(&t.isolated);
        let devs = devices(&t, &all, Level::Numa, CoreGrain::WholeCores);
        let with_cpus: Vec<_> = t.cpu_nodes().filter(|n| n.cpus.intersects(&all)).collect();
        assert_eq!(devs.len(), with_cpus.len(), "{name}");
        let total: usize = devs.iter().map(|d| d.cpus).sum();
        assert_eq!(
            total,
            all.len(),
            "{name}: every allocatable CPU in one device"
        );
        for (d, n) in devs.iter().zip(&with_cpus) {
            assert_eq!(d.name, format!("numa{}", n.id), "{name}");
            assert_eq!(d.cpus, n.cpus.intersection(&all).len(), "{name} {}", d.name);
            let pool = pool_of(&t, &d.name).unwrap();
            assert_eq!(pool.cpus, n.cpus, "{name} {}: the device's CPUs", d.name);
            assert_eq!(d.memory_bytes, n.memory_bytes, "{name} {}", d.name);
            assert_eq!(
                attr(d, NUMA_NODE),
                Some(&AttrValue::Int(i64::from(n.id))),
                "{name}"
            );
            assert!(attr(d, "socket").is_some(), "{name} {}: socket", d.name);
            assert_eq!(d.cpu_step, t.core_size_gcd(), "{name}");
            let names: Vec<&str> = d.attributes.iter().map(|(k, _)| k.as_str()).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(names, sorted, "{name}: sorted, each once");
        }
    }
}

#[test]
fn kunpeng_920_numa_nodes_name_the_cpu_and_its_socket() {
    let t = topology("synthetic-2s-4numa-96c-kunpeng920");
    let devs = devices(&t, &t.online, Level::Numa, CoreGrain::WholeCores);
    assert_eq!(devs.len(), 4);
    let sockets: Vec<_> = devs.iter().map(|d| attr(d, "socket").cloned()).collect();
    assert_eq!(
        sockets,
        [0, 0, 1, 1].map(|s| Some(AttrValue::Int(s))).to_vec(),
        "two NUMA nodes per socket"
    );
    for d in &devs {
        assert_eq!(d.cpus, 24);
        assert_eq!(
            attr(d, "cpuModel"),
            Some(&AttrValue::Text("HiSilicon Kunpeng 920".into()))
        );
        assert_eq!(attr(d, "midrPart"), Some(&AttrValue::Text("0xd01".into())));
        assert_eq!(attr(d, "smt"), Some(&AttrValue::Bool(false)));
    }
}

#[test]
fn kunpeng_950_clusters_are_devices_when_asked_for_and_reserved_cpus_are_left_out() {
    let t = topology("synthetic-1s-2numa-96c-kunpeng950");
    let clusters = t.pools.iter().filter(|p| p.level == Level::Cluster).count();
    assert!(clusters > 0, "the fixture has clusters");
    let first = t.pools.iter().find(|p| p.level == Level::Cluster).unwrap();
    let allocatable = t.online.difference(&first.cpus);
    let devs = devices(&t, &allocatable, Level::Cluster, CoreGrain::WholeCores);
    assert_eq!(
        devs.len(),
        clusters - 1,
        "the reserved cluster is no device"
    );
    assert!(devs
        .iter()
        .all(|d| d.level == Level::Cluster && d.name.starts_with("cluster")));
    for d in &devs {
        assert!(attr(d, "cluster").is_some(), "{}", d.name);
        assert!(
            attr(d, NUMA_NODE).is_some(),
            "{}: a cluster is in one node",
            d.name
        );
        assert_eq!(
            attr(d, "cpuModel"),
            Some(&AttrValue::Text("HiSilicon Kunpeng 950".into()))
        );
    }
}

#[test]
fn a_level_the_machine_does_not_have_falls_back_to_numa_nodes() {
    let t = topology("4socket-4numa-144cpu-smt2");
    assert!(t.pools.iter().all(|p| p.level != Level::Cluster));
    let devs = devices(&t, &t.online, Level::Cluster, CoreGrain::WholeCores);
    assert!(devs.iter().all(|d| d.level == Level::Numa));
    assert_eq!(devs.len(), 4);
}

#[test]
fn sockets_span_nodes_and_carry_no_numa_node() {
    let t = topology("synthetic-2s-4numa-96c-kunpeng920");
    let devs = devices(&t, &t.online, Level::Socket, CoreGrain::Threads);
    assert_eq!(devs.len(), 2);
    for d in &devs {
        assert_eq!(attr(d, NUMA_NODE), None, "{}", d.name);
        assert_eq!(d.cpus, 48);
        assert_eq!(d.cpu_step, 1);
    }
    let none = devices(&t, &CpuSet::new(), Level::Socket, CoreGrain::Threads);
    assert!(none.is_empty(), "no allocatable CPU, no device");
}

#[test]
fn smt_machines_step_by_whole_cores() {
    let t = topology("synthetic-2s-2numa-smt-96t");
    let devs = devices(&t, &t.online, Level::Numa, CoreGrain::WholeCores);
    assert!(devs.iter().all(|d| d.cpu_step == 2));
    assert!(devs
        .iter()
        .all(|d| attr(d, "smt") == Some(&AttrValue::Bool(true))));
}
