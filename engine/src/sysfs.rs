//! Topology discovery from a sysfs tree (`/sys`, or a fixture's dump in tests).
//!
//! Reading files is behind [`FileSource`], so the parsing here is testable on in-memory trees;
//! [`DirSource`] reads a real directory, [`MapSource`] a tree in memory (a dump file's: see
//! `dump`), [`RootSource`] either, as `--sysfs-root` names it. The tree is checked, not trusted: every error names the
//! file it came from (and the CPUs, where CPUs are involved), and oddities discovery can work
//! around come back as [`DiscoveryWarning`]s for the caller to log.
//!
//! - `source`: [`FileSource`], [`DirSource`], [`MapSource`], [`RootSource`].
//! - `dump`: the one-file text form of a tree ([`MapSource::from_dump`], `to_dump`, `write_tree`).
//! - `parse`: single values (id files, `cpuN`/`nodeN` names, `meminfo`).
//! - `checks`: consistency across files (node overlaps, CPUs in no node, distances, ...).
//! - `error`: [`DiscoveryError`] and [`DiscoveryWarning`].

mod checks;
mod error;
mod parse;

use crate::cpuset::{CpuSet, MAX_IDS};
use crate::nodeset::MAX_NODES;
use crate::pci::{is_accelerator_class, PciDevice};
use crate::raw::{RawCpu, RawNode, RawTopology};
pub use crate::source::{DirSource, DumpError, FileSource, MapSource, RootSource, DUMP_MAGIC};
use checks::NodeFiles;
pub use error::{DiscoveryError, DiscoveryWarning};
use parse::{cpus_error, dir_id, malformed, parse_id, parse_memtotal, Id};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

const CPU_DIR: &str = "devices/system/cpu";
const NODE_DIR: &str = "devices/system/node";
const PCI_DIR: &str = "bus/pci/devices";
const TIER_DIR: &str = "devices/virtual/memory_tiering";

fn read_error(path: &str, source: io::Error) -> DiscoveryError {
    DiscoveryError::Read {
        path: path.to_string(),
        source,
    }
}

/// What reading `path` gave, a file or directory that is not there as `None`.
fn absent_as_none<T>(path: &str, read: io::Result<T>) -> Result<Option<T>, DiscoveryError> {
    match read {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(read_error(path, e)),
    }
}

struct Reader<'a, S: FileSource + ?Sized> {
    src: &'a S,
}

impl<S: FileSource + ?Sized> Reader<'_, S> {
    fn read(&self, path: &str) -> Result<String, DiscoveryError> {
        self.src.read(path).map_err(|e| read_error(path, e))
    }

    fn read_opt(&self, path: &str) -> Result<Option<String>, DiscoveryError> {
        absent_as_none(path, self.src.read(path))
    }

    /// Directory entries; `None` when the directory does not exist.
    fn list_opt(&self, path: &str) -> Result<Option<Vec<String>>, DiscoveryError> {
        absent_as_none(path, self.src.list(path))
    }

    fn cpuset(&self, path: &str, text: &str) -> Result<CpuSet, DiscoveryError> {
        CpuSet::parse(text).map_err(|e| cpus_error(path, text, e))
    }

    /// A topology id file of `cpu` (`physical_package_id`, `die_id`, ...): a decimal integer
    /// below `limit`, or -1 for "unknown" (`None`, as is a missing file).
    fn id_opt(
        &self,
        cpu: usize,
        dir: &str,
        name: &'static str,
        limit: u64,
    ) -> Result<Option<u64>, DiscoveryError> {
        let path = format!("{dir}/{name}");
        let Some(text) = self.read_opt(&path)? else {
            return Ok(None);
        };
        match parse_id(&text) {
            Id::Unknown => Ok(None),
            Id::Value(v) if v < limit => Ok(Some(v)),
            Id::Value(_) | Id::OutOfRange => Err(DiscoveryError::TopologyIdOutOfRange {
                path,
                cpu,
                what: name,
                value: text.trim().chars().take(40).collect(),
                limit,
            }),
            Id::Malformed => Err(malformed(&path, "not an integer".into(), &text)),
        }
    }

    fn hex_opt(&self, path: &str) -> Result<Option<u32>, DiscoveryError> {
        match self.read_opt(path)? {
            None => Ok(None),
            Some(t) => {
                let s = t.trim().trim_start_matches("0x");
                u32::from_str_radix(s, 16)
                    .map(Some)
                    .map_err(|_| malformed(path, "not a hexadecimal number".into(), &t))
            }
        }
    }
}

