use super::testing::Mount;
use super::*;

const ID: &str = "0b1c2d3e4f5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

#[test]
fn v2_with_the_systemd_driver_is_read_and_written() {
    let m = Mount::new("v2");
    m.file("cgroup.controllers", "cpuset cpu memory\n");
    m.file("cgroup.procs", "");
    let scope = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda.slice/cri-containerd-{ID}.scope"
    );
    let cpus = m.file(&format!("{scope}/cpuset.cpus"), "0-3\n");
    let mems = m.file(&format!("{scope}/cpuset.mems"), "\n");
    let fs = Cgroupfs::detect(&m.0).expect("detected");
    assert_eq!(fs.hierarchy(), Hierarchy::V2);
    assert!(fs.writable().is_ok());
    let got = fs.read(ID).expect("read");
    assert_eq!(got.cpus, CpuSet::parse("0-3").expect("cpus"));
    assert!(got.mems.is_empty(), "an empty v2 file reads as no nodes");

    fs.write(ID, &CpuSet::parse("1,5-6").expect("cpus"), None)
        .expect("write");
    assert_eq!(std::fs::read_to_string(&cpus).expect("read"), "1,5-6");
    assert_eq!(
        std::fs::read_to_string(&mems).expect("read"),
        "\n",
        "mems untouched"
    );
    let nodes = NodeSet::parse("1").expect("nodes");
    fs.write(ID, &CpuSet::parse("1").expect("cpus"), Some(&nodes))
        .expect("write");
    assert_eq!(std::fs::read_to_string(&mems).expect("read"), "1");
}

#[test]
fn v1_cpuset_hierarchy_with_the_cgroupfs_driver() {
    let m = Mount::new("v1");
    m.file("cpuset/cpuset.cpus", "0-7\n");
    m.file("cpuset/cgroup.procs", "");
    m.file(
        &format!("cpuset/kubepods/burstable/podb/{ID}/cpuset.cpus"),
        "0-7\n",
    );
    m.file(
        &format!("cpuset/kubepods/burstable/podb/{ID}/cpuset.mems"),
        "0\n",
    );
    let fs = Cgroupfs::detect(&m.0).expect("detected");
    assert_eq!(fs.hierarchy(), Hierarchy::V1Cpuset);
    assert_eq!(fs.root(), m.0.join("cpuset"));
    let got = fs.read(ID).expect("read");
    assert_eq!(got.mems, NodeSet::parse("0").expect("nodes"));
    fs.write(ID, &CpuSet::parse("2-3").expect("cpus"), None)
        .expect("write");
    assert_eq!(
        fs.read(ID).expect("read").cpus,
        CpuSet::parse("2-3").expect("cpus")
    );
}

#[test]
fn a_missing_or_moved_container_and_bad_content() {
    let m = Mount::new("moved");
    m.file("cgroup.controllers", "cpuset\n");
    let fs = Cgroupfs::detect(&m.0).expect("detected");
    let err = fs.read(ID).expect_err("nothing there");
    assert!(err.is_not_found(), "{err}");

    // Created after the first lookup walked: found once the walk may run again.
    let first = m.file(&format!("a/{ID}/cpuset.cpus"), "1\n");
    m.file(&format!("a/{ID}/cpuset.mems"), "0\n");
    std::thread::sleep(WALK_AT_MOST_EVERY);
    assert!(fs.read(ID).is_ok());

    // Gone from where it was and back elsewhere (a runtime restarted with another parent).
    let _ = std::fs::remove_dir_all(first.parent().expect("dir"));
    m.file(&format!("b/{ID}/cpuset.cpus"), "garbage\n");
    m.file(&format!("b/{ID}/cpuset.mems"), "0\n");
    std::thread::sleep(WALK_AT_MOST_EVERY);
    match fs.read(ID) {
        Err(CgroupError::Parse { text, .. }) => assert_eq!(text, "garbage"),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn no_cpuset_hierarchy_is_no_cgroupfs() {
    let m = Mount::new("none");
    m.file("memory/memory.limit_in_bytes", "1\n");
    assert!(Cgroupfs::detect(&m.0).is_none());
}
