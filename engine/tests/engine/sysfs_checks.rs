//! sysfs is checked, not trusted: each inconsistency a copy of a fixture is given here is a
//! named error that says which file and which CPUs (or a warning, where discovery can work
//! around it), never a panic or a quietly wrong model.

use proptest::prelude::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use tap_engine::sysfs::{
    discover, discover_dir, discover_dir_with_warnings, discover_with_warnings, Discovery,
    DiscoveryError, DiscoveryOptions, DiscoveryWarning, FileSource, MapSource,
};
use tap_engine::testdata::{fixture, fixture_file, fixture_names, materialised};
use tap_engine::Topology;

const GPU96: &str = "synthetic-2s-4numa-96c-gpu";

/// A fixture read into memory, to mutate: most tests run discovery on these.
#[derive(Clone)]
struct Tree {
    map: MapSource,
}

impl Tree {
    fn of(name: &str) -> Tree {
        static GPU: OnceLock<MapSource> = OnceLock::new();
        assert_eq!(name, GPU96);
        let map = GPU.get_or_init(|| fixture(name).expect("fixture"));
        Tree { map: map.clone() }
    }

    fn write(&mut self, rel: &str, content: &str) -> &mut Self {
        self.map.files.insert(rel.to_string(), content.to_string());
        self
    }

    /// Removes a file, a symlink or a directory with everything under it.
    fn remove(&mut self, rel: &str) -> &mut Self {
        let dir = format!("{rel}/");
        let gone = |k: &String| k == rel || k.starts_with(&dir);
        let m = &mut self.map;
        let before = m.files.len() + m.links.len();
        m.files.retain(|k, _| !gone(k));
        m.links.retain(|k, _| !gone(k));
        m.dirs.retain(|k| !gone(k));
        assert!(
            m.files.len() + m.links.len() < before,
            "{rel} is not in the tree"
        );
        self
    }

    /// The error discovery reports on the GPU fixture with file `rel` written as `content`.
    fn error_with(rel: &str, content: &str) -> DiscoveryError {
        Tree::of(GPU96).write(rel, content).error()
    }

    /// The error discovery reports on the GPU fixture without `rel`.
    fn error_without(rel: &str) -> DiscoveryError {
        Tree::of(GPU96).remove(rel).error()
    }

    fn error(&self) -> DiscoveryError {
        match discover(&self.map, &DiscoveryOptions::default()) {
            Ok(raw) => panic!("accepted, nodes {:?}", raw.nodes),
            Err(e) => e,
        }
    }

    fn discovery(&self) -> Discovery {
        let d = discover_with_warnings(&self.map, &DiscoveryOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        Topology::build(&d.raw).unwrap_or_else(|e| panic!("{e}"));
        d
    }

    fn warnings(&self) -> Vec<DiscoveryWarning> {
        self.discovery().warnings
    }

    /// The warnings discovery gives on the GPU fixture with file `rel` written as `content`.
    fn warnings_with(rel: &str, content: &str) -> Vec<DiscoveryWarning> {
        Tree::of(GPU96).write(rel, content).warnings()
    }
}

/// Reads the sysfs tree at `root` into `m` as a reader of `/sys` sees it: symlinks are followed
/// (a `cpuN/nodeK` link to a directory shows that directory's files under the link's name),
/// except a link to a directory the walk is already inside (the kernel's `node/nodeK/cpuN`
/// back-links), which would loop.
fn read_into(root: &Path, m: &mut MapSource) {
    let mut inside = vec![fs::canonicalize(root).expect("canonicalize")];
    read_tree(root, "", &mut inside, m);
}

fn read_tree(dir: &Path, prefix: &str, inside: &mut Vec<PathBuf>, m: &mut MapSource) {
    for e in fs::read_dir(dir).expect("read_dir") {
        let path = e.expect("entry").path();
        let name = path.file_name().expect("name").to_string_lossy();
        let rel = format!("{prefix}{name}");
        // `fs::metadata` follows links, as opening a path under /sys does.
        let meta = fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if !meta.is_dir() {
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            m.files.insert(rel, text);
            continue;
        }
        let real = fs::canonicalize(&path).expect("canonicalize");
        if inside.contains(&real) {
            continue;
        }
        inside.push(real);
        read_tree(&path, &format!("{rel}/"), inside, m);
        inside.pop();
    }
}

/// A fixture written out to a temporary directory, removed on drop: for the tests that delete
/// node directories, so that they go through `DirSource`'s listing too.
struct DiskTree {
    root: PathBuf,
}

impl DiskTree {
    fn copy_of(name: &str) -> DiskTree {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "tap-sysfs-checks-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fixture(name)
            .expect("fixture")
            .write_tree(&root)
            .expect("write_tree");
        DiskTree { root }
    }
}

impl Drop for DiskTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The error's message names every one of `parts`.
fn says(err: &DiscoveryError, parts: &[&str]) {
    let msg = err.to_string();
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not say {p:?}");
    }
}