/// Options for discovery.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryOptions {
    /// Extra PCI devices (addresses) to report even if they are neither display controllers nor
    /// processing accelerators.
    pub extra_devices: Vec<String>,
}

/// A discovered topology and what was odd about the tree it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    pub raw: RawTopology,
    pub warnings: Vec<DiscoveryWarning>,
}

/// Discovers the topology under a sysfs root, dropping warnings: see [`discover_with_warnings`].
pub fn discover(
    src: &(impl FileSource + ?Sized),
    opts: &DiscoveryOptions,
) -> Result<RawTopology, DiscoveryError> {
    discover_with_warnings(src, opts).map(|d| d.raw)
}

/// Discovers the topology under a sysfs root. The tree is checked, not trusted: files that
/// disagree with each other are an error (see [`DiscoveryError`]) rather than a wrong model;
/// oddities discovery can work around are returned as warnings.
pub fn discover_with_warnings(
    src: &(impl FileSource + ?Sized),
    opts: &DiscoveryOptions,
) -> Result<Discovery, DiscoveryError> {
    let r = Reader { src };
    // CPUs with a cpuN directory; online ones are the `online` list (every directory when the
    // list is missing), each of which must have its directory.
    let mut cpu_dirs = CpuSet::new();
    for name in r.list_opt(CPU_DIR)?.unwrap_or_default() {
        match dir_id(&name, "cpu", MAX_IDS) {
            None => {}
            Some(Ok(id)) => {
                cpu_dirs.insert(id);
            }
            Some(Err(value)) => {
                return Err(DiscoveryError::CpuIdOutOfRange {
                    path: format!("{CPU_DIR}/{name}"),
                    value,
                })
            }
        }
    }
    let online_path = format!("{CPU_DIR}/online");
    let online = match r.read_opt(&online_path)? {
        Some(t) => {
            let online = r.cpuset(&online_path, &t)?;
            checks::online_has_dirs(&online_path, CPU_DIR, &online, &cpu_dirs)?;
            online
        }
        None => cpu_dirs,
    };
    if online.is_empty() {
        return Err(DiscoveryError::NoCpus {
            path: CPU_DIR.to_string(),
        });
    }
    let isolated_path = format!("{CPU_DIR}/isolated");
    let isolated = match r.read_opt(&isolated_path)? {
        Some(t) => r.cpuset(&isolated_path, &t)?,
        None => CpuSet::new(),
    };

    let node_files = read_nodes(&r)?;
    checks::nodes_disjoint(&node_files)?;
    checks::every_cpu_in_a_node(NODE_DIR, &online, &node_files)?;
    checks::memory_adds_up(&node_files)?;
    let mut warnings = checks::distance_warnings(&node_files);
    let mut nodes: Vec<RawNode> = node_files.into_iter().map(|n| n.node).collect();
    read_memory_tiers(&r, &mut nodes, &mut warnings)?;

    let mut cpus = Vec::new();
    for id in online.iter() {
        cpus.push(read_cpu(&r, id, &nodes)?);
    }
    let devices = read_devices(&r, opts, &nodes, &mut warnings)?;
    Ok(Discovery {
        raw: RawTopology {
            cpus,
            nodes,
            devices,
            isolated,
            // Identified by the caller, from sysfs and proc (crate::cpu_model::identify).
            cpu: crate::cpu_model::CpuModel::unknown(),
        },
        warnings,
    })
}

