//! The hugepages of each NUMA node from sysfs
//! (`devices/system/node/node<N>/hugepages/hugepages-<size>kB/{nr,free}_hugepages`), for the
//! NodeResourceTopology's zones. What cannot be read is left out (a kernel without hugepages,
//! a fixture without the files).
//!
//! What a zone promises ([`available`]): the kernel's pool less the pages the containers the
//! agent books hold by their limits (`hugepages-<size>` limits, which the runtime sets as
//! hugetlb limits), and never more than the kernel has free. The kernel counts a page free
//! until a container faults it in, so `free_hugepages` alone promises the pages a container
//! was admitted with but has not touched yet; the pool less the limits does not, and the
//! bound by the free pages covers pages taken by what the agent does not book. It still
//! promises too much when both happen at once on a node: pages used by something the agent
//! does not book (a host process, a container it does not hold) *and* a booked container's
//! pages not yet faulted in; the kernel's per-node figures cannot tell them apart.
//!
//! A container's limit is held on every node its pages may come from ([`held`]): its memory
//! nodes when the agent binds memory, else its CPUs' nodes (the kernel takes local pages
//! first), every node for a container without a grant. One on two nodes holds its whole limit
//! on both: how its pages split is not known.

use super::nrt::Hugepages;
use crate::agent::{ContainerInfo, HugepageLimit};
use std::collections::BTreeMap;
use std::path::Path;
use tap_engine::sysfs::{FileSource, RootSource};
use tap_engine::Engine;

/// Pages held by limits, by `(NUMA node, page size in kB)`.
pub type Held = BTreeMap<(u32, u64), u64>;

/// The pages of one size one node may promise: `total` (`nr_hugepages`) less `held` by the
/// booked containers' limits, at most the `free` ones (`free_hugepages`), never below 0.
pub fn available(total: u64, free: u64, held: u64) -> u64 {
    total.saturating_sub(held).min(free)
}

/// Adds `limits` to `held` on each of `nodes`.
pub fn hold(held: &mut Held, nodes: impl IntoIterator<Item = u32>, limits: &[HugepageLimit]) {
    for node in nodes {
        for l in limits {
            let pages = held.entry((node, l.size_kb)).or_default();
            *pages = pages.saturating_add(l.pages());
        }
    }
}

/// The pages the `booked` containers hold by their limits, on the nodes their pages may come
/// from (see the module's text).
pub fn held(engine: &Engine, booked: &[ContainerInfo]) -> Held {
    let topo = engine.topology();
    let mut out = Held::new();
    for c in booked.iter().filter(|c| !c.hugepage_limits.is_empty()) {
        let nodes: Vec<u32> = match engine.grant(&c.id) {
            Some(g) => g
                .mems
                .unwrap_or_else(|| topo.nodes_of(&g.cpus))
                .iter()
                .filter_map(|n| u32::try_from(n).ok())
                .collect(),
            None => topo.nodes.iter().map(|n| n.id).collect(),
        };
        hold(&mut out, nodes, &c.hugepage_limits);
    }
    out
}