#[test]
fn overlapping_node_cpulists_are_an_error() {
    let err = Tree::error_with("devices/system/node/node1/cpulist", "20-47\n");
    assert!(
        matches!(&err, DiscoveryError::OverlappingNodes { cpus, .. } if cpus.to_string() == "20-23"),
        "{err:?}"
    );
    says(
        &err,
        &[
            "CPUs 20-23",
            "devices/system/node/node0/cpulist",
            "devices/system/node/node1/cpulist",
        ],
    );
}

#[test]
fn online_naming_a_cpu_without_a_directory_is_an_error() {
    let err = Tree::error_without("devices/system/cpu/cpu95");
    assert!(
        matches!(&err, DiscoveryError::OnlineCpuWithoutDir { cpus, .. } if cpus.to_string() == "95"),
        "{err:?}"
    );
    says(&err, &["devices/system/cpu/online", "CPUs 95"]);

    let mut t = Tree::of(GPU96);
    t.write("devices/system/cpu/online", "0-97\n");
    says(&t.error(), &["devices/system/cpu/online", "CPUs 96-97"]);
}

#[test]
fn out_of_range_physical_package_id_is_an_error() {
    for bad in ["99999", "1024", "-7", "99999999999999999999999"] {
        let err = Tree::error_with("devices/system/cpu/cpu5/topology/physical_package_id", bad);
        assert!(
            matches!(
                &err,
                DiscoveryError::TopologyIdOutOfRange {
                    cpu: 5,
                    what: "physical_package_id",
                    ..
                }
            ),
            "{bad}: {err:?}"
        );
        says(
            &err,
            &[
                "devices/system/cpu/cpu5/topology/physical_package_id",
                "CPU 5",
                bad,
            ],
        );
    }
    // -1 is the kernel's "unknown": accepted, as before.
    let mut t = Tree::of(GPU96);
    t.write(
        "devices/system/cpu/cpu5/topology/physical_package_id",
        "-1\n",
    );
    t.warnings();
}

