//! Where the sysfs fixtures are, for tests, benches and examples.
//!
//! Every fixture the repository's tests, benches, examples and e2e tier read ships in the
//! repository as one dump file under `fixtures/sysfs/` (the format and the fixtures: the README
//! there; the proc files that go with some of them are folders under `fixtures/proc/`), so a
//! plain clone tests itself. Code names a fixture by name and finds it here, never by a path of
//! its own: [`fixture`] reads it into memory, for discovery and tests; [`materialised`] writes
//! it out once as a folder under the Cargo target directory, for what needs a real directory
//! (an agent started with `--sysfs-root`, a container image, a test that edits files on disk).

use crate::cpuset::CpuSet;
use crate::raw::{RawCpu, RawNode};
use crate::sysfs::{DiscoveryError, MapSource};
use crate::RawTopology;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The repository's fixtures folder, `fixtures/sysfs` at the workspace root.
///
/// Cargo runs tests, benches and examples with `CARGO_MANIFEST_DIR` set to the package being
/// run (every workspace package sits one level below the root), so that checkout is preferred
/// to the one this crate was compiled in: a build directory shared between two clones can hold
/// this crate compiled in the other one (Cargo judges it fresh by modification times).
pub fn fixtures_root() -> PathBuf {
    let at_run = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(|dir| Path::new(&dir).join("../fixtures/sysfs"))
        .filter(|root| root.is_dir());
    at_run.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/sysfs"))
}

/// The dump file of fixture `name`: `fixtures/sysfs/<name>` in the repository. The agent's
/// `--sysfs-root` (and tap-sim's) takes it as it is.
pub fn fixture_file(name: &str) -> PathBuf {
    fixtures_root().join(name)
}

/// Fixture `name` read into memory (its symlinks are followed when read).
pub fn fixture(name: &str) -> io::Result<MapSource> {
    let text = std::fs::read_to_string(fixture_file(name))?;
    MapSource::from_dump(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The topology discovery finds in fixture `name`.
pub fn discover_fixture(name: &str) -> Result<RawTopology, DiscoveryError> {
    crate::sysfs::discover_dir(&fixture_file(name))
}

/// The proc root that goes with fixture `name` (`fixtures/proc/<name>`: the NVIDIA driver's
/// GPU files, where the fixture has them), for `--proc-root`.
pub fn proc_fixture_dir(name: &str) -> PathBuf {
    fixtures_root().join("../proc").join(name)
}

/// The names of every fixture the repository ships (its dump files), sorted.
pub fn fixture_names() -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(fixtures_root())? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type()?.is_file() && name != "README.md" {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Fixture `name` as a folder (files and symlinks), written once under the Cargo target
/// directory: `<target>/tap-fixtures/<hash of the dump>/<name>`, so that the folder has the
/// fixture's name and a changed dump gets a new one. It is written under a temporary name
/// and renamed into place, so tests running at the same time never see half of it; don't
/// change it (copy it first).
pub fn materialised(name: &str) -> io::Result<PathBuf> {
    let text = std::fs::read_to_string(fixture_file(name))?;
    let parent = target_dir()
        .join("tap-fixtures")
        .join(format!("{:016x}", fnv1a(text.as_bytes())));
    let dir = parent.join(name);
    if dir.is_dir() {
        return Ok(dir);
    }
    let tree =
        MapSource::from_dump(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    std::fs::create_dir_all(&parent)?;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let tmp = parent.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let written = tree
        .write_tree(&tmp)
        .and_then(|()| std::fs::rename(&tmp, &dir));
    match written {
        Ok(()) => Ok(dir),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another process renamed its copy into place first.
            if dir.is_dir() {
                Ok(dir)
            } else {
                Err(e)
            }
        }
    }
}

/// The Cargo target directory of the running binary (a test, bench or example sits in it:
/// Cargo keeps `.rustc_info.json` at its root), else `CARGO_TARGET_DIR`, else `target` at the
/// workspace root.
fn target_dir() -> PathBuf {
    let workspace = fixtures_root().join("../..");
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        exe.ancestors()
            .find(|d| d.join(".rustc_info.json").is_file() || d.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
    });
    from_exe
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(|t| workspace.join(t)))
        .unwrap_or_else(|| workspace.join("target"))
}

/// 64-bit FNV-1a: names a dump's content.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Container `i` of the placement benchmarks' mix: 70% Burstable (100m-500m requested, twice
/// that as the limit), 20% BestEffort, 10% Guaranteed with 1 or 2 CPUs. The criterion bench
/// (`engine/benches/placement.rs`) and the instruction count (`engine/examples/
/// placement_workload.rs`, hack/bench-ir.sh) build their state from it, so both measure the
/// same thing.
pub fn bench_request(i: usize) -> crate::ContainerRequest {
    use crate::Qos;
    let k = i as u64;
    let (qos, request, limit) = match i % 10 {
        0 => (Qos::Guaranteed, 1000 + 1000 * (k / 10 % 2), None),
        1 | 2 => (Qos::BestEffort, 0, None),
        _ => {
            let r = 100 + (k * 37) % 400;
            (Qos::Burstable, r, Some(2 * r))
        }
    };
    crate::ContainerRequest {
        id: format!("c{i:04}"),
        namespace: "default".into(),
        container_name: "app".into(),
        qos: Some(qos),
        cpu_request_milli: request,
        cpu_limit_milli: if qos == Qos::Guaranteed {
            Some(request)
        } else {
            limit
        },
        ..Default::default()
    }
}

/// The container the placement benchmarks place on their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `new`: Burstable, 4 CPUs requested, 8 the limit.
    Burstable,
    /// `new-g`: Guaranteed, 4 CPUs (exclusive where the policy gives them).
    Guaranteed,
}