/// NUMA nodes, ascending by id; none when the kernel has no node directory (no NUMA).
fn read_nodes<S: FileSource + ?Sized>(r: &Reader<S>) -> Result<Vec<NodeFiles>, DiscoveryError> {
    let mut dirs: BTreeMap<u32, String> = BTreeMap::new();
    for name in r.list_opt(NODE_DIR)?.unwrap_or_default() {
        let path = format!("{NODE_DIR}/{name}");
        let id = match dir_id(&name, "node", MAX_NODES) {
            None => continue,
            // Below MAX_NODES, so it fits a u32.
            Some(Ok(id)) => id as u32,
            Some(Err(value)) => return Err(DiscoveryError::NodeIdOutOfRange { path, value }),
        };
        if let Some(first) = dirs.insert(id, path.clone()) {
            return Err(DiscoveryError::DuplicateNode {
                first,
                second: path,
                id,
            });
        }
    }
    let mut nodes = Vec::new();
    for (id, base) in dirs {
        let mut cpus_path = format!("{base}/cpulist");
        let cpus = match r.read_opt(&cpus_path)? {
            Some(t) => r.cpuset(&cpus_path, &t)?,
            None => {
                cpus_path = format!("{base}/cpumap");
                let t = r.read(&cpus_path)?;
                CpuSet::parse_mask(&t).map_err(|e| cpus_error(&cpus_path, &t, e))?
            }
        };
        let mi_path = format!("{base}/meminfo");
        let memory_bytes = match r.read_opt(&mi_path)? {
            Some(t) => parse_memtotal(&mi_path, &t)?,
            None => 0,
        };
        let distance_path = format!("{base}/distance");
        let distances = match r.read_opt(&distance_path)? {
            Some(t) => t
                .split_whitespace()
                .map(|x| x.parse::<u32>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| malformed(&distance_path, "not a list of integers".into(), &t))?,
            None => Vec::new(),
        };
        // The HMAT's bandwidth (MB/s); optional, and a value that does not parse is no value.
        let bw_path = format!("{base}/access0/initiators/read_bandwidth");
        let read_bandwidth = r
            .read_opt(&bw_path)?
            .and_then(|t| t.trim().parse::<u64>().ok());
        nodes.push(NodeFiles {
            node: RawNode {
                id,
                cpus,
                memory_bytes,
                distances,
                read_bandwidth,
                memory_tier: None,
            },
            cpus_path,
            distance_path,
        });
    }
    Ok(nodes)
}

/// The kernel's memory tiers, where it has them: each `memory_tier<N>/nodelist` gives its nodes
/// tier `N`. An optimisation, never a reason to refuse a machine: a list that does not parse is
/// a warning and gives no tier; a node in two tiers keeps the faster; a node discovery did not
/// find is ignored.
fn read_memory_tiers<S: FileSource + ?Sized>(
    r: &Reader<S>,
    nodes: &mut [RawNode],
    warnings: &mut Vec<DiscoveryWarning>,
) -> Result<(), DiscoveryError> {
    for name in r.list_opt(TIER_DIR)?.unwrap_or_default() {
        let Some(Ok(tier)) = dir_id(&name, "memory_tier", u32::MAX as usize) else {
            continue;
        };
        let path = format!("{TIER_DIR}/{name}/nodelist");
        let Some(text) = r.read_opt(&path)? else {
            continue;
        };
        let Ok(list) = crate::nodeset::NodeSet::parse(text.trim()) else {
            warnings.push(DiscoveryWarning::MemoryTierUnreadable {
                path,
                value: text.trim().chars().take(40).collect(),
            });
            continue;
        };
        // Below u32::MAX: `dir_id`'s limit.
        let tier = tier as u32;
        for n in nodes.iter_mut().filter(|n| list.contains(n.id as usize)) {
            n.memory_tier = Some(n.memory_tier.map_or(tier, |t| t.min(tier)));
        }
    }
    Ok(())
}