#[test]
fn die_and_cluster_ids_beyond_the_set_capacity_are_errors() {
    let err = Tree::error_with("devices/system/cpu/cpu7/topology/die_id", "1024\n");
    assert!(
        matches!(
            &err,
            DiscoveryError::TopologyIdOutOfRange {
                cpu: 7,
                what: "die_id",
                ..
            }
        ),
        "{err:?}"
    );
    says(&err, &["cpu7/topology/die_id", "1024", "CPU 7"]);

    // cluster_id is read where cluster_cpus_list is missing.
    let mut t = Tree::of(GPU96);
    t.remove("devices/system/cpu/cpu9/topology/cluster_cpus_list");
    t.write("devices/system/cpu/cpu9/topology/cluster_id", "5000\n");
    let err = t.error();
    assert!(
        matches!(
            &err,
            DiscoveryError::TopologyIdOutOfRange {
                cpu: 9,
                what: "cluster_id",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn cpu_and_node_directories_beyond_the_set_capacity_are_errors() {
    let err = Tree::error_with("devices/system/cpu/cpu1024/topology/core_id", "0\n");
    assert!(
        matches!(&err, DiscoveryError::CpuIdOutOfRange { value, .. } if value == "1024"),
        "{err:?}"
    );
    says(&err, &["devices/system/cpu/cpu1024"]);

    let err = Tree::error_with("devices/system/node/node4096/cpulist", "\n");
    assert!(
        matches!(&err, DiscoveryError::NodeIdOutOfRange { value, .. } if value == "4096"),
        "{err:?}"
    );
    says(&err, &["devices/system/node/node4096"]);

    // Node sets hold ids below 128 (tap_engine::nodeset::MAX_NODES), not 1,024 as CPU sets.
    let err = Tree::error_with("devices/system/node/node128/cpulist", "\n");
    assert!(
        matches!(&err, DiscoveryError::NodeIdOutOfRange { value, .. } if value == "128"),
        "{err:?}"
    );
    says(&err, &["devices/system/node/node128", "128"]);

    // In a CPU list or a node's cpumap.
    let err = Tree::error_with("devices/system/node/node0/cpulist", "0-23,1500\n");
    assert!(
        matches!(&err, DiscoveryError::CpuIdOutOfRange { value, .. } if value == "1500"),
        "{err:?}"
    );
    says(&err, &["devices/system/node/node0/cpulist", "CPU id 1500"]);
    let mut t = Tree::of(GPU96);
    t.remove("devices/system/node/node3/cpulist").write(
        "devices/system/node/node3/cpumap",
        &format!("1{}\n", "0".repeat(256)),
    );
    let err = t.error();
    assert!(
        matches!(&err, DiscoveryError::CpuIdOutOfRange { value, .. } if value == "1024"),
        "{err:?}"
    );
    says(&err, &["devices/system/node/node3/cpumap"]);
}

#[test]
fn a_sibling_list_without_its_own_cpu_is_an_error() {
    for file in ["thread_siblings_list", "cluster_cpus_list"] {
        let mut t = Tree::of(GPU96);
        let path = format!("devices/system/cpu/cpu5/topology/{file}");
        t.write(&path, "6-7\n");
        let err = t.error();
        assert!(
            matches!(&err, DiscoveryError::ListOmitsItsCpu { cpu: 5, list, .. } if list.to_string() == "6-7"),
            "{err:?}"
        );
        says(&err, &[&path, "CPUs 6-7", "CPU 5"]);
    }
}

#[test]
fn a_node_listed_twice_is_an_error() {
    let err = Tree::error_with("devices/system/node/node01/cpulist", "\n");
    assert!(
        matches!(&err, DiscoveryError::DuplicateNode { id: 1, .. }),
        "{err:?}"
    );
    says(
        &err,
        &["devices/system/node/node01", "devices/system/node/node1"],
    );
}

#[test]
fn cpus_in_no_node_while_nodes_exist_are_an_error_not_a_folded_node_0() {
    let err = Tree::error_without("devices/system/node/node1");
    assert!(
        matches!(
            &err,
            DiscoveryError::CpusInNoNode { cpus, nodes, .. }
                if cpus.to_string() == "24-47" && nodes.to_string() == "0,2-3"
        ),
        "{err:?}"
    );
    says(&err, &["CPUs 24-47", "devices/system/node", "nodes 0,2-3"]);

    // The same on disk, through DirSource's directory listing.
    let disk = DiskTree::copy_of(GPU96);
    fs::remove_dir_all(disk.root.join("devices/system/node/node1")).expect("rm");
    let err = discover_dir(&disk.root).map(|raw| raw.nodes).unwrap_err();
    assert!(
        matches!(err, DiscoveryError::CpusInNoNode { .. }),
        "{err:?}"
    );
    says(&err, &["CPUs 24-47"]);
}

#[test]
fn memtotal_that_overflows_is_an_error_not_a_panic() {
    let err = Tree::error_with(
        "devices/system/node/node2/meminfo",
        "Node 2 MemTotal:       18014398509481984 kB\nNode 2 MemFree: 1 kB\n",
    );
    assert!(
        matches!(&err, DiscoveryError::MemTotalOverflow { kib, .. } if kib == "18014398509481984"),
        "{err:?}"
    );
    says(
        &err,
        &["devices/system/node/node2/meminfo", "18014398509481984"],
    );
}

#[test]
fn node_memory_that_overflows_only_in_sum_is_an_error() {
    let mut t = Tree::of(GPU96);
    // 2^52 kB = 2^62 bytes: each fits, two of them are more than i64::MAX bytes.
    for n in 0..4 {
        t.write(
            &format!("devices/system/node/node{n}/meminfo"),
            &format!("Node {n} MemTotal: 4503599627370496 kB\n"),
        );
    }
    let err = t.error();
    assert!(
        matches!(&err, DiscoveryError::MemoryTotalOverflow { nodes } if nodes.to_string() == "0-3"),
        "{err:?}"
    );
}

#[test]
fn asymmetric_distance_is_a_warning() {
    let w = Tree::warnings_with("devices/system/node/node0/distance", "10 12 21 20\n");
    assert_eq!(
        w,
        vec![DiscoveryWarning::AsymmetricDistance {
            a: 0,
            b: 2,
            a_path: "devices/system/node/node0/distance".into(),
            b_path: "devices/system/node/node2/distance".into(),
            a_to_b: 21,
            b_to_a: 20,
        }]
    );
    let msg = w[0].to_string();
    assert!(msg.contains("node0/distance gives 21 to node 2"), "{msg}");
}

#[test]
fn short_distance_row_is_a_warning() {
    let w = Tree::warnings_with("devices/system/node/node3/distance", "20 20 12\n");
    assert_eq!(
        w,
        vec![DiscoveryWarning::DistanceRowLength {
            path: "devices/system/node/node3/distance".into(),
            node: 3,
            got: 3,
            expected: 4,
        }]
    );
    let msg = w[0].to_string();
    assert!(
        msg.contains("node3/distance lists 3 distances for 4"),
        "{msg}"
    );
}

#[test]
fn device_on_an_unknown_node_is_a_warning() {
    let mut t = Tree::of(GPU96);
    t.write("bus/pci/devices/0000:10:00.0/numa_node", "7\n");
    let d = t.discovery();
    assert_eq!(d.raw.devices[0].numa_node, None);
    assert!(
        matches!(&d.warnings[..], [DiscoveryWarning::DeviceNodeUnknown { value, .. }] if value == "7"),
        "{:?}",
        d.warnings
    );
}

#[test]
fn no_node_directories_is_one_node_with_all_cpus() {
    let check = |d: Discovery| {
        assert_eq!(d.warnings, vec![]);
        let topo = Topology::build(&d.raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(topo.nodes.len(), 1);
        assert_eq!(topo.nodes[0].id, 0);
        assert_eq!(topo.nodes[0].cpus.to_string(), "0-95");
        assert_eq!(topo.sockets, 2);
        assert_eq!(topo.devices[0].numa_node, None);
    };
    // A kernel without NUMA: no node directory, and -1 for a device's node.
    let mut t = Tree::of(GPU96);
    t.remove("devices/system/node")
        .write("bus/pci/devices/0000:10:00.0/numa_node", "-1\n");
    check(t.discovery());
    // The directory without nodeN entries.
    t.write("devices/system/node/possible", "0\n");
    check(t.discovery());
    // On disk.
    let disk = DiskTree::copy_of(GPU96);
    fs::remove_dir_all(disk.root.join("devices/system/node")).expect("rm");
    fs::write(
        disk.root.join("bus/pci/devices/0000:10:00.0/numa_node"),
        "-1\n",
    )
    .expect("write");
    check(discover_dir_with_warnings(&disk.root).unwrap_or_else(|e| panic!("{e}")));
}

#[test]
fn every_fixture_discovers_without_warnings() {
    let names = fixture_names().expect("fixtures");
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let d = discover_dir_with_warnings(&fixture_file(&name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.warnings, vec![], "{name}");
    }
}

/// Every fixture keeps the kernel's symlinks (`cpuN/nodeK` to the node's directory, `cpuN/cpufreq`
/// to its policy), in its dump and in its folder on disk, and reads through them: discovery on
/// the dump in memory, on the folder, and on the folder read into memory through its links
/// gives the same.
#[test]
fn fixtures_read_through_their_symlinks() {
    let folder = materialised(GPU96).expect("materialised");
    let link = folder.join("devices/system/cpu/cpu0/node0");
    let kind = fs::symlink_metadata(&link).expect("cpu0/node0").file_type();
    assert!(kind.is_symlink(), "{} is not a symlink", link.display());
    let dump = fixture(GPU96).expect("fixture");
    assert_eq!(
        dump.links["devices/system/cpu/cpu0/node0"],
        "../../node/node0"
    );
    assert_eq!(
        dump.read("devices/system/cpu/cpu0/node0/cpulist")
            .expect("cpulist"),
        "0-23\n"
    );
    for name in fixture_names().expect("fixtures") {
        let folder = materialised(&name).expect("materialised");
        let mut m = MapSource::default();
        read_into(&folder, &mut m);
        let on_disk = discover_dir(&folder).unwrap_or_else(|e| panic!("{name}: {e}"));
        let in_memory =
            discover(&m, &DiscoveryOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(in_memory, on_disk, "{name}");
        let dump = fixture(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let from_dump =
            discover(&dump, &DiscoveryOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(from_dump, on_disk, "{name}");
        // The dump file is exactly what its tree writes back.
        let text = fs::read_to_string(fixture_file(&name)).expect("dump");
        assert!(
            dump.to_dump() == text,
            "{name}: the dump does not round-trip"
        );
        let node_link = m.files.keys().find(|k| {
            k.starts_with("devices/system/cpu/cpu")
                && k.contains("/node")
                && k.ends_with("/cpulist")
        });
        assert!(
            node_link.is_some(),
            "{name}: no cpuN/nodeK link was read through"
        );
    }
}

/// Real sysfs also links each node to its CPUs (`node/nodeK/cpuN` -> `../../cpu/cpuN`), which
/// with `cpuN/nodeK` makes a cycle: the walk follows each link once and stops where it would
/// come back.
#[test]
fn back_links_are_followed_without_looping() {
    let disk = DiskTree::copy_of(GPU96);
    let cpulist = fs::read_to_string(disk.root.join("devices/system/node/node1/cpulist"))
        .expect("node1 cpulist");
    for cpu in tap_engine::CpuSet::parse(&cpulist).expect("cpulist").iter() {
        let back = disk
            .root
            .join(format!("devices/system/node/node1/cpu{cpu}"));
        std::os::unix::fs::symlink(format!("../../cpu/cpu{cpu}"), back).expect("symlink");
    }
    let mut m = MapSource::default();
    read_into(&disk.root, &mut m);
    let has = |k: &str| m.files.contains_key(k);
    assert!(has("devices/system/node/node1/cpu24/topology/core_id"));
    assert!(has("devices/system/cpu/cpu24/node1/cpu25/topology/core_id"));
    assert!(!has(
        "devices/system/cpu/cpu24/node1/cpu24/topology/core_id"
    ));
    assert!(!has("devices/system/node/node1/cpu24/node1/cpulist"));
    let on_disk = discover_dir(&disk.root).unwrap_or_else(|e| panic!("{e}"));
    let in_memory = discover(&m, &DiscoveryOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(in_memory, on_disk);
}

/// A small, valid tree in memory whose files the proptest replaces with garbage.
fn small_tree() -> MapSource {
    let mut m = MapSource::default()
        .with("devices/system/cpu/online", "0-3\n")
        .with_node(0, "0-1", 1024, "10 20")
        .with_node(1, "2-3", 2048, "20 10")
        .with("bus/pci/devices/0000:10:00.0/class", "0x030000\n")
        .with("bus/pci/devices/0000:10:00.0/numa_node", "1\n");
    for cpu in 0..4 {
        let b = format!("devices/system/cpu/cpu{cpu}/topology");
        for (file, v) in [
            ("physical_package_id", cpu / 2),
            ("die_id", 0),
            ("core_id", cpu),
            ("cluster_id", cpu / 2),
        ] {
            m = m.with(&format!("{b}/{file}"), &format!("{v}\n"));
        }
    }
    m
}

const TARGETS: [&str; 10] = [
    "devices/system/cpu/online",
    "devices/system/cpu/isolated",
    "devices/system/node/node0/cpulist",
    "devices/system/node/node1/cpumap",
    "devices/system/node/node1/meminfo",
    "devices/system/node/node0/distance",
    "devices/system/cpu/cpu1/topology/physical_package_id",
    "devices/system/cpu/cpu2/topology/die_id",
    "devices/system/cpu/cpu3/topology/cluster_id",
    "bus/pci/devices/0000:10:00.0/numa_node",
];

fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,40}",
        any::<i128>().prop_map(|n| format!("{n}\n")),
        any::<u64>().prop_map(|n| format!("Node 1 MemTotal: {n} kB\n")),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| format!("{a}-{b}\n")),
        "[0-9a-f,]{0,300}",
        "[0-9 ,-]{0,40}",
    ]
}

proptest! {
    /// Garbage or random numbers in any file: discovery returns Ok or Err, and a model built
    /// from an Ok never panics either.
    #[test]
    fn garbage_in_sysfs_files_never_panics(
        edits in proptest::collection::vec((0..TARGETS.len(), content()), 1..4)
    ) {
        let mut m = small_tree();
        for (i, text) in edits {
            m = m.with(TARGETS[i], &text);
            if TARGETS[i].ends_with("cpumap") {
                m.files.remove("devices/system/node/node1/cpulist");
            }
        }
        if let Ok(raw) = discover(&m, &DiscoveryOptions::default()) {
            let _ = Topology::build(&raw);
        }
    }
}
