//! Checks across sysfs files. Discovery parses each file on its own; these look at the files
//! together, so that an inconsistent tree is an error (or a warning) instead of a wrong model.

use super::error::{DiscoveryError, DiscoveryWarning};
use crate::cpuset::CpuSet;
use crate::nodeset::NodeSet;
use crate::raw::RawNode;

/// A NUMA node as read, with the files its facts came from.
pub(super) struct NodeFiles {
    pub node: RawNode,
    /// `cpulist`, or `cpumap` where the list is missing.
    pub cpus_path: String,
    pub distance_path: String,
}

/// Every CPU the `online` list names has a `cpuN` directory.
pub(super) fn online_has_dirs(
    path: &str,
    dir: &str,
    online: &CpuSet,
    dirs: &CpuSet,
) -> Result<(), DiscoveryError> {
    let missing = online.difference(dirs);
    if missing.is_empty() {
        return Ok(());
    }
    Err(DiscoveryError::OnlineCpuWithoutDir {
        path: path.to_string(),
        dir: dir.to_string(),
        cpus: Box::new(missing),
    })
}

/// No CPU is in two nodes' lists (offline CPUs included: the kernel keeps them in one node).
pub(super) fn nodes_disjoint(nodes: &[NodeFiles]) -> Result<(), DiscoveryError> {
    let mut seen = CpuSet::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.node.cpus.intersects(&seen) {
            for earlier in &nodes[..i] {
                let both = earlier.node.cpus.intersection(&n.node.cpus);
                if !both.is_empty() {
                    return Err(DiscoveryError::OverlappingNodes {
                        first: earlier.cpus_path.clone(),
                        second: n.cpus_path.clone(),
                        cpus: Box::new(both),
                    });
                }
            }
        }
        seen = seen.union(&n.node.cpus);
    }
    Ok(())
}

/// Where node directories exist, every online CPU is in one of them. (Without any node
/// directory the kernel has no NUMA support and the machine is one node.)
pub(super) fn every_cpu_in_a_node(
    dir: &str,
    online: &CpuSet,
    nodes: &[NodeFiles],
) -> Result<(), DiscoveryError> {
    if nodes.is_empty() {
        return Ok(());
    }
    let mut covered = CpuSet::new();
    let mut ids = NodeSet::new();
    for n in nodes {
        covered = covered.union(&n.node.cpus);
        ids.insert(n.node.id as usize);
    }
    let orphans = online.difference(&covered);
    if orphans.is_empty() {
        return Ok(());
    }
    Err(DiscoveryError::CpusInNoNode {
        dir: dir.to_string(),
        cpus: Box::new(orphans),
        nodes: Box::new(ids),
    })
}

/// The nodes' memory adds up to at most `i64::MAX` bytes, so any pool's sum fits both `u64`
/// and the signed arithmetic placement does on memory.
pub(super) fn memory_adds_up(nodes: &[NodeFiles]) -> Result<(), DiscoveryError> {
    let limit = i64::MAX.unsigned_abs();
    let mut total: u64 = 0;
    for n in nodes {
        match total.checked_add(n.node.memory_bytes) {
            Some(t) if t <= limit => total = t,
            _ => {
                return Err(DiscoveryError::MemoryTotalOverflow {
                    nodes: Box::new(NodeSet::from_ids(nodes.iter().map(|n| n.node.id as usize))),
                })
            }
        }
    }
    Ok(())
}

/// Rows of the wrong length and asymmetric pairs. Both are worked around (a missing distance
/// defaults in the model; each node keeps its own row), so they are warnings.
pub(super) fn distance_warnings(nodes: &[NodeFiles]) -> Vec<DiscoveryWarning> {
    let mut out = Vec::new();
    let count = nodes.len();
    for n in nodes {
        let got = n.node.distances.len();
        if got != count {
            out.push(DiscoveryWarning::DistanceRowLength {
                path: n.distance_path.clone(),
                node: n.node.id,
                got,
                expected: count,
            });
        }
    }
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate().skip(i + 1) {
            let (Some(&a_to_b), Some(&b_to_a)) = (a.node.distances.get(j), b.node.distances.get(i))
            else {
                continue;
            };
            if a_to_b != b_to_a {
                out.push(DiscoveryWarning::AsymmetricDistance {
                    a: a.node.id,
                    b: b.node.id,
                    a_path: a.distance_path.clone(),
                    b_path: b.distance_path.clone(),
                    a_to_b,
                    b_to_a,
                });
            }
        }
    }
    out
}