/// One online CPU's `topology/` facts.
fn read_cpu<S: FileSource + ?Sized>(
    r: &Reader<S>,
    id: usize,
    nodes: &[RawNode],
) -> Result<RawCpu, DiscoveryError> {
    let base = format!("{CPU_DIR}/cpu{id}/topology");
    let limit = MAX_IDS as u64;
    // Ids below MAX_IDS fit a u32.
    let package = r.id_opt(id, &base, "physical_package_id", limit)?;
    let die = r.id_opt(id, &base, "die_id", limit)?;
    // The first CPU of a sibling list, which must include the CPU itself (an empty list counts
    // as missing).
    let first_of = |name: &str| -> Result<Option<usize>, DiscoveryError> {
        let p = format!("{base}/{name}");
        let Some(t) = r.read_opt(&p)? else {
            return Ok(None);
        };
        let list = r.cpuset(&p, &t)?;
        if !list.is_empty() && !list.contains(id) {
            return Err(DiscoveryError::ListOmitsItsCpu {
                path: p,
                cpu: id,
                list: Box::new(list),
            });
        }
        Ok(list.first())
    };
    // Identities from id files carry bit 40 so they never equal a CPU number; they are not
    // unique machine-wide on their own, the builder keys them by package and die.
    let core = match first_of("thread_siblings_list")? {
        Some(c) => c as u64,
        None => {
            let cid = r.id_opt(id, &base, "core_id", 1 << 32)?;
            (1u64 << 40) | cid.unwrap_or(id as u64)
        }
    };
    let cluster = match first_of("cluster_cpus_list")? {
        Some(c) => Some(c as u64),
        None => r
            .id_opt(id, &base, "cluster_id", limit)?
            .map(|v| (1u64 << 40) | v),
    };
    Ok(RawCpu {
        id,
        package: package.unwrap_or(0) as u32,
        die: die.unwrap_or(0) as u32,
        cluster,
        core,
        numa: nodes.iter().find(|n| n.cpus.contains(id)).map(|n| n.id),
        llc: read_l3(r, id)?,
    })
}

/// The CPU's level-3 cache identity: the first CPU of `cache/index<k>/shared_cpu_list` for
/// the index whose `level` is 3. `None` without cache information; a list that does not parse
/// or omits the CPU itself counts as none (the cache level is an optimisation, never a reason
/// to refuse a machine).
fn read_l3<S: FileSource + ?Sized>(
    r: &Reader<S>,
    id: usize,
) -> Result<Option<u64>, DiscoveryError> {
    let base = format!("{CPU_DIR}/cpu{id}/cache");
    for name in r.list_opt(&base)?.unwrap_or_default() {
        if !name.starts_with("index") {
            continue;
        }
        let level = r.read_opt(&format!("{base}/{name}/level"))?;
        if level.as_deref().map(str::trim) != Some("3") {
            continue;
        }
        let list = r
            .read_opt(&format!("{base}/{name}/shared_cpu_list"))?
            .and_then(|t| CpuSet::parse(t.trim()).ok())
            .filter(|l| l.contains(id));
        return Ok(list.and_then(|l| l.first()).map(|c| c as u64));
    }
    Ok(None)
}

/// PCI devices: display controllers and processing accelerators (GPUs, NPUs and the consoles
/// [`crate::devices::classify`] tells apart), and any device named in the options. A `numa_node` that
/// names no discovered node is a warning and the device gets no node.
fn read_devices<S: FileSource + ?Sized>(
    r: &Reader<S>,
    opts: &DiscoveryOptions,
    nodes: &[RawNode],
    warnings: &mut Vec<DiscoveryWarning>,
) -> Result<Vec<PciDevice>, DiscoveryError> {
    let mut devices = Vec::new();
    for addr in r.list_opt(PCI_DIR)?.unwrap_or_default() {
        let base = format!("{PCI_DIR}/{addr}");
        let Some(class) = r.hex_opt(&format!("{base}/class"))? else {
            continue;
        };
        let wanted = is_accelerator_class(class) || opts.extra_devices.iter().any(|d| d == &addr);
        if !wanted {
            continue;
        }
        let nn_path = format!("{base}/numa_node");
        let numa_node = match r.read_opt(&nn_path)? {
            None => None,
            Some(t) => match parse_id(&t) {
                Id::Unknown => None,
                // A kernel without NUMA has no node directories and the model's one node is 0.
                Id::Value(0) if nodes.is_empty() => Some(0),
                Id::Value(v) if nodes.iter().any(|n| u64::from(n.id) == v) => Some(v as u32),
                _ => {
                    warnings.push(DiscoveryWarning::DeviceNodeUnknown {
                        path: nn_path,
                        value: t.trim().chars().take(40).collect(),
                    });
                    None
                }
            },
        };
        devices.push(PciDevice {
            address: addr.clone(),
            class,
            vendor: r.hex_opt(&format!("{base}/vendor"))?.unwrap_or(0),
            device: r.hex_opt(&format!("{base}/device"))?.unwrap_or(0),
            numa_node,
            uuid: None,
        });
    }
    Ok(devices)
}

