//! Topology discovery from a sysfs tree (`/sys`, or a fixture folder in tests).
//!
//! Reading files is behind [`FileSource`], so the parsing here is testable on in-memory trees;
//! [`DirSource`] reads a real directory. Every error names the file it came from.

use crate::cpuset::CpuSet;
use crate::topology::{PciDevice, RawCpu, RawNode, RawTopology};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Where sysfs files come from.
pub trait FileSource {
    /// The file's text; `Err` with `NotFound` when it does not exist.
    fn read(&self, rel: &str) -> io::Result<String>;
    /// Entry names of a directory.
    fn list(&self, rel: &str) -> io::Result<Vec<String>>;
}

/// A sysfs tree on disk rooted at `root` (e.g. `/sys`).
#[derive(Debug, Clone)]
pub struct DirSource {
    pub root: PathBuf,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirSource { root: root.into() }
    }
}

impl FileSource for DirSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        std::fs::read_to_string(self.root.join(rel))
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.root.join(rel))? {
            out.push(e?.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(out)
    }
}

/// An in-memory tree for tests: path -> content.
#[derive(Debug, Clone, Default)]
pub struct MapSource {
    pub files: BTreeMap<String, String>,
}

impl MapSource {
    pub fn with(mut self, path: &str, content: &str) -> Self {
        self.files.insert(path.to_string(), content.to_string());
        self
    }
}

impl FileSource for MapSource {
    fn read(&self, rel: &str) -> io::Result<String> {
        self.files
            .get(rel)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, rel.to_string()))
    }
    fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let prefix = format!("{}/", rel.trim_end_matches('/'));
        let mut out: Vec<String> = self
            .files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
            .collect();
        out.dedup();
        if out.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, rel.to_string()));
        }
        Ok(out)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("malformed {path}: {what} (content {content:?})")]
    Malformed {
        path: String,
        what: String,
        content: String,
    },
}

const CPU_DIR: &str = "devices/system/cpu";
const NODE_DIR: &str = "devices/system/node";
const PCI_DIR: &str = "bus/pci/devices";

struct Reader<'a, S: FileSource + ?Sized> {
    src: &'a S,
}