/// Every hugepage size of every NUMA node under `sysfs_root` (a directory or a dump file, as
/// `--sysfs-root`), ordered by node and size.
pub fn read(sysfs_root: &Path) -> Vec<Hugepages> {
    let Ok(src) = RootSource::open(sysfs_root) else {
        return Vec::new();
    };
    let nodes = "devices/system/node";
    let Ok(names) = src.list(nodes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names {
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        out.extend(node_pages(&src, &format!("{nodes}/{name}/hugepages"), node));
    }
    out.sort_by_key(|h| (h.node, h.size_kb));
    out
}

fn node_pages(src: &RootSource, dir: &str, node: u32) -> Vec<Hugepages> {
    let Ok(sizes) = src.list(dir) else {
        return Vec::new();
    };
    let number = |p: &str| -> Option<u64> { src.read(p).ok()?.trim().parse().ok() };
    sizes
        .iter()
        .filter_map(|name| {
            let size_kb = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(Hugepages {
                node,
                size_kb,
                total: number(&format!("{dir}/{name}/nr_hugepages"))?,
                free: number(&format!("{dir}/{name}/free_hugepages"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule on made-up numbers, in pages.
    #[test]
    fn available_is_the_pool_less_the_limits_within_the_free_pages() {
        // 512 pages, 100 held by limits, 12 of them faulted in: 500 free, 412 promised.
        assert_eq!(available(512, 500, 100), 412);
        // All 100 faulted in and 88 more used by a process the agent does not book.
        assert_eq!(available(512, 324, 100), 324);
        // Nothing held: the free pages.
        assert_eq!(available(512, 500, 0), 500);
        // A limit larger than the pool: nothing, not a wrap-around.
        assert_eq!(available(2, 2, 3), 0);
        assert_eq!(available(0, 0, u64::MAX), 0);
        // A free count above the pool (a torn read) is bounded by the pool.
        assert_eq!(available(8, 10, 0), 8);
    }

    /// A container on two nodes holds its whole limit on both; limits add up per size.
    #[test]
    fn limits_are_held_on_every_node_the_pages_may_come_from() {
        let two_mb = |pages: u64| HugepageLimit {
            size_kb: 2048,
            bytes: pages << 21,
        };
        let one_gb = HugepageLimit {
            size_kb: 1 << 20,
            bytes: 3 << 30,
        };
        let mut held = Held::new();
        hold(&mut held, [1], &[two_mb(100)]);
        hold(&mut held, [0, 1], &[two_mb(10), one_gb]);
        assert_eq!(
            held,
            Held::from([
                ((0, 2048), 10),
                ((0, 1 << 20), 3),
                ((1, 2048), 110),
                ((1, 1 << 20), 3),
            ])
        );
        // Node 1: 512 pages, 110 held; its 1Gi pool of 2 cannot hold the 3.
        assert_eq!(available(512, 500, held[&(1, 2048)]), 402);
        assert_eq!(available(2, 2, held[&(1, 1 << 20)]), 0);
        assert_eq!(available(2, 2, held[&(0, 1 << 20)]), 0);
    }

    #[test]
    fn reads_each_node_and_size_and_skips_what_is_not_there() {
        let root = std::env::temp_dir().join(format!("tap-hugepages-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let put = |rel: &str, v: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, v).expect("write");
        };
        let n = "devices/system/node";
        put(
            &format!("{n}/node1/hugepages/hugepages-2048kB/nr_hugepages"),
            "512\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-2048kB/free_hugepages"),
            "500\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-1048576kB/nr_hugepages"),
            "2\n",
        );
        put(
            &format!("{n}/node1/hugepages/hugepages-1048576kB/free_hugepages"),
            "2\n",
        );
        // Unreadable numbers and stray names are left out.
        put(
            &format!("{n}/node0/hugepages/hugepages-2048kB/nr_hugepages"),
            "x\n",
        );
        put(
            &format!("{n}/node0/hugepages/hugepages-2048kB/free_hugepages"),
            "0\n",
        );
        put(&format!("{n}/online"), "0-1\n");
        let got = read(&root);
        let names: Vec<_> = got
            .iter()
            .map(|h| (h.node, h.resource(), h.total, h.free))
            .collect();
        assert_eq!(
            names,
            [
                (1, "hugepages-2Mi".to_string(), 512, 500),
                (1, "hugepages-1Gi".to_string(), 2, 2)
            ]
        );
        assert!(read(&root.join("missing")).is_empty());
        // The same tree as a dump file (what the repository's fixtures are).
        let mut tree = tap_engine::sysfs::MapSource::default();
        for rel in [
            "node1/hugepages/hugepages-2048kB/nr_hugepages",
            "node1/hugepages/hugepages-2048kB/free_hugepages",
            "node1/hugepages/hugepages-1048576kB/nr_hugepages",
            "node1/hugepages/hugepages-1048576kB/free_hugepages",
            "node0/hugepages/hugepages-2048kB/nr_hugepages",
            "node0/hugepages/hugepages-2048kB/free_hugepages",
            "online",
        ] {
            let text = std::fs::read_to_string(root.join(n).join(rel)).expect("read");
            tree.files.insert(format!("{n}/{rel}"), text);
        }
        let dump = root.join("dump");
        std::fs::write(&dump, tree.to_dump()).expect("write");
        assert_eq!(read(&dump), got);
        let _ = std::fs::remove_dir_all(&root);
    }
}