/// Convenience: discover from a directory on disk or a dump file ([`RootSource`]), dropping
/// warnings.
pub fn discover_dir(root: &Path) -> Result<RawTopology, DiscoveryError> {
    discover(&open_root(root)?, &DiscoveryOptions::default())
}

/// Discover from a directory on disk or a dump file ([`RootSource`]), with warnings for the
/// caller to log.
pub fn discover_dir_with_warnings(root: &Path) -> Result<Discovery, DiscoveryError> {
    discover_with_warnings(&open_root(root)?, &DiscoveryOptions::default())
}

/// [`RootSource::open`], its failure (an unreadable or malformed dump) as a read error of the
/// file.
pub fn open_root(root: &Path) -> Result<RootSource, DiscoveryError> {
    RootSource::open(root).map_err(|e| read_error(&root.display().to_string(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    /// `tiny` with HMAT read bandwidths that make the memory-only node 2 four times faster
    /// than node 0's DRAM.
    fn tiny_with_hbm_bandwidth() -> MapSource {
        tiny()
            .with(
                "devices/system/node/node0/access0/initiators/read_bandwidth",
                "100000\n",
            )
            .with(
                "devices/system/node/node2/access0/initiators/read_bandwidth",
                "400000\n",
            )
    }

    fn tiny() -> MapSource {
        let mut m = MapSource::default()
            .with("devices/system/cpu/online", "0-2,4\n")
            .with_node(0, "0-1", 1024, "10 20 20")
            .with_node(1, "2-4", 2048, "20 10 20")
            // A memory-only node.
            .with_node(2, "", 4096, "17 28 10");
        for cpu in [0, 1, 2, 4] {
            let b = format!("devices/system/cpu/cpu{cpu}/topology");
            m = m
                .with(
                    &format!("{b}/physical_package_id"),
                    if cpu < 2 { "0" } else { "1" },
                )
                .with(&format!("{b}/core_id"), &cpu.to_string())
                .with(&format!("{b}/thread_siblings_list"), &cpu.to_string());
        }
        m
    }

    #[test]
    fn offline_cpus_memory_only_nodes_and_gaps() {
        let raw = discover(&tiny(), &DiscoveryOptions::default()).unwrap();
        assert_eq!(raw.cpus.len(), 4);
        assert_eq!(raw.nodes.len(), 3);
        assert_eq!(raw.nodes[2].memory_bytes, 4096 * 1024);
        let t = Topology::build(&raw).unwrap();
        assert_eq!(t.online.to_string(), "0-2,4");
        assert_eq!(t.sockets, 2);
        // CPU 3 is offline: it is in node1's cpulist but not in the model.
        assert_eq!(t.node(1).unwrap().cpus.to_string(), "2,4");
        // The memory-only node is a tier of its own (PMEM/CXL without HMAT data), in no pool.
        assert_eq!(t.pool_by_name("socket0").unwrap().mems.to_string(), "0");
        assert_eq!(t.node(2).unwrap().kind, crate::topology::MemoryKind::Pmem);
        assert_eq!(raw.nodes[2].read_bandwidth, None);
    }

    #[test]
    fn hmat_bandwidth_makes_a_memory_only_node_hbm() {
        let m = tiny_with_hbm_bandwidth();
        let raw = discover(&m, &DiscoveryOptions::default()).unwrap();
        assert_eq!(raw.nodes[2].read_bandwidth, Some(400_000));
        let t = Topology::build(&raw).unwrap();
        assert_eq!(t.node(2).unwrap().kind, crate::topology::MemoryKind::Hbm);
    }

    /// Memory tiers: each tier's nodelist gives its nodes the tier; a slower tier than the CPU
    /// nodes' makes a memory-only node PMEM/CXL even where the HMAT says it is faster than
    /// DRAM. A list that does not parse is a warning and no tier.
    #[test]
    fn memory_tiers_are_read_and_come_before_the_hmat() {
        let tier = |n: &str| format!("devices/virtual/memory_tiering/memory_tier{n}/nodelist");
        let m = tiny_with_hbm_bandwidth()
            .with(&tier("4"), "0-1\n")
            .with(&tier("22"), "2\n");
        let d = discover_with_warnings(&m, &DiscoveryOptions::default()).unwrap();
        let tiers: Vec<Option<u32>> = d.raw.nodes.iter().map(|n| n.memory_tier).collect();
        assert_eq!(tiers, vec![Some(4), Some(4), Some(22)]);
        let unreadable = |w: &[DiscoveryWarning]| -> Vec<String> {
            w.iter()
                .filter(|w| matches!(w, DiscoveryWarning::MemoryTierUnreadable { .. }))
                .map(|w| w.to_string())
                .collect()
        };
        assert!(unreadable(&d.warnings).is_empty(), "{:?}", d.warnings);
        let t = Topology::build(&d.raw).unwrap();
        assert_eq!(t.node(2).unwrap().kind, crate::topology::MemoryKind::Pmem);
        // A tier the node shares with the DRAM: the HMAT decides.
        let m = m.with(&tier("22"), "\n").with(&tier("4"), "0-2\n");
        let raw = discover(&m, &DiscoveryOptions::default()).unwrap();
        let t = Topology::build(&raw).unwrap();
        assert_eq!(t.node(2).unwrap().kind, crate::topology::MemoryKind::Hbm);
        // Unreadable: a warning naming the file, no tier.
        let m = tiny().with(&tier("4"), "0-x\n");
        let d = discover_with_warnings(&m, &DiscoveryOptions::default()).unwrap();
        assert!(d.raw.nodes.iter().all(|n| n.memory_tier.is_none()));
        let said = unreadable(&d.warnings);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("memory_tier4/nodelist"), "{said:?}");
    }

    #[test]
    fn malformed_files_name_the_file() {
        let m = tiny().with("devices/system/node/node1/cpulist", "2-x\n");
        let err = discover(&m, &DiscoveryOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("devices/system/node/node1/cpulist"), "{err}");
        let m = tiny().with(
            "devices/system/cpu/cpu1/topology/physical_package_id",
            "zero",
        );
        let err = discover(&m, &DiscoveryOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpu1/topology/physical_package_id"), "{err}");
        let m = tiny().with("devices/system/node/node0/meminfo", "nothing here");
        let err = discover(&m, &DiscoveryOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("node0/meminfo"), "{err}");
    }

    #[test]
    fn pci_display_controllers_are_found() {
        let m = tiny()
            .with("bus/pci/devices/0000:10:00.0/class", "0x030200\n")
            .with("bus/pci/devices/0000:10:00.0/vendor", "0x10de\n")
            .with("bus/pci/devices/0000:10:00.0/device", "0x1db6\n")
            .with("bus/pci/devices/0000:10:00.0/numa_node", "1\n")
            .with("bus/pci/devices/0000:00:1f.0/class", "0x060100\n")
            .with("bus/pci/devices/0000:00:1f.0/numa_node", "-1\n");
        let raw = discover(&m, &DiscoveryOptions::default()).unwrap();
        assert_eq!(raw.devices.len(), 1);
        assert_eq!(raw.devices[0].numa_node, Some(1));
        assert!(raw.devices[0].is_gpu());
        let opts = DiscoveryOptions {
            extra_devices: vec!["0000:00:1f.0".into()],
        };
        let raw = discover(&m, &opts).unwrap();
        assert_eq!(raw.devices.len(), 2);
        assert_eq!(raw.devices[0].numa_node, None);
    }
}