impl<S: FileSource + ?Sized> Reader<'_, S> {
    fn read(&self, path: &str) -> Result<String, DiscoveryError> {
        self.src.read(path).map_err(|source| DiscoveryError::Read {
            path: path.to_string(),
            source,
        })
    }

    fn read_opt(&self, path: &str) -> Result<Option<String>, DiscoveryError> {
        match self.src.read(path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(DiscoveryError::Read {
                path: path.to_string(),
                source,
            }),
        }
    }

    fn cpuset(&self, path: &str, text: &str) -> Result<CpuSet, DiscoveryError> {
        CpuSet::parse(text).map_err(|e| malformed(path, e.to_string(), text))
    }

    fn int_opt(&self, path: &str) -> Result<Option<i64>, DiscoveryError> {
        match self.read_opt(path)? {
            None => Ok(None),
            Some(t) => t
                .trim()
                .parse::<i64>()
                .map(Some)
                .map_err(|_| malformed(path, "not an integer".into(), &t)),
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

fn malformed(path: &str, what: String, content: &str) -> DiscoveryError {
    DiscoveryError::Malformed {
        path: path.to_string(),
        what,
        content: content.chars().take(120).collect(),
    }
}

/// Options for discovery.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryOptions {
    /// Extra PCI devices (addresses) to report even if they are not display controllers.
    pub extra_devices: Vec<String>,
}

/// Discovers the topology under a sysfs root.
pub fn discover(
    src: &(impl FileSource + ?Sized),
    opts: &DiscoveryOptions,
) -> Result<RawTopology, DiscoveryError> {
    let r = Reader { src };
    // Online CPUs: the `online` list, or every cpuN directory when it is missing.
    let online_path = format!("{CPU_DIR}/online");
    let online = match r.read_opt(&online_path)? {
        Some(t) => r.cpuset(&online_path, &t)?,
        None => {
            let mut s = CpuSet::new();
            for name in src.list(CPU_DIR).map_err(|source| DiscoveryError::Read {
                path: CPU_DIR.to_string(),
                source,
            })? {
                if let Some(id) = name
                    .strip_prefix("cpu")
                    .and_then(|n| n.parse::<usize>().ok())
                {
                    s.insert(id);
                }
            }
            s
        }
    };
    let isolated_path = format!("{CPU_DIR}/isolated");
    let isolated = match r.read_opt(&isolated_path)? {
        Some(t) => r.cpuset(&isolated_path, &t)?,
        None => CpuSet::new(),
    };

    // NUMA nodes.
    let mut nodes = Vec::new();
    if let Ok(names) = src.list(NODE_DIR) {
        let mut ids: Vec<u32> = names
            .iter()
            .filter_map(|n| n.strip_prefix("node").and_then(|x| x.parse().ok()))
            .collect();
        ids.sort_unstable();
        for id in ids {
            let base = format!("{NODE_DIR}/node{id}");
            let cl_path = format!("{base}/cpulist");
            let cpus = match r.read_opt(&cl_path)? {
                Some(t) => r.cpuset(&cl_path, &t)?,
                None => {
                    let map_path = format!("{base}/cpumap");
                    let t = r.read(&map_path)?;
                    CpuSet::parse_mask(&t).map_err(|e| malformed(&map_path, e.to_string(), &t))?
                }
            };
            let mi_path = format!("{base}/meminfo");
            let memory_bytes = match r.read_opt(&mi_path)? {
                Some(t) => parse_memtotal(&t)
                    .ok_or_else(|| malformed(&mi_path, "no MemTotal line".into(), &t))?,
                None => 0,
            };
            let d_path = format!("{base}/distance");
            let distances = match r.read_opt(&d_path)? {
                Some(t) => t
                    .split_whitespace()
                    .map(|x| x.parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| malformed(&d_path, "not a list of integers".into(), &t))?,
                None => Vec::new(),
            };
            nodes.push(RawNode {
                id,
                cpus,
                memory_bytes,
                distances,
            });
        }
    }

    // CPUs.
    let mut cpus = Vec::new();
    for id in online.iter() {
        let base = format!("{CPU_DIR}/cpu{id}/topology");
        let package = r
            .int_opt(&format!("{base}/physical_package_id"))?
            .unwrap_or(0);
        let die = r.int_opt(&format!("{base}/die_id"))?.unwrap_or(0);
        let first_of = |name: &str| -> Result<Option<usize>, DiscoveryError> {
            let p = format!("{base}/{name}");
            match r.read_opt(&p)? {
                Some(t) => Ok(r.cpuset(&p, &t)?.first()),
                None => Ok(None),
            }
        };
        let core = match first_of("thread_siblings_list")? {
            Some(c) => c as u64,
            None => {
                let cid = r.int_opt(&format!("{base}/core_id"))?.unwrap_or(id as i64);
                // Not unique machine-wide on its own; the builder keys it by package and die.
                (1u64 << 40) | (cid.max(0) as u64)
            }
        };
        let cluster = match first_of("cluster_cpus_list")? {
            Some(c) => Some(c as u64),
            None => r
                .int_opt(&format!("{base}/cluster_id"))?
                .filter(|v| *v >= 0)
                .map(|v| (1u64 << 40) | v as u64),
        };
        let numa = nodes.iter().find(|n| n.cpus.contains(id)).map(|n| n.id);
        cpus.push(RawCpu {
            id,
            package: package.max(0) as u32,
            die: die.max(0) as u32,
            cluster,
            core,
            numa,
        });
    }

    // PCI devices: display controllers, and any device named in the options.
    let mut devices = Vec::new();
    if let Ok(addrs) = src.list(PCI_DIR) {
        for addr in addrs {
            let base = format!("{PCI_DIR}/{addr}");
            let Some(class) = r.hex_opt(&format!("{base}/class"))? else {
                continue;
            };
            let wanted = class >> 16 == 0x03 || opts.extra_devices.iter().any(|d| d == &addr);
            if !wanted {
                continue;
            }
            let numa_node = r
                .int_opt(&format!("{base}/numa_node"))?
                .filter(|n| *n >= 0)
                .map(|n| n as u32);
            devices.push(PciDevice {
                address: addr.clone(),
                class,
                vendor: r.hex_opt(&format!("{base}/vendor"))?.unwrap_or(0),
                device: r.hex_opt(&format!("{base}/device"))?.unwrap_or(0),
                numa_node,
            });
        }
    }

    Ok(RawTopology {
        cpus,
        nodes,
        devices,
        isolated,
    })
}

fn parse_memtotal(text: &str) -> Option<u64> {
    for line in text.lines() {
        if let Some(idx) = line.find("MemTotal:") {
            let rest = line[idx + "MemTotal:".len()..].trim();
            let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
            return Some(kb * 1024);
        }
    }
    None
}

/// Convenience: discover from a directory on disk.
pub fn discover_dir(root: &Path) -> Result<RawTopology, DiscoveryError> {
    discover(&DirSource::new(root), &DiscoveryOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn tiny() -> MapSource {
        let mut m = MapSource::default()
            .with("devices/system/cpu/online", "0-2,4\n")
            .with("devices/system/node/node0/cpulist", "0-1\n")
            .with(
                "devices/system/node/node0/meminfo",
                "Node 0 MemTotal:  1024 kB\n",
            )
            .with("devices/system/node/node0/distance", "10 20 20\n")
            .with("devices/system/node/node1/cpulist", "2-4\n")
            .with(
                "devices/system/node/node1/meminfo",
                "Node 1 MemTotal:  2048 kB\n",
            )
            .with("devices/system/node/node1/distance", "20 10 20\n")
            // A memory-only node.
            .with("devices/system/node/node2/cpulist", "\n")
            .with(
                "devices/system/node/node2/meminfo",
                "Node 2 MemTotal:  4096 kB\n",
            )
            .with("devices/system/node/node2/distance", "17 28 10\n");
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
        assert_eq!(t.pool_by_name("socket0").unwrap().mems.to_string(), "0,2");
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