impl Probe {
    pub fn request(self) -> crate::ContainerRequest {
        let (id, qos, limit) = match self {
            Probe::Burstable => ("new", crate::Qos::Burstable, 8000),
            Probe::Guaranteed => ("new-g", crate::Qos::Guaranteed, 4000),
        };
        crate::ContainerRequest {
            id: id.into(),
            namespace: "default".into(),
            qos: Some(qos),
            cpu_request_milli: 4000,
            cpu_limit_milli: Some(limit),
            ..Default::default()
        }
    }
}

/// Why a fixture gave no topology.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("the fixture does not discover: {0}")]
    Discovery(#[from] DiscoveryError),
    #[error("the fixture builds no topology: {0}")]
    Topology(#[from] crate::topology::TopologyError),
}

/// The topology of fixture `name`, built.
pub fn fixture_topology(name: &str) -> Result<std::sync::Arc<crate::Topology>, FixtureError> {
    let raw = discover_fixture(name)?;
    Ok(std::sync::Arc::new(crate::Topology::build(&raw)?))
}

/// An engine of `policy` on `topo` with the first `n` containers of [`bench_request`] placed.
pub fn bench_engine(
    topo: std::sync::Arc<crate::Topology>,
    policy: crate::PolicyKind,
    n: usize,
) -> crate::Engine {
    let mut e = crate::Engine::new(
        topo,
        crate::EngineConfig {
            policy,
            ..Default::default()
        },
    );
    for i in 0..n {
        let _ = e.create(&bench_request(i));
    }
    e
}

/// A hand-made machine for tests: `sockets` x `dies` x `numa_per_die` NUMA nodes, each of
/// `clusters_per_numa` clusters of `cores_per_cluster` single-thread cores, CPU ids linear;
/// `memory_bytes` per node; distances 10 local, 12 within a socket, 20 across sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub sockets: u32,
    pub dies: u32,
    pub numa_per_die: u32,
    pub clusters_per_numa: u32,
    pub cores_per_cluster: u32,
    /// Whether the CPUs report their cluster (else `RawCpu::cluster` is `None`).
    pub cluster_ids: ClusterIds,
    pub memory_bytes: u64,
}

/// Whether a [`Shape`]'s CPUs report the cluster they belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterIds {
    Reported,
    Absent,
}

impl Shape {
    /// `sockets` x `numa_per_socket` nodes of `cores` single-thread cores, one die per socket,
    /// no cluster information.
    pub fn plain(sockets: u32, numa_per_socket: u32, cores: u32, memory_bytes: u64) -> Shape {
        Shape {
            sockets,
            dies: 1,
            numa_per_die: numa_per_socket,
            clusters_per_numa: 1,
            cores_per_cluster: cores,
            cluster_ids: ClusterIds::Absent,
            memory_bytes,
        }
    }

    /// What discovery would read off such a machine.
    pub fn raw(&self) -> RawTopology {
        let nodes_per_socket = self.dies * self.numa_per_die;
        let n_nodes = self.sockets * nodes_per_socket;
        let mut raw = RawTopology::default();
        for node in 0..n_nodes {
            let socket = node / nodes_per_socket;
            let mut set = CpuSet::new();
            for cl in 0..self.clusters_per_numa {
                for _ in 0..self.cores_per_cluster {
                    let id = raw.cpus.len();
                    raw.cpus.push(RawCpu {
                        id,
                        package: socket,
                        die: node % nodes_per_socket / self.numa_per_die,
                        cluster: (self.cluster_ids == ClusterIds::Reported)
                            .then_some(u64::from(node * self.clusters_per_numa + cl)),
                        core: id as u64,
                        numa: Some(node),
                        llc: None,
                    });
                    set.insert(id);
                }
            }
            let distances = (0..n_nodes)
                .map(|o| match o {
                    o if o == node => 10,
                    o if o / nodes_per_socket == socket => 12,
                    _ => 20,
                })
                .collect();
            raw.nodes.push(RawNode {
                id: node,
                cpus: set,
                memory_bytes: self.memory_bytes,
                distances,
                read_bandwidth: None,
                memory_tier: None,
            });
        }
        raw
    }
}
